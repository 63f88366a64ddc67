//! Nothing of a dead engine process reaches its successor: batches held
//! while a slow ring is asked, or while the ready gate is closed, came on a
//! connection to the old process and are never applied on top of a new
//! process that took the endpoint. Over real ZMQ, against the publisher's
//! ground truth.

mod support;

use std::sync::Arc;

use kv_indexer::ingest::{Ingest, IngestConfig};
use kv_indexer::{StorageTier, WorkerId};
use support::harness::{assert_converges, settle, spec_for, test_config, wait_connected};
use support::model_sink::ModelSink;
use support::publisher::{PublisherConfig, TestEvent, TestPublisher};
use support::wait_until;

const DEVICE: StorageTier = StorageTier::Device;

/// Publishes one store of `n` new blocks; their hashes.
fn store(publisher: &mut TestPublisher, n: usize) -> Vec<u64> {
    let event = publisher.new_store(DEVICE, None, n);
    let TestEvent::Stored { hashes, .. } = event.clone() else { unreachable!() };
    publisher.publish(vec![event]);
    hashes
}

/// The blocks of `old` the sink still credits to `worker`.
fn credited(sink: &ModelSink, worker: WorkerId, old: &[Vec<u64>]) -> usize {
    old.iter().flatten().filter(|&&h| sink.holds(worker, DEVICE, h)).count()
}

#[test]
fn batches_held_for_a_slow_replay_never_reach_the_process_that_took_the_endpoint() {
    let worker = WorkerId::new(90, 0);
    let ingest = Ingest::start(test_config()).unwrap();
    let mut publisher = TestPublisher::new(PublisherConfig { seed: 90, ..PublisherConfig::default() });
    let sink = Arc::new(ModelSink::new());
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    wait_connected(&mut publisher, 1, 1);
    // The first process applies seqs 0..=9.
    let mut old: Vec<Vec<u64>> = (0..10).map(|_| store(&mut publisher, 2)).collect();
    assert_converges(&sink, worker, &publisher);
    // It loses 10 and sends 11..=13: the gap's replay waits on its slow
    // ring, the live batches are held.
    publisher.hold_replay(Some(0));
    publisher.lose_next(1);
    old.extend((10..14).map(|_| store(&mut publisher, 2)));
    assert!(wait_until(|| ingest.counters().held_batches == 3), "{:?}", ingest.counters());
    // It dies; a new process binds the same endpoints, loses its seq 0 and
    // sends 1..=4. The ring answers only now, as the new process's.
    publisher.restart(true);
    assert!(publisher.wait_subscribed(1), "listener never reconnected");
    publisher.lose_next(1);
    for _ in 0..5 {
        store(&mut publisher, 2);
    }
    publisher.hold_replay(None);
    settle(&ingest, worker, &publisher);
    assert_converges(&sink, worker, &publisher);
    assert_eq!(credited(&sink, worker, &old), 0, "blocks of the dead process credited");
    let c = ingest.counters();
    assert_eq!(c.held_batches, 0);
    assert!(c.unproven_dropped >= 3, "{c:?}");
    assert!(c.restarts >= 1, "{c:?}");
}

/// A daemon in startup recovery (gate closed) holds what its engines
/// send; one engine restarts meanwhile. `ring`: whether it has a replay
/// endpoint.
fn gate_closed_over_a_restart(instance: u64, ring: bool) {
    let worker = WorkerId::new(instance, 0);
    let ingest = Ingest::start(IngestConfig { ready_gate_open: false, ..test_config() }).unwrap();
    let ring_capacity = if ring { PublisherConfig::default().ring_capacity } else { None };
    let cfg = PublisherConfig { seed: instance, ring_capacity, ..PublisherConfig::default() };
    let mut publisher = TestPublisher::new(cfg);
    let sink = Arc::new(ModelSink::new());
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    assert!(publisher.wait_subscribed(1));
    let old: Vec<Vec<u64>> = (0..6).map(|_| store(&mut publisher, 2)).collect();
    assert!(wait_until(|| ingest.counters().held_batches == 6), "{:?}", ingest.counters());
    // A new process takes the endpoint; its first batch continues the old
    // seqs exactly (it lost 0..=5), the case seqs alone cannot tell.
    publisher.restart(true);
    assert!(publisher.wait_subscribed(1), "listener never reconnected");
    publisher.lose_next(6);
    for _ in 0..9 {
        store(&mut publisher, 2);
    }
    assert!(wait_until(|| ingest.counters().held_batches == 9), "{:?}", ingest.counters());
    ingest.open_ready_gate();
    settle(&ingest, worker, &publisher);
    let c = ingest.counters();
    if ring {
        // The ring tells the processes apart: exactly the new one's blocks.
        assert_converges(&sink, worker, &publisher);
        assert_eq!(credited(&sink, worker, &old), 0, "blocks of the dead process credited");
        assert_eq!(c.unverified_continuations, 0, "{c:?}");
    } else {
        // Without a ring a continuation cannot be told from the same
        // process: taken on faith, and counted as such.
        assert_eq!(c.unverified_continuations, 1, "{c:?}");
    }
}

#[test]
fn batches_held_while_the_gate_is_closed_never_reach_a_new_process() {
    gate_closed_over_a_restart(91, true);
}

#[test]
fn without_a_ring_a_new_connection_continuing_the_watermark_is_counted_as_unverified() {
    gate_closed_over_a_restart(92, false);
}

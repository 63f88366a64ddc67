//! Over real ZMQ, against the publisher's ground truth: a ring answer
//! that comes while the listener's connection is down (its engine died;
//! the next connection waits for its backoff) never vouches for the dead
//! connection, so no held batch of the dead process lands on top of its
//! successor's; a restart the connection hides (a proxy) is never
//! continued as the old process; a key registered again after its blocks
//! were removed is filled from the ring's start, not resumed past them.

mod support;

use std::sync::Arc;
use std::time::Duration;

use kv_indexer::ingest::{Ingest, IngestConfig};
use kv_indexer::{StorageTier, WorkerId};
use support::harness::{settle, spec_for, test_config};
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

#[test]
fn a_ring_answer_while_the_engine_is_away_never_vouches_for_its_dead_connection() {
    let worker = WorkerId::new(95, 0);
    // The next connection after a drop waits 5 to 10 s; a ring request
    // nothing answers is asked again after 3 s, and live batches wait for
    // a ring at most 24 s.
    let cfg = IngestConfig {
        replay_timeout_ms: 3_000,
        reconnect_ivl_ms: 5_000,
        reconnect_ivl_max_ms: 5_000,
        ..test_config()
    };
    let ingest = Ingest::start(cfg).unwrap();
    let mut publisher = TestPublisher::new(PublisherConfig { seed: 95, ..PublisherConfig::default() });
    let sink = Arc::new(ModelSink::new());
    // The first process has published 0..=9; its ring is slow to answer
    // the fill a new listener asks for.
    let mut old: Vec<Vec<u64>> = (0..10).map(|_| store(&mut publisher, 2)).collect();
    publisher.mute_replay(true);
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    assert!(publisher.wait_subscribed(1));
    assert!(wait_until(|| !publisher.replay_requests().is_empty()));
    // Live batches 10 and 11 wait for the fill.
    old.extend((10..12).map(|_| store(&mut publisher, 2)));
    assert!(wait_until(|| ingest.counters().held_batches == 2), "{:?}", ingest.counters());
    // It dies; a new process binds the same endpoints and publishes 0..=9
    // before the listener's next connection. Its ring answers (one reply a
    // second) the fill's request asked again.
    publisher.restart(true);
    for _ in 0..10 {
        store(&mut publisher, 2);
    }
    publisher.pace_replay(Some(Duration::from_secs(1)));
    publisher.mute_replay(false);
    // The listener reconnects; the new process publishes 10..=12.
    assert!(publisher.wait_subscribed(1), "listener never reconnected");
    assert!(wait_until(|| ingest.counters().held_batches == 0), "{:?}", ingest.counters());
    for _ in 0..3 {
        store(&mut publisher, 2);
    }
    settle(&ingest, worker, &publisher);
    let c = ingest.counters();
    let stale = old.iter().flatten().filter(|&&h| sink.holds(worker, DEVICE, h)).count();
    assert_eq!(stale, 0, "blocks of the dead process credited: {c:?}");
}

#[test]
fn a_restart_the_connection_hides_is_not_continued_as_the_old_process() {
    // The engine's socket outlives its process (as behind a proxy that
    // keeps our connection up): the new process's batches come on the
    // same connection. Its seq 0 is lost; its 1..=9 are below the
    // watermark but are not the batches kept for those seqs, so each is a
    // restart, never a duplicate, and its 10.. never continue the old
    // process's blocks.
    let worker = WorkerId::new(96, 0);
    let ingest = Ingest::start(test_config()).unwrap();
    let mut publisher = TestPublisher::new(PublisherConfig { seed: 96, ..PublisherConfig::default() });
    let sink = Arc::new(ModelSink::new());
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    support::harness::wait_connected(&mut publisher, 1, 1);
    let old: Vec<Vec<u64>> = (0..10).map(|_| store(&mut publisher, 2)).collect();
    support::harness::assert_converges(&sink, worker, &publisher);
    publisher.restart(false);
    publisher.lose_next(1);
    for _ in 0..13 {
        store(&mut publisher, 2);
    }
    settle(&ingest, worker, &publisher);
    let c = ingest.counters();
    let stale = old.iter().flatten().filter(|&&h| sink.holds(worker, DEVICE, h)).count();
    assert_eq!(stale, 0, "blocks of the dead process credited: {c:?}");
}

#[test]
fn a_registration_again_after_its_blocks_were_removed_refills_them_from_the_ring() {
    // Unregistering removes the listener, then the worker's blocks; the
    // watermark is kept for the next registration of the key. The engine
    // still holds its blocks and its ring still has every batch.
    let worker = WorkerId::new(98, 0);
    let ingest = Ingest::start(test_config()).unwrap();
    let mut publisher = TestPublisher::new(PublisherConfig { seed: 98, ..PublisherConfig::default() });
    let sink = Arc::new(ModelSink::new());
    let id = ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    support::harness::wait_connected(&mut publisher, 1, 1);
    for _ in 0..10 {
        store(&mut publisher, 2);
    }
    support::harness::assert_converges(&sink, worker, &publisher);
    ingest.remove_listener(id).unwrap();
    ingest.remove_worker(worker, sink.clone()).unwrap();
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    support::harness::wait_connected(&mut publisher, 2, 2);
    settle(&ingest, worker, &publisher);
    support::harness::assert_converges(&sink, worker, &publisher);
}

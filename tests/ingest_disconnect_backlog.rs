//! Over real ZMQ: a listener behind on a busy engine that restarts keeps
//! every batch it had queued from the old connection and never aborts.
//! A SUB socket that ZMQ never reconnects (`ZMQ_RECONNECT_IVL` -1)
//! terminates its pipe when its connection drops, dropping what it had
//! not yet read, and libzmq aborts (`fq.cpp:112`) when that lands between
//! two frames of a message; ours keep theirs (see `subscriber.rs`).

mod support;

use std::sync::Arc;
use std::time::Duration;

use kv_indexer::ingest::{Ingest, IngestConfig};
use kv_indexer::{StorageTier, WorkerId};
use support::gate_sink::{GateSink, OpenOnDrop};
use support::harness::{assert_converges, settle, spec_with, test_config};
use support::publisher::{PublisherConfig, TestPublisher};
use support::wait_until;

const DEVICE: StorageTier = StorageTier::Device;

fn store(publisher: &mut TestPublisher) {
    let event = publisher.new_store(DEVICE, None, 2);
    publisher.publish(vec![event]);
}

#[test]
fn a_connection_dropped_with_batches_queued_neither_aborts_nor_loses_them() {
    // One listener thread that runs the shard: while the sink holds the
    // first batch, 499 more pile up in the SUB socket. The connection then
    // drops (the same process binds again). What the socket received
    // before the drop is to be read before the next socket opens: the
    // stream continues on the next connection with no gap.
    let worker = WorkerId::new(97, 0);
    let cfg = IngestConfig { listener_threads: 1, shard_threads: 1, ..test_config() };
    let ingest = Ingest::start(cfg).unwrap();
    let mut publisher =
        TestPublisher::new(PublisherConfig { seed: 97, ring_capacity: None, ..PublisherConfig::default() });
    let sink = Arc::new(GateSink::closed_for(&[worker]));
    let _open_on_failure = OpenOnDrop(sink.clone());
    ingest.add_listener(spec_with(worker, &publisher, sink.clone())).unwrap();
    assert!(publisher.wait_subscribed(1));
    store(&mut publisher);
    assert!(wait_until(|| sink.waited.load(std::sync::atomic::Ordering::Relaxed) == 1));
    for _ in 1..500 {
        store(&mut publisher);
    }
    // Time for the batches to cross the connection, and for the drop.
    std::thread::sleep(Duration::from_millis(300));
    publisher.blip();
    std::thread::sleep(Duration::from_millis(300));
    // Busy threads keep ZMQ's I/O thread from answering the socket's
    // pipe termination at once, as a loaded host does.
    let spin = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let spinners: Vec<_> = (0..4)
        .map(|_| {
            let spin = spin.clone();
            std::thread::spawn(move || {
                while spin.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    sink.open();
    assert!(publisher.wait_subscribed(1), "listener never reconnected");
    spin.store(false, std::sync::atomic::Ordering::Relaxed);
    spinners.into_iter().for_each(|t| t.join().unwrap());
    store(&mut publisher);
    settle(&ingest, worker, &publisher);
    let c = ingest.counters();
    assert_eq!((c.resyncs, c.gaps_detected, c.batches_received), (0, 0, 501), "{c:?}");
    assert_converges(&sink.model, worker, &publisher);
}

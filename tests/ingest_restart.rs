//! Engine restarts: seq back to 0 on the same connection, and a new process
//! on a new connection whose first batches were missed. No block of the old
//! process may survive, including under a dp-rank override.

mod support;

use std::sync::Arc;

use kv_indexer::ingest::Ingest;
use kv_indexer::{StorageTier, WorkerId};
use support::harness::{assert_converges, settle, spec_for, test_config, wait_connected};
use support::model_sink::ModelSink;
use support::publisher::{PublisherConfig, TestEvent, TestPublisher};
use support::wait_until;

const DEVICE: StorageTier = StorageTier::Device;

/// Publishes a known store and returns its hashes.
fn store(publisher: &mut TestPublisher, n: usize) -> Vec<u64> {
    let event = publisher.new_store(DEVICE, None, n);
    let TestEvent::Stored { hashes, .. } = event.clone() else { unreachable!() };
    publisher.publish(vec![event]);
    hashes
}

#[test]
fn seq_zero_after_a_higher_watermark_clears_the_old_blocks() {
    let worker = WorkerId::new(20, 0);
    let ingest = Ingest::start(test_config()).unwrap();
    let mut publisher = TestPublisher::new(PublisherConfig::default());
    let sink = Arc::new(ModelSink::new());
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    wait_connected(&mut publisher, 1, 1);
    let old = store(&mut publisher, 3);
    publisher.publish_random(30);
    assert_converges(&sink, worker, &publisher);

    publisher.restart(false);
    publisher.publish_random(10);
    settle(&ingest, worker, &publisher);
    assert_converges(&sink, worker, &publisher);
    assert!(!sink.holds(worker, DEVICE, old[0]), "a block of the old process survived");
    let c = ingest.counters();
    assert_eq!(c.restarts, 1);
    assert_eq!((c.duplicates_dropped, c.resyncs, c.batches_lost), (0, 0, 0));
}

#[test]
fn a_new_process_on_a_new_connection_is_a_restart_even_past_seq_zero() {
    let worker = WorkerId::new(21, 0);
    let ingest = Ingest::start(test_config()).unwrap();
    let mut publisher = TestPublisher::new(PublisherConfig::default());
    let sink = Arc::new(ModelSink::new());
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    wait_connected(&mut publisher, 1, 1);
    let old = store(&mut publisher, 3);
    publisher.publish_random(20);
    assert_converges(&sink, worker, &publisher);
    let watermark = publisher.next_seq() - 1;

    // New process, new socket on the same port. Its first three batches
    // never reach us, so its first delivered seq (3) is neither 0 nor far
    // below the watermark (20): only the reconnect tells it is a restart.
    publisher.restart(true);
    publisher.lose_next(3);
    publisher.publish_random(3);
    assert!(publisher.wait_subscribed(1), "listener never reconnected");
    publisher.publish_random(5);
    settle(&ingest, worker, &publisher);
    assert_converges(&sink, worker, &publisher);
    assert!(!sink.holds(worker, DEVICE, old[0]), "a block of the old process survived");
    // The fill on reconnecting asked from the watermark, found nothing
    // there and started over from 0. Whether the ring's or the live copy of
    // the last batches comes first is timing: duplicates are not counted here.
    let asked = publisher.replay_requests();
    assert!(asked.contains(&watermark), "{asked:?}");
    assert_eq!(asked.last(), Some(&0));
    let c = ingest.counters();
    assert_eq!((c.restarts, c.resyncs, c.batches_lost), (1, 0, 0));
}

#[test]
fn a_restart_clears_the_rank_named_in_the_batches() {
    // Registered as rank 0, but the engine names rank 3 in its batches.
    let registered = WorkerId::new(22, 0);
    let named = WorkerId::new(22, 3);
    let ingest = Ingest::start(test_config()).unwrap();
    let mut publisher = TestPublisher::new(PublisherConfig { batch_dp_rank: Some(3), ..PublisherConfig::default() });
    let sink = Arc::new(ModelSink::new());
    ingest.add_listener(spec_for(registered, &publisher, &sink)).unwrap();
    wait_connected(&mut publisher, 1, 1);
    let old = store(&mut publisher, 2);
    publisher.publish_random(10);
    assert_converges(&sink, named, &publisher);
    assert_eq!(sink.workers(), vec![named]);

    publisher.restart(false);
    let new = store(&mut publisher, 2);
    assert!(wait_until(|| sink.holds(named, DEVICE, new[0])));
    assert!(!sink.holds(named, DEVICE, old[0]));
    assert_converges(&sink, named, &publisher);
    assert_eq!(ingest.counters().restarts, 1);
}

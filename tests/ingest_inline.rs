//! One listener thread and one shard: the listener thread runs the shard
//! itself, applying each batch where it decoded it. The ordering rules must
//! hold as with shard threads: a restart's clear lands between the old
//! stream and the new one, a gap is replayed before later batches, and the
//! API's messages (remove a worker, sync) reach the shard although no
//! thread of its own waits on its queue.

mod support;

use std::sync::Arc;

use kv_indexer::ingest::{Ingest, IngestConfig};
use kv_indexer::{StorageTier, WorkerId};
use support::harness::{assert_converges, settle, spec_for, test_config};
use support::model_sink::ModelSink;
use support::publisher::{PublisherConfig, TestPublisher};
use support::wait_until;

const DEVICE: StorageTier = StorageTier::Device;

fn inline_config() -> IngestConfig {
    IngestConfig { listener_threads: 1, shard_threads: 1, ..test_config() }
}

#[test]
fn restarts_and_gaps_keep_their_order_when_the_listener_applies() {
    let worker = WorkerId::new(30, 0);
    let ingest = Ingest::start(inline_config()).unwrap();
    let mut publisher = TestPublisher::new(PublisherConfig::default());
    let sink = Arc::new(ModelSink::new());
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    assert!(publisher.wait_subscribed(1));
    publisher.publish_random(30);
    assert_converges(&sink, worker, &publisher);

    // A gap, replayed from the engine's ring before the batch after it.
    publisher.lose_next(4);
    publisher.publish_random(6);
    settle(&ingest, worker, &publisher);
    assert_converges(&sink, worker, &publisher);

    let old = publisher.truth()[DEVICE.index()].clone();
    assert!(!old.is_empty());
    publisher.restart(false);
    publisher.publish_random(10);
    settle(&ingest, worker, &publisher);
    assert_converges(&sink, worker, &publisher);
    assert!(old.iter().all(|&h| !sink.holds(worker, DEVICE, h)), "a block of the old process survived");
    let c = ingest.counters();
    assert_eq!((c.restarts, c.replays_ok, c.resyncs, c.batches_lost), (1, 1, 0, 0));
    assert_eq!(c.shard_queue_depths, vec![0]);
}

#[test]
fn the_api_reaches_a_shard_the_listener_thread_runs() {
    let ingest = Ingest::start(inline_config()).unwrap();
    let sink = Arc::new(ModelSink::new());
    let mut publishers = Vec::new();
    for i in 0..4u64 {
        let worker = WorkerId::new(40 + i, 0);
        let mut publisher = TestPublisher::new(PublisherConfig::default());
        ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
        assert!(publisher.wait_subscribed(1));
        publisher.publish_random(20);
        publishers.push((worker, publisher));
    }
    for (worker, publisher) in &publishers {
        assert_converges(&sink, *worker, publisher);
    }
    // Idle now: only the API's messages wake the thread.
    for _ in 0..3 {
        ingest.sync_shards().unwrap();
    }
    let (gone, _) = &publishers[1];
    let id = ingest.listener_for(*gone).unwrap();
    assert_eq!(ingest.remove_listener(id).unwrap(), vec![0]);
    ingest.remove_worker(*gone, sink.clone()).unwrap();
    assert!(!sink.workers().contains(gone), "the removed worker is gone at once");
    assert_eq!(sink.workers().len(), 3);
    // The others still ingest.
    let (kept, publisher) = &mut publishers[2];
    publisher.publish_random(5);
    assert!(wait_until(|| sink.tiers_or_empty(*kept) == *publisher.truth()));
    ingest.shutdown();
}

#[test]
fn a_long_coalescing_window_keeps_order_and_loses_nothing() {
    use std::time::Duration;
    let worker = WorkerId::new(50, 0);
    // Far longer than the default, so messages pile up in ZMQ's pipes
    // between reads, gaps and the restart included.
    let cfg = IngestConfig { coalesce: Duration::from_millis(50), ..inline_config() };
    let ingest = Ingest::start(cfg).unwrap();
    let mut publisher = TestPublisher::new(PublisherConfig::default());
    let sink = Arc::new(ModelSink::new());
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    assert!(publisher.wait_subscribed(1));
    for _ in 0..4 {
        publisher.publish_random(25);
        std::thread::sleep(Duration::from_millis(5));
    }
    publisher.lose_next(3);
    publisher.publish_random(20);
    settle(&ingest, worker, &publisher);
    assert_converges(&sink, worker, &publisher);
    publisher.restart(false);
    publisher.publish_random(40);
    settle(&ingest, worker, &publisher);
    assert_converges(&sink, worker, &publisher);
    let c = ingest.counters();
    assert_eq!((c.restarts, c.replays_ok, c.resyncs, c.batches_lost), (1, 1, 0, 0));
    assert_eq!(c.held_dropped, 0);
}

#[test]
fn a_coalescing_window_past_its_limit_is_refused() {
    let cfg = IngestConfig { coalesce: std::time::Duration::from_millis(101), ..inline_config() };
    let err = Ingest::start(cfg).err().expect("refused");
    assert!(err.to_string().contains("coalesce must be at most 100 ms"), "{err}");
}

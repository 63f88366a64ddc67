//! One listener thread and one shard: the listener thread runs the shard
//! itself, applying each batch where it decoded it. The ordering rules must
//! hold as with shard threads: a restart's clear lands between the old
//! stream and the new one, a gap is replayed before later batches, and the
//! API's messages (remove a worker, sync) reach the shard although no
//! thread of its own waits on its queue; what piles up while the thread
//! applies is read afterwards in order.

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use kv_indexer::ingest::{Ingest, IngestConfig};
use kv_indexer::{StorageTier, WorkerId};
use support::gate_sink::{GateSink, OpenOnDrop};
use support::harness::{assert_converges, listener_of, settle, spec_for, spec_with, test_config};
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
    let id = listener_of(&ingest, *gone).unwrap().id;
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
fn batches_that_pile_up_while_the_thread_applies_keep_order_and_lose_nothing() {
    let worker = WorkerId::new(50, 0);
    let ingest = Ingest::start(inline_config()).unwrap();
    let mut publisher = TestPublisher::new(PublisherConfig::default());
    // The listener thread runs the shard, so while the sink holds the first
    // batch the thread reads nothing: everything below piles up in ZMQ's
    // pipes, gaps and the restart included, and is read in bursts after.
    let sink = Arc::new(GateSink::closed_for(&[worker]));
    let _open_on_failure = OpenOnDrop(sink.clone());
    ingest.add_listener(spec_with(worker, &publisher, sink.clone())).unwrap();
    assert!(publisher.wait_subscribed(1));
    let first = publisher.new_store(DEVICE, None, 2);
    publisher.publish(vec![first]);
    assert!(wait_until(|| sink.waited.load(Ordering::Relaxed) == 1), "the first batch never reached the sink");
    for _ in 0..4 {
        publisher.publish_random(25);
    }
    publisher.lose_next(3);
    publisher.publish_random(20);
    sink.open();
    settle(&ingest, worker, &publisher);
    assert_converges(&sink.model, worker, &publisher);
    publisher.restart(false);
    publisher.publish_random(40);
    settle(&ingest, worker, &publisher);
    assert_converges(&sink.model, worker, &publisher);
    let c = ingest.counters();
    assert_eq!((c.restarts, c.replays_ok, c.resyncs, c.batches_lost), (1, 1, 0, 0));
    assert_eq!(c.held_dropped, 0);
}

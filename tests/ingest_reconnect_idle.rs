//! An engine that goes idle right after the listener reconnected: nothing
//! live shows what the listener missed while it was away, and only the
//! first connection (or an `engine_gone_ms` clear) asks the ring. Each test
//! compares the sink with the engine's ground truth once the engine is
//! idle and the listener connected again.

mod support;

use std::sync::Arc;

use kv_indexer::ingest::Ingest;
use kv_indexer::{StorageTier, WorkerId};
use support::fault_proxy::{FaultProxy, Faults};
use support::harness::{assert_converges, settle, spec_for, test_config, wait_connected};
use support::model_sink::ModelSink;
use support::publisher::{PublisherConfig, TestEvent, TestPublisher};

#[test]
fn a_restarted_engine_idle_after_the_reconnect_holds_nothing_of_the_old_process() {
    let worker = WorkerId::new(70, 0);
    let ingest = Ingest::start(test_config()).unwrap();
    let sink = Arc::new(ModelSink::new());
    let mut publisher = TestPublisher::new(PublisherConfig { seed: 70, ..PublisherConfig::default() });
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    wait_connected(&mut publisher, 1, 1);
    let old = publisher.publish_stores_only(5);
    settle(&ingest, worker, &publisher);
    assert_converges(&sink, worker, &publisher);

    // A new process on the same port (empty cache, seq from 0). Its first
    // batches go out before the listener is subscribed again (ZMQ
    // reconnects with a backoff): they are in its ring, never delivered
    // live. Then it goes idle.
    publisher.restart(true);
    assert!(publisher.wait_subscribed(1), "the listener never reconnected");
    publisher.lose_next(3);
    publisher.publish_stores_only(3);

    // The engine holds the 3 new batches' blocks and none of the old ones.
    assert_converges(&sink, worker, &publisher);
    assert!(old.iter().all(|&h| !sink.holds(worker, StorageTier::Device, h)), "a block of the old process stayed");
}

#[test]
fn evictions_missed_while_disconnected_are_not_listed_once_reconnected() {
    let worker = WorkerId::new(71, 0);
    let ingest = Ingest::start(test_config()).unwrap();
    let sink = Arc::new(ModelSink::new());
    let mut publisher = TestPublisher::new(PublisherConfig { seed: 71, ..PublisherConfig::default() });
    let proxy = FaultProxy::start(&publisher.endpoint, Faults::NONE, 71);
    assert!(publisher.wait_subscribed(1), "the proxy never subscribed");
    let spec = spec_for(worker, &publisher, &sink);
    ingest.add_listener(kv_indexer::ingest::ListenerSpec { endpoint: proxy.endpoint.clone(), ..spec }).unwrap();
    assert!(proxy.wait_subscribed(1), "the listener never subscribed");
    let hashes = publisher.publish_stores_only(4);
    settle(&ingest, worker, &publisher);
    assert_converges(&sink, worker, &publisher);

    // The connection drops (far shorter than engine_gone_ms); meanwhile the
    // same engine evicts two blocks, published while nobody is subscribed.
    proxy.unbind();
    publisher.publish(vec![TestEvent::Removed { tier: StorageTier::Device, hashes: vec![hashes[6], hashes[7]] }]);
    assert!(proxy.wait_received(5), "the proxy never saw the eviction");
    proxy.rebind();
    assert!(proxy.wait_subscribed(1), "the listener never reconnected");

    // Idle from here: the engine no longer holds the two evicted blocks.
    assert_converges(&sink, worker, &publisher);
    assert!(!sink.holds(worker, StorageTier::Device, hashes[7]), "an evicted block is still listed");
}

//! Ring fills over real ZMQ sockets: a listener asks its engine's ring for
//! everything it holds as soon as it connects, and the fill races the live
//! stream under the sequence rules. Also what happens to a worker whose
//! engine never answers (`engine_gone_ms`). Every test compares the sink
//! with the publisher's ground truth.

mod support;

use std::sync::Arc;

use kv_indexer::ingest::{EventSink, Ingest, IngestConfig, ListenerSpec, ListenerStatus};
use kv_indexer::{Event, StorageTier, StoredBlock, WorkerId};
use support::fault_proxy::{FaultProxy, Faults};
use support::harness::{assert_converges, assert_no_stale, settle, spec_for, test_config};
use support::model_sink::ModelSink;
use support::publisher::{PublisherConfig, TestPublisher};
use support::wait_until;

fn start() -> (Ingest, Arc<ModelSink>) {
    (Ingest::start(test_config()).unwrap(), Arc::new(ModelSink::new()))
}

#[test]
fn live_copies_of_what_the_fill_applied_are_duplicates_not_a_restart() {
    // The live stream reaches the listener only after the ring answered:
    // its first batch, seq 0, lies far below the watermark the fill left.
    let worker = WorkerId::new(60, 0);
    let (ingest, sink) = start();
    let mut publisher = TestPublisher::new(PublisherConfig { seed: 60, ..PublisherConfig::default() });
    let proxy = FaultProxy::start(&publisher.endpoint, Faults::NONE, 60);
    assert!(publisher.wait_subscribed(1));
    proxy.pause(true);
    publisher.publish_random(10);
    let spec = ListenerSpec { endpoint: proxy.endpoint.clone(), ..spec_for(worker, &publisher, &sink) };
    ingest.add_listener(spec).unwrap();
    assert_converges(&sink, worker, &publisher);
    assert!(proxy.wait_subscribed(1));
    proxy.pause(false);
    publisher.publish_random(5);
    settle(&ingest, worker, &publisher);
    assert_converges(&sink, worker, &publisher);
    let c = ingest.counters();
    assert_eq!((c.ring_fills, c.batches_filled, c.duplicates_dropped), (1, 10, 10));
    assert_eq!((c.restarts, c.resyncs, c.gaps_detected, c.batches_applied), (0, 0, 0, 15));
}

#[test]
fn a_live_batch_during_the_fill_bounds_it() {
    let worker = WorkerId::new(61, 0);
    let (ingest, sink) = start();
    let mut publisher = TestPublisher::new(PublisherConfig { seed: 61, ..PublisherConfig::default() });
    publisher.publish_random(10);
    // A slow ring: the fill is asked, and live batches come before its answer.
    publisher.hold_replay(Some(0));
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    assert!(publisher.wait_subscribed(1));
    assert!(wait_until(|| publisher.replay_requests() == vec![0]));
    publisher.publish_random(5);
    assert!(wait_until(|| ingest.counters().held_batches == 5), "{:?}", ingest.counters());
    // The ring's answer (0..=9, as it was when asked) arrives now and
    // starts the stream. The held batches are dropped unjudged (nothing
    // proves their connection reaches the ring's process), and the fill
    // asks again to read them from the ring, with no later batch needed.
    publisher.hold_replay(None);
    settle(&ingest, worker, &publisher);
    assert_converges(&sink, worker, &publisher);
    let c = ingest.counters();
    assert_eq!((c.ring_fills, c.batches_filled, c.batches_applied, c.unproven_dropped), (1, 15, 15, 5));
    assert_eq!((c.duplicates_dropped, c.replays_started, c.gaps_detected, c.held_batches), (0, 0, 0, 0));
}

#[test]
fn a_fill_cut_short_by_a_new_process_leaves_nothing_of_the_old_one() {
    let worker = WorkerId::new(64, 0);
    let (ingest, sink) = start();
    let mut publisher = TestPublisher::new(PublisherConfig { seed: 64, ..PublisherConfig::default() });
    let old = publisher.publish_stores_only(10);
    // The old process's answer is still in flight when the listener asks.
    publisher.hold_replay(Some(0));
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    assert!(wait_until(|| publisher.replay_requests() == vec![0]));
    // A new process binds the port: the listener reconnects mid-fill and
    // asks the new process's ring, empty then.
    publisher.restart(true);
    assert!(publisher.wait_subscribed(1));
    assert!(wait_until(|| publisher.replay_requests() == vec![0, 0]));
    // The old process's answer arrives after all, then the new one publishes.
    publisher.hold_replay(None);
    publisher.lose_next(1);
    publisher.publish_stores_only(4);
    settle(&ingest, worker, &publisher);
    assert_converges(&sink, worker, &publisher);
    assert!(old.iter().all(|&h| !sink.holds(worker, StorageTier::Device, h)), "a block of the old process came back");
    // The new process's ring, empty when asked, starts the stream; its
    // batches held meanwhile are dropped and read from it again, the lost
    // 0 included.
    let c = ingest.counters();
    assert_eq!((c.ring_fills, c.batches_filled, c.restarts, c.batches_lost), (2, 4, 0, 0));
}

#[test]
fn batches_sent_before_the_subscription_took_are_read_from_the_ring_once_the_engine_is_quiet() {
    let worker = WorkerId::new(65, 0);
    let (ingest, sink) = start();
    let mut publisher = TestPublisher::new(PublisherConfig { seed: 65, ..PublisherConfig::default() });
    publisher.publish_random(3);
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    assert!(wait_until(|| ingest.counters().batches_filled == 3));
    // What a PUB socket does with batches sent before our subscription
    // reaches it: they never arrive. The engine then goes quiet, so no
    // later batch shows them missing; its ring has them.
    publisher.lose_next(5);
    publisher.publish_random(5);
    assert_converges(&sink, worker, &publisher);
    // Counted when the read ends, which may come after the sink converged.
    assert!(wait_until(|| ingest.counters().batches_filled == 8), "{:?}", ingest.counters());
    let c = ingest.counters();
    assert_eq!((c.ring_fills, c.batches_filled, c.batches_lost, c.resyncs, c.gaps_detected), (1, 8, 0, 0, 0));
    assert!(c.late_join_reads >= 1, "{c:?}");
    // A live batch shows the subscription took: the reads stop.
    publisher.publish_random(1);
    settle(&ingest, worker, &publisher);
    let reads = ingest.counters().late_join_reads;
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    assert_eq!(ingest.counters().late_join_reads, reads, "read again after a live batch came");
}

#[test]
fn a_fill_that_ended_on_its_deadline_is_read_again_once_quiet() {
    // The ring answers its first batch and stalls (no end marker): the fill
    // ends on a deadline, in the listener's round of running asks, and its
    // late read must still come though nothing else wakes the listener.
    let worker = WorkerId::new(66, 0);
    let cfg = IngestConfig { replay_timeout_ms: 300, ..test_config() };
    let (ingest, sink) = (Ingest::start(cfg).unwrap(), Arc::new(ModelSink::new()));
    let mut publisher = TestPublisher::new(PublisherConfig { seed: 66, ..PublisherConfig::default() });
    publisher.publish_random(3);
    publisher.hold_replay(Some(1));
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    assert!(wait_until(|| ingest.counters().batches_filled == 1));
    // Past the fill's deadline (idle, asked again, no reply for a timeout).
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    publisher.hold_replay(None);
    let read = wait_until(|| ingest.counters().batches_filled == 3);
    assert!(read, "no late read after the fill: {:?}", ingest.counters());
    assert_converges(&sink, worker, &publisher);
}

#[test]
fn a_ring_that_starts_later_than_asked_fills_what_it_holds_and_nothing_stale() {
    let worker = WorkerId::new(62, 0);
    let (ingest, sink) = start();
    let cfg = PublisherConfig { ring_capacity: Some(8), seed: 62, ..PublisherConfig::default() };
    let mut publisher = TestPublisher::new(cfg);
    publisher.publish_random(20);
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    // The ring holds 12..=19: those are applied, 0..12 are missed at join.
    assert!(wait_until(|| ingest.counters().batches_filled == 8));
    ingest.sync_shards().unwrap();
    assert_no_stale(&sink, worker, &publisher);
    let c = ingest.counters();
    assert_eq!((c.ring_fills, c.batches_missed_at_join), (1, 12));
    assert_eq!((c.resyncs, c.batches_lost, c.replays_started), (0, 0, 0));
    assert_eq!(ingest.listener_status()[0].last_seq, Some(19));
}

#[test]
fn a_worker_whose_engine_never_answers_is_cleared_after_engine_gone() {
    // Blocks the worker got before its listener was added (a snapshot's, a
    // peer's dump) stay only as long as its engine could still appear.
    let worker = WorkerId::new(63, 0);
    let cfg = IngestConfig { engine_gone_ms: 300, ..test_config() };
    let ingest = Ingest::start(cfg).unwrap();
    let sink = Arc::new(ModelSink::new());
    let blocks = [(7, 70), (8, 80)].map(|(engine_hash, local_hash)| StoredBlock { engine_hash, local_hash });
    let store = Event::stored(worker, StorageTier::Device, None, blocks.to_vec());
    sink.apply(&store);
    assert!(sink.holds(worker, StorageTier::Device, 7));
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let spec = ListenerSpec {
        worker,
        endpoint: format!("tcp://{nobody}"),
        replay_endpoint: None,
        block_size: 4,
        sink: sink.clone() as Arc<dyn EventSink>,
    };
    let id = ingest.add_listener(spec).unwrap();
    assert!(wait_until(|| ingest.counters().engine_gone_clears == 1));
    assert!(wait_until(|| !sink.holds(worker, StorageTier::Device, 7)), "the worker kept its blocks");
    let info = ingest.listener_status().into_iter().find(|i| i.id == id).unwrap();
    assert_eq!(info.status, ListenerStatus::Pending);
    assert!(info.last_error.unwrap_or_default().contains("cleared"));
}

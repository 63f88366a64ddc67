//! Sequence rules over real ZMQ sockets: in-order delivery in both
//! encodings, duplicates, gaps with and without replay, gaps older than the
//! engine's buffer, late joins and watermarks kept across re-registration.
//! Every test compares the sink with the publisher's ground truth.

mod support;

use std::sync::Arc;
use std::time::Duration;

use kv_indexer::ingest::{Ingest, IngestConfig};
use kv_indexer::{StorageTier, WorkerId};
use support::harness::{assert_converges, assert_no_stale, listener_of, settle, spec_for, test_config, wait_connected};
use support::model_sink::ModelSink;
use support::publisher::{Encoding, HashForm, PublisherConfig, ReplyForm, TestEvent, TestPublisher};
use support::wait_until;

const DEVICE: StorageTier = StorageTier::Device;

fn setup(cfg: PublisherConfig, worker: WorkerId) -> (Ingest, TestPublisher, Arc<ModelSink>) {
    let ingest = Ingest::start(test_config()).unwrap();
    let mut publisher = TestPublisher::new(cfg);
    let sink = Arc::new(ModelSink::new());
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    wait_connected(&mut publisher, 1, 1);
    (ingest, publisher, sink)
}

#[test]
fn every_encoding_and_reply_form_recovers_a_gap_exactly() {
    let forms = [
        (Encoding::Tagged, HashForm::Uint, ReplyForm::FourFrames),
        (Encoding::Tagged, HashForm::Bytes, ReplyForm::ThreeFrames),
        (Encoding::Positional, HashForm::Int, ReplyForm::ThreeFrames),
        (Encoding::Positional, HashForm::Mixed, ReplyForm::FourFrames),
    ];
    for (i, (encoding, hash_form, reply_form)) in forms.into_iter().enumerate() {
        let worker = WorkerId::new(10 + i as u64, 0);
        let cfg =
            PublisherConfig { encoding, hash_form, reply_form, seed: 100 + i as u64, ..PublisherConfig::default() };
        let (ingest, mut publisher, sink) = setup(cfg, worker);
        publisher.publish_random(40);
        assert_converges(&sink, worker, &publisher);
        publisher.lose_next(5);
        publisher.publish_random(20);
        settle(&ingest, worker, &publisher);
        assert_converges(&sink, worker, &publisher);
        let c = ingest.counters();
        assert_eq!(c.gaps_detected, 1, "{encoding:?}");
        assert_eq!(c.replays_ok, 1, "{encoding:?}");
        assert_eq!(c.batches_replayed, 5, "{encoding:?}");
        assert_eq!((c.batches_lost, c.resyncs), (0, 0), "{encoding:?}");
        assert_eq!(c.batches_applied, 60, "{encoding:?}");
    }
}

#[test]
fn a_stale_duplicate_is_dropped() {
    let worker = WorkerId::new(1, 0);
    let (ingest, mut publisher, sink) = setup(PublisherConfig::default(), worker);
    let first = publisher.new_store(DEVICE, None, 2);
    publisher.publish(vec![first]);
    let store = publisher.new_store(DEVICE, None, 3);
    let TestEvent::Stored { hashes, .. } = store.clone() else { unreachable!() };
    let store_seq = publisher.publish(vec![store]);
    publisher.publish(vec![TestEvent::Removed { tier: DEVICE, hashes: hashes.clone() }]);
    // Applying the store again would bring back evicted blocks.
    publisher.resend(store_seq);
    let last = publisher.new_store(DEVICE, None, 1);
    publisher.publish(vec![last]);
    assert_converges(&sink, worker, &publisher);
    assert!(!sink.holds(worker, DEVICE, hashes[0]));
    let c = ingest.counters();
    assert_eq!(c.duplicates_dropped, 1);
    assert_eq!((c.restarts, c.resyncs, c.gaps_detected), (0, 0, 0));
}

#[test]
fn a_gap_without_replay_clears_the_worker_instead_of_keeping_stale_blocks() {
    let worker = WorkerId::new(2, 0);
    let cfg = PublisherConfig { ring_capacity: None, ..PublisherConfig::default() };
    let (ingest, mut publisher, sink) = setup(cfg, worker);
    publisher.publish_random(10);
    let store = publisher.new_store(DEVICE, None, 3);
    let TestEvent::Stored { hashes, .. } = store.clone() else { unreachable!() };
    publisher.publish(vec![store]);
    assert_converges(&sink, worker, &publisher);
    assert!(sink.holds(worker, DEVICE, hashes[0]));

    // The eviction is lost in transit and cannot be replayed.
    publisher.lose_next(1);
    publisher.publish(vec![TestEvent::Removed { tier: DEVICE, hashes: vec![hashes[0]] }]);
    let after = publisher.new_store(DEVICE, None, 2);
    let TestEvent::Stored { hashes: after, .. } = after.clone() else { unreachable!() };
    publisher.publish(vec![TestEvent::Stored { tier: DEVICE, parent: None, hashes: after.clone() }]);
    assert!(wait_until(|| sink.holds(worker, DEVICE, after[1])));
    assert!(!sink.holds(worker, DEVICE, hashes[0]), "evicted block kept");
    assert_no_stale(&sink, worker, &publisher);
    let c = ingest.counters();
    assert_eq!((c.gaps_detected, c.batches_lost, c.resyncs), (1, 1, 1));
    assert_eq!(c.replays_started, 0);

    // Once the engine clears, live events rebuild the exact state.
    publisher.publish(vec![TestEvent::Cleared]);
    publisher.publish_random(20);
    assert_converges(&sink, worker, &publisher);
}

#[test]
fn a_gap_older_than_the_buffer_is_a_partial_replay_and_a_resync() {
    let worker = WorkerId::new(3, 0);
    let cfg = PublisherConfig { ring_capacity: Some(8), ..PublisherConfig::default() };
    let (ingest, mut publisher, sink) = setup(cfg, worker);
    let store = publisher.new_store(DEVICE, None, 3);
    let TestEvent::Stored { hashes, .. } = store.clone() else { unreachable!() };
    publisher.publish(vec![store]);
    assert_converges(&sink, worker, &publisher);

    publisher.lose_next(20);
    publisher.publish(vec![TestEvent::Removed { tier: DEVICE, hashes: vec![hashes[0]] }]);
    publisher.publish_random(19);
    publisher.publish_random(1);
    // Lost: seqs 1..=20. When seq 21 arrives the ring holds 14..=21, so
    // 14..=20 come back and 1..=13 are gone.
    assert!(wait_until(|| ingest.counters().replays_partial == 1));
    assert!(wait_until(|| ingest.listener_status()[0].last_seq == Some(21)));
    // Everything up to seq 21 is queued to the shards; let them apply it.
    ingest.sync_shards().unwrap();
    assert!(!sink.holds(worker, DEVICE, hashes[0]), "evicted block kept");
    assert_no_stale(&sink, worker, &publisher);
    let c = ingest.counters();
    // The gap's replay, after any fill asked for on connecting, asks from
    // the watermark (0): the ring starts at 14, past it, and its copy of
    // batch 21 shows it is the live process's, rolled past the watermark.
    assert_eq!(publisher.replay_requests().last(), Some(&0));
    assert_eq!((c.batches_lost, c.resyncs, c.batches_replayed), (13, 1, 7));

    publisher.publish(vec![TestEvent::Cleared]);
    publisher.publish_random(10);
    assert_converges(&sink, worker, &publisher);
}

#[test]
fn a_late_listener_fills_from_the_ring_of_an_idle_engine() {
    let worker = WorkerId::new(4, 0);
    let ingest = Ingest::start(test_config()).unwrap();
    let mut publisher =
        TestPublisher::new(PublisherConfig { encoding: Encoding::Positional, ..PublisherConfig::default() });
    // Published before anyone subscribed: only the replay ring has them,
    // and the engine stays idle: no live batch shows what is missing.
    publisher.publish_random(15);
    let sink = Arc::new(ModelSink::new());
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    assert_converges(&sink, worker, &publisher);
    assert_eq!(publisher.replay_requests(), vec![0]);
    let c = ingest.counters();
    assert_eq!((c.ring_fills, c.batches_filled, c.batches_missed_at_join), (1, 15, 0));
    assert_eq!((c.replays_started, c.gaps_detected, c.resyncs), (0, 0, 0));

    // The live stream goes on from where the ring ended.
    assert!(publisher.wait_subscribed(1));
    publisher.publish_random(5);
    settle(&ingest, worker, &publisher);
    assert_converges(&sink, worker, &publisher);
    let c = ingest.counters();
    assert_eq!((c.batches_applied, c.duplicates_dropped, c.replays_started), (20, 0, 0));
}

#[test]
fn a_late_listener_without_replay_counts_the_missed_batches_and_keeps_what_follows() {
    let worker = WorkerId::new(5, 0);
    let ingest = Ingest::start(test_config()).unwrap();
    let mut publisher = TestPublisher::new(PublisherConfig { ring_capacity: None, ..PublisherConfig::default() });
    publisher.publish_random(7);
    let sink = Arc::new(ModelSink::new());
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    assert!(publisher.wait_subscribed(1));
    let store = publisher.new_store(DEVICE, None, 2);
    publisher.publish(vec![store]);
    assert!(wait_until(|| ingest.counters().batches_applied == 1));
    assert_no_stale(&sink, worker, &publisher);
    let c = ingest.counters();
    assert_eq!((c.batches_missed_at_join, c.resyncs, c.batches_lost), (7, 0, 0));
}

#[test]
fn the_watermark_survives_unregister_and_register() {
    let worker = WorkerId::new(6, 0);
    let (ingest, mut publisher, sink) = setup(PublisherConfig::default(), worker);
    publisher.publish_random(5);
    assert_converges(&sink, worker, &publisher);
    let id = listener_of(&ingest, worker).unwrap().id;
    ingest.remove_listener(id).unwrap();
    // Published while unregistered: nobody receives them, and the engine
    // goes idle. The new listener fills from the kept watermark (4): the
    // ring's batch 4 shows the same process, and the 3 after it are applied.
    publisher.publish_random(3);
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    assert_converges(&sink, worker, &publisher);
    assert_eq!(publisher.replay_requests(), vec![0, 4]);
    assert!(wait_until(|| ingest.counters().batches_filled == 3));
    assert!(publisher.wait_subscribed(2));
    publisher.publish_random(2);
    assert_converges(&sink, worker, &publisher);
    assert_eq!((ingest.counters().restarts, ingest.counters().resyncs), (0, 0));
}

#[test]
fn malformed_messages_are_dropped_without_touching_the_stream() {
    let worker = WorkerId::new(7, 0);
    let (ingest, mut publisher, sink) = setup(PublisherConfig::default(), worker);
    publisher.publish_random(3);
    publisher.send_raw(vec![b"kv".to_vec(), 9u64.to_be_bytes().to_vec()]);
    publisher.send_raw(vec![b"kv".to_vec(), vec![0; 7], vec![0x90]]);
    publisher.send_raw(vec![vec![], 3u64.to_be_bytes().to_vec(), vec![0x90], vec![]]);
    publisher.send_raw(vec![vec![], u64::MAX.to_be_bytes().to_vec(), vec![0x90]]);
    publisher.publish_random(3);
    settle(&ingest, worker, &publisher);
    assert_converges(&sink, worker, &publisher);
    let c = ingest.counters();
    assert_eq!(c.malformed_messages, 4);
    assert_eq!((c.gaps_detected, c.resyncs, c.batches_applied), (0, 0, 6));
}

#[test]
fn an_undecodable_batch_counts_as_lost_and_resyncs() {
    let worker = WorkerId::new(8, 0);
    let (ingest, mut publisher, sink) = setup(PublisherConfig::default(), worker);
    let store = publisher.new_store(DEVICE, None, 2);
    let TestEvent::Stored { hashes, .. } = store.clone() else { unreachable!() };
    publisher.publish(vec![store]);
    assert_converges(&sink, worker, &publisher);
    // A truncated msgpack array: the engine did something we cannot read.
    publisher.send_payload(vec![0x93, 0xcb]);
    let next = publisher.new_store(DEVICE, None, 1);
    let TestEvent::Stored { hashes: next_hashes, .. } = next.clone() else { unreachable!() };
    publisher.publish(vec![next]);
    assert!(wait_until(|| sink.holds(worker, DEVICE, next_hashes[0])));
    assert!(!sink.holds(worker, DEVICE, hashes[0]), "kept blocks across an unreadable batch");
    let c = ingest.counters();
    assert_eq!((c.undecodable_batches, c.batches_lost, c.resyncs), (1, 1, 1));
}

#[test]
fn a_replay_with_a_hole_is_partial_and_resyncs_at_the_hole() {
    let worker = WorkerId::new(9, 0);
    let (ingest, mut publisher, sink) = setup(PublisherConfig::default(), worker);
    publisher.publish_random(10);
    assert_converges(&sink, worker, &publisher);
    publisher.lose_next(5);
    publisher.publish_random(5);
    // Seqs 10..=14 were lost; the buffer no longer has 12.
    publisher.forget(12);
    publisher.publish_random(5);
    settle(&ingest, worker, &publisher);
    assert_no_stale(&sink, worker, &publisher);
    let c = ingest.counters();
    assert_eq!((c.replays_partial, c.batches_lost, c.resyncs), (1, 1, 1));
    assert_eq!(c.batches_replayed, 4);

    publisher.publish(vec![TestEvent::Cleared]);
    publisher.publish_random(5);
    assert_converges(&sink, worker, &publisher);
}

/// A listener with `cfg` on a fresh publisher whose first five batches
/// it holds exactly.
fn five_batches_in(cfg: IngestConfig, worker: WorkerId) -> (Ingest, TestPublisher, Arc<ModelSink>) {
    let ingest = Ingest::start(cfg).unwrap();
    let mut publisher = TestPublisher::new(PublisherConfig::default());
    let sink = Arc::new(ModelSink::new());
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    assert!(publisher.wait_subscribed(1));
    publisher.publish_random(5);
    assert_converges(&sink, worker, &publisher);
    (ingest, publisher, sink)
}

#[test]
fn a_replay_that_times_out_fails_resyncs_and_releases_the_held_batches() {
    let worker = WorkerId::new(10, 0);
    let (ingest, mut publisher, sink) =
        five_batches_in(IngestConfig { replay_timeout_ms: 200, ..test_config() }, worker);
    publisher.mute_replay(true);
    publisher.lose_next(2);
    publisher.publish_random(6);
    settle(&ingest, worker, &publisher);
    assert_no_stale(&sink, worker, &publisher);
    let c = ingest.counters();
    assert_eq!((c.replays_started, c.replays_failed, c.batches_lost, c.resyncs), (1, 1, 2, 1));
    assert_eq!(c.held_batches, 0);
    let info = listener_of(&ingest, worker).unwrap();
    assert!(info.last_error.unwrap_or_default().contains("timed out"));

    // A later gap that a replay recovers in full clears the stale error.
    publisher.mute_replay(false);
    publisher.lose_next(1);
    publisher.publish_random(3);
    settle(&ingest, worker, &publisher);
    assert!(wait_until(|| ingest.counters().replays_ok == 1));
    let info = listener_of(&ingest, worker).unwrap();
    assert_eq!(info.last_error, None);
}

#[test]
fn a_replay_that_keeps_answering_outlives_its_timeout() {
    let worker = WorkerId::new(11, 0);
    let (ingest, mut publisher, sink) =
        five_batches_in(IngestConfig { replay_timeout_ms: 300, ..test_config() }, worker);
    // A slow engine: 12 lost batches come back 60 ms apart, the whole
    // answer taking more than twice the timeout, no reply later than it.
    publisher.pace_replay(Some(Duration::from_millis(60)));
    publisher.lose_next(12);
    publisher.publish_random(13);
    settle(&ingest, worker, &publisher);
    assert_converges(&sink, worker, &publisher);
    let c = ingest.counters();
    assert_eq!((c.replays_ok, c.replays_failed, c.batches_replayed), (1, 0, 12));
    assert_eq!((c.batches_lost, c.resyncs), (0, 0));
    assert_eq!(listener_of(&ingest, worker).unwrap().last_error, None);
}

#[test]
fn a_replay_that_trickles_ends_at_its_longest_run() {
    let worker = WorkerId::new(12, 0);
    let (ingest, mut publisher, sink) =
        five_batches_in(IngestConfig { replay_timeout_ms: 100, ..test_config() }, worker);
    // 60 batches 40 ms apart: each reply within the timeout, the whole
    // answer three times the longest run (8 timeouts).
    publisher.pace_replay(Some(Duration::from_millis(40)));
    publisher.lose_next(60);
    publisher.publish_random(61);
    assert!(wait_until(|| listener_of(&ingest, worker)
        .and_then(|i| i.last_error)
        .is_some_and(|e| e.contains("timed out"))));
    settle(&ingest, worker, &publisher);
    assert_no_stale(&sink, worker, &publisher);
    let c = ingest.counters();
    assert!(c.batches_replayed < 60, "the whole trickle was waited for: {} batches", c.batches_replayed);
    assert_eq!(c.resyncs, 1);
    // Nothing more is waited for: the engine's later batches apply.
    publisher.pace_replay(None);
    publisher.publish_random(3);
    settle(&ingest, worker, &publisher);
    assert_no_stale(&sink, worker, &publisher);
}

#[test]
fn a_replay_stops_once_the_live_batches_it_holds_overflow() {
    let worker = WorkerId::new(13, 0);
    let (ingest, mut publisher, sink) =
        five_batches_in(IngestConfig { replay_timeout_ms: 2_000, held_batches_max: 4, ..test_config() }, worker);
    // A slow answer (60 batches, 40 ms apart) while the engine goes on
    // publishing more than the listener may hold.
    publisher.pace_replay(Some(Duration::from_millis(40)));
    publisher.lose_next(60);
    publisher.publish_random(61);
    assert!(wait_until(|| ingest.counters().replays_started == 1));
    publisher.publish_random(10);
    let stopped = |e: &str| e.contains("overflowed");
    assert!(wait_until(|| listener_of(&ingest, worker).and_then(|i| i.last_error).is_some_and(|e| stopped(&e))));
    let c = ingest.counters();
    assert!(c.batches_replayed < 60, "the whole answer was waited for: {} batches", c.batches_replayed);
    assert!(c.held_dropped > 0 && c.resyncs == 1, "dropped {}, resyncs {}", c.held_dropped, c.resyncs);
    // Once every batch sent has arrived, no replay runs and nothing is
    // held: once the held ones are judged, the ring is read for the
    // dropped ones (a fill), with no later batch needed to show them.
    publisher.pace_replay(None);
    let idle = |c: &kv_indexer::ingest::IngestCounters| {
        let sent = publisher.next_seq() - 60;
        c.batches_received == sent
            && c.held_batches == 0
            && c.replays_started == c.replays_ok + c.replays_partial + c.replays_failed
    };
    assert!(wait_until(|| idle(&ingest.counters())));
    publisher.publish_random(3);
    settle(&ingest, worker, &publisher);
    assert_no_stale(&sink, worker, &publisher);
    let c = ingest.counters();
    assert!(c.ring_fills >= 2, "the dropped batches were not read from the ring: {c:?}");
}

#[test]
fn a_fill_with_nothing_waiting_reads_a_long_ring_whole() {
    // An idle engine with 40 batches in its ring, answering 30 ms apart:
    // each reply well within the timeout, the whole answer 12 timeouts,
    // past the 8 that live batches may wait. No live batch waits here, so
    // nothing cuts the fill short.
    let worker = WorkerId::new(13, 0);
    let ingest = Ingest::start(IngestConfig { replay_timeout_ms: 100, ..test_config() }).unwrap();
    let mut publisher = TestPublisher::new(PublisherConfig { seed: 13, ..PublisherConfig::default() });
    let sink = Arc::new(ModelSink::new());
    publisher.publish_random(40);
    publisher.pace_replay(Some(Duration::from_millis(30)));
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    assert_converges(&sink, worker, &publisher);
    assert!(wait_until(|| ingest.counters().batches_filled == 40), "{:?}", ingest.counters());
    let c = ingest.counters();
    assert_eq!((c.ring_fills, c.resyncs, c.batches_lost, c.batches_missed_at_join), (1, 0, 0, 0));
}

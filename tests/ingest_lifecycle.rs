//! Listener lifecycle and API: pending until connected, paused behind the
//! ready gate, failed on a refused handshake, bad endpoints rejected,
//! ordered worker removal, isolation from a dead replay endpoint, shutdown.

mod support;

use std::io::Write;
use std::net::TcpListener;
use std::sync::Arc;

use kv_indexer::ingest::{EventSink, Ingest, IngestConfig, IngestError, ListenerSpec, ListenerStatus};
use kv_indexer::{StorageTier, WorkerId};
use support::harness::{assert_converges, listener_of, settle, spec_for, test_config};
use support::model_sink::ModelSink;
use support::publisher::{PublisherConfig, TestPublisher};
use support::wait_until;

/// A loopback port nothing listens on (bound, read, released).
fn free_endpoint() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    format!("tcp://{}", listener.local_addr().unwrap())
}

fn status_of(ingest: &Ingest, worker: WorkerId) -> ListenerStatus {
    listener_of(ingest, worker).unwrap().status
}

#[test]
fn a_listener_is_pending_until_its_publisher_appears_and_after_it_goes() {
    let ingest = Ingest::start(test_config()).unwrap();
    let endpoint = free_endpoint();
    let worker = WorkerId::new(30, 0);
    let sink = Arc::new(ModelSink::new());
    let spec = ListenerSpec {
        worker,
        endpoint: endpoint.clone(),
        replay_endpoint: None,
        block_size: 4,
        sink: sink.clone() as Arc<dyn EventSink>,
    };
    ingest.add_listener(spec).unwrap();
    assert_eq!(status_of(&ingest, worker), ListenerStatus::Pending);

    let mut publisher = TestPublisher::new(PublisherConfig {
        endpoint: Some(endpoint),
        ring_capacity: None,
        ..PublisherConfig::default()
    });
    assert!(wait_until(|| status_of(&ingest, worker) == ListenerStatus::Active));
    assert!(publisher.wait_subscribed(1));
    publisher.publish_random(10);
    assert_converges(&sink, worker, &publisher);

    drop(publisher);
    assert!(wait_until(|| status_of(&ingest, worker) == ListenerStatus::Pending));
    let info = listener_of(&ingest, worker).unwrap();
    assert!(info.last_error.unwrap().contains("lost connection"));
}

/// An ingest with its ready gate closed and one listener of `worker`, paused.
fn paused_listener(cfg: IngestConfig, worker: WorkerId) -> (Ingest, TestPublisher, Arc<ModelSink>) {
    let ingest = Ingest::start(IngestConfig { ready_gate_open: false, ..cfg }).unwrap();
    let mut publisher = TestPublisher::new(PublisherConfig::default());
    let sink = Arc::new(ModelSink::new());
    ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    assert!(publisher.wait_subscribed(1));
    assert!(wait_until(|| status_of(&ingest, worker) == ListenerStatus::Paused));
    (ingest, publisher, sink)
}

#[test]
fn a_closed_ready_gate_holds_batches_in_order_until_opened() {
    let worker = WorkerId::new(31, 0);
    let (ingest, mut publisher, sink) = paused_listener(test_config(), worker);
    publisher.publish_random(25);
    assert!(wait_until(|| ingest.counters().held_batches == 25));
    assert_eq!(sink.workers(), vec![], "applied while the gate was closed");
    assert_eq!(status_of(&ingest, worker), ListenerStatus::Paused, "the gate is closed");

    ingest.open_ready_gate();
    settle(&ingest, worker, &publisher);
    assert_converges(&sink, worker, &publisher);
    assert_eq!(status_of(&ingest, worker), ListenerStatus::Active);
    let c = ingest.counters();
    assert_eq!((c.held_batches, c.batches_applied, c.gaps_detected), (0, 25, 0));
}

#[test]
fn held_batches_past_a_streams_share_of_the_budget_are_dropped_and_counted() {
    // A 1 MiB budget lets one stream hold 64 KiB: most of 40 stores of 200
    // blocks each, sent while the gate is closed, are dropped; the ring
    // fill when it opens recovers them.
    let worker = WorkerId::new(32, 0);
    let (ingest, mut publisher, sink) =
        paused_listener(IngestConfig { budget_bytes: 1 << 20, ..test_config() }, worker);
    for _ in 0..40 {
        let store = publisher.new_store(StorageTier::Device, None, 200);
        publisher.publish(vec![store]);
    }
    assert!(wait_until(|| {
        let c = ingest.counters();
        c.held_batches + c.held_dropped == 40
    }));
    let c = ingest.counters();
    assert!(c.held_dropped > 0 && c.held_batches > 0, "{c:?}");
    assert!(c.budget_bytes <= 64 << 10, "held past the stream's share: {c:?}");
    assert_eq!(sink.workers(), vec![], "applied while the gate was closed");

    ingest.open_ready_gate();
    publisher.publish_random(1);
    assert_converges(&sink, worker, &publisher);
    let c = ingest.counters();
    assert_eq!((c.held_batches, c.batches_lost, c.resyncs), (0, 0, 0), "{c:?}");
    assert!(wait_until(|| ingest.counters().budget_bytes == 0), "{:?}", ingest.counters());
    ingest.shutdown();
}

fn assert_fails_against(ingest: &Ingest, worker: WorkerId, endpoint: String) {
    let spec = ListenerSpec {
        worker,
        endpoint,
        replay_endpoint: None,
        block_size: 4,
        sink: Arc::new(ModelSink::new()) as Arc<dyn EventSink>,
    };
    ingest.add_listener(spec).unwrap();
    let failed = wait_until(|| status_of(ingest, worker) == ListenerStatus::Failed);
    let info = listener_of(ingest, worker).unwrap();
    assert!(failed, "{info:?}");
    let error = info.last_error.unwrap_or_default();
    assert!(error.contains("handshake"), "{error}");
}

#[test]
fn a_peer_that_is_no_publisher_marks_the_listener_failed() {
    let ingest = Ingest::start(test_config()).unwrap();

    // A ZMQ socket of a type a SUB may not talk to.
    let ctx = zmq::Context::new();
    let wrong = ctx.socket(zmq::PULL).unwrap();
    wrong.bind("tcp://127.0.0.1:*").unwrap();
    let endpoint = wrong.get_last_endpoint().unwrap().unwrap();
    assert_fails_against(&ingest, WorkerId::new(32, 0), endpoint);

    // A plain TCP server that answers in another protocol.
    let http = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("tcp://{}", http.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut stream in http.incoming().flatten() {
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        }
    });
    assert_fails_against(&ingest, WorkerId::new(32, 1), endpoint);
}

#[test]
fn bad_specs_are_rejected_and_nothing_is_registered() {
    let ingest = Ingest::start(test_config()).unwrap();
    let sink: Arc<dyn EventSink> = Arc::new(ModelSink::new());
    let spec = |endpoint: &str, replay: Option<&str>, block_size: u32| ListenerSpec {
        worker: WorkerId::new(33, 0),
        endpoint: endpoint.to_string(),
        replay_endpoint: replay.map(str::to_string),
        block_size,
        sink: sink.clone(),
    };
    let good = free_endpoint();
    for bad in ["", "not-an-endpoint", "tcp://127.0.0.1", "nope://127.0.0.1:5557"] {
        let err = ingest.add_listener(spec(bad, None, 4)).unwrap_err();
        assert!(matches!(err, IngestError::BadEndpoint { .. }), "{bad:?}: {err}");
    }
    let err = ingest.add_listener(spec(&good, Some("tcp://"), 4)).unwrap_err();
    assert!(matches!(err, IngestError::BadEndpoint { .. }), "{err}");
    let err = ingest.add_listener(spec(&good, None, 0)).unwrap_err();
    assert!(matches!(err, IngestError::InvalidSpec(_)), "{err}");
    assert!(ingest.listener_status().is_empty());

    ingest.add_listener(spec(&good, None, 4)).unwrap();
    let err = ingest.add_listener(spec(&good, None, 4)).unwrap_err();
    assert_eq!(err, IngestError::AlreadyRegistered(WorkerId::new(33, 0)));
    assert_eq!(ingest.listener_status().len(), 1);
}

#[test]
fn removing_a_worker_lands_after_its_queued_batches() {
    let ingest = Ingest::start(test_config()).unwrap();
    let worker = WorkerId::new(34, 0);
    let mut publisher = TestPublisher::new(PublisherConfig::default());
    let sink = Arc::new(ModelSink::new());
    let id = ingest.add_listener(spec_for(worker, &publisher, &sink)).unwrap();
    assert!(publisher.wait_subscribed(1));
    publisher.publish_random(200);
    assert!(wait_until(|| ingest.counters().batches_received > 0));
    // Unregister while batches are still flowing through the pipeline.
    ingest.remove_listener(id).unwrap();
    ingest.remove_worker(worker, sink.clone() as Arc<dyn EventSink>).unwrap();
    assert_eq!(sink.tiers(worker), None, "a batch landed after the removal");
    assert_eq!(ingest.counters().workers_removed, 1);
    assert!(ingest.listener_status().is_empty());
    assert_eq!(ingest.remove_listener(id), Err(IngestError::UnknownListener(id)));
}

#[test]
fn removing_a_listener_names_every_rank_it_fed() {
    // Registered as rank 0; the engine names rank 3 in its batches.
    let ingest = Ingest::start(test_config()).unwrap();
    let mut publisher = TestPublisher::new(PublisherConfig { batch_dp_rank: Some(3), ..PublisherConfig::default() });
    let sink = Arc::new(ModelSink::new());
    let id = ingest.add_listener(spec_for(WorkerId::new(35, 0), &publisher, &sink)).unwrap();
    assert!(publisher.wait_subscribed(1));
    publisher.publish_random(5);
    assert!(wait_until(|| sink.workers() == vec![WorkerId::new(35, 3)]));
    assert_eq!(ingest.remove_listener(id), Ok(vec![0, 3]));
}

#[test]
fn a_dead_replay_endpoint_does_not_stall_other_workers_on_the_same_thread() {
    let ingest =
        Ingest::start(IngestConfig { listener_threads: 1, replay_timeout_ms: 60_000, ..test_config() }).unwrap();
    let sink = Arc::new(ModelSink::new());

    // A publisher whose replay endpoint swallows requests.
    let stuck = WorkerId::new(35, 0);
    let mut mute = TestPublisher::new(PublisherConfig { seed: 35, ..PublisherConfig::default() });
    mute.mute_replay(true);
    ingest.add_listener(spec_for(stuck, &mute, &sink)).unwrap();
    // A listener whose engine is not up at all.
    let absent = WorkerId::new(36, 0);
    let spec = ListenerSpec {
        worker: absent,
        endpoint: free_endpoint(),
        replay_endpoint: Some(free_endpoint()),
        block_size: 4,
        sink: sink.clone() as Arc<dyn EventSink>,
    };
    ingest.add_listener(spec).unwrap();
    // A healthy publisher on the same listener thread.
    let healthy = WorkerId::new(37, 0);
    let mut good = TestPublisher::new(PublisherConfig { seed: 37, ..PublisherConfig::default() });
    ingest.add_listener(spec_for(healthy, &good, &sink)).unwrap();
    assert!(mute.wait_subscribed(1) && good.wait_subscribed(1));

    mute.publish_random(3);
    mute.lose_next(2);
    mute.publish_random(6);
    // After the fill asked on connecting (from 0), the gap's replay, asked
    // from the watermark (2) so the ring's batch there can be checked.
    assert!(wait_until(|| mute.replay_requests().last() == Some(&2)));
    good.publish_random(50);
    assert_converges(&sink, healthy, &good);
    // The stuck worker still waits for its replay, its live batches held.
    assert!(wait_until(|| ingest.counters().held_batches == 4));
    assert_ne!(sink.tiers_or_empty(stuck), *mute.truth());
    assert_eq!(status_of(&ingest, absent), ListenerStatus::Pending);
    ingest.shutdown();
}

#[test]
fn shutdown_stops_the_pipeline() {
    let ingest = Ingest::start(test_config()).unwrap();
    let publisher = TestPublisher::new(PublisherConfig::default());
    let sink = Arc::new(ModelSink::new());
    ingest.add_listener(spec_for(WorkerId::new(38, 0), &publisher, &sink)).unwrap();
    ingest.shutdown();
    ingest.shutdown();
    let err = ingest.add_listener(spec_for(WorkerId::new(39, 0), &publisher, &sink)).unwrap_err();
    assert_eq!(err, IngestError::ShutDown);
}

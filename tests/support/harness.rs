//! Glue between the test publisher, the model sink and `Ingest`: a small
//! test configuration, listener specs and convergence checks with
//! readable failure messages.

use std::sync::Arc;

use kv_indexer::ingest::{EventSink, Ingest, IngestConfig, ListenerInfo, ListenerSpec};
use kv_indexer::WorkerId;

use super::model_sink::{is_subset, ModelSink, Tiers};
use super::publisher::TestPublisher;
use super::wait_until;

/// A configuration sized for tests: two of each thread, no pinning.
pub fn test_config() -> IngestConfig {
    IngestConfig {
        listener_threads: 2,
        shard_threads: 2,
        pin_threads: false,
        shard_queue_batches: 256,
        replay_timeout_ms: 10_000,
        ..IngestConfig::default()
    }
}

/// A listener spec subscribing `worker` to `publisher`, feeding `sink`.
pub fn spec_for(worker: WorkerId, publisher: &TestPublisher, sink: &Arc<ModelSink>) -> ListenerSpec {
    spec_with(worker, publisher, Arc::clone(sink) as Arc<dyn EventSink>)
}

/// `spec_for` with any sink.
pub fn spec_with(worker: WorkerId, publisher: &TestPublisher, sink: Arc<dyn EventSink>) -> ListenerSpec {
    ListenerSpec {
        worker,
        endpoint: publisher.endpoint.clone(),
        replay_endpoint: publisher.replay_endpoint.clone(),
        block_size: 4,
        sink,
    }
}

fn describe(held: &Tiers, truth: &Tiers) -> String {
    let mut out = String::new();
    for (tier, (h, t)) in held.iter().zip(truth).enumerate() {
        let stale = h.difference(t).count();
        let missing = t.difference(h).count();
        out.push_str(&format!("tier {tier}: held {} truth {} stale {stale} missing {missing}; ", h.len(), t.len()));
    }
    out
}

/// Waits until the sink holds exactly the publisher's truth for `worker`.
pub fn assert_converges(sink: &ModelSink, worker: WorkerId, publisher: &TestPublisher) {
    let ok = wait_until(|| sink.tiers_or_empty(worker) == *publisher.truth());
    assert!(
        ok,
        "worker {worker} never matched its engine: {}",
        describe(&sink.tiers_or_empty(worker), publisher.truth())
    );
}

/// Asserts the sink holds nothing the engine does not (no stale block).
pub fn assert_no_stale(sink: &ModelSink, worker: WorkerId, publisher: &TestPublisher) {
    let held = sink.tiers_or_empty(worker);
    assert!(
        is_subset(&held, publisher.truth()),
        "worker {worker} holds stale blocks: {}",
        describe(&held, publisher.truth())
    );
}

/// Waits until `publisher` has `subscriptions` subscribers and, if it has a
/// ring, `fills` requests in all: a listener asks the ring for what it holds
/// as soon as it connects. Batches published after that are not in the
/// fill's answer, so a test's counts (duplicates) do not depend on timing.
pub fn wait_connected(publisher: &mut TestPublisher, subscriptions: usize, fills: usize) {
    assert!(publisher.wait_subscribed(subscriptions), "listener never subscribed");
    if publisher.replay_endpoint.is_some() {
        let asked = wait_until(|| publisher.replay_requests().len() >= fills);
        assert!(asked, "listener never asked the ring: {:?}", publisher.replay_requests());
    }
}

/// Waits until the listener of `registered` has dealt with everything
/// `publisher` sent, then until the shards have applied it, so counters
/// and sink state are final.
pub fn settle(ingest: &Ingest, registered: WorkerId, publisher: &TestPublisher) {
    let want = publisher.next_seq().checked_sub(1);
    assert!(listener_of(ingest, registered).is_some(), "no listener of {registered}");
    let done = wait_until(|| listener_of(ingest, registered).and_then(|i| i.last_seq) == want);
    assert!(done, "listener of {registered} never reached seq {want:?}");
    ingest.sync_shards().unwrap();
}

/// The listener registered for `worker` (instance, registered dp rank), as
/// `Ingest::listener_status` lists it.
pub fn listener_of(ingest: &Ingest, worker: WorkerId) -> Option<ListenerInfo> {
    ingest.listener_status().into_iter().find(|i| i.worker == worker)
}

//! A sink that can hold its shard: while its gate is closed, applying an
//! event of a gated worker blocks (the shard thread, or the listener thread
//! that runs the shard, sits inside the sink). Lets a test make work pile
//! up behind a busy shard without timing anything. Everything else goes to
//! an exact `ModelSink`, and the order of applied batches is recorded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kv_indexer::ingest::EventSink;
use kv_indexer::{Event, StorageTier, WorkerId};
use parking_lot::{Condvar, Mutex};

use super::model_sink::ModelSink;

#[derive(Default)]
pub struct GateSink {
    pub model: ModelSink,
    /// Workers whose events wait while the gate is closed; empty: all.
    gated: Mutex<Vec<WorkerId>>,
    closed: Mutex<bool>,
    opened: Condvar,
    /// Batches that found the gate closed and waited.
    pub waited: AtomicU64,
    /// The worker of each applied batch, in the order applied.
    pub applied: Mutex<Vec<WorkerId>>,
}

impl GateSink {
    /// A sink whose gate is closed for `gated` (empty: every worker).
    pub fn closed_for(gated: &[WorkerId]) -> Self {
        let sink = GateSink::default();
        *sink.gated.lock() = gated.to_vec();
        *sink.closed.lock() = true;
        sink
    }

    pub fn open(&self) {
        *self.closed.lock() = false;
        self.opened.notify_all();
    }

    /// How many applied batches were of `worker`.
    pub fn applied_of(&self, worker: WorkerId) -> usize {
        self.applied.lock().iter().filter(|&&w| w == worker).count()
    }

    fn pass(&self, worker: WorkerId) {
        let gated = {
            let g = self.gated.lock();
            g.is_empty() || g.contains(&worker)
        };
        let mut closed = self.closed.lock();
        if gated && *closed {
            self.waited.fetch_add(1, Ordering::Relaxed);
            while *closed {
                self.opened.wait(&mut closed);
            }
        }
    }
}

impl EventSink for GateSink {
    fn apply(&self, event: &Event) {
        self.apply_all(std::slice::from_ref(event));
    }

    fn apply_all(&self, events: &[Event]) {
        let Some(first) = events.first() else { return };
        self.pass(first.worker);
        self.applied.lock().push(first.worker);
        self.model.apply_all(events);
    }

    fn retain_held(&self, worker: WorkerId, tier: StorageTier, engine_hashes: &mut Vec<u64>) {
        self.model.retain_held(worker, tier, engine_hashes);
    }

    fn remove_worker(&self, worker: WorkerId) {
        self.model.remove_worker(worker);
    }
}

/// Opens the gate when dropped: declared after the pipeline, it lets a
/// failing test's shard thread out of the sink before the pipeline joins it.
pub struct OpenOnDrop(pub Arc<GateSink>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

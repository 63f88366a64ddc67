//! Where a shard puts a worker's events. The ingest pipeline knows nothing
//! of the index behind it: a (model, tenant) index implements this trait and
//! each listener is given its index's sink when it is added.

use crate::event::{Event, StorageTier, WorkerId};

/// Receives one worker's events, in order, from that worker's shard thread.
pub trait EventSink: Send + Sync {
    /// Applies one event. Called only from the shard that owns `event.worker`.
    fn apply(&self, event: &Event);
    /// Applies a batch of events in order; sinks may do it more cheaply
    /// than one `apply` each (the index takes its writer lock once).
    fn apply_all(&self, events: &[Event]) {
        for e in events {
            self.apply(e);
        }
    }
    /// Keeps in `engine_hashes` only those `worker` holds in `tier` (a
    /// sink that cannot tell keeps them all). Called only from the shard
    /// that owns `worker`, between its applies.
    fn retain_held(&self, _worker: WorkerId, _tier: StorageTier, _engine_hashes: &mut Vec<u64>) {}
    /// Forgets every block of `worker` and the worker itself.
    fn remove_worker(&self, worker: WorkerId);
}

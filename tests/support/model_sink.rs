//! An exact model of what a worker holds: per worker, per tier, the set of
//! engine hashes stored and not since removed or cleared. Used as the sink
//! under test to compare with the publisher's ground truth.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use kv_indexer::ingest::EventSink;
use kv_indexer::{Event, EventKind, StorageTier, WorkerId};
use parking_lot::Mutex;

/// Held engine hashes of one worker, indexed by `StorageTier::index`.
pub type Tiers = [BTreeSet<u64>; 4];

/// Exact set model of every worker's blocks.
#[derive(Default)]
pub struct ModelSink {
    workers: Mutex<HashMap<WorkerId, Tiers>>,
    pub events: AtomicU64,
    pub clears: AtomicU64,
    pub removals: AtomicU64,
}

impl ModelSink {
    pub fn new() -> Self {
        Self::default()
    }

    /// The worker's blocks, or `None` if it has never been written or was removed.
    pub fn tiers(&self, worker: WorkerId) -> Option<Tiers> {
        self.workers.lock().get(&worker).cloned()
    }

    /// The worker's blocks, empty tiers if unknown.
    pub fn tiers_or_empty(&self, worker: WorkerId) -> Tiers {
        self.tiers(worker).unwrap_or_default()
    }

    pub fn workers(&self) -> Vec<WorkerId> {
        let mut w: Vec<WorkerId> = self.workers.lock().keys().copied().collect();
        w.sort();
        w
    }

    pub fn holds(&self, worker: WorkerId, tier: StorageTier, hash: u64) -> bool {
        self.workers.lock().get(&worker).is_some_and(|t| t[tier.index()].contains(&hash))
    }
}

impl EventSink for ModelSink {
    fn apply(&self, event: &Event) {
        self.events.fetch_add(1, Ordering::Relaxed);
        let mut workers = self.workers.lock();
        match &event.kind {
            EventKind::Stored { blocks, .. } => {
                let tiers = workers.entry(event.worker).or_default();
                tiers[event.tier.index()].extend(blocks.iter().map(|b| b.engine_hash));
            }
            EventKind::Removed { engine_hashes } => {
                if let Some(tiers) = workers.get_mut(&event.worker) {
                    for h in engine_hashes {
                        tiers[event.tier.index()].remove(h);
                    }
                }
            }
            EventKind::Cleared => {
                self.clears.fetch_add(1, Ordering::Relaxed);
                if let Some(tiers) = workers.get_mut(&event.worker) {
                    tiers.iter_mut().for_each(BTreeSet::clear);
                }
            }
        }
    }

    fn remove_worker(&self, worker: WorkerId) {
        self.removals.fetch_add(1, Ordering::Relaxed);
        self.workers.lock().remove(&worker);
    }
}

/// True when every block in `held` is also in `truth` (nothing stale).
pub fn is_subset(held: &Tiers, truth: &Tiers) -> bool {
    held.iter().zip(truth).all(|(h, t)| h.is_subset(t))
}

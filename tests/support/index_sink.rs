//! The real `Index` as an ingest sink, and a way to read per-worker block
//! sets back out of it (through its dump) to compare with an engine's truth.

use std::collections::HashMap;
use std::sync::Arc;

use kv_indexer::index::{Index, IndexConfig};
use kv_indexer::ingest::EventSink;
use kv_indexer::{Event, EventKind, WorkerId};

use super::model_sink::Tiers;

/// Feeds an `Index`.
pub struct IndexSink(pub Arc<Index>);

impl IndexSink {
    pub fn new(block_size: u32) -> Self {
        IndexSink(Arc::new(Index::new(IndexConfig::new(block_size))))
    }

    /// Per worker, the engine hashes the index's dump holds in each tier.
    pub fn dumped(&self) -> HashMap<WorkerId, Tiers> {
        let mut out: HashMap<WorkerId, Tiers> = HashMap::new();
        // Applied in order: a dump may store stand-in ancestors and remove them again.
        for event in self.0.dump_events() {
            let tiers = out.entry(event.worker).or_default();
            match &event.kind {
                EventKind::Stored { blocks, .. } => {
                    tiers[event.tier.index()].extend(blocks.iter().map(|b| b.engine_hash))
                }
                EventKind::Removed { engine_hashes } => {
                    for h in engine_hashes {
                        tiers[event.tier.index()].remove(h);
                    }
                }
                EventKind::Cleared => *tiers = Tiers::default(),
            }
        }
        out
    }
}

impl EventSink for IndexSink {
    fn apply(&self, event: &Event) {
        self.0.apply(event);
    }

    fn remove_worker(&self, worker: WorkerId) {
        self.0.remove_worker(worker);
    }
}

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
        // A dump is a list of held blocks: stored chains only, each block once.
        for d in self.0.dump_events() {
            let event = d.event;
            let tiers = out.entry(event.worker).or_default();
            let EventKind::Stored { blocks, .. } = &event.kind else { panic!("a dump holds stores only: {event:?}") };
            for b in blocks {
                assert!(tiers[event.tier.index()].insert(b.engine_hash), "listed twice: {event:?}");
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

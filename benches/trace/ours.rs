//! kv-indexer's index as a replay backend: events carry the engines' opaque
//! hashes (or hashes shared by all engines, see `hashes`), sticky writer
//! threads apply them, readers query inline.

use std::sync::Arc;

use kv_indexer::index::{Index, IndexConfig};
use kv_indexer::{Event, StorageTier, StoredBlock, WorkerId};

use super::backend::{Backend, IndexMemory, WriterPool};
use super::hashes::EngineHashes;
use super::workload::{Op, OpKind, Workload};

/// The worker id a workload worker number maps to.
pub fn worker_id(worker: u32) -> WorkerId {
    WorkerId::new(worker as u64, 0)
}

/// Our index behind `writers` sticky writer threads.
pub struct Ours {
    index: Arc<Index>,
    pool: WriterPool<Event>,
    hashes: EngineHashes,
}

impl Ours {
    /// A fresh index for `wl`'s block size, with its writer threads, fed `hashes`.
    pub fn new(wl: &Workload, writers: usize, hashes: EngineHashes) -> Self {
        let index = Arc::new(Index::new(IndexConfig::new(wl.config.block_size as u32)));
        let apply_index = index.clone();
        let pool = WriterPool::new(writers, wl.config.workers, move |e: &Event| {
            let o = apply_index.apply(e);
            // Duplicates are legal (engines may re-store); the rest means lost state.
            (o.unknown_parent + o.unknown_removed + o.depth_exceeded + o.rejected) as u64
        });
        Self { index, pool, hashes }
    }
}

impl Backend for Ours {
    type Event = Event;
    type Hash = u64;

    fn label(&self) -> String {
        match self.hashes {
            EngineHashes::Engine => "kv-indexer".into(),
            EngineHashes::Shared => "kv-indexer-shared".into(),
        }
    }

    fn build_event(&self, op: &Op, wl: &Workload, _event_id: u64) -> Event {
        let range = op.start..op.start + op.len as usize;
        let worker = worker_id(op.worker);
        match op.kind {
            OpKind::Stored { parent } => Event::stored(
                worker,
                StorageTier::Device,
                parent.map(|(engine, seq)| self.hashes.of(engine, seq)),
                wl.stored[range]
                    .iter()
                    .map(|b| StoredBlock {
                        engine_hash: self.hashes.of(b.engine_hash, b.seq_hash),
                        local_hash: b.local_hash,
                    })
                    .collect(),
            ),
            OpKind::Removed => Event::removed(
                worker,
                StorageTier::Device,
                wl.removed[range].iter().map(|b| self.hashes.of(b.engine_hash, b.seq_hash)).collect(),
            ),
            OpKind::Query => unreachable!("queries are not events"),
        }
    }

    fn hash(local: u64) -> u64 {
        local
    }

    fn submit(&self, worker: u32, event: Event) {
        self.pool.submit(worker, event);
    }

    fn applied_events(&self, worker: u32) -> u64 {
        self.pool.applied(worker)
    }

    fn drain(&self) {
        self.pool.drain();
    }

    fn find_matches(&self, hashes: &[u64], out: &mut Vec<(u32, u32)>) {
        out.extend(
            self.index
                .find_matches(hashes)
                .workers
                .iter()
                .filter(|m| m.device > 0)
                .map(|m| (m.worker.instance_id as u32, m.device)),
        );
    }

    fn memory(&self) -> Option<IndexMemory> {
        let s = self.index.stats();
        Some(IndexMemory { pairs: s.pairs, bytes: s.bytes })
    }

    fn event_problems(&self) -> u64 {
        self.pool.problems()
    }
}

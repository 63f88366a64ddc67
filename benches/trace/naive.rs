//! A slow, obviously exact model of the index, with the same method shape as
//! `kv_indexer::index::Index`: one lock, per-worker maps from engine hash to
//! the block's own chain hash (derived from its parent's), and a query that
//! walks every worker. It stands in until the real index is available.

use std::sync::Mutex;

use kv_indexer::hash::chain_hash;
use kv_indexer::{Event, EventKind, StorageTier, WorkerId};
use rustc_hash::{FxHashMap, FxHashSet};

#[derive(Default)]
struct WorkerBlocks {
    chain_by_engine: FxHashMap<u64, u64>,
    chains: FxHashMap<u64, u32>,
}

/// The exact model.
#[derive(Default)]
pub struct NaiveIndex {
    workers: Mutex<FxHashMap<WorkerId, WorkerBlocks>>,
}

impl NaiveIndex {
    /// Applies one event; returns the number of blocks it could not place or remove.
    pub fn apply(&self, event: &Event) -> u64 {
        if event.tier != StorageTier::Device {
            return 0;
        }
        let mut all = self.workers.lock().unwrap();
        let w = all.entry(event.worker).or_default();
        let mut problems = 0;
        match &event.kind {
            EventKind::Stored { parent, blocks } => {
                let mut prev = match parent {
                    None => None,
                    Some(p) => match w.chain_by_engine.get(p) {
                        Some(c) => Some(*c),
                        None => return blocks.len() as u64,
                    },
                };
                for b in blocks {
                    let chain = prev.map_or(b.local_hash, |p| chain_hash(p, b.local_hash));
                    if w.chain_by_engine.insert(b.engine_hash, chain).is_none() {
                        *w.chains.entry(chain).or_default() += 1;
                    }
                    prev = Some(chain);
                }
            }
            EventKind::Removed { engine_hashes } => {
                for h in engine_hashes {
                    match w.chain_by_engine.remove(h) {
                        Some(chain) => {
                            let n = w.chains.get_mut(&chain).expect("counted chain");
                            *n -= 1;
                            if *n == 0 {
                                w.chains.remove(&chain);
                            }
                        }
                        None => problems += 1,
                    }
                }
            }
            EventKind::Cleared => *w = WorkerBlocks::default(),
        }
        problems
    }

    /// (worker, depth) for every worker holding a nonzero prefix of `locals`.
    pub fn find_matches(&self, locals: &[u64]) -> Vec<(WorkerId, u32)> {
        let mut seqs = Vec::new();
        kv_indexer::hash::sequence_hashes_into(locals, &mut seqs);
        let all = self.workers.lock().unwrap();
        all.iter()
            .filter_map(|(id, w)| {
                let d = seqs.iter().take_while(|s| w.chains.contains_key(s)).count();
                (d > 0).then_some((*id, d as u32))
            })
            .collect()
    }

    /// Live (block, worker) pairs.
    pub fn pairs(&self) -> u64 {
        let all = self.workers.lock().unwrap();
        all.values().map(|w| w.chain_by_engine.len() as u64).sum()
    }

    /// Distinct chains held by anyone (kept for parity with the real stats).
    pub fn entries(&self) -> u64 {
        let all = self.workers.lock().unwrap();
        let set: FxHashSet<u64> = all
            .values()
            .flat_map(|w| w.chains.keys().copied())
            .collect();
        set.len() as u64
    }
}

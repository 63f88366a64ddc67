//! The positional index: which workers hold which prefix of a request.
//!
//! No I/O and no threads of its own. Blocks are identified by position
//! (their depth in the prefix) and the index's own chain hash, derived at
//! store time from the parent's chain, so two prefixes that share a chunk at
//! the same position never mix, whatever the engine hashes are. Consecutive
//! blocks stored together form a run (`runs`): their chains are kept once
//! for every holder (`blocks`), and who holds them is a few segments with
//! inline 64-bit worker sets per group of 64 worker slots (`members`). The
//! only per-(block, worker) structure is the worker's engine hash -> block
//! map (`records`), which Removed events need.
//!
//! Concurrency: any number of readers run `find_matches` at once with no
//! lock; writes are serialized per index by a writer lock and must arrive in
//! per-worker order (one owner per worker). See `tree` for the shape,
//! `writer` for applying events and `query` for the search.

mod blocks;
mod budget;
mod chain;
mod dump;
mod members;
mod pages;
mod query;
mod records;
mod runs;
mod slots;
mod starts;
mod tree;
mod writer;

pub use budget::Budget;

use crate::event::{Event, EventKind, WorkerId};
use parking_lot::Mutex;
use slots::PublishedSlots;
use std::cell::RefCell;
use std::sync::Arc;
use tree::Shared;
use writer::Writer;

/// Default positions skipped per jump; see the benchmark in README.
pub const JUMP_DEFAULT: usize = 32;
/// Default deepest position indexed (blocks past it are refused and counted).
pub const DEPTH_MAX_DEFAULT: usize = 1 << 18;

/// How to build an index.
#[derive(Clone, Debug)]
pub struct IndexConfig {
    /// Tokens per block (informational for the index; fixed per index).
    pub block_size: u32,
    /// Positions per jump in the search; 0 picks `JUMP_DEFAULT`.
    pub jump: usize,
    /// Deepest position indexed; 0 picks `DEPTH_MAX_DEFAULT`.
    pub depth_max: usize,
    /// Pairs and entries this index may take, shared with other indexes.
    pub budget: Arc<Budget>,
}

impl IndexConfig {
    /// Defaults for `block_size`, with a budget of its own and no cap.
    pub fn new(block_size: u32) -> Self {
        IndexConfig { block_size, jump: 0, depth_max: 0, budget: Arc::new(Budget::unlimited()) }
    }
}

/// One worker's matched depths, in blocks. `host` and `disk` are cumulative:
/// `device <= host <= disk`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerMatch {
    pub worker: WorkerId,
    pub device: u32,
    pub host: u32,
    pub disk: u32,
}

/// The answer to a query: every worker with a nonzero depth in some tier.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Matches {
    pub workers: Vec<WorkerMatch>,
}

/// What applying one event did, block by block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyOutcome {
    pub stored: u32,
    pub removed: u32,
    /// Stores of blocks the worker already held.
    pub duplicate: u32,
    /// Blocks refused because the worker does not hold their parent.
    pub unknown_parent: u32,
    /// Removes of blocks the worker does not hold.
    pub unknown_removed: u32,
    /// Blocks refused because they lie past the deepest position indexed.
    pub depth_exceeded: u32,
    /// Blocks refused because the index is full (worker slots or entry ids).
    pub rejected: u32,
    /// Blocks refused because the shared budget's cap was reached.
    pub shed: u32,
    /// Pairs dropped by a Cleared event.
    pub cleared: u32,
}

impl ApplyOutcome {
    /// Adds another outcome's counts to this one.
    pub fn add(&mut self, o: &ApplyOutcome) {
        self.stored += o.stored;
        self.removed += o.removed;
        self.duplicate += o.duplicate;
        self.unknown_parent += o.unknown_parent;
        self.unknown_removed += o.unknown_removed;
        self.depth_exceeded += o.depth_exceeded;
        self.rejected += o.rejected;
        self.shed += o.shed;
        self.cleared += o.cleared;
    }
}

/// Size of an index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Indexed blocks (each once, whoever holds it, in whatever tier).
    pub entries: u64,
    /// Live (block, worker) pairs.
    pub pairs: u64,
    /// Bytes held by the index's own structures.
    pub bytes: u64,
    pub workers: u64,
}

/// The index of one (model, tenant).
pub struct Index {
    block_size: u32,
    jump: usize,
    shared: Shared,
    writer: Mutex<Writer>,
}

thread_local! {
    static CHAIN_SCRATCH: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

impl Index {
    pub fn new(cfg: IndexConfig) -> Index {
        let depth_max = if cfg.depth_max == 0 { DEPTH_MAX_DEFAULT } else { cfg.depth_max };
        Index {
            block_size: cfg.block_size,
            jump: if cfg.jump == 0 { JUMP_DEFAULT } else { cfg.jump },
            shared: Shared {
                runs: pages::Pages::new(),
                chunks: pages::Pages::new(),
                starts: starts::Starts::new(),
                slots: PublishedSlots::new(),
                tier_pairs: Default::default(),
                depth_max,
                budget: cfg.budget,
            },
            writer: Mutex::new(Writer::default()),
        }
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Applies one event. Events of one worker must be applied in order.
    pub fn apply(&self, event: &Event) -> ApplyOutcome {
        let mut w = self.writer.lock();
        // Pinned once here; nested pins in the writer are nearly free.
        let _guard = crossbeam::epoch::pin();
        Self::apply_locked(&mut w, &self.shared, event)
    }

    /// Applies events in order under one writer lock, reporting each
    /// event's outcome to `seen`. Readers still see each event whole.
    pub fn apply_all(&self, events: &[Event], mut seen: impl FnMut(&Event, &ApplyOutcome)) {
        let mut w = self.writer.lock();
        let _guard = crossbeam::epoch::pin();
        for e in events {
            let o = Self::apply_locked(&mut w, &self.shared, e);
            seen(e, &o);
        }
    }

    fn apply_locked(w: &mut Writer, shared: &Shared, event: &Event) -> ApplyOutcome {
        let mut out = ApplyOutcome::default();
        let slot = match &event.kind {
            EventKind::Stored { blocks, .. } => match w.slot(shared, event.worker) {
                Some(s) => s,
                None => {
                    out.rejected = blocks.len() as u32;
                    return out;
                }
            },
            EventKind::Removed { engine_hashes } => match w.slot_of(event.worker) {
                Some(s) => s,
                None => {
                    out.unknown_removed = engine_hashes.len() as u32;
                    return out;
                }
            },
            EventKind::Cleared => match w.slot_of(event.worker) {
                Some(s) => s,
                None => return out,
            },
        };
        // Readers retry a worker whose version moved while they looked.
        w.bump(slot);
        match &event.kind {
            EventKind::Stored { parent, blocks } => {
                w.store(shared, event.worker, event.tier, *parent, blocks, &mut out)
            }
            EventKind::Removed { engine_hashes } => w.remove(shared, event.worker, event.tier, engine_hashes, &mut out),
            EventKind::Cleared => out.cleared = w.clear(shared, event.worker) as u32,
        }
        w.bump(slot);
        out
    }

    /// Drops every block of `worker` and forgets it; false if unknown.
    pub fn remove_worker(&self, worker: WorkerId) -> bool {
        self.writer.lock().remove_worker(&self.shared, worker)
    }

    /// Depths of every worker for a query given as the local hashes of its blocks.
    pub fn find_matches(&self, local_hashes: &[u64]) -> Matches {
        CHAIN_SCRATCH.with(|s| {
            let mut chains = s.borrow_mut();
            let mut chains = chain::Chains::new(local_hashes, &mut chains);
            query::find(&self.shared, &mut chains, self.jump, || self.writer.lock())
        })
    }

    /// Events that rebuild this index exactly, per worker, parents first.
    pub fn dump_events(&self) -> Vec<Event> {
        let w = self.writer.lock();
        dump::dump(&w, &self.shared)
    }

    /// Workers that have a slot in this index.
    pub fn workers(&self) -> Vec<WorkerId> {
        let mut v: Vec<WorkerId> = self.writer.lock().slot_of.keys().copied().collect();
        v.sort_unstable();
        v
    }

    pub fn stats(&self) -> IndexStats {
        let w = self.writer.lock();
        IndexStats {
            entries: w.tree.entries(),
            pairs: w.pairs,
            bytes: (std::mem::size_of::<Index>() + w.tree.bytes(&self.shared) + w.records_bytes()) as u64,
            workers: w.slot_of.len() as u64,
        }
    }

    /// Checks every invariant of the layout (runs listed by their first
    /// chain and under their parents, entries counted, each worker's bits
    /// equal to its records) and panics on a breach; returns the entries.
    /// For tests: it walks the whole index.
    #[doc(hidden)]
    pub fn check_consistency(&self) -> u64 {
        let w = self.writer.lock();
        w.check(&self.shared)
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        // What this index held is room for the others again.
        let w = self.writer.get_mut();
        self.shared.budget.release_pairs(w.pairs);
        self.shared.budget.release_entries(w.tree.entries());
        w.tree.release_all(&self.shared);
    }
}

#[cfg(test)]
mod tests;

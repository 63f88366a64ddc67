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
//! The promise: for every worker and tier, the depth an answer credits is
//! never more than the largest depth the worker held at one instant while
//! the query ran, and it is exact when the worker's blocks did not change
//! during the query (under-reporting during a concurrent change is
//! allowed). It holds for every interleaving of every event kind.
//!
//! Concurrency: any number of readers run `find_matches` at once with no
//! lock; an event holds its worker's own state and the index's tree lock
//! only while it changes runs and members, and one worker's events must
//! arrive in order (one owner per worker). Every change of a worker's bits
//! is made in a window that only sets them or only clears them
//! (`workers::Window`), and a query accepts a worker's answer only if one
//! of the two ways was quiet while it walked (`query::find` says why that
//! keeps the promise). See `tree` for the shape, `writer` for applying
//! events and `query` for the search; `race_tests` stops writers and
//! readers at every step (`pause`) to prove it.
//!
//! Memory a write unlinks is freed by later writes once no query can hold
//! it; a program whose indexes may go quiet calls `reclaim` now and then
//! (the daemon does, each second) so the last of it goes too.
//!
//! Invariants, checked by `Index::check_consistency`, which the model tests
//! call throughout:
//! - Outside a window, a worker's bit is set on exactly the blocks its
//!   records name (per tier), so a quiet worker is answered exactly.
//! - Every live run is listed by its first chain and under a block of its
//!   parent run, and the blocks of live runs are the entries the budget
//!   counts.
//! - A store whose parent the worker does not hold is refused and counted,
//!   never guessed into position 0. A device block needs a device parent; a
//!   lower-tier block may hang off a block the worker holds in any tier.
//! - Stores are idempotent; a remove of unknown hashes skips them and
//!   removes the rest; an engine hash reused for other content replaces the
//!   old block. Every block of an event ends in exactly one outcome (stored,
//!   duplicate, or refused for one reason, which then refuses the rest).
//!
//! How the promise is proven: the writer and the query walk pass pause
//! points (`pause`) at every change a reader can see and every step of a
//! walk. `race_tests` stops one side at each point in turn and runs the
//! other meanwhile (a query at every point of an event; events at every
//! point, and every pair of points, of a walk), for each case that once
//! broke the promise and for random scripts of every event kind, against
//! the answers of the same steps applied one at a time; `sched_tests` lets
//! several writers and queries interleave at any points. The integration
//! test `index_concurrent` adds real threads: readers hold each answer to
//! the exact model's depths over the steps the query overlapped. All run
//! in CI, also with debug assertions on.
//!
//! Bytes per (block, worker) pair, on the conversation trace (1,048,576
//! live pairs over 868,082 blocks, about 2,000 runs; `benches/trace_apply`):
//! records 12.8 B a slot at about 88% full = 14.5 B; chains 8 B a block x
//! 0.83 blocks a pair = 6.6 B, plus chunk tails and the chunk owner table
//! (8 B per 16 blocks) = 0.6 B; runs, members, chunk lists and the start
//! table together about 0.3 B; per-worker bookkeeping under 0.1 B.
//! Measured: 22.5 bytes of index a pair.
//!
//! Files: `tree` (runs and reclaiming), `runs` (a run's header), `blocks`
//! (chain chunks), `members` (who holds what), `starts` (first chain to
//! run), `records` (engine hash to block), `workers` and `slots` (worker
//! slots, windows, the readers' table), `writer` (applying events), `query`
//! (the search), `chain` (the prefix hash), `dump` and `load` (dumps out and
//! in), `pages` (lock-free paged arrays), `budget` (the shared cap),
//! `reclaim` (freeing off the query path), `pause` (the race tests' points).

mod blocks;
mod budget;
mod chain;
mod dump;
mod load;
mod members;
mod pages;
mod pause;
mod query;
mod reclaim;
mod records;
mod runs;
mod slots;
mod starts;
mod tree;
mod workers;
mod writer;

pub use budget::Budget;
pub(crate) use chain::{chains_into, Chains};
pub use dump::{DumpEvent, Orphan};
pub use load::{Loaded, Loader, TooManyWaiting};
pub use reclaim::reclaim;

use crate::event::{Event, EventKind, StorageTier, WorkerId};
use parking_lot::{Mutex, RwLock};
use slots::PublishedSlots;
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tree::{Shared, Tree};
use workers::{WorkerState, Workers};

/// Asks the cache for the line at `p`.
#[inline]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint and never faults.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Default positions skipped per jump; see the jump benchmark in docs/benchmarks.md.
pub const JUMP_DEFAULT: usize = 64;
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
    /// The shape: runs, blocks and members. Held only while an event
    /// changes it; queries never take it (but as a last resort).
    tree: Mutex<Tree>,
    /// Worker slots; each worker's state has a lock of its own.
    workers: RwLock<Workers>,
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
                pairs: Default::default(),
                tier_pairs: Default::default(),
                depth_max,
                budget: cfg.budget,
            },
            tree: Mutex::new(Tree::default()),
            workers: RwLock::new(Workers::default()),
        }
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    fn ctx(&self) -> writer::Ctx<'_> {
        writer::Ctx { shared: &self.shared, tree: &self.tree }
    }

    /// Runs `f` on the worker's state; None when the worker has no slot
    /// (and `place` is false, or the index is full).
    fn with_worker<R>(&self, worker: WorkerId, place: bool, f: impl FnOnce(&mut WorkerState) -> R) -> Option<R> {
        loop {
            let found = self.workers.read().lookup(worker);
            let handle = match found {
                Some(h) => h,
                None if place => self.workers.write().place(&self.shared.slots, worker)?,
                None => return None,
            };
            let mut cell = handle.cell.lock();
            // The slot may have been given to another worker meanwhile: look again.
            let Some(st) = cell.as_mut().filter(|st| st.id == worker) else { continue };
            return Some(f(st));
        }
    }

    /// Applies one event. Events of one worker must be applied in order.
    pub fn apply(&self, event: &Event) -> ApplyOutcome {
        // Pinned once here; nested pins in the writer are nearly free.
        let guard = crossbeam::epoch::pin();
        let mut out = ApplyOutcome::default();
        let ctx = self.ctx();
        match &event.kind {
            EventKind::Stored { parent, blocks } => {
                let done = self.with_worker(event.worker, true, |st| {
                    let above = parent.map_or(writer::Above::Root, writer::Above::Hash);
                    writer::store(&ctx, st, event.tier, above, &[], blocks, &mut out)
                });
                if done.is_none() {
                    out.rejected = blocks.len() as u32;
                }
            }
            EventKind::Removed { engine_hashes } => {
                let done = self.with_worker(event.worker, false, |st| {
                    writer::remove(&ctx, st, event.tier, engine_hashes, &mut out)
                });
                if done.is_none() {
                    out.unknown_removed = engine_hashes.len() as u32;
                }
            }
            EventKind::Cleared => {
                out.cleared = self.with_worker(event.worker, false, |st| writer::clear(&ctx, st)).unwrap_or(0) as u32;
            }
        }
        drop(guard);
        reclaim::after_write();
        out
    }

    /// Applies events in order, reporting each event's outcome to `seen`.
    /// Readers see each event whole.
    pub fn apply_all(&self, events: &[Event], mut seen: impl FnMut(&Event, &ApplyOutcome)) {
        for e in events {
            let o = self.apply(e);
            seen(e, &o);
        }
    }

    /// Stores `blocks` for `worker` under `above`, after blocks of local
    /// hashes `unheld` that go on the path but are not held (a dump's
    /// orphan under its missing ancestors; see `load`).
    fn store_under(
        &self,
        worker: WorkerId,
        tier: StorageTier,
        above: writer::Above,
        unheld: &[u64],
        blocks: &[crate::event::StoredBlock],
    ) -> ApplyOutcome {
        let guard = crossbeam::epoch::pin();
        let mut out = ApplyOutcome::default();
        let ctx = self.ctx();
        let done = self.with_worker(worker, true, |st| writer::store(&ctx, st, tier, above, unheld, blocks, &mut out));
        if done.is_none() {
            out.rejected = blocks.len() as u32;
        }
        drop(guard);
        reclaim::after_write();
        out
    }

    /// Keeps in `engine_hashes` only those `worker` holds in `tier`.
    pub fn retain_held(&self, worker: WorkerId, tier: StorageTier, engine_hashes: &mut Vec<u64>) {
        let records = |st: &mut WorkerState| engine_hashes.retain(|&h| st.records[tier.index()].get(h).is_some());
        if self.with_worker(worker, false, records).is_none() {
            engine_hashes.clear();
        }
    }

    /// Drops every block of `worker` and forgets it; false if unknown.
    pub fn remove_worker(&self, worker: WorkerId) -> bool {
        let ctx = self.ctx();
        let cleared = self.with_worker(worker, false, |st| {
            writer::clear(&ctx, st);
            st.id = WorkerId::new(u64::MAX, u32::MAX);
        });
        if cleared.is_none() {
            return false;
        }
        let mut workers = self.workers.write();
        if let Some(h) = workers.lookup(worker) {
            *h.cell.lock() = None;
        }
        workers.release(&self.shared.slots, worker);
        drop(workers);
        reclaim::after_write();
        true
    }

    /// Depths of every worker for a query given as the local hashes of its blocks.
    pub fn find_matches(&self, local_hashes: &[u64]) -> Matches {
        CHAIN_SCRATCH.with(|s| {
            let mut chains = s.borrow_mut();
            let mut chains = chain::Chains::new(local_hashes, &mut chains, self.jump);
            query::find(&self.shared, &mut chains, self.jump, || Some(self.tree.lock()))
        })
    }

    /// `find_matches` that never waits for the tree lock: workers it could
    /// not settle without it are left out. For tests that run a query
    /// while a writer is stopped holding the lock.
    #[cfg(test)]
    pub(crate) fn find_matches_unlocked(&self, local_hashes: &[u64]) -> Matches {
        CHAIN_SCRATCH.with(|s| {
            let mut chains = s.borrow_mut();
            let mut chains = chain::Chains::new(local_hashes, &mut chains, self.jump);
            query::find(&self.shared, &mut chains, self.jump, || self.tree.try_lock())
        })
    }

    /// Every block every worker holds, as stored chains, per worker,
    /// parents first (see `dump`); `load_dump` rebuilds the index from them.
    /// Each worker's events are one state of that worker.
    pub fn dump_events(&self) -> Vec<DumpEvent> {
        let mut cursor = self.dump_cursor();
        let mut events = Vec::new();
        while let Some(worker) = cursor.next_worker(self) {
            events.extend(worker);
        }
        events
    }

    /// A dump taken one worker at a time (`DumpCursor::next_worker`), for
    /// a dump streamed while events land: each worker's events are its
    /// blocks at one instant, the instant its turn comes; writers wait
    /// only while that one worker is read. Workers placed after this call
    /// are not dumped, and one removed before its turn is skipped.
    pub fn dump_cursor(&self) -> DumpCursor {
        DumpCursor { cells: self.workers.read().cells(), next: 0, dumped: rustc_hash::FxHashSet::default() }
    }

    /// Workers that have a slot in this index.
    pub fn workers(&self) -> Vec<WorkerId> {
        self.workers.read().ids()
    }

    pub fn stats(&self) -> IndexStats {
        let (cells, workers, slot_bytes) = {
            let w = self.workers.read();
            (w.cells(), w.len(), w.bytes())
        };
        let records: usize = cells.iter().map(|c| c.lock().as_ref().map_or(0, WorkerState::bytes)).sum();
        let tree = self.tree.lock();
        IndexStats {
            entries: tree.entries(),
            pairs: self.shared.pairs.load(Ordering::Relaxed),
            bytes: (std::mem::size_of::<Index>() + tree.bytes(&self.shared) + records + slot_bytes) as u64,
            workers: workers as u64,
        }
    }

    /// Checks every invariant of the layout (runs listed by their first
    /// chain and under their parents, entries counted, each worker's bits
    /// equal to its records) and panics on a breach; returns the entries.
    /// For tests: it walks the whole index, with every lock held.
    #[doc(hidden)]
    pub fn check_consistency(&self) -> u64 {
        let workers = self.workers.write();
        let cells = workers.cells();
        let states: Vec<_> = cells.iter().map(|c| c.lock()).collect();
        let tree = self.tree.lock();
        let blocks = tree.check(&self.shared);
        let pairs: u64 =
            states.iter().filter_map(|s| s.as_ref()).map(|st| writer::check_worker(&tree, &self.shared, st)).sum();
        assert_eq!(pairs, self.shared.pairs.load(Ordering::Relaxed), "pairs count every (block, worker, tier)");
        blocks
    }
}

/// Where a dump taken a worker at a time stands (`Index::dump_cursor`).
pub struct DumpCursor {
    cells: Vec<workers::Cell>,
    next: usize,
    /// Workers dumped already: one removed and placed again in a slot
    /// still ahead is not dumped twice.
    dumped: rustc_hash::FxHashSet<WorkerId>,
}

impl DumpCursor {
    /// The events of the next worker that holds a slot, or None at the
    /// end. `index` must be the index the cursor was taken from.
    pub fn next_worker(&mut self, index: &Index) -> Option<Vec<DumpEvent>> {
        while let Some(cell) = self.cells.get(self.next) {
            self.next += 1;
            let st = cell.lock();
            if let Some(st) = st.as_ref().filter(|st| self.dumped.insert(st.id)) {
                let tree = index.tree.lock();
                return Some(dump::dump_worker(&tree, &index.shared, st));
            }
        }
        None
    }

    /// Workers left to visit (an upper bound on the events' workers).
    pub fn workers_left(&self) -> usize {
        self.cells.len() - self.next
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        // What this index held is room for the others again.
        let tree = self.tree.get_mut();
        self.shared.budget.release_pairs(*self.shared.pairs.get_mut());
        self.shared.budget.release_entries(tree.entries());
        tree.release_all(&self.shared);
    }
}

#[cfg(test)]
mod race_tests;
#[cfg(test)]
mod sched_tests;
#[cfg(test)]
mod tests;

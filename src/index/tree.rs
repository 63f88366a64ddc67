//! The shape of the index: runs, their blocks and who holds them, changed
//! by the writer only.
//!
//! Blocks form a tree of prefixes cut into runs. A block is found from its
//! parent: the next block of the parent's run, or the first block of a run
//! hanging under the parent (looked up by chain in `Starts`). Every block
//! exists once, whoever holds it, in whatever tier: a store that follows
//! existing blocks only sets its worker's bits.
//!
//! Reclaiming: a run keeps its blocks up to the last one anybody holds or
//! a child run hangs under; blocks past that are cut at once (and their
//! chunks freed), and a run with no block held and no child goes, then its
//! parent run is looked at the same way. A tail cut by the only worker
//! holding it changes nothing but the length: that worker's bits stay past
//! the end until an append clears them, and a reader that took the old
//! length sees the run's cut count move and walks again. After every
//! worker is cleared the index holds zero blocks and zero runs, and its
//! pages are released.

use super::blocks::{ChunkAlloc, ChunkOwner, ChunkPages, CHUNK_BLOCKS, NIL};
use super::budget::Budget;
use super::members::{self, Change, Members};
use super::pages::Writer;
use super::reclaim;
use super::runs::{chunk_list, RunHeader, RunPages, PAGE_RUNS};
use super::slots::PublishedSlots;
use super::starts::Starts;
use crossbeam::epoch;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Most runs one index can hold.
pub(crate) const RUNS_MAX: u32 = 1 << 28;

/// Everything queries read.
pub(crate) struct Shared {
    pub runs: RunPages,
    pub chunks: ChunkPages,
    pub starts: Starts,
    pub slots: PublishedSlots,
    /// Live (block, worker) pairs.
    pub pairs: AtomicU64,
    /// Live (block, worker) pairs per tier; queries skip empty lower tiers.
    pub tier_pairs: [AtomicU64; 4],
    pub depth_max: usize,
    /// Pairs and entries every index of the daemon may hold (see `budget`).
    pub budget: Arc<Budget>,
}

/// The writer's own facts about a run.
#[derive(Default)]
struct RunInfo {
    /// The block this run hangs under; NIL when it starts at position 0.
    parent: u32,
    /// Runs hanging under this run's blocks: (offset of the block, run).
    children: Vec<(u32, u32)>,
    live: bool,
}

/// A block and where it is: its run and offset there.
#[derive(Clone, Copy)]
pub(crate) struct Place {
    pub id: u32,
    pub run: u32,
    pub off: u32,
}

/// Who a new block is for: tier, group, bit (0: held by nobody yet).
#[derive(Clone, Copy)]
pub(crate) struct Holder {
    pub tier: usize,
    pub group: u32,
    pub bit: u64,
}

/// The writer's side of the shape. An index keeps its one tree behind its
/// tree lock, so whoever holds a `&Tree` holds the lock.
pub(crate) struct Tree {
    /// The pages' writer token (see `pages::Writer`).
    pub(super) writer: Writer,
    info: Vec<RunInfo>,
    free_runs: Vec<u32>,
    alloc: ChunkAlloc,
    /// Live blocks (the budget's entries).
    entries: u64,
    live_runs: u64,
    /// Bytes of chunk lists and members now published.
    side_bytes: usize,
}

impl Default for Tree {
    fn default() -> Self {
        Tree {
            // SAFETY: an index makes one tree, for its tree lock (`Index::new`).
            writer: unsafe { Writer::new() },
            info: Vec::new(),
            free_runs: Vec::new(),
            alloc: ChunkAlloc::default(),
            entries: 0,
            live_runs: 0,
            side_bytes: 0,
        }
    }
}

/// The offsets `off .. off + n` of a run cut where its chunks end: for
/// each piece, the chunk's index in the run, the first slot and how many.
fn chunk_spans(off: usize, n: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    let end = off + n;
    let mut at = off;
    std::iter::from_fn(move || {
        (at < end).then(|| {
            let slot = at % CHUNK_BLOCKS;
            let take = (CHUNK_BLOCKS - slot).min(end - at);
            let span = (at / CHUNK_BLOCKS, slot, take);
            at += take;
            span
        })
    })
}

/// Writes `chains` as the blocks from offset `off` of a run whose chunk
/// `i` is `chunk(i)`, a chunk at a time.
fn write_chains(shared: &Shared, writer: &Writer, off: usize, chains: &[u64], chunk: impl Fn(usize) -> u32) {
    let mut rest = chains;
    for (index, slot, take) in chunk_spans(off, chains.len()) {
        let c = shared.chunks.at(chunk(index), writer);
        for (j, &chain) in rest[..take].iter().enumerate() {
            c.set(slot + j, chain);
        }
        rest = &rest[take..];
    }
}

/// The ids of a run's chunk list, as its writer sees them.
///
/// # Safety
/// Writer only: lists are replaced and freed by the writer alone.
unsafe fn list_of(h: &RunHeader) -> &[AtomicU32] {
    // SAFETY: passed on from the caller.
    unsafe { chunk_list::ids(h.chunks.load(Ordering::Relaxed)) }
}

/// Frees an unlinked chunk list once no reader can hold it.
fn retire_list(p: *mut AtomicU32, bytes: usize) {
    if !p.is_null() {
        // SAFETY: the callers unlinked `p`, which came from `chunk_list::new`.
        unsafe { reclaim::retire(p as *mut u8, chunk_list::free, bytes) };
    }
}

/// Frees a published value once no reader can hold it.
fn retire<T>(p: *mut T, bytes: usize) {
    // SAFETY: the callers unlinked `p`, which came from `Box::into_raw`.
    unsafe { reclaim::retire_box(p, bytes) };
}

impl Tree {
    pub(crate) fn entries(&self) -> u64 {
        self.entries
    }

    pub(crate) fn bytes(&self, shared: &Shared) -> usize {
        shared.runs.bytes()
            + shared.chunks.bytes()
            + shared.starts.bytes()
            + self.alloc.bytes()
            + self.side_bytes
            + self.info.capacity() * std::mem::size_of::<RunInfo>()
            + self.info.iter().map(|i| i.children.capacity() * 8).sum::<usize>()
            + self.free_runs.capacity() * 4
    }

    fn header<'a>(&self, shared: &'a Shared, run: u32) -> &'a RunHeader {
        shared.runs.at(run, &self.writer)
    }

    pub(crate) fn len(&self, shared: &Shared, run: u32) -> u32 {
        self.header(shared, run).len.load(Ordering::Relaxed)
    }

    pub(crate) fn start(&self, shared: &Shared, run: u32) -> u32 {
        self.header(shared, run).start.load(Ordering::Relaxed)
    }

    /// The run and offset of block `id`.
    #[inline]
    pub(crate) fn locate(&self, id: u32) -> (u32, u32) {
        let o = self.alloc.owner(id / CHUNK_BLOCKS as u32);
        (o.run, o.index * CHUNK_BLOCKS as u32 + id % CHUNK_BLOCKS as u32)
    }

    #[inline]
    pub(crate) fn chain(&self, shared: &Shared, id: u32) -> u64 {
        shared.chunks.at(id / CHUNK_BLOCKS as u32, &self.writer).chain(id as usize % CHUNK_BLOCKS)
    }

    /// Position of block `id` in its prefix.
    pub(crate) fn position(&self, shared: &Shared, id: u32) -> u32 {
        let (run, off) = self.locate(id);
        self.start(shared, run) + off
    }

    /// The id of the block at `offset` of `run`.
    #[inline]
    pub(crate) fn block_at(&self, shared: &Shared, run: u32, offset: u32) -> u32 {
        let h = self.header(shared, run);
        // SAFETY: the writer replaces lists; it is the caller.
        let list = unsafe { list_of(h) };
        let chunk = list[offset as usize / CHUNK_BLOCKS].load(Ordering::Relaxed);
        chunk * CHUNK_BLOCKS as u32 + offset % CHUNK_BLOCKS as u32
    }

    /// The id of the block after `p` in its run (which has one): the next
    /// slot of the same chunk, unless `p` ends its chunk.
    #[inline]
    pub(crate) fn after(&self, shared: &Shared, p: Place) -> u32 {
        if !((p.off + 1) as usize).is_multiple_of(CHUNK_BLOCKS) {
            p.id + 1
        } else {
            self.block_at(shared, p.run, p.off + 1)
        }
    }

    /// Pushes the ids of the `n` blocks from offset `off` of `run`, a chunk
    /// at a time.
    pub(crate) fn push_ids(&self, shared: &Shared, run: u32, off: u32, n: u32, ids: &mut Vec<u32>) {
        // SAFETY: the writer replaces lists; it is the caller.
        let list = unsafe { list_of(self.header(shared, run)) };
        for (index, slot, take) in chunk_spans(off as usize, n as usize) {
            let first = list[index].load(Ordering::Relaxed) * CHUNK_BLOCKS as u32 + slot as u32;
            ids.extend(first..first + take as u32);
        }
    }

    /// The parent block of `id` (NIL at position 0).
    pub(crate) fn parent_of(&self, shared: &Shared, id: u32) -> u32 {
        let (run, off) = self.locate(id);
        if off > 0 {
            self.block_at(shared, run, off - 1)
        } else {
            self.info[run as usize].parent
        }
    }

    /// Members of `run` in `tier` (writer's view).
    pub(crate) fn members<'a>(&self, shared: &'a Shared, run: u32, tier: usize) -> Option<&'a Members> {
        // SAFETY: the writer replaces members; it is the caller.
        unsafe { self.header(shared, run).members[tier].load(Ordering::Relaxed).as_ref() }
    }

    /// Where block `id` is.
    #[inline]
    pub(crate) fn place(&self, id: u32) -> Place {
        let (run, off) = self.locate(id);
        Place { id, run, off }
    }

    /// The existing block with `chain` at `pos` under `parent` (None: at
    /// position 0), if any.
    pub(crate) fn next(&self, shared: &Shared, parent: Option<Place>, pos: u32, chain: u64) -> Option<Place> {
        if let Some(p) = parent {
            if p.off + 1 < self.len(shared, p.run) {
                let id = self.after(shared, p);
                if self.chain(shared, id) == chain {
                    return Some(Place { id, run: p.run, off: p.off + 1 });
                }
            }
        }
        // SAFETY: only the writer frees start tables, and it is the caller.
        let run = shared.starts.get(chain, unsafe { epoch::unprotected() })?;
        let ok = (run as usize) < self.info.len()
            && self.info[run as usize].live
            && self.info[run as usize].parent == parent.map_or(NIL, |p| p.id)
            && self.start(shared, run) == pos;
        ok.then(|| Place { id: self.block_at(shared, run, 0), run, off: 0 })
    }

    /// Whether a run already starts with `chain` (then a new run cannot).
    pub(crate) fn chain_taken(&self, shared: &Shared, chain: u64) -> bool {
        // SAFETY: as in `next`.
        shared.starts.get(chain, unsafe { epoch::unprotected() }).is_some()
    }

    fn set_members(&mut self, shared: &Shared, run: u32, tier: usize, change: Change) {
        let Change::Replace(new) = change else { return };
        if let Some(m) = &new {
            self.side_bytes += m.bytes();
        }
        let new = new.map_or(std::ptr::null_mut(), Box::into_raw);
        let old = self.header(shared, run).members[tier].swap(new, Ordering::AcqRel);
        // SAFETY: only the writer publishes members; `old` came from Box::into_raw.
        let old_bytes = unsafe { old.as_ref() }.map_or(0, |m| m.bytes());
        self.side_bytes -= old_bytes;
        retire(old, old_bytes);
        super::pause::point();
    }

    /// Sets or clears the holder's bit over `a..b` of `run` in its tier.
    pub(crate) fn mark(&mut self, shared: &Shared, run: u32, who: Holder, a: u32, b: u32, on: bool) {
        let len = self.len(shared, run);
        let change = members::update(self.members(shared, run, who.tier), who.group, a, b, len, who.bit, on);
        self.set_members(shared, run, who.tier, change);
    }

    /// Clears the holder's bit over `a..b` of `run`, like `mark`, but a
    /// tail nobody else holds is cut off instead (`trim` does the rest).
    pub(crate) fn let_go(&mut self, shared: &Shared, run: u32, who: Holder, a: u32, b: u32) {
        if a > 0 && b == self.len(shared, run) && self.tail_is_only(shared, run, who, a) {
            // The worker let go of a tail nobody else holds (an engine
            // evicting the end of a sequence): the run ends before it, and
            // nothing else changes. Its bits stay past the end, where no
            // reader of the new length looks, and an append clears them
            // before it makes a block there visible (`prepare_append`).
            self.cut(shared, run, a);
            return;
        }
        self.mark(shared, run, who, a, b, false);
    }

    /// Whether blocks `from..` of `run` are held by `who` alone (in any tier)
    /// and no run hangs under them.
    fn tail_is_only(&self, shared: &Shared, run: u32, who: Holder, from: u32) -> bool {
        if self.info[run as usize].children.iter().any(|&(off, _)| off >= from) {
            return false;
        }
        (0..4).all(|tier| {
            self.members(shared, run, tier)
                .is_none_or(|m| m.tail_only(from, (tier == who.tier).then_some((who.group, who.bit))))
        })
    }

    /// Appends `chains` to `run` (whose last block is their parent), held by
    /// `holder`; returns the first new block's id, or None when the index is
    /// out of chunks (nothing is appended then).
    pub(crate) fn append(&mut self, shared: &Shared, run: u32, chains: &[u64], holder: Holder) -> Option<u32> {
        let len = self.len(shared, run);
        let new_len = len + chains.len() as u32;
        let chunks_needed = (new_len as usize).div_ceil(CHUNK_BLOCKS);
        let h = self.header(shared, run);
        // SAFETY: writer only.
        let list = unsafe { list_of(h) };
        let have = (len as usize).div_ceil(CHUNK_BLOCKS);
        let mut fresh = Vec::new();
        for index in have..chunks_needed {
            match self.alloc.alloc(&shared.chunks, &self.writer, ChunkOwner { run, index: index as u32 }) {
                Some(c) => fresh.push(c),
                None => {
                    for c in fresh {
                        self.alloc.free(&shared.chunks, &self.writer, c);
                    }
                    return None;
                }
            }
        }
        if chunks_needed > list.len() {
            // Grow the list by half again, so appends one by one stay cheap.
            let cap = chunks_needed.max(list.len() + list.len() / 2);
            let kept = list[..have].iter().map(|c| c.load(Ordering::Relaxed));
            let new = chunk_list::new(kept.chain(fresh.iter().copied()), cap, NIL);
            self.side_bytes += chunk_list::bytes(cap);
            self.side_bytes -= chunk_list::bytes(list.len());
            let old = h.chunks.swap(new, Ordering::AcqRel);
            retire_list(old, chunk_list::bytes(list.len()));
        } else {
            for (k, &c) in fresh.iter().enumerate() {
                list[have + k].store(c, Ordering::Release);
            }
        }
        // A reader that reads one of these chains also sees every cut before
        // them (the chunks may have been cut from this or another run).
        std::sync::atomic::fence(Ordering::Release);
        // SAFETY: writer only; the list is the one just published.
        let list = unsafe { list_of(h) };
        write_chains(shared, &self.writer, len as usize, chains, |i| list[i].load(Ordering::Relaxed));
        // Nobody but the holder holds the new blocks, in any tier, before they are visible.
        for tier in 0..4 {
            let keep = (tier == holder.tier).then_some((holder.group, holder.bit));
            let change = members::prepare_append(self.members(shared, run, tier), len, keep);
            self.set_members(shared, run, tier, change);
        }
        if holder.bit != 0 {
            let m = self.members(shared, run, holder.tier);
            let change = members::update(m, holder.group, len, new_len, new_len, holder.bit, true);
            self.set_members(shared, run, holder.tier, change);
        }
        h.len.store(new_len, Ordering::Release);
        super::pause::point();
        self.entries += chains.len() as u64;
        Some(self.block_at(shared, run, len))
    }

    /// A new run of `chains` at `start` under `parent`, held by `holder`;
    /// returns its first block's id, or None when the index is full.
    /// The first chain must not start another run (`chain_taken`).
    pub(crate) fn new_run(
        &mut self,
        shared: &Shared,
        parent: u32,
        start: u32,
        chains: &[u64],
        holder: Holder,
    ) -> Option<u32> {
        debug_assert!(!chains.is_empty());
        let run = match self.free_runs.pop() {
            Some(r) => r,
            None if (self.info.len() as u32) < RUNS_MAX => {
                let r = self.info.len() as u32;
                self.info.push(RunInfo::default());
                shared.runs.ensure(r as usize / PAGE_RUNS, &self.writer);
                r
            }
            None => return None,
        };
        let chunks_needed = chains.len().div_ceil(CHUNK_BLOCKS);
        let mut ids = Vec::with_capacity(chunks_needed);
        for index in 0..chunks_needed {
            match self.alloc.alloc(&shared.chunks, &self.writer, ChunkOwner { run, index: index as u32 }) {
                Some(c) => ids.push(c),
                None => {
                    for c in ids {
                        self.alloc.free(&shared.chunks, &self.writer, c);
                    }
                    self.free_runs.push(run);
                    return None;
                }
            }
        }
        // As in `append`: a reader of these chains sees the cuts before them.
        std::sync::atomic::fence(Ordering::Release);
        write_chains(shared, &self.writer, 0, chains, |i| ids[i]);
        let h = self.header(shared, run);
        let list = chunk_list::new(ids.iter().copied(), ids.len(), NIL);
        self.side_bytes += chunk_list::bytes(ids.len());
        let old = h.chunks.swap(list, Ordering::AcqRel);
        debug_assert!(old.is_null());
        h.start.store(start, Ordering::Release);
        let len = chains.len() as u32;
        if holder.bit != 0 {
            let change = members::update(None, holder.group, 0, len, len, holder.bit, true);
            self.set_members(shared, run, holder.tier, change);
        }
        h.len.store(len, Ordering::Release);
        super::pause::point();
        self.info[run as usize] = RunInfo { parent, children: Vec::new(), live: true };
        if parent != NIL {
            let (p, off) = self.locate(parent);
            self.info[p as usize].children.push((off, run));
        }
        shared.starts.insert(chains[0], run);
        super::pause::point();
        self.entries += chains.len() as u64;
        self.live_runs += 1;
        Some(ids[0] * CHUNK_BLOCKS as u32)
    }

    /// Cuts `run` after its last held or parent block, frees it when nothing
    /// is left, and looks at its parent run the same way.
    pub(crate) fn trim(&mut self, shared: &Shared, mut run: u32) {
        loop {
            let len = self.len(shared, run);
            let held = (0..4).map(|t| self.members(shared, run, t).map_or(0, |m| m.held_end(len))).max().unwrap_or(0);
            if held == len {
                return;
            }
            let info = &self.info[run as usize];
            let keep = info.children.iter().map(|&(off, _)| off + 1).max().unwrap_or(0).max(held);
            if keep == len {
                return;
            }
            if keep > 0 {
                self.cut(shared, run, keep);
                return;
            }
            let parent = info.parent;
            self.free_run(shared, run);
            if parent == NIL {
                return;
            }
            run = self.locate(parent).0;
        }
    }

    fn cut(&mut self, shared: &Shared, run: u32, keep: u32) {
        let h = self.header(shared, run);
        let len = h.len.load(Ordering::Relaxed);
        // Nobody holds a block past `keep` any more, though the members may
        // still say so there. A reader that took the old length may take
        // them, or members and chains changed after this cut, so it checks
        // `cuts` once done with the run and looks again. The count moves
        // after the length: a reader that sees the new count (it loads the
        // count first) also sees the new length.
        h.len.store(keep, Ordering::Release);
        super::pause::point();
        h.cuts.fetch_add(1, Ordering::AcqRel);
        super::pause::point();
        // SAFETY: writer only.
        let list = unsafe { list_of(h) };
        for id in &list[(keep as usize).div_ceil(CHUNK_BLOCKS)..(len as usize).div_ceil(CHUNK_BLOCKS)] {
            let c = id.swap(NIL, Ordering::Relaxed);
            self.alloc.free(&shared.chunks, &self.writer, c);
        }
        let gone = (len - keep) as u64;
        self.entries -= gone;
        shared.budget.release_entries(gone);
    }

    fn free_run(&mut self, shared: &Shared, run: u32) {
        let h = self.header(shared, run);
        let len = h.len.load(Ordering::Relaxed);
        let first = self.chain(shared, self.block_at(shared, run, 0));
        h.len.store(0, Ordering::Release);
        super::pause::point();
        h.cuts.fetch_add(1, Ordering::AcqRel);
        super::pause::point();
        let removed = shared.starts.remove(first);
        super::pause::point();
        debug_assert!(removed, "run {run} was listed by its first chain");
        let list = h.chunks.swap(std::ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: writer only; the list came from `chunk_list::new`.
        let ids = unsafe { chunk_list::ids(list) };
        for id in ids {
            let c = id.load(Ordering::Relaxed);
            if c != NIL {
                self.alloc.free(&shared.chunks, &self.writer, c);
            }
        }
        let freed = chunk_list::bytes(ids.len());
        self.side_bytes -= freed;
        retire_list(list, freed);
        for tier in 0..4 {
            self.set_members(shared, run, tier, Change::Replace(None));
        }
        let parent = self.info[run as usize].parent;
        if parent != NIL {
            let p = self.locate(parent).0;
            let siblings = &mut self.info[p as usize].children;
            let i = siblings.iter().position(|&(_, r)| r == run).expect("listed under its parent");
            siblings.swap_remove(i);
        }
        self.info[run as usize] = RunInfo::default();
        self.free_runs.push(run);
        self.entries -= len as u64;
        self.live_runs -= 1;
        shared.budget.release_entries(len as u64);
    }

    /// The ancestor of block `id` at `position` (`id` itself if it lies
    /// there); None when `id` lies above it.
    pub(crate) fn ancestor_at(&self, shared: &Shared, mut id: u32, position: u32) -> Option<u32> {
        let mut at = self.position(shared, id);
        while at > position {
            id = self.parent_of(shared, id);
            at -= 1;
        }
        (at == position && id != NIL).then_some(id)
    }

    /// Whether block `id` is the last of its run.
    pub(crate) fn is_tail(&self, shared: &Shared, id: u32) -> bool {
        let (run, off) = self.locate(id);
        off + 1 == self.len(shared, run)
    }

    pub(crate) fn is_live(&self, run: u32) -> bool {
        self.info.get(run as usize).is_some_and(|i| i.live)
    }

    /// Every live run (for dumps, checks and clears).
    pub(crate) fn live_runs(&self) -> impl Iterator<Item = u32> + '_ {
        self.info.iter().enumerate().filter(|(_, i)| i.live).map(|(r, _)| r as u32)
    }

    /// Debug check: the blocks of every live run add up to the entries, and
    /// every run is listed under its parent and by its first chain.
    pub(crate) fn check(&self, shared: &Shared) -> u64 {
        let mut blocks = 0;
        let guard = epoch::pin();
        for run in self.live_runs() {
            let len = self.len(shared, run);
            assert!(len > 0, "a live run has blocks");
            blocks += len as u64;
            let first = self.chain(shared, self.block_at(shared, run, 0));
            assert_eq!(shared.starts.get(first, &guard), Some(run), "run {run} found by its first chain");
            let parent = self.info[run as usize].parent;
            if parent != NIL {
                let (p, off) = self.locate(parent);
                assert!(self.info[p as usize].children.contains(&(off, run)), "run {run} listed under its parent");
                assert!(off < self.len(shared, p), "run {run} hangs under a block of its parent run");
                assert_eq!(self.start(shared, run), self.start(shared, p) + off + 1);
            }
        }
        assert_eq!(blocks, self.entries, "entries count every live block");
        assert_eq!(shared.starts.len() as u64, self.live_runs, "one start per live run");
        blocks
    }
}

impl Tree {
    /// Frees what live runs' headers own; the index is going away, so no
    /// reader is left.
    pub(crate) fn release_all(&mut self, shared: &Shared) {
        for run in self.live_runs().collect::<Vec<_>>() {
            let h = shared.runs.at(run, &self.writer);
            let list = h.chunks.swap(std::ptr::null_mut(), Ordering::Relaxed);
            if !list.is_null() {
                // SAFETY: came from `chunk_list::new`; no reader is left.
                unsafe { chunk_list::free(list as *mut u8) };
            }
            for m in &h.members {
                let m = m.swap(std::ptr::null_mut(), Ordering::Relaxed);
                if !m.is_null() {
                    // SAFETY: as above.
                    drop(unsafe { Box::from_raw(m) });
                }
            }
        }
    }
}

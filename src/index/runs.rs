//! Runs: consecutive blocks of one prefix, stored once for every holder.
//!
//! A run is a path of blocks at positions `start .. start + len`; it hangs
//! under one block of another run (or starts at position 0). Its blocks'
//! chains live in chunks (`blocks`), listed in order by its chunk list; who
//! holds which of its blocks, per tier, lives in its `Members`. A block
//! whose parent is the last block of a run is appended to that run, so a
//! worker that extends its sequence one block per event (decoding) grows a
//! run rather than making new structures.
//!
//! The header is what readers load, all atomics. The writer publishes in an
//! order readers can rely on: a new block's chain, then any new chunk list
//! and members, then the length (release). A reader loads the length first
//! (acquire), so everything up to it is there. Blocks past the length are
//! held by nobody in the members a reader can see (see `tree`), so a reader
//! that saw an older, longer length never credits anyone with them.

use super::blocks::{Chunk, ChunkPages, CHUNK_BLOCKS};
use super::members::Members;
use super::pages::{Pages, Zeroable};
use crossbeam::epoch::Guard;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

/// Runs per page of headers.
pub(crate) const PAGE_RUNS: usize = 256;

/// The chunks of one run, in order, as one allocation: its capacity in
/// front of the chunk ids, so a reader has the ids with one load of the
/// list's address (a list behind a second pointer cost one more dependent
/// miss for every run a query crossed). Readers see the ids up to the
/// run's length.
pub(crate) mod chunk_list {
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A new list of `ids` with room for `cap` (at least as many); the
    /// rest is `fill`.
    pub(crate) fn new(ids: impl Iterator<Item = u32>, cap: usize, fill: u32) -> *mut AtomicU32 {
        let mut all = Vec::with_capacity(cap + 1);
        all.push(AtomicU32::new(cap as u32));
        all.extend(ids.map(AtomicU32::new));
        debug_assert!(all.len() <= cap + 1, "a list holds its ids");
        all.resize_with(cap + 1, || AtomicU32::new(fill));
        Box::into_raw(all.into_boxed_slice()) as *mut AtomicU32
    }

    /// The ids of the list at `p` (none for null).
    ///
    /// # Safety
    /// `p` is null or came from `new` and is not freed while `'a` lasts.
    #[inline]
    pub(crate) unsafe fn ids<'a>(p: *const AtomicU32) -> &'a [AtomicU32] {
        if p.is_null() {
            return &[];
        }
        // SAFETY: `new` wrote the capacity first and that many ids after it.
        unsafe {
            let cap = (*p).load(Ordering::Relaxed) as usize;
            std::slice::from_raw_parts(p.add(1), cap)
        }
    }

    /// Bytes a list with room for `cap` ids holds.
    pub(crate) fn bytes(cap: usize) -> usize {
        (cap + 1) * 4
    }

    /// Frees a list (a `reclaim::retire` free function).
    ///
    /// # Safety
    /// `p` came from `new`, and nothing reads it any more.
    pub(crate) unsafe fn free(p: *mut u8) {
        let p = p as *mut AtomicU32;
        // SAFETY: as `ids`; the slice is the one `new` boxed.
        unsafe {
            let cap = (*p).load(Ordering::Relaxed) as usize;
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, cap + 1)));
        }
    }
}

/// What readers know of a run.
pub(crate) struct RunHeader {
    pub start: AtomicU32,
    pub len: AtomicU32,
    /// Times the run was cut shorter (or freed): a reader that saw it move
    /// while it looked may have mixed the old length with newer members.
    pub cuts: AtomicU32,
    /// A `chunk_list`.
    pub chunks: AtomicPtr<AtomicU32>,
    pub members: [AtomicPtr<Members>; 4],
}

// SAFETY: atomics and null pointers.
unsafe impl Zeroable for RunHeader {}

pub(crate) type RunPages = Pages<RunHeader, PAGE_RUNS>;

/// One reader's view of a run: its length and the structures up to it.
pub(crate) struct RunView<'g> {
    pub start: u32,
    pub len: u32,
    /// `cuts` when the view was taken.
    pub cuts: u32,
    chunks: &'g [AtomicU32],
    pub members: [Option<&'g Members>; 4],
}

impl RunHeader {
    /// Whether the run was cut since `view` was taken; call after the
    /// reader is done with the view.
    #[inline]
    pub(crate) fn cut_since(&self, view: &RunView) -> bool {
        std::sync::atomic::fence(Ordering::Acquire);
        self.cuts.load(Ordering::Relaxed) != view.cuts
    }

    /// Loads the run in the order the writer publishes it.
    #[inline]
    pub(crate) fn view<'g>(&self, guard: &'g Guard) -> RunView<'g> {
        let cuts = self.cuts.load(Ordering::Acquire);
        let len = self.len.load(Ordering::Acquire);
        let start = self.start.load(Ordering::Acquire);
        let _ = guard;
        // SAFETY: lists and members are freed through epochs only, and `guard` is pinned.
        // A list is null only in a run being made or freed, whose length a
        // reader pairs with no list (`chain` then answers None).
        let chunks = unsafe { chunk_list::ids(self.chunks.load(Ordering::Acquire)) };
        let members = std::array::from_fn(|t| unsafe { self.members[t].load(Ordering::Acquire).as_ref() });
        RunView { start, len, cuts, chunks, members }
    }
}

impl RunView<'_> {
    /// The chain of the block at `offset` (< len); None if the view is torn.
    #[inline]
    pub(crate) fn chain(&self, pages: &ChunkPages, offset: u32, guard: &Guard) -> Option<u64> {
        let id = self.chunks.get(offset as usize / CHUNK_BLOCKS)?.load(Ordering::Relaxed);
        Some(pages.get(id, guard)?.chain(offset as usize % CHUNK_BLOCKS))
    }

    /// Asks the cache for the chain at `offset`, ahead of a `chain` call.
    #[inline]
    pub(crate) fn prefetch(&self, pages: &ChunkPages, offset: u32, guard: &Guard) {
        let Some(id) = self.chunks.get(offset as usize / CHUNK_BLOCKS) else { return };
        if let Some(chunk) = pages.get(id.load(Ordering::Relaxed), guard) {
            let at = (chunk as *const Chunk as *const u8).wrapping_add(offset as usize % CHUNK_BLOCKS * 8);
            super::prefetch(at);
        }
    }
}

//! Dense worker slots and the table readers use to name them.
//!
//! Each worker of an index gets the lowest free slot; slot `s` is bit
//! `s % 64` of group `s / 64`. Worker sets in the index are bitsets over
//! these slots. The writer publishes an immutable slot table on every
//! change (copy on write, reclaimed through epochs), so a query reads a
//! consistent table without taking a lock. A slot is only recycled after
//! every bit it owned inside a run's length has been cleared (bits a tail
//! cut left past a run's end may stay: no reader looks there, and an
//! append by another worker clears them first).

use super::reclaim;
use crate::event::WorkerId;
use crossbeam::epoch::{self, Atomic, Owned};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bits per group: the width of the inline worker set.
pub(crate) const GROUP_BITS: u32 = 64;
/// Most workers one index can hold (groups are u16).
pub(crate) const SLOTS_MAX: u32 = 1 << 16;

/// Which way a window of a worker's event changes its bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Way {
    /// Bits are only set.
    Add = 0,
    /// Bits are only cleared.
    Remove = 1,
}

/// The windows of one group's slots. Every change of a worker's bits is
/// made inside a window of its worker, which sets bits only (`Way::Add`)
/// or clears them only (`Way::Remove`); a slot's sequence of each way is
/// odd while a window of that way is open. A reader that saw no window of
/// one way open or opened while it walked saw the worker's bits move one
/// way only (see `query`). `group` sums each way up so that a query over a
/// quiet group reads two words, not 128: a word's high half counts every
/// opening and closing in the group, its low half how many are open.
pub(crate) struct Versions {
    pub slots: [[AtomicU64; 2]; GROUP_BITS as usize],
    pub group: [AtomicU64; 2],
}

/// What a `Versions::group` word gains when a window opens, and when it closes.
pub(crate) const GROUP_BEGIN: u64 = (1 << 32) + 1;
pub(crate) const GROUP_END: u64 = (1 << 32) - 1;

impl Versions {
    pub(crate) fn new() -> Self {
        Versions {
            slots: std::array::from_fn(|_| [AtomicU64::new(0), AtomicU64::new(0)]),
            group: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }
}

/// One slot's sequences, add then remove, as a reader loaded them.
pub(crate) type Seqs = [u64; 2];

/// Whether a worker's bits moved one way only between two readings of its
/// sequences: no window of some way was open at the first reading or
/// opened before the second.
#[inline]
pub(crate) fn one_way(before: Seqs, after: Seqs) -> bool {
    (0..2).any(|w| before[w] == after[w] && before[w] & 1 == 0)
}

/// Whether a group's windows moved one way only between two readings of
/// its summary words (see `Versions`).
#[inline]
pub(crate) fn group_one_way(before: Seqs, after: Seqs) -> bool {
    (0..2).any(|w| before[w] == after[w] && before[w] as u32 == 0)
}

/// Slot -> worker, as seen by readers.
#[derive(Clone, Default)]
pub(crate) struct SlotTable {
    pub workers: Vec<Option<WorkerId>>,
    /// Per group, the bits of slots in use.
    pub live: Vec<u64>,
    /// Per group, the slots' window sequences (shared with the writer).
    pub versions: Vec<Arc<Versions>>,
    /// Per slot, when its worker was placed there: a slot that names the
    /// same worker in two tables held it all along only if this is equal.
    pub placed: Vec<u64>,
}

impl SlotTable {
    pub(crate) fn groups(&self) -> usize {
        self.live.len()
    }

    pub(crate) fn worker(&self, group: usize, bit: u32) -> Option<WorkerId> {
        self.workers.get(group * GROUP_BITS as usize + bit as usize).copied().flatten()
    }

    /// Whether `worker` has held the same slot from table `earlier` to this one.
    pub(crate) fn kept_since(&self, earlier: &SlotTable, worker: WorkerId) -> bool {
        earlier.slot_of(worker).is_some_and(|(g, b)| {
            let s = g * GROUP_BITS as usize + b as usize;
            self.worker(g, b) == Some(worker) && self.placed.get(s) == earlier.placed.get(s)
        })
    }

    /// The (group, bit) of `worker`'s slot: a scan, for rare checks.
    pub(crate) fn slot_of(&self, worker: WorkerId) -> Option<(usize, u32)> {
        let s = self.workers.iter().position(|w| *w == Some(worker))?;
        Some((s / GROUP_BITS as usize, (s % GROUP_BITS as usize) as u32))
    }

    /// The summary words of `group` (see `Versions`).
    #[inline]
    pub(crate) fn group_words(&self, group: usize) -> Seqs {
        let g = &self.versions[group].group;
        [g[0].load(Ordering::Acquire), g[1].load(Ordering::Acquire)]
    }

    /// The sequences of the slots in `mask` of `group`.
    pub(crate) fn read_seqs(&self, group: usize, mut mask: u64, out: &mut [Seqs; GROUP_BITS as usize]) {
        let v = &self.versions[group].slots;
        while mask != 0 {
            let b = mask.trailing_zeros() as usize;
            out[b] = [v[b][0].load(Ordering::Acquire), v[b][1].load(Ordering::Acquire)];
            mask &= mask - 1;
        }
    }
}

/// The published slot table.
pub(crate) struct PublishedSlots {
    current: Atomic<SlotTable>,
}

impl PublishedSlots {
    pub(crate) fn new() -> Self {
        PublishedSlots { current: Atomic::new(SlotTable::default()) }
    }

    /// Runs `f` on the current table.
    pub(crate) fn read<R>(&self, guard: &epoch::Guard, f: impl FnOnce(&SlotTable) -> R) -> R {
        let table = self.current.load(Ordering::Acquire, guard);
        // SAFETY: the pointer is never null (set in `new` and `publish`), and
        // the table it points to is only destroyed after every guard pinned
        // before its replacement is dropped.
        f(unsafe { table.deref() })
    }

    /// Replaces the table. Only the index writer calls this.
    pub(crate) fn publish(&self, table: SlotTable) {
        let guard = epoch::pin();
        let old = self.current.swap(Owned::new(table), Ordering::AcqRel, &guard);
        // SAFETY: `old` is no longer reachable from `current`; readers that
        // still hold it are pinned, so destruction waits for them.
        let bytes = unsafe { old.as_ref() }.map_or(0, |t| t.workers.len() * 24 + t.live.len() * 16);
        unsafe { reclaim::retire_shared(old, bytes) };
    }
}

impl Drop for PublishedSlots {
    fn drop(&mut self) {
        // SAFETY: we have exclusive access; no reader can hold the pointer.
        unsafe {
            let table = self.current.load(Ordering::Relaxed, epoch::unprotected());
            drop(table.into_owned());
        }
    }
}

//! Per-position hash tables: the part of the index that queries read.
//!
//! Each storage tier has one table per block position. A table maps
//! `(chain hash, worker group)` to a slot holding the entry's id and an
//! atomic 64-bit worker set.
//!
//! Readers take no lock. A table is a seqlock: its version is odd while the
//! writer moves keys (insert, backward-shift delete), and a reader retries a
//! probe whose version changed. Slot fields are atomics, so a torn read is
//! only ever retried, never undefined. Resizing builds a new table off to
//! the side and swaps the pointer; the old one is freed once no reader that
//! might hold it is pinned (crossbeam epochs). Worker-set bits are flipped
//! in place with atomic or/and and need no version change.
//!
//! Only the index's writer (under its writer lock) calls the mutating methods.
//! Tables use linear probing, grow at 3/4 load and shrink below 1/8, and an
//! emptied table is freed, so emptied positions give memory back.

use crossbeam::epoch::{self, Atomic, Guard, Owned, Shared};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Marks an empty slot (entry ids never reach it).
const EMPTY: u32 = u32::MAX;
/// Positions per lazily allocated segment.
const SEGMENT_LEVELS: usize = 256;
/// Smallest non-empty table.
const MIN_CAPACITY: usize = 8;

pub(crate) struct Slot {
    chain: AtomicU64,
    bits: AtomicU64,
    id: AtomicU32,
    group: AtomicU32,
}

impl Slot {
    fn empty() -> Self {
        Slot { chain: AtomicU64::new(0), bits: AtomicU64::new(0), id: AtomicU32::new(EMPTY), group: AtomicU32::new(0) }
    }

    /// The worker set of this entry's group.
    #[inline]
    pub(crate) fn bits(&self) -> u64 {
        self.bits.load(Ordering::Acquire)
    }

    #[inline]
    pub(crate) fn set(&self, mask: u64) {
        self.bits.fetch_or(mask, Ordering::Release);
    }

    #[inline]
    /// Clears `mask`; returns the bits as they were.
    pub(crate) fn clear(&self, mask: u64) -> u64 {
        self.bits.fetch_and(!mask, Ordering::AcqRel)
    }

    pub(crate) fn id(&self) -> u32 {
        self.id.load(Ordering::Relaxed)
    }

    #[inline]
    fn is(&self, chain: u64, group: u32) -> bool {
        self.chain.load(Ordering::Relaxed) == chain && self.group.load(Ordering::Relaxed) == group
    }

    fn store(&self, chain: u64, group: u32, id: u32, bits: u64) {
        self.chain.store(chain, Ordering::Relaxed);
        self.group.store(group, Ordering::Relaxed);
        self.bits.store(bits, Ordering::Relaxed);
        self.id.store(id, Ordering::Relaxed);
    }
}

#[inline]
fn home(chain: u64, group: u32, shift: u32) -> usize {
    let key = chain ^ (group as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize
}

struct Table {
    slots: Box<[Slot]>,
    shift: u32,
}

impl Table {
    fn new(capacity: usize) -> Table {
        debug_assert!(capacity.is_power_of_two() && capacity >= MIN_CAPACITY);
        Table { slots: (0..capacity).map(|_| Slot::empty()).collect(), shift: 64 - capacity.trailing_zeros() }
    }

    /// The slot of `(chain, group)`. Bounded even if read torn.
    #[inline]
    fn find(&self, chain: u64, group: u32) -> Option<&Slot> {
        let mask = self.slots.len() - 1;
        let mut i = home(chain, group, self.shift);
        for _ in 0..self.slots.len() {
            let slot = &self.slots[i];
            if slot.id.load(Ordering::Relaxed) == EMPTY {
                return None;
            }
            if slot.is(chain, group) {
                return Some(slot);
            }
            i = (i + 1) & mask;
        }
        None
    }

    fn place(&self, chain: u64, group: u32, id: u32, bits: u64) {
        let mask = self.slots.len() - 1;
        let mut i = home(chain, group, self.shift);
        while self.slots[i].id.load(Ordering::Relaxed) != EMPTY {
            i = (i + 1) & mask;
        }
        self.slots[i].store(chain, group, id, bits);
    }
}

/// One position's table.
pub(crate) struct Level {
    version: AtomicU64,
    table: Atomic<Table>,
    /// Keys in the table (writer-maintained).
    len: AtomicUsize,
}

impl Level {
    fn new() -> Self {
        Level { version: AtomicU64::new(0), table: Atomic::null(), len: AtomicUsize::new(0) }
    }

    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// The worker set of `(chain, group)`, 0 if absent. Lock-free.
    #[inline]
    pub(crate) fn bits(&self, chain: u64, group: u32, guard: &Guard) -> u64 {
        loop {
            let v1 = self.version.load(Ordering::Acquire);
            if v1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let table = self.table.load(Ordering::Acquire, guard);
            // SAFETY: the table is freed only through `defer_destroy`, after
            // every guard pinned before its replacement is gone.
            let bits = match unsafe { table.as_ref() } {
                None => 0,
                Some(t) => t.find(chain, group).map_or(0, Slot::bits),
            };
            fence(Ordering::Acquire);
            if self.version.load(Ordering::Relaxed) == v1 {
                return bits;
            }
        }
    }

    /// Writer only: the slot of `(chain, group)`.
    pub(crate) fn slot<'g>(&self, chain: u64, group: u32, guard: &'g Guard) -> Option<&'g Slot> {
        let table = self.table.load(Ordering::Acquire, guard);
        // SAFETY: only the writer frees tables, and it is the caller.
        unsafe { table.as_ref() }.and_then(|t| t.find(chain, group))
    }

    fn begin(&self) -> u64 {
        let v = self.version.load(Ordering::Relaxed);
        self.version.store(v + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        v
    }

    fn end(&self, v: u64) {
        self.version.store(v + 2, Ordering::Release);
    }

    fn swap_table(&self, new: Option<Table>, guard: &Guard) {
        let new = match new {
            Some(t) => Owned::new(t).into_shared(guard),
            None => Shared::null(),
        };
        let v = self.begin();
        let old = self.table.swap(new, Ordering::AcqRel, guard);
        self.end(v);
        if !old.is_null() {
            // SAFETY: `old` is unreachable now; readers still holding it are pinned.
            unsafe { guard.defer_destroy(old) };
        }
    }

    fn rebuild(&self, capacity: usize, guard: &Guard) {
        let new = Table::new(capacity);
        let old = self.table.load(Ordering::Acquire, guard);
        // SAFETY: writer only.
        if let Some(old) = unsafe { old.as_ref() } {
            for s in old.slots.iter().filter(|s| s.id() != EMPTY) {
                new.place(s.chain.load(Ordering::Relaxed), s.group.load(Ordering::Relaxed), s.id(), s.bits());
            }
        }
        self.swap_table(Some(new), guard);
    }

    fn capacity(&self, guard: &Guard) -> usize {
        // SAFETY: writer only.
        unsafe { self.table.load(Ordering::Acquire, guard).as_ref() }.map_or(0, |t| t.slots.len())
    }

    /// Writer only: adds a key that is not present yet, with worker set `bits`.
    pub(crate) fn insert(&self, chain: u64, group: u32, id: u32, bits: u64, guard: &Guard) {
        debug_assert!(id != EMPTY);
        let len = self.len();
        let cap = self.capacity(guard);
        if (len + 1) * 4 > cap * 3 {
            self.rebuild((cap * 2).max(MIN_CAPACITY), guard);
        }
        let table = self.table.load(Ordering::Acquire, guard);
        // SAFETY: writer only; just ensured non-null.
        let t = unsafe { table.deref() };
        let v = self.begin();
        t.place(chain, group, id, bits);
        self.end(v);
        self.len.store(len + 1, Ordering::Relaxed);
    }

    /// Writer only: removes a key; returns whether it was present.
    pub(crate) fn remove(&self, chain: u64, group: u32, guard: &Guard) -> bool {
        let table = self.table.load(Ordering::Acquire, guard);
        // SAFETY: writer only.
        let Some(t) = (unsafe { table.as_ref() }) else { return false };
        let mask = t.slots.len() - 1;
        let mut i = home(chain, group, t.shift);
        loop {
            let s = &t.slots[i];
            if s.id() == EMPTY {
                return false;
            }
            if s.is(chain, group) {
                break;
            }
            i = (i + 1) & mask;
        }
        let v = self.begin();
        // Backward-shift deletion keeps every probe chain unbroken.
        let mut hole = i;
        let mut j = (i + 1) & mask;
        loop {
            let s = &t.slots[j];
            if s.id() == EMPTY {
                break;
            }
            let (c, g) = (s.chain.load(Ordering::Relaxed), s.group.load(Ordering::Relaxed));
            let h = home(c, g, t.shift);
            let movable = if hole <= j { h <= hole || h > j } else { h <= hole && h > j };
            if movable {
                t.slots[hole].store(c, g, s.id(), s.bits.load(Ordering::Relaxed));
                hole = j;
            }
            j = (j + 1) & mask;
        }
        t.slots[hole].store(0, 0, EMPTY, 0);
        self.end(v);
        let len = self.len() - 1;
        self.len.store(len, Ordering::Relaxed);
        if len == 0 {
            self.swap_table(None, guard);
        } else if t.slots.len() > MIN_CAPACITY && len * 8 < t.slots.len() {
            self.rebuild((t.slots.len() / 4).max(MIN_CAPACITY), guard);
        }
        true
    }

    fn bytes(&self) -> usize {
        let guard = epoch::pin();
        self.capacity(&guard) * std::mem::size_of::<Slot>()
    }
}

impl Drop for Level {
    fn drop(&mut self) {
        // SAFETY: exclusive access; no reader can hold the table.
        unsafe {
            let t = self.table.load(Ordering::Relaxed, epoch::unprotected());
            if !t.is_null() {
                drop(t.into_owned());
            }
        }
    }
}

type Segment = Box<[Level]>;

/// The tables of one tier, one per position, allocated a segment at a time.
pub(crate) struct Levels {
    segments: Box<[OnceLock<Segment>]>,
}

impl Levels {
    /// Room for `depth_max` positions.
    pub(crate) fn new(depth_max: usize) -> Self {
        let n = depth_max.div_ceil(SEGMENT_LEVELS);
        Levels { segments: (0..n).map(|_| OnceLock::new()).collect() }
    }

    /// The table at `level`, if its segment exists.
    #[inline]
    pub(crate) fn get(&self, level: usize) -> Option<&Level> {
        let seg = self.segments.get(level / SEGMENT_LEVELS)?.get()?;
        Some(&seg[level % SEGMENT_LEVELS])
    }

    /// The table at `level`, allocating its segment. `level` must be below `depth_max`.
    pub(crate) fn get_or_create(&self, level: usize) -> &Level {
        let seg =
            self.segments[level / SEGMENT_LEVELS].get_or_init(|| (0..SEGMENT_LEVELS).map(|_| Level::new()).collect());
        &seg[level % SEGMENT_LEVELS]
    }

    /// Bytes held by tables and segments.
    pub(crate) fn bytes(&self) -> usize {
        let mut total = self.segments.len() * std::mem::size_of::<OnceLock<Segment>>();
        for seg in self.segments.iter().filter_map(|s| s.get()) {
            total += seg.len() * std::mem::size_of::<Level>();
            total += seg.iter().map(Level::bytes).sum::<usize>();
        }
        total
    }

    /// Number of keys over all positions.
    pub(crate) fn keys(&self) -> usize {
        self.segments.iter().filter_map(|s| s.get()).flat_map(|seg| seg.iter()).map(Level::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn insert_find_remove_against_a_map() {
        let level = Level::new();
        let guard = epoch::pin();
        let mut model: HashMap<(u64, u32), u32> = HashMap::new();
        let mut x: u64 = 0x1234_5678;
        for step in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // A small key space so removes hit, and small keys to stress clustering.
            let chain = x % 512;
            let group = (x >> 20) as u32 % 3;
            if x % 3 == 0 {
                assert_eq!(level.remove(chain, group, &guard), model.remove(&(chain, group)).is_some());
            } else if let std::collections::hash_map::Entry::Vacant(e) = model.entry((chain, group)) {
                e.insert(step);
                level.insert(chain, group, step, 0, &guard);
                level.slot(chain, group, &guard).unwrap().set(1 << (step % 64));
            }
            assert_eq!(level.len(), model.len());
        }
        for (&(c, g), &id) in &model {
            assert_eq!(level.slot(c, g, &guard).map(|s| s.id()), Some(id));
            assert_eq!(level.bits(c, g, &guard), 1 << (id % 64));
        }
        for &(c, g) in model.keys() {
            assert!(level.remove(c, g, &guard));
        }
        assert_eq!(level.len(), 0);
        assert_eq!(level.bytes(), 0, "an emptied table gives its memory back");
    }
}

//! Per-position hash tables: the part of the index that queries read.
//!
//! Each storage tier has one table per block position. A table maps
//! `(chain hash, worker group)` to a slot holding the entry's id and an
//! atomic 64-bit worker set. Queries take a table's read lock for a probe and
//! read the set atomically; the single writer of an index takes the write lock
//! only to add or remove keys (and to resize), and flips bits under the read lock.
//!
//! Tables use linear probing with backward-shift deletion (no tombstones), grow
//! at 3/4 load and shrink below 1/8, so emptied positions give memory back.

use parking_lot::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Marks an empty slot (entry ids never reach it).
const EMPTY: u32 = u32::MAX;
/// Positions per lazily allocated segment.
const SEGMENT_LEVELS: usize = 256;
/// Smallest non-empty table.
const MIN_CAPACITY: usize = 8;

#[repr(C)]
pub(crate) struct Slot {
    chain: u64,
    bits: AtomicU64,
    id: u32,
    group: u32,
}

impl Slot {
    const fn empty() -> Self {
        Slot {
            chain: 0,
            bits: AtomicU64::new(0),
            id: EMPTY,
            group: 0,
        }
    }

    /// The worker set of this entry's group, read atomically.
    #[inline]
    pub(crate) fn bits(&self) -> u64 {
        self.bits.load(Ordering::Acquire)
    }

    #[inline]
    pub(crate) fn set(&self, mask: u64) {
        self.bits.fetch_or(mask, Ordering::Release);
    }

    #[inline]
    pub(crate) fn clear(&self, mask: u64) {
        self.bits.fetch_and(!mask, Ordering::Release);
    }

    pub(crate) fn id(&self) -> u32 {
        self.id
    }
}

#[inline]
fn home(chain: u64, group: u32, shift: u32) -> usize {
    let key = chain ^ (group as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize
}

/// One position's table.
pub(crate) struct LevelTable {
    slots: Box<[Slot]>,
    len: usize,
    shift: u32,
}

impl LevelTable {
    fn new() -> Self {
        LevelTable {
            slots: Box::default(),
            len: 0,
            shift: 64,
        }
    }

    fn alloc(capacity: usize) -> Box<[Slot]> {
        (0..capacity).map(|_| Slot::empty()).collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<Slot>()
    }

    /// The slot of `(chain, group)`, if present.
    #[inline]
    pub(crate) fn find(&self, chain: u64, group: u32) -> Option<&Slot> {
        if self.len == 0 {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = home(chain, group, self.shift);
        loop {
            let slot = &self.slots[i];
            if slot.id == EMPTY {
                return None;
            }
            if slot.chain == chain && slot.group == group {
                return Some(slot);
            }
            i = (i + 1) & mask;
        }
    }

    /// Adds a key that is not present yet.
    pub(crate) fn insert(&mut self, chain: u64, group: u32, id: u32) {
        debug_assert!(id != EMPTY);
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.resize((self.slots.len() * 2).max(MIN_CAPACITY));
        }
        self.place(chain, group, id, 0);
        self.len += 1;
    }

    fn place(&mut self, chain: u64, group: u32, id: u32, bits: u64) {
        let mask = self.slots.len() - 1;
        let mut i = home(chain, group, self.shift);
        while self.slots[i].id != EMPTY {
            debug_assert!(!(self.slots[i].chain == chain && self.slots[i].group == group));
            i = (i + 1) & mask;
        }
        let slot = &mut self.slots[i];
        slot.chain = chain;
        slot.group = group;
        slot.id = id;
        *slot.bits.get_mut() = bits;
    }

    /// Removes a key; returns whether it was present.
    pub(crate) fn remove(&mut self, chain: u64, group: u32) -> bool {
        if self.len == 0 {
            return false;
        }
        let mask = self.slots.len() - 1;
        let mut i = home(chain, group, self.shift);
        loop {
            let slot = &self.slots[i];
            if slot.id == EMPTY {
                return false;
            }
            if slot.chain == chain && slot.group == group {
                break;
            }
            i = (i + 1) & mask;
        }
        // Backward-shift deletion keeps every probe chain unbroken.
        let mut hole = i;
        let mut j = (i + 1) & mask;
        loop {
            let s = &self.slots[j];
            if s.id == EMPTY {
                break;
            }
            let h = home(s.chain, s.group, self.shift);
            // Move s into the hole if its home is not in (hole, j].
            let movable = if hole <= j {
                h <= hole || h > j
            } else {
                h <= hole && h > j
            };
            if movable {
                let (chain, group, id, bits) =
                    (s.chain, s.group, s.id, s.bits.load(Ordering::Relaxed));
                let dst = &mut self.slots[hole];
                dst.chain = chain;
                dst.group = group;
                dst.id = id;
                *dst.bits.get_mut() = bits;
                hole = j;
            }
            j = (j + 1) & mask;
        }
        let dst = &mut self.slots[hole];
        dst.id = EMPTY;
        *dst.bits.get_mut() = 0;
        self.len -= 1;
        if self.len == 0 {
            *self = LevelTable::new();
        } else if self.slots.len() > MIN_CAPACITY && self.len * 8 < self.slots.len() {
            self.resize((self.slots.len() / 4).max(MIN_CAPACITY));
        }
        true
    }

    fn resize(&mut self, capacity: usize) {
        debug_assert!(capacity.is_power_of_two() && capacity > self.len);
        let old = std::mem::replace(&mut self.slots, Self::alloc(capacity));
        self.shift = 64 - capacity.trailing_zeros();
        for s in old.iter().filter(|s| s.id != EMPTY) {
            self.place(s.chain, s.group, s.id, s.bits.load(Ordering::Relaxed));
        }
    }
}

type Segment = Box<[RwLock<LevelTable>]>;

/// The tables of one tier, one per position, allocated a segment at a time.
pub(crate) struct Levels {
    segments: Box<[OnceLock<Segment>]>,
}

impl Levels {
    /// Room for `depth_max` positions.
    pub(crate) fn new(depth_max: usize) -> Self {
        let n = depth_max.div_ceil(SEGMENT_LEVELS);
        Levels {
            segments: (0..n).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The table at `level`, if its segment exists.
    #[inline]
    pub(crate) fn get(&self, level: usize) -> Option<&RwLock<LevelTable>> {
        let seg = self.segments.get(level / SEGMENT_LEVELS)?.get()?;
        Some(&seg[level % SEGMENT_LEVELS])
    }

    /// The table at `level`, allocating its segment. `level` must be below `depth_max`.
    pub(crate) fn get_or_create(&self, level: usize) -> &RwLock<LevelTable> {
        let seg = self.segments[level / SEGMENT_LEVELS].get_or_init(|| {
            (0..SEGMENT_LEVELS)
                .map(|_| RwLock::new(LevelTable::new()))
                .collect()
        });
        &seg[level % SEGMENT_LEVELS]
    }

    /// Bytes held by tables and segments.
    pub(crate) fn bytes(&self) -> usize {
        let mut total = self.segments.len() * std::mem::size_of::<OnceLock<Segment>>();
        for seg in self.segments.iter().filter_map(|s| s.get()) {
            total += seg.len() * std::mem::size_of::<RwLock<LevelTable>>();
            total += seg.iter().map(|t| t.read().bytes()).sum::<usize>();
        }
        total
    }

    /// Number of keys over all positions.
    pub(crate) fn keys(&self) -> usize {
        self.segments
            .iter()
            .filter_map(|s| s.get())
            .flat_map(|seg| seg.iter())
            .map(|t| t.read().len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn insert_find_remove_against_a_map() {
        let mut t = LevelTable::new();
        let mut model: HashMap<(u64, u32), u32> = HashMap::new();
        let mut x: u64 = 0x1234_5678;
        for step in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // A small key space so removes hit, and sequential-looking keys to stress clustering.
            let chain = x % 512;
            let group = (x >> 20) as u32 % 3;
            if x % 3 == 0 {
                assert_eq!(
                    t.remove(chain, group),
                    model.remove(&(chain, group)).is_some()
                );
            } else if let std::collections::hash_map::Entry::Vacant(e) = model.entry((chain, group))
            {
                e.insert(step);
                t.insert(chain, group, step);
            }
            assert_eq!(t.len(), model.len());
        }
        for (&(c, g), &id) in &model {
            assert_eq!(t.find(c, g).map(|s| s.id()), Some(id));
        }
        let keys: Vec<_> = model.keys().copied().collect();
        for (c, g) in keys {
            assert!(t.remove(c, g));
        }
        assert_eq!(t.len(), 0);
        assert_eq!(t.bytes(), 0, "an emptied table gives its memory back");
    }

    #[test]
    fn bits_survive_resize_and_shift() {
        let mut t = LevelTable::new();
        for i in 0..100u64 {
            t.insert(i, 0, i as u32);
            t.find(i, 0).unwrap().set(1 << (i % 64));
        }
        for i in (0..100u64).step_by(2) {
            assert!(t.remove(i, 0));
        }
        for i in (1..100u64).step_by(2) {
            assert_eq!(t.find(i, 0).unwrap().bits(), 1 << (i % 64));
        }
    }
}

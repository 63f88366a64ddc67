//! Where runs start: the chain hash of a run's first block to the run.
//!
//! A query that leaves a run (its blocks end, or the query's diverge) looks
//! up its next block's chain here to find the run that continues it. Chains
//! name whole prefixes, so one table serves every position; the caller
//! checks the run's start position too.
//!
//! Readers take no lock: the table is a seqlock (its version is odd while
//! the writer moves keys; a probe that saw a change is retried), slots are
//! atomics, and a resized table replaces the old one, which is freed through
//! epochs. Linear probing, backward-shift deletion, growth at 3/4 load,
//! shrinking below 1/8. Only the index's writer mutates it.

use super::reclaim;
use crossbeam::epoch::{self, Atomic, Guard, Owned};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};

const EMPTY: u32 = u32::MAX;
const MIN_CAPACITY: usize = 16;

struct Slot {
    chain: AtomicU64,
    run: AtomicU32,
}

struct Table {
    slots: Box<[Slot]>,
    shift: u32,
}

#[inline]
fn home(chain: u64, shift: u32) -> usize {
    (chain.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize
}

impl Table {
    fn new(capacity: usize) -> Table {
        let slots = (0..capacity).map(|_| Slot { chain: AtomicU64::new(0), run: AtomicU32::new(EMPTY) }).collect();
        Table { slots, shift: 64 - capacity.trailing_zeros() }
    }

    /// The slot index of `chain`; bounded even when read torn.
    fn find(&self, chain: u64) -> Option<usize> {
        let mask = self.slots.len() - 1;
        let mut i = home(chain, self.shift);
        for _ in 0..self.slots.len() {
            let s = &self.slots[i];
            if s.run.load(Ordering::Relaxed) == EMPTY {
                return None;
            }
            if s.chain.load(Ordering::Relaxed) == chain {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
        None
    }

    fn place(&self, chain: u64, run: u32) {
        let mask = self.slots.len() - 1;
        let mut i = home(chain, self.shift);
        while self.slots[i].run.load(Ordering::Relaxed) != EMPTY {
            i = (i + 1) & mask;
        }
        self.slots[i].chain.store(chain, Ordering::Relaxed);
        self.slots[i].run.store(run, Ordering::Relaxed);
    }
}

/// First-block chain -> run.
pub(crate) struct Starts {
    version: AtomicU64,
    table: Atomic<Table>,
    len: AtomicUsize,
}

impl Starts {
    pub(crate) fn new() -> Self {
        Starts { version: AtomicU64::new(0), table: Atomic::null(), len: AtomicUsize::new(0) }
    }

    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// The run whose first block has `chain`. Lock-free.
    #[inline]
    pub(crate) fn get(&self, chain: u64, guard: &Guard) -> Option<u32> {
        loop {
            let v1 = self.version.load(Ordering::Acquire);
            if v1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let t = self.table.load(Ordering::Acquire, guard);
            // SAFETY: tables are freed through `reclaim` only.
            let run = unsafe { t.as_ref() }.and_then(|t| t.find(chain).map(|i| t.slots[i].run.load(Ordering::Relaxed)));
            fence(Ordering::Acquire);
            if self.version.load(Ordering::Relaxed) == v1 {
                return run;
            }
        }
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

    fn current<'g>(&self, guard: &'g Guard) -> Option<&'g Table> {
        // SAFETY: writer only, or a pinned guard.
        unsafe { self.table.load(Ordering::Acquire, guard).as_ref() }
    }

    fn swap(&self, new: Option<Table>, guard: &Guard) {
        let new = new.map_or(epoch::Shared::null(), |t| Owned::new(t).into_shared(guard));
        let v = self.begin();
        let old = self.table.swap(new, Ordering::AcqRel, guard);
        self.end(v);
        // SAFETY: unreachable now; readers still holding it are pinned.
        let bytes = unsafe { old.as_ref() }.map_or(0, |t| t.slots.len() * std::mem::size_of::<Slot>());
        unsafe { reclaim::retire_shared(old, bytes) };
    }

    fn rebuild(&self, capacity: usize, guard: &Guard) {
        let new = Table::new(capacity);
        if let Some(old) = self.current(guard) {
            for s in old.slots.iter() {
                let run = s.run.load(Ordering::Relaxed);
                if run != EMPTY {
                    new.place(s.chain.load(Ordering::Relaxed), run);
                }
            }
        }
        self.swap(Some(new), guard);
    }

    /// Writer only: adds `chain` (not present yet).
    pub(crate) fn insert(&self, chain: u64, run: u32) {
        let guard = epoch::pin();
        let len = self.len();
        let cap = self.current(&guard).map_or(0, |t| t.slots.len());
        if (len + 1) * 4 > cap * 3 {
            self.rebuild((cap * 2).max(MIN_CAPACITY), &guard);
        }
        let t = self.current(&guard).expect("just ensured");
        let v = self.begin();
        t.place(chain, run);
        self.end(v);
        self.len.store(len + 1, Ordering::Relaxed);
    }

    /// Writer only: removes `chain`; whether it was there.
    pub(crate) fn remove(&self, chain: u64) -> bool {
        let guard = epoch::pin();
        let Some(t) = self.current(&guard) else { return false };
        let Some(i) = t.find(chain) else { return false };
        let mask = t.slots.len() - 1;
        let v = self.begin();
        let mut hole = i;
        let mut j = (i + 1) & mask;
        loop {
            let s = &t.slots[j];
            let run = s.run.load(Ordering::Relaxed);
            if run == EMPTY {
                break;
            }
            let c = s.chain.load(Ordering::Relaxed);
            let h = home(c, t.shift);
            let movable = if hole <= j { h <= hole || h > j } else { h <= hole && h > j };
            if movable {
                t.slots[hole].chain.store(c, Ordering::Relaxed);
                t.slots[hole].run.store(run, Ordering::Relaxed);
                hole = j;
            }
            j = (j + 1) & mask;
        }
        t.slots[hole].run.store(EMPTY, Ordering::Relaxed);
        self.end(v);
        let len = self.len() - 1;
        self.len.store(len, Ordering::Relaxed);
        if len == 0 {
            self.swap(None, &guard);
        } else if t.slots.len() > MIN_CAPACITY && len * 8 < t.slots.len() {
            self.rebuild((t.slots.len() / 4).max(MIN_CAPACITY), &guard);
        }
        true
    }

    pub(crate) fn bytes(&self) -> usize {
        // SAFETY: only the writer replaces the table, and it calls this.
        let guard = unsafe { epoch::unprotected() };
        self.current(guard).map_or(0, |t| t.slots.len() * std::mem::size_of::<Slot>())
    }
}

impl Drop for Starts {
    fn drop(&mut self) {
        // SAFETY: exclusive access.
        unsafe {
            let t = self.table.load(Ordering::Relaxed, epoch::unprotected());
            if !t.is_null() {
                drop(t.into_owned());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn insert_get_remove_against_a_map() {
        let s = Starts::new();
        let guard = epoch::pin();
        let mut model: HashMap<u64, u32> = HashMap::new();
        let mut x: u64 = 0x1234_5678;
        for step in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let chain = x % 700;
            if x.is_multiple_of(3) {
                assert_eq!(s.remove(chain), model.remove(&chain).is_some());
            } else if let std::collections::hash_map::Entry::Vacant(e) = model.entry(chain) {
                e.insert(step);
                s.insert(chain, step);
            }
            assert_eq!(s.len(), model.len());
        }
        for (&c, &r) in &model {
            assert_eq!(s.get(c, &guard), Some(r));
        }
        for &c in model.keys() {
            assert!(s.remove(c));
        }
        assert_eq!(s.bytes(), 0, "an emptied table gives its memory back");
    }
}

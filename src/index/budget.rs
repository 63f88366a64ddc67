//! A memory budget shared by every index of a daemon: how many (block,
//! worker) pairs and index entries may be live at once.
//!
//! Pairs are what grows with the cluster (blocks each worker caches times
//! workers), so they are what an operator caps. Entries (one per block,
//! tier and group of 64 workers) are normally far fewer than pairs, but an
//! entry no worker holds stays while it has children (it is their parent in
//! the prefix), so an unlucky removal order could keep many entries for
//! few pairs; the same cap bounds them too, which makes the bound on the
//! index's memory real.
//!
//! Stored pairs cost one compare-and-swap on a shared counter per batch; the
//! counters never pass the cap, so a reader of the gauge sees at most the cap.
//! The index refuses a store that would pass it (see `Writer::store`): the
//! refused block and the rest of its event are counted as shed and never
//! indexed, so queries under-report rather than claim blocks a worker lacks.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live pairs and entries, against one cap.
#[derive(Debug)]
pub struct Budget {
    pairs_max: u64,
    pairs: AtomicU64,
    entries: AtomicU64,
}

impl Budget {
    /// A budget of `pairs_max` pairs (and as many entries); 0 means no cap.
    pub fn new(pairs_max: u64) -> Budget {
        let pairs_max = if pairs_max == 0 { u64::MAX } else { pairs_max };
        Budget { pairs_max, pairs: AtomicU64::new(0), entries: AtomicU64::new(0) }
    }

    /// No cap: what an index gets when nobody shares one with it.
    pub fn unlimited() -> Budget {
        Budget::new(0)
    }

    /// The cap, or None when there is none.
    pub fn pairs_max(&self) -> Option<u64> {
        (self.pairs_max != u64::MAX).then_some(self.pairs_max)
    }

    /// Live (block, worker) pairs in every index sharing this budget.
    pub fn pairs(&self) -> u64 {
        self.pairs.load(Ordering::Relaxed)
    }

    /// Live index entries in every index sharing this budget.
    pub fn entries(&self) -> u64 {
        self.entries.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    fn take(counter: &AtomicU64, max: u64) -> bool {
        counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < max).then_some(n + 1)).is_ok()
    }

    fn take_up_to(counter: &AtomicU64, max: u64, n: u64) -> u64 {
        match counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| (c < max).then(|| c + n.min(max - c))) {
            Ok(before) => n.min(max - before),
            Err(_) => 0,
        }
    }

    /// Takes room for one pair; false when the cap is reached.
    #[cfg(test)]
    pub(crate) fn take_pair(&self) -> bool {
        Self::take(&self.pairs, self.pairs_max)
    }

    /// Takes room for up to `n` pairs in one step; returns how many it got.
    pub(crate) fn take_pairs(&self, n: u64) -> u64 {
        Self::take_up_to(&self.pairs, self.pairs_max, n)
    }

    /// Takes room for one entry; false when the cap is reached.
    #[cfg(test)]
    pub(crate) fn take_entry(&self) -> bool {
        Self::take(&self.entries, self.pairs_max)
    }

    /// Takes room for up to `n` entries in one step; returns how many it got.
    pub(crate) fn take_entries(&self, n: u64) -> u64 {
        Self::take_up_to(&self.entries, self.pairs_max, n)
    }

    pub(crate) fn release_pairs(&self, n: u64) {
        if n > 0 {
            let before = self.pairs.fetch_sub(n, Ordering::Relaxed);
            debug_assert!(before >= n, "released more pairs than taken");
        }
    }

    pub(crate) fn release_entries(&self, n: u64) {
        if n > 0 {
            let before = self.entries.fetch_sub(n, Ordering::Relaxed);
            debug_assert!(before >= n, "released more entries than taken");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_passes_the_cap_and_frees_room() {
        let b = Budget::new(3);
        assert_eq!(b.pairs_max(), Some(3));
        assert!((0..3).all(|_| b.take_pair()));
        assert!(!b.take_pair(), "the fourth pair is refused");
        assert_eq!(b.pairs(), 3);
        b.release_pairs(2);
        assert!(b.take_pair() && b.take_pair() && !b.take_pair());
        assert!(b.take_entry() && b.take_entry() && b.take_entry() && !b.take_entry());
        b.release_entries(1);
        assert_eq!(b.entries(), 2);
        assert_eq!(b.take_entries(5), 1, "a batch gets what is left");
        assert_eq!(b.take_entries(5), 0);
        b.release_pairs(3);
        assert_eq!(b.take_pairs(2), 2);
    }

    #[test]
    fn zero_means_no_cap() {
        let b = Budget::new(0);
        assert_eq!(b.pairs_max(), None);
        assert!((0..10_000).all(|_| b.take_pair()));
    }
}

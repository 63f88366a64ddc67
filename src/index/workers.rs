//! The workers of one index: ids to dense slots, each slot's writer state
//! behind a lock of its own, and the windows its events change bits in.
//!
//! Slot `s` is bit `s % 64` of group `s / 64`; a worker gets the lowest free
//! slot. Events of one worker lock only that worker's state (and the tree,
//! briefly), so writers of different workers work side by side. Every
//! change of a worker's bits is made inside a `Window` of its worker that
//! either only sets bits or only clears them, whose sequences readers
//! check (`slots::Versions`); the table that readers use to name slots is
//! republished on every change.

use super::records::Records;
use super::slots::{PublishedSlots, SlotTable, Versions, Way, GROUP_BEGIN, GROUP_BITS, GROUP_END, SLOTS_MAX};
use crate::event::WorkerId;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What the writer keeps per worker.
pub(crate) struct WorkerState {
    pub id: WorkerId,
    pub slot: u32,
    /// Per tier, engine hash -> block id: what Removed events name.
    pub records: [Records; 4],
    /// Per (tier, block) the worker holds under more than one engine hash
    /// (rare: engines name one content with one hash), how many extra hashes.
    pub aliases: FxHashMap<(u8, u32), u32>,
    /// The window sequences of the worker's group, which readers check.
    versions: Arc<Versions>,
}

/// While alive, the worker's bits may be changing one way (`Way`): that
/// way's sequence of its slot is odd. Opened and closed under the tree
/// lock only, so a reader that holds the lock sees no window open.
pub(crate) struct Window {
    versions: Arc<Versions>,
    bit: usize,
    way: usize,
}

impl Window {
    pub(crate) fn open(st: &WorkerState, way: Way) -> Window {
        let (bit, way) = ((st.slot % GROUP_BITS) as usize, way as usize);
        // The group's word first, so that it counts a window open whenever
        // a slot's sequence is odd.
        st.versions.group[way].fetch_add(GROUP_BEGIN, Ordering::AcqRel);
        st.versions.slots[bit][way].fetch_add(1, Ordering::AcqRel);
        super::pause::point();
        Window { versions: st.versions.clone(), bit, way }
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        self.versions.slots[self.bit][self.way].fetch_add(1, Ordering::AcqRel);
        self.versions.group[self.way].fetch_add(GROUP_END, Ordering::AcqRel);
        super::pause::point();
    }
}

impl WorkerState {
    /// Bytes of the worker's records and aliases.
    pub(crate) fn bytes(&self) -> usize {
        self.records.iter().map(Records::bytes).sum::<usize>()
            + self.aliases.capacity() * 16
            + std::mem::size_of::<WorkerState>()
    }
}

/// One slot's state: `None` while the slot is free.
pub(crate) type Cell = Arc<Mutex<Option<WorkerState>>>;

/// A worker found or placed: its slot and state.
pub(crate) struct Handle {
    pub cell: Cell,
}

#[derive(Default)]
pub(crate) struct Workers {
    slot_of: FxHashMap<WorkerId, u32>,
    cells: Vec<Cell>,
    free_slots: BTreeSet<u32>,
    versions: Vec<Arc<Versions>>,
    /// Per slot, when its worker was placed there (a count of placements).
    placed: Vec<u64>,
    placements: u64,
}

impl Workers {
    pub(crate) fn lookup(&self, worker: WorkerId) -> Option<Handle> {
        let &slot = self.slot_of.get(&worker)?;
        Some(self.handle(slot))
    }

    fn handle(&self, slot: u32) -> Handle {
        Handle { cell: self.cells[slot as usize].clone() }
    }

    /// The worker's slot, placing it in the lowest free one; None when full.
    pub(crate) fn place(&mut self, slots: &PublishedSlots, worker: WorkerId) -> Option<Handle> {
        if let Some(h) = self.lookup(worker) {
            return Some(h);
        }
        let slot = match self.free_slots.pop_first() {
            Some(s) => s,
            None if (self.cells.len() as u32) < SLOTS_MAX => {
                self.cells.push(Arc::new(Mutex::new(None)));
                (self.cells.len() - 1) as u32
            }
            None => return None,
        };
        while self.versions.len() * (GROUP_BITS as usize) < self.cells.len() {
            self.versions.push(Arc::new(Versions::new()));
        }
        self.placements += 1;
        self.placed.resize(self.cells.len(), 0);
        self.placed[slot as usize] = self.placements;
        *self.cells[slot as usize].lock() = Some(WorkerState {
            id: worker,
            slot,
            records: Default::default(),
            aliases: FxHashMap::default(),
            versions: self.versions[(slot / GROUP_BITS) as usize].clone(),
        });
        self.slot_of.insert(worker, slot);
        self.publish(slots);
        Some(self.handle(slot))
    }

    /// Frees the worker's slot; its state must be cleared and set to None.
    pub(crate) fn release(&mut self, slots: &PublishedSlots, worker: WorkerId) {
        let Some(slot) = self.slot_of.remove(&worker) else { return };
        self.free_slots.insert(slot);
        while let Some(&last) = self.free_slots.last() {
            if last as usize + 1 != self.cells.len() {
                break;
            }
            self.free_slots.remove(&last);
            self.cells.pop();
        }
        self.placed.truncate(self.cells.len());
        if self.cells.len() * 4 < self.cells.capacity() {
            self.cells.shrink_to_fit();
        }
        self.publish(slots);
    }

    fn publish(&self, slots: &PublishedSlots) {
        let groups = self.cells.len().div_ceil(GROUP_BITS as usize);
        // Versions are never dropped: a reader holding an older table must see
        // the same counters the writers bump.
        let mut table = SlotTable {
            workers: vec![None; groups * GROUP_BITS as usize],
            live: vec![0; groups],
            versions: self.versions[..groups].to_vec(),
            placed: vec![0; groups * GROUP_BITS as usize],
        };
        table.placed[..self.placed.len()].copy_from_slice(&self.placed);
        for (&id, &slot) in &self.slot_of {
            table.workers[slot as usize] = Some(id);
            table.live[(slot / GROUP_BITS) as usize] |= 1 << (slot % GROUP_BITS);
        }
        slots.publish(table);
    }

    /// Every worker, by id.
    pub(crate) fn ids(&self) -> Vec<WorkerId> {
        let mut v: Vec<WorkerId> = self.slot_of.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Every slot's state, in slot order.
    pub(crate) fn cells(&self) -> Vec<Cell> {
        self.cells.clone()
    }

    pub(crate) fn len(&self) -> usize {
        self.slot_of.len()
    }

    pub(crate) fn bytes(&self) -> usize {
        self.cells.capacity() * 8 + self.slot_of.capacity() * 24 + self.versions.len() * std::mem::size_of::<Versions>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot that went to another worker and came back still tells a
    /// reader holding the first table that its worker was placed anew.
    #[test]
    fn a_slot_placed_again_is_not_kept() {
        let slots = PublishedSlots::new();
        let mut workers = Workers::default();
        let (a, b) = (WorkerId::new(1, 0), WorkerId::new(2, 0));
        let guard = crossbeam::epoch::pin();
        let table_of = |slots: &PublishedSlots| slots.read(&guard, |t| t.clone());
        workers.place(&slots, a).expect("room");
        let first = table_of(&slots);
        workers.place(&slots, b).expect("room");
        assert!(table_of(&slots).kept_since(&first, a), "a kept its slot while b came");
        for w in [a, b] {
            *workers.lookup(w).expect("placed").cell.lock() = None;
            workers.release(&slots, w);
        }
        workers.place(&slots, b).expect("room");
        *workers.lookup(b).expect("placed").cell.lock() = None;
        workers.release(&slots, b);
        workers.place(&slots, a).expect("room");
        let now = table_of(&slots);
        assert_eq!(now.slot_of(a), first.slot_of(a), "a is back in its old slot");
        assert!(!now.kept_since(&first, a), "but was placed there anew");
        assert!(!now.kept_since(&first, b), "b is gone");
    }
}

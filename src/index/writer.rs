//! Applying events: the only code that changes an index.
//!
//! One writer at a time per index (the index's writer lock). For each worker
//! the writer keeps, per tier, its records (engine hash -> entry). For each
//! entry it keeps the workers that *hold* the block (`Entry::held`). The
//! query-visible set of a device entry is narrower: the workers that *reach*
//! it, i.e. hold it and, recursively, its parent. Reach is what makes jump
//! search exact: a worker in the set at position `i` holds the whole query
//! prefix up to `i`, so skipped positions need no check.
//!
//! Removing a device block a worker reaches detaches the worker from every
//! descendant it holds (they stay held, not reached); storing or re-storing
//! the parent reattaches them. Lower tiers have no reach: their query-visible
//! set is the held set and queries walk them position by position.
//!
//! An entry with no holder is freed at once, unless it still has children
//! (it is their structural parent); it is freed when its last child goes.

use super::budget::Budget;
use super::chain;
use super::level::Levels;
use super::records::Records;
use super::slab::{Entry, Slab, NIL};
use super::slots::{PublishedSlots, SlotTable, Versions, GROUP_BITS, SLOTS_MAX};
use super::ApplyOutcome;
use crate::event::{StorageTier, StoredBlock, WorkerId};
use crossbeam::epoch;
use rustc_hash::FxHashMap;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const DEVICE: usize = StorageTier::Device as usize;

/// What the writer keeps per worker slot.
pub(crate) struct WorkerState {
    pub id: WorkerId,
    pub records: [Records; 4],
    /// Device blocks the worker holds but does not reach.
    pub detached: u64,
    /// Per entry the worker holds under more than one engine hash (rare:
    /// engines name one content with one hash), how many extra hashes.
    pub aliases: FxHashMap<u32, u32>,
}

/// Everything shared between the writer and readers.
pub(crate) struct Shared {
    pub levels: [Levels; 4],
    pub slots: PublishedSlots,
    /// Live (block, worker) pairs per tier; queries skip empty lower tiers.
    pub tier_pairs: [AtomicU64; 4],
    pub depth_max: usize,
    /// Pairs and entries every index of the daemon may hold (see `budget`).
    pub budget: Arc<Budget>,
}

#[derive(Default)]
pub(crate) struct Writer {
    pub slab: Slab,
    pub slot_of: FxHashMap<WorkerId, u32>,
    pub workers: Vec<Option<WorkerState>>,
    free_slots: BTreeSet<u32>,
    versions: Vec<Arc<Versions>>,
    pub pairs: u64,
}

/// Where an entry sits: tier, position, chain hash, worker group.
#[derive(Clone, Copy)]
struct Key {
    tier: usize,
    level: u32,
    chain: u64,
    group: u16,
}

/// Why no entry could be made for a stored block.
enum NoEntry {
    /// The shared budget's cap is reached: shed, for now.
    Budget,
    /// The index's entry ids are exhausted.
    Full,
}

#[inline]
fn split(slot: u32) -> (u16, u64) {
    ((slot / GROUP_BITS) as u16, 1u64 << (slot % GROUP_BITS))
}

impl Writer {
    fn publish(&mut self, shared: &Shared) {
        let groups = self.workers.len().div_ceil(GROUP_BITS as usize);
        while self.versions.len() < groups {
            self.versions.push(Arc::new(std::array::from_fn(|_| AtomicU64::new(0))));
        }
        // Versions are never dropped: a reader holding an older table must see
        // the same counters the writer bumps.
        let mut table = SlotTable {
            workers: Vec::with_capacity(groups * 64),
            live: vec![0; groups],
            versions: self.versions[..groups].to_vec(),
        };
        for (slot, w) in self.workers.iter().enumerate() {
            table.workers.push(w.as_ref().map(|w| w.id));
            if w.is_some() {
                table.live[slot / 64] |= 1 << (slot % 64);
            }
        }
        shared.slots.publish(table);
    }

    /// The worker's slot, allocating one; None when the index is full.
    pub(crate) fn slot(&mut self, shared: &Shared, worker: WorkerId) -> Option<u32> {
        if let Some(&s) = self.slot_of.get(&worker) {
            return Some(s);
        }
        let slot = match self.free_slots.pop_first() {
            Some(s) => s,
            None if (self.workers.len() as u32) < SLOTS_MAX => {
                self.workers.push(None);
                (self.workers.len() - 1) as u32
            }
            None => return None,
        };
        self.workers[slot as usize] =
            Some(WorkerState { id: worker, records: Default::default(), detached: 0, aliases: FxHashMap::default() });
        self.slot_of.insert(worker, slot);
        self.publish(shared);
        Some(slot)
    }

    /// Marks the start (odd) or end (even) of an event of the worker in `slot`.
    pub(crate) fn bump(&self, slot: u32) {
        let v = &self.versions[(slot / GROUP_BITS) as usize][(slot % GROUP_BITS) as usize];
        v.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn slot_of(&self, worker: WorkerId) -> Option<u32> {
        self.slot_of.get(&worker).copied()
    }

    fn state(&mut self, slot: u32) -> &mut WorkerState {
        self.workers[slot as usize].as_mut().expect("slot in use")
    }

    /// The query-visible bit of `id` for `bit`.
    fn visible(&self, shared: &Shared, id: u32, bit: u64) -> bool {
        let e = self.slab.get(id);
        let guard = epoch::pin();
        let level = shared.levels[e.tier as usize].get(e.level as usize).expect("entry's level exists");
        level.slot(e.chain, e.group as u32, &guard).is_some_and(|s| s.bits() & bit != 0)
    }

    fn set_visible(&self, shared: &Shared, id: u32, bit: u64, on: bool) {
        let e = self.slab.get(id);
        let guard = epoch::pin();
        let level = shared.levels[e.tier as usize].get(e.level as usize).expect("entry's level exists");
        let slot = level.slot(e.chain, e.group as u32, &guard).expect("entry has a slot");
        if on {
            slot.set(bit)
        } else {
            slot.clear(bit);
        }
    }

    /// Withdraws the worker's visible bit from `id` in one probe; returns
    /// whether it was set.
    fn take_visible(&self, shared: &Shared, id: u32, bit: u64) -> bool {
        let e = self.slab.get(id);
        let guard = epoch::pin();
        let level = shared.levels[e.tier as usize].get(e.level as usize).expect("entry's level exists");
        let slot = level.slot(e.chain, e.group as u32, &guard).expect("entry has a slot");
        slot.clear(bit) & bit != 0
    }

    /// Finds the entry of a stored block's parent for this worker: the same
    /// tier first; a lower-tier block may also hang off a block the worker
    /// holds in another tier. A device block needs a device parent.
    fn parent_entry(&self, slot: u32, tier: usize, engine_hash: u64) -> Option<u32> {
        let st = self.workers[slot as usize].as_ref()?;
        if let Some(id) = st.records[tier].get(engine_hash) {
            return Some(id);
        }
        if tier == DEVICE {
            return None;
        }
        (0..4).filter(|&t| t != tier).find_map(|t| st.records[t].get(engine_hash))
    }

    /// The entry at `key`, created (with `local`, `parent` and visible
    /// `bits`) if absent; the flag says whether it was created.
    fn entry_at(
        &mut self,
        shared: &Shared,
        key: Key,
        local: u64,
        parent: u32,
        bits: u64,
    ) -> Result<(u32, bool), NoEntry> {
        let Key { tier, level, chain, group } = key;
        let guard = epoch::pin();
        let table = shared.levels[tier].get_or_create(level as usize);
        if let Some(s) = table.slot(chain, group as u32, &guard) {
            return Ok((s.id(), false));
        }
        if !shared.budget.take_entry() {
            return Err(NoEntry::Budget);
        }
        let entry = Entry {
            chain,
            local,
            held: 0,
            parent,
            level,
            first_child: NIL,
            next_sibling: NIL,
            prev_sibling: NIL,
            group,
            tier: tier as u8,
        };
        let Some(id) = self.slab.alloc(entry) else {
            shared.budget.release_entries(1);
            return Err(NoEntry::Full);
        };
        table.insert(chain, group as u32, id, bits, &guard);
        if parent != NIL {
            let head = self.slab.get(parent).first_child;
            if head != NIL {
                self.slab.get_mut(head).prev_sibling = id;
            }
            self.slab.get_mut(id).next_sibling = head;
            self.slab.get_mut(parent).first_child = id;
        }
        Ok((id, true))
    }

    /// Frees `id` and then its ancestors while they have no holder and no child.
    fn reclaim(&mut self, shared: &Shared, mut id: u32) {
        while id != NIL {
            let e = *self.slab.get(id);
            if e.held != 0 || e.first_child != NIL {
                return;
            }
            let guard = epoch::pin();
            let removed =
                shared.levels[e.tier as usize].get_or_create(e.level as usize).remove(e.chain, e.group as u32, &guard);
            debug_assert!(removed, "entry had a slot");
            if e.prev_sibling != NIL {
                self.slab.get_mut(e.prev_sibling).next_sibling = e.next_sibling;
            } else if e.parent != NIL {
                self.slab.get_mut(e.parent).first_child = e.next_sibling;
            }
            if e.next_sibling != NIL {
                self.slab.get_mut(e.next_sibling).prev_sibling = e.prev_sibling;
            }
            self.slab.free(id);
            shared.budget.release_entries(1);
            id = e.parent;
        }
    }

    /// Makes `id` reached by `bit`, then every held-but-detached device descendant.
    fn attach(&mut self, shared: &Shared, slot: u32, id: u32, bit: u64) {
        self.set_visible(shared, id, bit, true);
        if self.state(slot).detached == 0 {
            return;
        }
        let mut stack = vec![id];
        while let Some(p) = stack.pop() {
            let mut c = self.slab.get(p).first_child;
            while c != NIL {
                let e = *self.slab.get(c);
                if e.tier as usize == DEVICE && e.held & bit != 0 && !self.visible(shared, c, bit) {
                    self.set_visible(shared, c, bit, true);
                    self.state(slot).detached -= 1;
                    stack.push(c);
                }
                c = e.next_sibling;
            }
        }
    }

    /// Withdraws reach of `bit` from every device descendant of `id`.
    fn detach_descendants(&mut self, shared: &Shared, slot: u32, id: u32, bit: u64) {
        let mut stack = vec![id];
        while let Some(p) = stack.pop() {
            let mut c = self.slab.get(p).first_child;
            while c != NIL {
                let e = *self.slab.get(c);
                if e.tier as usize == DEVICE && e.held & bit != 0 && self.take_visible(shared, c, bit) {
                    self.state(slot).detached += 1;
                    stack.push(c);
                }
                c = e.next_sibling;
            }
        }
    }

    pub(crate) fn store(
        &mut self,
        shared: &Shared,
        worker: WorkerId,
        tier: StorageTier,
        parent: Option<u64>,
        blocks: &[StoredBlock],
        out: &mut ApplyOutcome,
    ) {
        let tier = tier as usize;
        let Some(slot) = self.slot(shared, worker) else {
            out.rejected += blocks.len() as u32;
            return;
        };
        let (group, bit) = split(slot);
        let (mut parent_id, mut level, mut parent_chain) = match parent {
            None => (NIL, 0u32, None),
            Some(h) => match self.parent_entry(slot, tier, h) {
                Some(p) => {
                    let e = self.slab.get(p);
                    (p, e.level + 1, Some(e.chain))
                }
                None => {
                    out.unknown_parent += blocks.len() as u32;
                    return;
                }
            },
        };
        // Whether the worker reaches the parent; after the first block it is
        // known from the block before, with no probe.
        let mut parent_reached = tier != DEVICE || self.parent_reached(shared, parent_id, bit);
        let mut added = 0u64;
        for (k, b) in blocks.iter().enumerate() {
            if level as usize >= shared.depth_max {
                out.depth_exceeded += (blocks.len() - k) as u32;
                break;
            }
            let chain = parent_chain.map_or(b.local_hash, |pc| chain::next(pc, b.local_hash));
            let previous = self.state(slot).records[tier].get(b.engine_hash);
            if let Some(old) = previous {
                let e = self.slab.get(old);
                if e.chain == chain && e.level == level {
                    out.duplicate += 1;
                    if tier == DEVICE {
                        let reached = self.visible(shared, old, bit);
                        if !reached && parent_reached {
                            self.state(slot).detached -= 1;
                            self.attach(shared, slot, old, bit);
                        }
                        parent_reached = reached || parent_reached;
                    }
                    parent_id = old;
                    parent_chain = Some(chain);
                    level += 1;
                    continue;
                }
            }
            // A new entry starts with the worker's bit when the worker can see it.
            // The engine reused a hash for other content (rare): the old block
            // goes, which may detach this block's ancestors, so visibility is
            // decided after that removal.
            let reuse = previous.is_some();
            let mut visible_now = tier != DEVICE || parent_reached;
            let key = Key { tier, level, chain, group };
            let bits = if visible_now && !reuse { bit } else { 0 };
            // Room for the new pair first (an alias gives it back below), so
            // at the cap nothing is allocated for a block that is refused.
            let entry = if shared.budget.take_pair() {
                self.entry_at(shared, key, b.local_hash, parent_id, bits).inspect_err(|_| {
                    shared.budget.release_pairs(1);
                })
            } else {
                Err(NoEntry::Budget)
            };
            let (id, created) = match entry {
                Ok(found) => found,
                Err(why) => {
                    if reuse {
                        // The engine reused the hash for content we cannot
                        // place: the old block is gone all the same.
                        self.remove_pair(shared, slot, tier, b.engine_hash);
                    }
                    let rest = (blocks.len() - k) as u32;
                    match why {
                        NoEntry::Budget => out.shed += rest,
                        NoEntry::Full => out.rejected += rest,
                    }
                    break;
                }
            };
            // Same block under a second engine hash of this worker: an alias.
            let alias = !created && self.slab.get(id).held & bit != 0;
            // Holding the new entry first pins it (and its parent) against the
            // reclaim below, which may free the old block and its ancestors.
            self.slab.get_mut(id).held |= bit;
            if reuse {
                self.remove_pair(shared, slot, tier, b.engine_hash);
                visible_now = tier != DEVICE || self.parent_reached(shared, parent_id, bit);
            }
            self.state(slot).records[tier].insert(b.engine_hash, id);
            if alias {
                shared.budget.release_pairs(1);
                *self.state(slot).aliases.entry(id).or_insert(0) += 1;
                out.duplicate += 1;
                if tier == DEVICE {
                    parent_reached = self.visible(shared, id, bit);
                }
                parent_id = id;
                parent_chain = Some(chain);
                level += 1;
                continue;
            }
            self.pairs += 1;
            added += 1;
            if !visible_now {
                self.state(slot).detached += 1;
            } else if !created || reuse {
                // A new entry got the bit at insertion and has no children yet;
                // an existing one needs the bit, and on the device tier may
                // have held-but-detached children to reattach.
                self.attach_or_set(shared, slot, id, bit, tier == DEVICE);
            }
            if tier == DEVICE {
                parent_reached = visible_now;
            }
            out.stored += 1;
            parent_id = id;
            parent_chain = Some(chain);
            level += 1;
        }
        shared.tier_pairs[tier].fetch_add(added, Ordering::Relaxed);
        #[cfg(debug_assertions)]
        self.check_reach(shared, slot);
    }

    /// Debug builds: a device block is visible to the worker exactly when it
    /// holds it and its parent is visible (or it sits at position 0).
    #[cfg(debug_assertions)]
    pub(crate) fn check_reach(&self, shared: &Shared, slot: u32) {
        let (_, bit) = split(slot);
        let Some(st) = self.workers[slot as usize].as_ref() else { return };
        // Bounded so debug runs of big workloads stay usable.
        if st.records[DEVICE].iter().count() > 4096 {
            return;
        }
        for (h, id) in st.records[DEVICE].iter() {
            let e = self.slab.get(id);
            let parent_ok =
                e.parent == NIL || (self.slab.get(e.parent).held & bit != 0 && self.visible(shared, e.parent, bit));
            assert_eq!(
                self.visible(shared, id, bit),
                parent_ok && e.held & bit != 0,
                "reach of block {h} at level {}",
                e.level
            );
        }
    }

    /// Sets the worker's visible bit on `id`; on the device tier also
    /// reattaches held-but-detached descendants.
    fn attach_or_set(&mut self, shared: &Shared, slot: u32, id: u32, bit: u64, device: bool) {
        if device {
            self.attach(shared, slot, id, bit);
        } else {
            self.set_visible(shared, id, bit, true);
        }
    }

    fn parent_reached(&self, shared: &Shared, parent_id: u32, bit: u64) -> bool {
        parent_id == NIL || self.visible(shared, parent_id, bit)
    }

    /// Drops one (block, worker) pair; false if the worker has no such block.
    pub(crate) fn remove_pair(&mut self, shared: &Shared, slot: u32, tier: usize, engine_hash: u64) -> bool {
        let Some(id) = self.state(slot).records[tier].remove(engine_hash) else {
            return false;
        };
        let (_, bit) = split(slot);
        let st = self.state(slot);
        if let Some(extra) = st.aliases.get_mut(&id) {
            // Another engine hash of this worker still names the block.
            *extra -= 1;
            if *extra == 0 {
                st.aliases.remove(&id);
            }
            return true;
        }
        self.pairs -= 1;
        shared.budget.release_pairs(1);
        shared.tier_pairs[tier].fetch_sub(1, Ordering::Relaxed);
        if tier == DEVICE {
            if self.take_visible(shared, id, bit) {
                self.detach_descendants(shared, slot, id, bit);
            } else {
                self.state(slot).detached -= 1;
            }
        } else {
            self.set_visible(shared, id, bit, false);
        }
        self.slab.get_mut(id).held &= !bit;
        self.reclaim(shared, id);
        true
    }

    pub(crate) fn remove(
        &mut self,
        shared: &Shared,
        worker: WorkerId,
        tier: StorageTier,
        hashes: &[u64],
        out: &mut ApplyOutcome,
    ) {
        let Some(&slot) = self.slot_of.get(&worker) else {
            out.unknown_removed += hashes.len() as u32;
            return;
        };
        for &h in hashes {
            if self.remove_pair(shared, slot, tier as usize, h) {
                out.removed += 1;
            } else {
                out.unknown_removed += 1;
            }
        }
    }

    /// Drops every block of the worker; returns how many pairs went.
    pub(crate) fn clear(&mut self, shared: &Shared, worker: WorkerId) -> u64 {
        let Some(&slot) = self.slot_of.get(&worker) else {
            return 0;
        };
        let (_, bit) = split(slot);
        let mut dropped = 0;
        for tier in 0..4 {
            let mut records = self.state(slot).records[tier].take();
            if !self.state(slot).aliases.is_empty() {
                records.sort_unstable_by_key(|&(_, id)| id);
                records.dedup_by_key(|&mut (_, id)| id);
            }
            // Clear every bit first so no cascade walks blocks about to go anyway.
            for &(_, id) in &records {
                self.set_visible(shared, id, bit, false);
                self.slab.get_mut(id).held &= !bit;
            }
            for &(_, id) in &records {
                // An earlier reclaim may already have freed it as an ancestor.
                if self.slab.is_live(id) {
                    self.reclaim(shared, id);
                }
            }
            shared.tier_pairs[tier].fetch_sub(records.len() as u64, Ordering::Relaxed);
            dropped += records.len() as u64;
        }
        self.pairs -= dropped;
        shared.budget.release_pairs(dropped);
        let st = self.state(slot);
        st.detached = 0;
        st.aliases = FxHashMap::default();
        dropped
    }

    /// Clears the worker and recycles its slot.
    pub(crate) fn remove_worker(&mut self, shared: &Shared, worker: WorkerId) -> bool {
        let Some(slot) = self.slot_of(worker) else {
            return false;
        };
        self.bump(slot);
        self.clear(shared, worker);
        self.bump(slot);
        let slot = self.slot_of.remove(&worker).expect("checked above");
        self.workers[slot as usize] = None;
        self.free_slots.insert(slot);
        while matches!(self.workers.last(), Some(None)) {
            self.workers.pop();
            self.free_slots.remove(&(self.workers.len() as u32));
        }
        if self.workers.len() * 4 < self.workers.capacity() {
            self.workers.shrink_to_fit();
        }
        self.publish(shared);
        true
    }

    pub(crate) fn records_bytes(&self) -> usize {
        self.workers
            .iter()
            .flatten()
            .map(|w| {
                w.records.iter().map(Records::bytes).sum::<usize>()
                    + w.aliases.capacity() * 16
                    + std::mem::size_of::<WorkerState>()
            })
            .sum::<usize>()
            + self.workers.capacity() * std::mem::size_of::<Option<WorkerState>>()
    }
}

//! Applying events: the only code that changes an index.
//!
//! One writer at a time per index (the index's writer lock), and one
//! worker's events in order. Per worker slot the writer keeps, per tier,
//! its records (engine hash -> block id): the one structure a Removed event
//! needs. Who holds a block is said once more, for queries, by the worker's
//! bit in the members of the block's run; the two always agree.
//!
//! A store walks from the parent block: blocks that exist already only get
//! the worker's bit (a range at a time along a run); the first block that
//! does not exist, and every one after it, is created in one go: appended to
//! the parent's run when the parent is its last block, else as a new run.
//! A remove clears the worker's bits (a range at a time) and trims the runs
//! it touched (`tree`).

use super::blocks::NIL;
use super::chain;
use super::records::Records;
use super::slots::{SlotTable, Versions, GROUP_BITS, SLOTS_MAX};
use super::tree::{Holder, Shared, Tree};
use super::ApplyOutcome;
use crate::event::{StorageTier, StoredBlock, WorkerId};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const DEVICE: usize = StorageTier::Device as usize;
/// How many records ahead a batch asks the cache for.
const PREFETCH_AHEAD: usize = 8;

/// What the writer keeps per worker slot.
pub(crate) struct WorkerState {
    pub id: WorkerId,
    pub records: [Records; 4],
    /// Per (tier, block) the worker holds under more than one engine hash
    /// (rare: engines name one content with one hash), how many extra hashes.
    pub aliases: FxHashMap<(u8, u32), u32>,
}

#[derive(Default)]
pub(crate) struct Writer {
    pub tree: Tree,
    pub slot_of: FxHashMap<WorkerId, u32>,
    pub workers: Vec<Option<WorkerState>>,
    free_slots: BTreeSet<u32>,
    versions: Vec<Arc<Versions>>,
    pub pairs: u64,
}

#[inline]
pub(crate) fn split(slot: u32) -> (u32, u64) {
    (slot / GROUP_BITS, 1u64 << (slot % GROUP_BITS))
}

/// Consecutive blocks of one run whose bit changes together.
struct Range {
    run: u32,
    a: u32,
    b: u32,
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
            Some(WorkerState { id: worker, records: Default::default(), aliases: FxHashMap::default() });
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

    /// The block a stored block's parent names for this worker: the same
    /// tier first; a lower-tier block may also hang off a block the worker
    /// holds in another tier. A device block needs a device parent.
    fn parent_block(&self, slot: u32, tier: usize, engine_hash: u64) -> Option<u32> {
        let st = self.workers[slot as usize].as_ref()?;
        if let Some(id) = st.records[tier].get(engine_hash) {
            return Some(id);
        }
        if tier == DEVICE {
            return None;
        }
        (0..4).filter(|&t| t != tier).find_map(|t| st.records[t].get(engine_hash))
    }

    /// Whether the worker's bit is set on block `id` in `tier`.
    fn holds(&self, shared: &Shared, id: u32, tier: usize, group: u32, bit: u64) -> bool {
        let (run, off) = self.tree.locate(id);
        self.tree.members(shared, run, tier).is_some_and(|m| m.holds(group, bit, off))
    }

    fn flush(&mut self, shared: &Shared, range: &mut Option<Range>, who: Holder, on: bool) {
        if let Some(r) = range.take() {
            self.tree.mark(shared, r.run, who, r.a, r.b, on);
        }
    }

    /// Adds block `id` to the pending range, flushing the range when `id`
    /// does not extend it.
    fn extend(&mut self, shared: &Shared, range: &mut Option<Range>, id: u32, who: Holder, on: bool) {
        let (run, off) = self.tree.locate(id);
        if let Some(r) = range {
            if r.run == run && r.b == off {
                r.b += 1;
                return;
            }
            if r.run == run && off + 1 == r.a {
                r.a -= 1;
                return;
            }
        }
        self.flush(shared, range, who, on);
        *range = Some(Range { run, a: off, b: off + 1 });
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
        let holder = Holder { tier, group, bit };
        let (mut cur, mut pos, mut pchain) = match parent {
            None => (NIL, 0u32, None),
            Some(h) => match self.parent_block(slot, tier, h) {
                Some(p) => (p, self.tree.position(shared, p) + 1, Some(self.tree.chain(shared, p))),
                None => {
                    out.unknown_parent += blocks.len() as u32;
                    return;
                }
            },
        };
        for b in blocks.iter().take(PREFETCH_AHEAD) {
            self.state(slot).records[tier].prefetch(b.engine_hash);
        }
        let mut range: Option<Range> = None;
        let mut k = 0;
        while k < blocks.len() {
            if let Some(b) = blocks.get(k + PREFETCH_AHEAD) {
                self.state(slot).records[tier].prefetch(b.engine_hash);
            }
            if pos as usize >= shared.depth_max {
                out.depth_exceeded += (blocks.len() - k) as u32;
                break;
            }
            let b = blocks[k];
            let chain = pchain.map_or(b.local_hash, |pc| chain::next(pc, b.local_hash));
            let previous = self.state(slot).records[tier].get(b.engine_hash);
            if let Some(old) = previous {
                if self.tree.chain(shared, old) == chain && self.tree.position(shared, old) == pos {
                    out.duplicate += 1;
                    (cur, pchain, pos, k) = (old, Some(chain), pos + 1, k + 1);
                    continue;
                }
            }
            let Some(id) = self.tree.next(shared, cur, pos, chain) else {
                // From here on nothing exists: create the rest in one go.
                self.flush(shared, &mut range, holder, true);
                self.create(shared, slot, holder, cur, pos, chain, &blocks[k..], out);
                break;
            };
            let alias = self.holds(shared, id, tier, group, bit);
            if !alias && !shared.budget.take_pair() {
                out.shed += (blocks.len() - k) as u32;
                if previous.is_some() {
                    // The engine reused the hash for content we cannot place:
                    // the old block is gone all the same.
                    self.flush(shared, &mut range, holder, true);
                    self.drop_record(shared, slot, tier, b.engine_hash);
                }
                break;
            }
            if alias {
                *self.state(slot).aliases.entry((tier as u8, id)).or_insert(0) += 1;
                out.duplicate += 1;
            } else {
                self.extend(shared, &mut range, id, holder, true);
                self.pairs += 1;
                shared.tier_pairs[tier].fetch_add(1, Ordering::Relaxed);
                out.stored += 1;
            }
            if previous.is_some() {
                // The engine reused the hash for other content: the new block is
                // held first, which pins it (and its parents) against the trim.
                self.flush(shared, &mut range, holder, true);
                self.drop_record(shared, slot, tier, b.engine_hash);
            }
            self.state(slot).records[tier].insert(b.engine_hash, id);
            (cur, pchain, pos, k) = (id, Some(chain), pos + 1, k + 1);
        }
        self.flush(shared, &mut range, holder, true);
    }

    /// Creates `blocks` (none of which exists) under `parent` at `pos`, the
    /// first with chain `first`, held by the worker.
    #[allow(clippy::too_many_arguments)]
    fn create(
        &mut self,
        shared: &Shared,
        slot: u32,
        holder: Holder,
        parent: u32,
        pos: u32,
        first: u64,
        blocks: &[StoredBlock],
        out: &mut ApplyOutcome,
    ) {
        let room = shared.depth_max.saturating_sub(pos as usize).min(blocks.len());
        out.depth_exceeded += (blocks.len() - room) as u32;
        let mut chains = Vec::with_capacity(room);
        let mut c = first;
        for (j, b) in blocks[..room].iter().enumerate() {
            if j > 0 {
                c = chain::next(c, b.local_hash);
            }
            if !shared.budget.take_pair() {
                break;
            }
            if !shared.budget.take_entry() {
                shared.budget.release_pairs(1);
                break;
            }
            chains.push(c);
        }
        let refused = (room - chains.len()) as u32;
        let appended = if chains.is_empty() {
            None
        } else if parent != NIL && self.is_tail(shared, parent) {
            let (run, _) = self.tree.locate(parent);
            self.tree.append(shared, run, &chains, holder)
        } else if self.tree.chain_taken(shared, chains[0]) {
            // A chain collision with a run elsewhere (odds 2^-64): refuse.
            None
        } else {
            self.tree.new_run(shared, parent, pos, &chains, holder)
        };
        let made = match appended {
            Some(id) => id,
            None => {
                let n = chains.len() as u64;
                shared.budget.release_pairs(n);
                shared.budget.release_entries(n);
                out.rejected += chains.len() as u32;
                out.shed += refused;
                self.drop_reused(shared, slot, holder.tier, &blocks[..room]);
                return;
            }
        };
        out.shed += refused;
        // The new blocks are consecutive in one run.
        let (run, off) = self.tree.locate(made);
        let tier = holder.tier;
        let mut reused = Vec::new();
        for (j, b) in blocks[..chains.len()].iter().enumerate() {
            let id = self.tree.block_at(shared, run, off + j as u32);
            if let Some(old) = self.state(slot).records[tier].insert(b.engine_hash, id) {
                reused.push(old);
            }
        }
        self.pairs += chains.len() as u64;
        shared.tier_pairs[tier].fetch_add(chains.len() as u64, Ordering::Relaxed);
        out.stored += chains.len() as u32;
        // Hashes the engine reused for this new content: the old blocks go.
        for old in reused {
            self.release_block(shared, slot, tier, old);
        }
        self.drop_reused(shared, slot, tier, &blocks[chains.len()..room]);
    }

    /// Refused blocks whose hashes named other blocks of the worker: those go.
    fn drop_reused(&mut self, shared: &Shared, slot: u32, tier: usize, refused: &[StoredBlock]) {
        for b in refused {
            self.drop_record(shared, slot, tier, b.engine_hash);
        }
    }

    fn is_tail(&self, shared: &Shared, id: u32) -> bool {
        let (run, off) = self.tree.locate(id);
        off + 1 == self.tree.len(shared, run)
    }

    /// Removes the worker's record of `engine_hash`; false if it had none.
    fn drop_record(&mut self, shared: &Shared, slot: u32, tier: usize, engine_hash: u64) -> bool {
        let Some(id) = self.state(slot).records[tier].remove(engine_hash) else { return false };
        self.release_block(shared, slot, tier, id);
        true
    }

    /// The worker no longer names block `id` by one of its hashes (already
    /// taken out of the records, or overwritten): its bit goes unless another
    /// hash still names the block.
    fn release_block(&mut self, shared: &Shared, slot: u32, tier: usize, id: u32) {
        if self.release_alias(slot, tier, id) {
            return;
        }
        let (group, bit) = split(slot);
        self.pairs -= 1;
        shared.budget.release_pairs(1);
        shared.tier_pairs[tier].fetch_sub(1, Ordering::Relaxed);
        let (run, off) = self.tree.locate(id);
        self.tree.mark(shared, run, Holder { tier, group, bit }, off, off + 1, false);
        self.tree.trim(shared, run);
    }

    /// One fewer extra hash for (tier, block); true if there was one.
    fn release_alias(&mut self, slot: u32, tier: usize, id: u32) -> bool {
        let st = self.state(slot);
        if st.aliases.is_empty() {
            return false;
        }
        let Some(extra) = st.aliases.get_mut(&(tier as u8, id)) else { return false };
        *extra -= 1;
        if *extra == 0 {
            st.aliases.remove(&(tier as u8, id));
        }
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
        let tier = tier as usize;
        let (group, bit) = split(slot);
        let who = Holder { tier, group, bit };
        for &h in hashes.iter().take(PREFETCH_AHEAD) {
            self.state(slot).records[tier].prefetch(h);
        }
        let mut range: Option<Range> = None;
        let mut touched: FxHashSet<u32> = FxHashSet::default();
        let mut gone = 0u64;
        for (k, &h) in hashes.iter().enumerate() {
            if let Some(&next) = hashes.get(k + PREFETCH_AHEAD) {
                self.state(slot).records[tier].prefetch(next);
            }
            let Some(id) = self.state(slot).records[tier].remove(h) else {
                out.unknown_removed += 1;
                continue;
            };
            out.removed += 1;
            if self.release_alias(slot, tier, id) {
                continue;
            }
            gone += 1;
            self.extend(shared, &mut range, id, who, false);
            touched.insert(self.tree.locate(id).0);
        }
        self.flush(shared, &mut range, who, false);
        self.pairs -= gone;
        shared.budget.release_pairs(gone);
        shared.tier_pairs[tier].fetch_sub(gone, Ordering::Relaxed);
        self.trim_all(shared, touched);
    }

    /// Trims every run in `runs` that is still live.
    fn trim_all(&mut self, shared: &Shared, runs: impl IntoIterator<Item = u32>) {
        let mut runs: Vec<u32> = runs.into_iter().collect();
        // Deepest first, so a run is looked at after its children went.
        runs.sort_unstable_by_key(|&r| std::cmp::Reverse(self.tree.start(shared, r)));
        for run in runs {
            if self.tree.is_live(run) {
                self.tree.trim(shared, run);
            }
        }
    }

    /// Drops every block of the worker; returns how many pairs went.
    pub(crate) fn clear(&mut self, shared: &Shared, worker: WorkerId) -> u64 {
        let Some(&slot) = self.slot_of.get(&worker) else {
            return 0;
        };
        let (group, bit) = split(slot);
        let mut dropped = 0;
        let mut touched: FxHashSet<u32> = FxHashSet::default();
        for tier in 0..4 {
            let records = self.state(slot).records[tier].take();
            let mut places: Vec<(u32, u32)> = records.iter().map(|&(_, id)| self.tree.locate(id)).collect();
            places.sort_unstable();
            places.dedup();
            let mut i = 0;
            while i < places.len() {
                let (run, a) = places[i];
                let mut b = a + 1;
                while i + 1 < places.len() && places[i + 1] == (run, b) {
                    b += 1;
                    i += 1;
                }
                self.tree.mark(shared, run, Holder { tier, group, bit }, a, b, false);
                touched.insert(run);
                i += 1;
            }
            shared.tier_pairs[tier].fetch_sub(places.len() as u64, Ordering::Relaxed);
            dropped += places.len() as u64;
        }
        self.pairs -= dropped;
        shared.budget.release_pairs(dropped);
        self.state(slot).aliases = FxHashMap::default();
        self.trim_all(shared, touched);
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

    /// Checks that every worker's bits say exactly what its records say, and
    /// the tree's own bookkeeping; returns the live blocks.
    pub(crate) fn check(&self, shared: &Shared) -> u64 {
        let blocks = self.tree.check(shared);
        let mut pairs = 0u64;
        for (slot, st) in self.workers.iter().enumerate() {
            let Some(st) = st else { continue };
            let (group, bit) = split(slot as u32);
            for tier in 0..4 {
                let mut named: Vec<(u32, u32)> = st.records[tier].iter().map(|(_, id)| self.tree.locate(id)).collect();
                named.sort_unstable();
                named.dedup();
                let mut held = Vec::new();
                for run in self.tree.live_runs() {
                    let len = self.tree.len(shared, run);
                    if let Some(m) = self.tree.members(shared, run, tier) {
                        held.extend((0..len).filter(|&o| m.holds(group, bit, o)).map(|o| (run, o)));
                    }
                }
                assert_eq!(named, held, "worker {} tier {tier}: records and bits agree", st.id);
                pairs += named.len() as u64;
            }
        }
        assert_eq!(pairs, self.pairs, "pairs count every (block, worker, tier)");
        blocks
    }
}

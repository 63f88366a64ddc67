//! Turning an index into what a dump says: every block each worker holds.
//!
//! What a dump says is what its readers take it to say (an operator with
//! `jq`, a monitoring job, a Dynamo replica), so it is exact as a document,
//! not only once replayed as events.
//!
//! For each worker, every block it holds, in every tier and under every
//! engine hash it uses, is one block of one Stored event, and nothing else
//! is: no Removed, no Cleared, no block the worker does not hold. Blocks
//! come parents first, chained into one event where a block's parent is
//! the block emitted just before it. A receiver resolves a parent hash in
//! the block's own tier first (then, for lower tiers, in the others), so
//! the parent hash written is one that resolves to the right block that way.
//!
//! An *orphan* is a block whose parent the worker does not hold where a
//! receiver would look (a host block that outlived its device parent, a
//! device block after a hole). It starts an event of its own, whose
//! `Orphan` says where it hangs: its position, the nearest ancestor the
//! dump names for this worker and tier (`anchor`; none: the root), and the
//! local hashes of the ancestors between, which the worker does not hold.
//! An ancestor that an earlier orphan of the same worker and tier already
//! lists is named through that orphan (its engine hash and the ancestor's
//! position), so what a dump carries for orphans is bounded by the blocks
//! the index holds, however many orphans share a missing prefix.
//!
//! The parent hash of an orphan is the engine hash the worker uses for its
//! parent block in another tier, when it has one that names no other block
//! of the worker in any tier; otherwise a hash the worker uses for no
//! block. Either way a receiver that knows nothing of `Orphan` (Dynamo)
//! cannot resolve it to another block, so it never places the block
//! anywhere the worker does not hold it: Dynamo 1.6.1 refuses such a
//! device block (parent not found) and keeps such a lower-tier block where
//! no query of this worker reaches. A null parent would put it at the root.

use super::blocks::NIL;
use super::chain;
use super::tree::{Shared, Tree};
use super::workers::WorkerState;
use crate::event::{Event, EventKind, StorageTier, StoredBlock, WorkerId};
use rustc_hash::FxHashMap;

/// One event of a dump: an event that stores held blocks (or, read from a
/// peer's dump, any event), and where its first block hangs when the
/// worker does not hold that block's parent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpEvent {
    pub event: Event,
    pub orphan: Option<Orphan>,
}

impl DumpEvent {
    /// An event with no orphan.
    pub fn plain(event: Event) -> Self {
        DumpEvent { event, orphan: None }
    }
}

impl From<Event> for DumpEvent {
    fn from(event: Event) -> Self {
        DumpEvent::plain(event)
    }
}

/// Where a stored chain's first block hangs when its worker does not hold
/// the block's parent: under the ancestors `missing` (local hashes, the
/// last one the parent), which the worker does not hold, under `anchor`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Orphan {
    /// Position of the first block (at least 1).
    pub position: u32,
    /// The engine hash, for this worker, of the nearest ancestor the dump
    /// names, at position `position - 1 - missing.len()`: a block the
    /// worker holds (resolved as a parent hash is), or, when the hash is
    /// that of an earlier orphan of the same worker and tier at a deeper
    /// position, the ancestor of that orphan there, which it lists among
    /// its own `missing`. None: `missing` starts at the root.
    pub anchor: Option<u64>,
    /// Local hashes of the missing ancestors, top down.
    pub missing: Vec<u64>,
}

impl Orphan {
    /// Position of the anchor; None for the root (or positions that do not
    /// add up, see `is_consistent`).
    pub fn anchor_position(&self) -> Option<u32> {
        self.anchor?;
        self.position.checked_sub(1)?.checked_sub(u32::try_from(self.missing.len()).ok()?)
    }

    /// Whether the positions add up: an anchor lies above the missing
    /// ancestors, and without one they reach down from the root.
    pub fn is_consistent(&self) -> bool {
        let missing = self.missing.len() as u64;
        match self.anchor {
            Some(_) => missing < u64::from(self.position),
            None => missing == u64::from(self.position) && missing > 0,
        }
    }
}

/// What a receiver will know of one worker while applying its events.
struct Known {
    /// The worker holds blocks in more than one tier: names resolve across
    /// tiers, so `by_hash` is kept. With one tier, a hash emitted for a
    /// block always resolves to it there, and nothing else is needed.
    multi: bool,
    /// Per tier, engine hash -> block (only when `multi`).
    by_hash: [FxHashMap<u64, u32>; 4],
    /// Per block, the first hash emitted for it (any tier)...
    first: FxHashMap<u32, u64>,
    /// ...and the others, in the order emitted (aliases, other tiers).
    more: FxHashMap<u32, Vec<u64>>,
}

impl Known {
    fn new(multi: bool, blocks: usize) -> Known {
        let by_hash = if multi {
            std::array::from_fn(|_| FxHashMap::with_capacity_and_hasher(blocks / 2, Default::default()))
        } else {
            Default::default()
        };
        let first = FxHashMap::with_capacity_and_hasher(blocks, Default::default());
        Known { multi, by_hash, first, more: FxHashMap::default() }
    }

    /// How `Writer::parent_block` will resolve `hash` for a block of `tier`.
    fn resolve(&self, tier: usize, hash: u64) -> Option<u32> {
        if let Some(&id) = self.by_hash[tier].get(&hash) {
            return Some(id);
        }
        if tier == 0 {
            return None;
        }
        (0..4).filter(|&t| t != tier).find_map(|t| self.by_hash[t].get(&hash).copied())
    }

    /// The hashes emitted for `block`, in the order emitted.
    fn names(&self, block: u32) -> impl Iterator<Item = u64> + '_ {
        let first = self.first.get(&block).copied();
        let more = first.and_then(|_| self.more.get(&block)).into_iter().flatten().copied();
        first.into_iter().chain(more)
    }

    /// A hash emitted for `block` that resolves to it from `tier`.
    fn name(&self, tier: usize, block: u32) -> Option<u64> {
        if !self.multi {
            return self.first.get(&block).copied();
        }
        self.names(block).find(|&h| self.resolve(tier, h) == Some(block))
    }

    /// A hash emitted for `block` in some tier that the worker uses for no
    /// other block in any tier (so no receiver resolves it elsewhere).
    fn only_name(&self, block: u32, state: &WorkerState) -> Option<u64> {
        let names_only = |h: u64| state.records.iter().all(|r| r.get(h).is_none_or(|id| id == block));
        self.names(block).find(|&h| names_only(h))
    }

    fn learn(&mut self, tier: usize, hash: u64, block: u32) {
        if self.multi {
            self.by_hash[tier].insert(hash, block);
        }
        match self.first.entry(block) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(hash);
            }
            std::collections::hash_map::Entry::Occupied(_) => self.more.entry(block).or_default().push(hash),
        }
    }
}

struct Emitter<'a> {
    tree: &'a Tree,
    shared: &'a Shared,
    events: Vec<DumpEvent>,
    /// (tier, block id of the last block of an open event) -> event index.
    open: FxHashMap<(u8, u32), usize>,
    worker: WorkerId,
}

impl Emitter<'_> {
    /// The local hash of block `id` at `position` under `parent`.
    fn local(&self, id: u32, parent: u32, position: u32) -> u64 {
        let pchain = (parent != NIL).then(|| self.tree.chain(self.shared, parent));
        chain::local_of(pchain, self.tree.chain(self.shared, id), position)
    }

    /// Appends block `id` to the open event of `tier` whose last block is
    /// its parent; true if there was one.
    fn extend(&mut self, tier: usize, parent: u32, id: u32, block: StoredBlock) -> bool {
        let Some(i) = self.open.remove(&(tier as u8, parent)) else { return false };
        if let EventKind::Stored { blocks, .. } = &mut self.events[i].event.kind {
            blocks.push(block);
        }
        self.open.insert((tier as u8, id), i);
        true
    }

    /// Starts an event with block `id` (an orphan's, or one under a block
    /// that ends no open event), under the parent hash `parent`.
    fn start(&mut self, tier: usize, parent: Option<u64>, id: u32, block: StoredBlock, orphan: Option<Orphan>) {
        self.open.insert((tier as u8, id), self.events.len());
        let event = Event::stored(self.worker, StorageTier::ALL[tier], parent, vec![block]);
        self.events.push(DumpEvent { event, orphan });
    }
}

/// A strong bijective mixer (splitmix64's finaliser).
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The events that say which blocks one worker holds.
pub(crate) fn dump_worker(tree: &Tree, shared: &Shared, state: &WorkerState) -> Vec<DumpEvent> {
    let total: usize = state.records.iter().map(|r| r.len()).sum();
    let tiers = state.records.iter().filter(|r| r.len() > 0).count();
    // (position, tier, hash, id, parent id)
    let mut blocks: Vec<(u32, u8, u64, u32, u32)> = Vec::with_capacity(total);
    for (tier, records) in state.records.iter().enumerate() {
        for (hash, id) in records.iter() {
            blocks.push((tree.position(shared, id), tier as u8, hash, id, tree.parent_of(shared, id)));
        }
    }
    // Parents first; device first within a position so lower tiers can hang off it.
    blocks.sort_unstable_by_key(|&(pos, tier, hash, _, _)| (pos, tier, hash));
    let mut known = Known::new(tiers > 1, total);
    // Per tier, missing ancestors an orphan listed -> that orphan's hash.
    let mut listed: FxHashMap<(usize, u32), u64> = FxHashMap::default();
    let open = FxHashMap::with_capacity_and_hasher(total.min(1 << 16), Default::default());
    let mut e = Emitter { tree, shared, events: Vec::new(), open, worker: state.id };
    let used = |h: u64| state.records.iter().any(|r| r.get(h).is_some());
    for (pos, tier, hash, id, parent) in blocks {
        let tier = tier as usize;
        let block = StoredBlock { engine_hash: hash, local_hash: e.local(id, parent, pos) };
        if parent == NIL {
            e.start(tier, None, id, block, None);
        } else if e.extend(tier, parent, id, block) {
            // Under the last block of an open event of its tier: the event's chain goes on.
        } else if let Some(p) = known.name(tier, parent) {
            e.start(tier, Some(p), id, block, None);
        } else {
            // Up to the nearest ancestor the worker holds here, or one an
            // earlier orphan listed, or the root.
            let mut missing = Vec::new();
            let mut anchor = None;
            let mut a = parent;
            while a != NIL {
                if let Some(h) = known.name(tier, a) {
                    anchor = Some(h);
                    break;
                }
                if let Some(&h) = listed.get(&(tier, a)) {
                    anchor = Some(h);
                    break;
                }
                missing.push(a);
                a = tree.parent_of(shared, a);
            }
            for &m in &missing {
                listed.insert((tier, m), hash);
            }
            let local_of = |m: u32| {
                let position = tree.position(shared, m);
                e.local(m, tree.parent_of(shared, m), position)
            };
            let orphan =
                Orphan { position: pos, anchor, missing: missing.iter().rev().map(|&m| local_of(m)).collect() };
            debug_assert!(orphan.is_consistent());
            let parent_hash = known.only_name(parent, state).unwrap_or_else(|| {
                // From content, not ids, so equal indexes dump equal events.
                let mut h = mix(tree.chain(shared, parent));
                while used(h) {
                    h = mix(h);
                }
                h
            });
            e.start(tier, Some(parent_hash), id, block, Some(orphan));
        }
        known.learn(tier, hash, id);
    }
    e.events
}

#[cfg(test)]
#[path = "dump_tests.rs"]
mod tests;

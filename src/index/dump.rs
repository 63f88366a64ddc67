//! Turning an index back into events that rebuild it exactly.
//!
//! For each worker, every block it holds, in every tier and under every
//! engine hash it uses, is emitted as a Stored event, parents before
//! children, chained into one event where a block's parent is the block
//! emitted just before it. A receiver resolves a parent hash in the block's
//! own tier first (then, for lower tiers, in the others), so the parent hash
//! chosen is one that resolves to the right block that way.
//!
//! A block whose parent the worker no longer holds (a host block that
//! outlived its parent, a device block after a hole) still needs its parent
//! to exist on the receiver: the missing ancestors are emitted too, under
//! hashes the worker does not use, and removed again by one Removed event
//! per tier at the end of the worker's events. Applying the whole dump thus
//! leaves the receiver with exactly the source's blocks and holes.

use super::blocks::NIL;
use super::chain;
use super::tree::{Shared, Tree};
use super::workers::WorkerState;
use crate::event::{Event, EventKind, StorageTier, StoredBlock};
use rustc_hash::{FxHashMap, FxHashSet};

/// What a receiver will know of one worker while applying its events.
#[derive(Default)]
struct Known {
    /// Per tier, engine hash -> block.
    by_hash: [FxHashMap<u64, u32>; 4],
    /// Per block, the hashes emitted for it (any tier).
    by_block: FxHashMap<u32, Vec<u64>>,
}

impl Known {
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

    /// A hash emitted for `block` that resolves to it from `tier`.
    fn name(&self, tier: usize, block: u32) -> Option<u64> {
        self.by_block.get(&block)?.iter().copied().find(|&h| self.resolve(tier, h) == Some(block))
    }

    fn learn(&mut self, tier: usize, hash: u64, block: u32) {
        self.by_hash[tier].insert(hash, block);
        self.by_block.entry(block).or_default().push(hash);
    }
}

struct Emitter<'a> {
    tree: &'a Tree,
    shared: &'a Shared,
    events: Vec<Event>,
    /// (tier, engine hash of the last block of an open event) -> event index.
    open: FxHashMap<(usize, u64), usize>,
    worker: crate::event::WorkerId,
}

impl Emitter<'_> {
    fn local(&self, id: u32) -> u64 {
        let parent = self.tree.parent_of(self.shared, id);
        let pchain = (parent != NIL).then(|| self.tree.chain(self.shared, parent));
        chain::local_of(pchain, self.tree.chain(self.shared, id), self.tree.position(self.shared, id))
    }

    fn emit(&mut self, tier: usize, parent: Option<u64>, hash: u64, id: u32) {
        let block = StoredBlock { engine_hash: hash, local_hash: self.local(id) };
        if let Some(p) = parent {
            if let Some(i) = self.open.remove(&(tier, p)) {
                if let EventKind::Stored { blocks, .. } = &mut self.events[i].kind {
                    blocks.push(block);
                }
                self.open.insert((tier, hash), i);
                return;
            }
        }
        self.open.insert((tier, hash), self.events.len());
        self.events.push(Event::stored(self.worker, StorageTier::ALL[tier], parent, vec![block]));
    }
}

/// The events that rebuild one worker's blocks.
pub(crate) fn dump_worker(tree: &Tree, shared: &Shared, state: &WorkerState) -> Vec<Event> {
    let mut blocks: Vec<(u32, usize, u64, u32)> = Vec::new();
    let mut used: FxHashSet<u64> = FxHashSet::default();
    for (tier, records) in state.records.iter().enumerate() {
        for (hash, id) in records.iter() {
            blocks.push((tree.position(shared, id), tier, hash, id));
            used.insert(hash);
        }
    }
    // Parents first; device first within a position so lower tiers can hang off it.
    blocks.sort_unstable_by_key(|&(pos, tier, hash, _)| (pos, tier, hash));
    let mut known = Known::default();
    let mut stand_ins: [Vec<u64>; 4] = Default::default();
    let mut e = Emitter { tree, shared, events: Vec::new(), open: FxHashMap::default(), worker: state.id };
    let mut next_stand_in = 0u64;
    for (_, tier, hash, id) in blocks {
        let parent = tree.parent_of(shared, id);
        let parent_hash = if parent == NIL {
            None
        } else {
            match known.name(tier, parent) {
                Some(h) => Some(h),
                None => {
                    // Ancestors the worker does not hold here, up to one it does (or the root).
                    let mut missing = vec![parent];
                    let mut top = None;
                    let mut a = tree.parent_of(shared, parent);
                    while a != NIL {
                        if let Some(h) = known.name(tier, a) {
                            top = Some(h);
                            break;
                        }
                        missing.push(a);
                        a = tree.parent_of(shared, a);
                    }
                    let mut above = top;
                    for &m in missing.iter().rev() {
                        let h = loop {
                            next_stand_in += 1;
                            // From content, not ids, so equal indexes dump equal events.
                            let h = (tree.chain(shared, m) ^ (tier as u64) << 61)
                                .wrapping_add(next_stand_in.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                            if used.insert(h) {
                                break h;
                            }
                        };
                        e.emit(tier, above, h, m);
                        known.learn(tier, h, m);
                        stand_ins[tier].push(h);
                        above = Some(h);
                    }
                    above
                }
            }
        };
        e.emit(tier, parent_hash, hash, id);
        known.learn(tier, hash, id);
    }
    for (tier, hashes) in stand_ins.into_iter().enumerate() {
        if !hashes.is_empty() {
            e.events.push(Event::removed(state.id, StorageTier::ALL[tier], hashes));
        }
    }
    e.events
}

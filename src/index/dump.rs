//! Turning an index back into events that rebuild it.
//!
//! For each worker, the blocks a query can see are emitted as Stored events,
//! parents before children, chained into one event where a block's parent
//! is the block emitted just before it. A block is emitted only if its parent
//! is emitted too (for this worker, in any tier), so every event applies
//! cleanly to an empty index. Device blocks a worker holds without holding
//! their prefix are invisible to queries and left out. A receiver resolves
//! a parent hash in the block's own tier first, so the parent hash chosen is
//! one that resolves to the right block that way; a worker that used one
//! engine hash for different blocks in different tiers (no engine does) can
//! leave a block with no such hash, and it is left out.

use super::slab::NIL;
use super::writer::{Shared, Writer};
use crate::event::{Event, EventKind, StorageTier, StoredBlock};
use rustc_hash::FxHashMap;

struct Block {
    level: u32,
    tier: usize,
    chain: u64,
    parent_chain: Option<u64>,
    engine_hash: u64,
    local: u64,
}

pub(crate) fn dump(writer: &Writer, shared: &Shared) -> Vec<Event> {
    let mut events: Vec<Event> = Vec::new();
    for (slot, state) in writer.workers.iter().enumerate() {
        let Some(state) = state else { continue };
        let bit = 1u64 << (slot % 64);
        let mut blocks = Vec::new();
        for (tier, records) in state.records.iter().enumerate() {
            for (engine_hash, id) in records.iter() {
                let e = writer.slab.get(id);
                let guard = crossbeam::epoch::pin();
                let visible = shared.levels[tier]
                    .get(e.level as usize)
                    .is_some_and(|t| t.bits(e.chain, e.group as u32, &guard) & bit != 0);
                if !visible {
                    continue;
                }
                let parent_chain = (e.parent != NIL).then(|| writer.slab.get(e.parent).chain);
                blocks.push(Block { level: e.level, tier, chain: e.chain, parent_chain, engine_hash, local: e.local });
            }
        }
        // Parents first; device first within a level so lower tiers can hang off it.
        blocks.sort_unstable_by_key(|b| (b.level, b.tier));
        // (level, chain) -> this worker's engine hashes of emitted blocks with that identity.
        let mut emitted: FxHashMap<(u32, u64), Vec<u64>> = FxHashMap::default();
        // Per tier, engine hash -> (level, chain) of emitted blocks: what a receiver will know.
        let mut known: [FxHashMap<u64, (u32, u64)>; 4] = Default::default();
        // (tier, engine hash of the last block of an open event) -> event index.
        let mut open: FxHashMap<(usize, u64), usize> = FxHashMap::default();
        let start = events.len();
        for b in blocks {
            let parent = match b.parent_chain {
                None => None,
                Some(pc) => {
                    let want = (b.level - 1, pc);
                    let candidates = emitted.get(&want).map(Vec::as_slice).unwrap_or(&[]);
                    // A receiver resolves a parent hash in the block's own tier first.
                    match candidates.iter().copied().find(|&h| resolve(&known, b.tier, h) == Some(want)) {
                        Some(h) => Some(h),
                        None => continue,
                    }
                }
            };
            emitted.entry((b.level, b.chain)).or_default().push(b.engine_hash);
            known[b.tier].insert(b.engine_hash, (b.level, b.chain));
            let block = StoredBlock { engine_hash: b.engine_hash, local_hash: b.local };
            if let Some(p) = parent {
                if let Some(i) = open.remove(&(b.tier, p)) {
                    if let EventKind::Stored { blocks, .. } = &mut events[start + i].kind {
                        blocks.push(block);
                    }
                    open.insert((b.tier, b.engine_hash), i);
                    continue;
                }
            }
            open.insert((b.tier, b.engine_hash), events.len() - start);
            events.push(Event::stored(state.id, StorageTier::ALL[b.tier], parent, vec![block]));
        }
    }
    events
}

/// How `Writer::parent_entry` will resolve `hash` for a block of `tier`.
fn resolve(known: &[FxHashMap<u64, (u32, u64)>; 4], tier: usize, hash: u64) -> Option<(u32, u64)> {
    if let Some(&k) = known[tier].get(&hash) {
        return Some(k);
    }
    if tier == 0 {
        return None;
    }
    (0..4).filter(|&t| t != tier).find_map(|t| known[t].get(&hash).copied())
}

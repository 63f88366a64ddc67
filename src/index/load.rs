//! A dump back into an index: the one loader that peer recovery and
//! snapshot restore share.
//!
//! A dump is a set of stored chains, not a log: Dynamo lists its lower-tier
//! blocks one per event in hash-map order, children before parents, and
//! the index refuses a store whose parent the worker does not hold, so
//! runs of consecutive stores are applied parents first (`parent_first`);
//! a remove or clear (old dumps, foreign ones) keeps its place.
//!
//! An orphan (see `dump`) is placed under stand-ins: its missing ancestors
//! are stored for its worker, in its tier, under its anchor, with hashes
//! neither the dump nor the index uses for that worker; the orphan is
//! stored under them; and once the worker's last event of the dump is
//! applied, they are removed again. The blocks stay, since the orphan
//! hangs under them, held by whoever else the dump says holds them: the
//! holes the source had. Stand-ins exist only here, while a dump loads
//! (peer recovery and snapshot restore run with the ready gate closed),
//! and never in a dump: the index keeps their names while they live, and
//! a dump taken meanwhile (a peer recovering from this daemon while it
//! recovers) leaves them out. An orphan whose anchor is not a block at the anchor's position,
//! or whose stand-ins cannot all be stored (depth, the shared cap), is not
//! applied at all and counts as refused for an unknown parent: a miss,
//! never a block placed where the worker does not hold it.

use super::dump::DumpEvent;
use super::ApplyOutcome;
use crate::event::{Event, EventKind, StorageTier, StoredBlock, WorkerId};
use rustc_hash::{FxHashMap, FxHashSet};

/// What loading a dump did (stand-ins not counted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// Events of the dump applied (or refused whole, for an orphan that
    /// could not be placed).
    pub events: u64,
    /// Blocks stored for a worker that did not hold them yet.
    pub blocks_stored: u64,
    /// Blocks refused (unknown parent, depth, the shared cap, a full index).
    pub blocks_refused: u64,
    /// Orphans placed under stand-ins.
    pub orphans: u64,
}

impl Loaded {
    fn add(&mut self, o: &ApplyOutcome) {
        self.blocks_stored += u64::from(o.stored);
        self.blocks_refused += u64::from(o.unknown_parent + o.depth_exceeded + o.rejected + o.shed);
    }
}

/// An orphan placed, for later orphans anchored on its missing ancestors.
struct Placed {
    position: u32,
    /// Stand-in hashes of its missing ancestors, top down.
    stand_ins: Vec<u64>,
}

/// A loader's state for one dump.
struct Loader<'a> {
    index: &'a super::Index,
    /// (worker, tier, engine hash of an orphan) -> its stand-ins.
    placed: FxHashMap<(WorkerId, usize, u64), Placed>,
    /// Stand-ins to remove, per worker and tier.
    pending: FxHashMap<WorkerId, [Vec<u64>; 4]>,
    /// Per worker with orphans, every hash the dump names for it.
    named: FxHashMap<WorkerId, FxHashSet<u64>>,
    next: u64,
}

impl super::Index {
    /// Applies a dump's events, ours or a peer's, through `apply` (which
    /// may count them); stand-ins go to the index directly.
    pub fn load_dump(&self, events: &[DumpEvent], mut apply: impl FnMut(&Event) -> ApplyOutcome) -> Loaded {
        let mut out = Loaded::default();
        let order = parent_first(events);
        let mut loader = Loader {
            index: self,
            placed: FxHashMap::default(),
            pending: FxHashMap::default(),
            named: named_by_orphan_workers(events),
            next: 0,
        };
        // Where each worker with orphans has its last event, to remove its stand-ins there.
        let mut last: FxHashMap<WorkerId, usize> = FxHashMap::default();
        for (k, &i) in order.iter().enumerate() {
            let w = events[i].event.worker;
            if loader.named.contains_key(&w) {
                last.insert(w, k);
            }
        }
        for (k, &i) in order.iter().enumerate() {
            let DumpEvent { event, orphan } = &events[i];
            out.events += 1;
            match (orphan, &event.kind) {
                (Some(orphan), EventKind::Stored { blocks, .. }) => {
                    let o = loader.place(event, orphan, blocks, &mut apply);
                    out.orphans += u64::from(o.unknown_parent == 0);
                    out.add(&o);
                }
                _ => out.add(&apply(event)),
            }
            if last.get(&event.worker) == Some(&k) {
                loader.remove_stand_ins(event.worker);
            }
        }
        out
    }

    /// The position of the block `hash` names for `worker` as the parent
    /// of a block of `tier` (as the writer resolves it).
    fn parent_position(&self, worker: WorkerId, tier: usize, hash: u64) -> Option<u32> {
        let id = self.with_worker(worker, false, |st| {
            st.records[tier]
                .get(hash)
                .or_else(|| (tier != 0).then(|| (0..4).find_map(|t| st.records[t].get(hash))).flatten())
        })??;
        Some(self.tree.lock().position(&self.shared, id))
    }

    /// Whether `worker` uses `hash` for a block in any tier.
    fn uses(&self, worker: WorkerId, hash: u64) -> bool {
        self.with_worker(worker, false, |st| st.records.iter().any(|r| r.get(hash).is_some())).unwrap_or(false)
    }
}

/// Every hash the dump names for workers that have orphans.
fn named_by_orphan_workers(events: &[DumpEvent]) -> FxHashMap<WorkerId, FxHashSet<u64>> {
    let mut named: FxHashMap<WorkerId, FxHashSet<u64>> = FxHashMap::default();
    for e in events.iter().filter(|e| e.orphan.is_some()) {
        named.entry(e.event.worker).or_default();
    }
    if named.is_empty() {
        return named;
    }
    for e in events {
        let Some(set) = named.get_mut(&e.event.worker) else { continue };
        match &e.event.kind {
            EventKind::Stored { parent, blocks } => {
                set.extend(parent.iter().copied().chain(blocks.iter().map(|b| b.engine_hash)));
                set.extend(e.orphan.as_ref().and_then(|o| o.anchor));
            }
            EventKind::Removed { engine_hashes } => set.extend(engine_hashes.iter().copied()),
            EventKind::Cleared => {}
        }
    }
    named
}

impl Loader<'_> {
    /// A hash neither the dump nor the index uses for `worker`.
    fn stand_in(&mut self, worker: WorkerId) -> u64 {
        loop {
            self.next += 1;
            let h = stand_in_hash(self.next);
            if !self.named.get(&worker).is_some_and(|s| s.contains(&h)) && !self.index.uses(worker, h) {
                return h;
            }
        }
    }

    /// Stores the orphan `event` under stand-ins; returns its outcome.
    fn place(
        &mut self,
        event: &Event,
        orphan: &super::dump::Orphan,
        blocks: &[StoredBlock],
        apply: &mut impl FnMut(&Event) -> ApplyOutcome,
    ) -> ApplyOutcome {
        let refused = ApplyOutcome { unknown_parent: blocks.len() as u32, ..ApplyOutcome::default() };
        let (worker, tier) = (event.worker, event.tier.index());
        if !orphan.is_consistent() {
            return refused;
        }
        // The hash the missing ancestors hang under (None: the root).
        let above = match (orphan.anchor, orphan.anchor_position()) {
            (Some(h), Some(at)) => match self.placed.get(&(worker, tier, h)).filter(|p| at < p.position) {
                Some(p) => {
                    let first = p.position - p.stand_ins.len() as u32;
                    let Some(k) = at.checked_sub(first) else { return refused };
                    Some(p.stand_ins[k as usize])
                }
                None if self.index.parent_position(worker, tier, h) == Some(at) => Some(h),
                None => return refused,
            },
            _ => None,
        };
        let stand_ins: Vec<u64> = orphan.missing.iter().map(|_| self.stand_in(worker)).collect();
        self.index.stand_ins.lock().name(worker, tier, &stand_ins);
        if !stand_ins.is_empty() {
            let chain = stand_ins
                .iter()
                .zip(&orphan.missing)
                .map(|(&engine_hash, &local_hash)| StoredBlock { engine_hash, local_hash })
                .collect();
            let o = self.index.apply(&Event::stored(worker, event.tier, above, chain));
            self.pending.entry(worker).or_default()[tier].extend(&stand_ins);
            if (o.stored + o.duplicate) as usize != stand_ins.len() {
                return refused;
            }
        }
        let parent = stand_ins.last().copied().or(above);
        let o = apply(&Event::stored(worker, event.tier, parent, blocks.to_vec()));
        if let Some(first) = blocks.first() {
            self.placed.insert((worker, tier, first.engine_hash), Placed { position: orphan.position, stand_ins });
        }
        o
    }

    /// Removes the stand-ins of `worker`: the blocks under its orphans stay
    /// where the orphans hang, held by whoever held them before.
    fn remove_stand_ins(&mut self, worker: WorkerId) {
        let Some(tiers) = self.pending.remove(&worker) else { return };
        for (tier, hashes) in tiers.into_iter().enumerate() {
            if !hashes.is_empty() {
                self.index.apply(&Event::removed(worker, StorageTier::ALL[tier], hashes.clone()));
                self.index.stand_ins.lock().forget(worker, tier, &hashes);
            }
        }
    }
}

/// The `n`th candidate stand-in hash (n from 1).
pub(super) fn stand_in_hash(n: u64) -> u64 {
    mix(n ^ 0x5354_414e_442d_494e)
}

/// A strong bijective mixer (splitmix64's finaliser).
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The order to apply dump events in: each stored chain after the event
/// that stores its parent block, or for an orphan its anchor (of the same
/// worker, in any tier), when the dump has one. Only runs of consecutive
/// stores are reordered, so a remove or clear keeps its place. The walk is
/// iterative and visits each event once; a parent cycle (a malformed dump)
/// is cut where it closes. A dump already in that order keeps it.
fn parent_first(events: &[DumpEvent]) -> Vec<usize> {
    let mut order = Vec::with_capacity(events.len());
    let mut start = 0;
    let is_store = |e: &DumpEvent| matches!(e.event.kind, EventKind::Stored { .. });
    while start < events.len() {
        let end = start + events[start..].iter().take_while(|e| is_store(e) == is_store(&events[start])).count();
        if is_store(&events[start]) {
            stores_parent_first(events, start..end, &mut order);
        } else {
            order.extend(start..end);
        }
        start = end;
    }
    order
}

fn stores_parent_first(events: &[DumpEvent], run: std::ops::Range<usize>, order: &mut Vec<usize>) {
    // The block each event hangs under: its parent, or an orphan's anchor.
    let above = |i: usize| {
        let e = &events[i];
        match (&e.orphan, &e.event.kind) {
            (Some(o), _) => o.anchor,
            (None, EventKind::Stored { parent, .. }) => *parent,
            _ => None,
        }
        .map(|h| (e.event.worker, h))
    };
    // Which event of the run stores each (worker, engine hash) some event
    // hangs under: a set of one key per event is probed for every block,
    // cheaper than a map of every block.
    let wanted: FxHashSet<(WorkerId, u64)> = run.clone().filter_map(above).collect();
    let mut producer: FxHashMap<(WorkerId, u64), usize> = FxHashMap::default();
    for i in run.clone() {
        if let EventKind::Stored { blocks, .. } = &events[i].event.kind {
            for b in blocks {
                let key = (events[i].event.worker, b.engine_hash);
                if wanted.contains(&key) {
                    producer.entry(key).or_insert(i);
                }
            }
        }
    }
    let parent_event = |i: usize| producer.get(&above(i)?).copied();
    // 0: not seen, 1: waiting for its parent, 2: placed.
    let mut state = vec![0u8; run.len()];
    let mut stack = Vec::new();
    for first in run.clone() {
        stack.push(first);
        while let Some(&i) = stack.last() {
            let slot = i - run.start;
            if state[slot] == 2 {
                stack.pop();
                continue;
            }
            let parent = parent_event(i).filter(|&p| p != i && state[p - run.start] == 0);
            match (state[slot], parent) {
                (0, Some(p)) => {
                    state[slot] = 1;
                    stack.push(p);
                }
                _ => {
                    state[slot] = 2;
                    order.push(i);
                    stack.pop();
                }
            }
        }
    }
}

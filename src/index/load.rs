//! A dump back into an index: the one loader that peer recovery and
//! snapshot restore share.
//!
//! A dump is a set of stored chains, not a log: Dynamo lists its lower-tier
//! blocks one per event in hash-map order, children before parents, and
//! the index refuses a store whose parent the worker does not hold, so
//! runs of consecutive stores are applied parents first (`parent_first`);
//! a remove or clear (old dumps, foreign ones) keeps its place.
//!
//! An orphan (see `dump`) is placed by the writer itself: its missing
//! ancestors go on the path under its anchor, held by nobody new (the
//! holes the source had), and its blocks under them, in one store
//! (`writer::Above::Ancestor`). So no block the worker does not hold is
//! ever credited to it or dumped, not even while a dump loads. An orphan
//! whose anchor is not a block at the anchor's position is refused for an
//! unknown parent: a miss, never a block placed where the worker does not
//! hold it.

use super::dump::DumpEvent;
use super::writer::Above;
use super::ApplyOutcome;
use crate::event::{EventKind, WorkerId};
use rustc_hash::{FxHashMap, FxHashSet};

/// What loading a dump did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// Events of the dump applied (or refused whole).
    pub events: u64,
    /// Blocks stored for a worker that did not hold them yet.
    pub blocks_stored: u64,
    /// Blocks refused (unknown parent, depth, the shared cap, a full index).
    pub blocks_refused: u64,
    /// Orphans placed under their missing ancestors.
    pub orphans: u64,
}

impl Loaded {
    fn add(&mut self, o: &ApplyOutcome) {
        self.blocks_stored += u64::from(o.stored);
        self.blocks_refused += u64::from(o.unknown_parent + o.depth_exceeded + o.rejected + o.shed);
    }
}

impl super::Index {
    /// Applies a dump's events, ours or a peer's, parents first; `seen`
    /// gets each event with what applying it did (for the caller's
    /// counters).
    pub fn load_dump(&self, events: &[DumpEvent], mut seen: impl FnMut(&crate::event::Event, &ApplyOutcome)) -> Loaded {
        let mut out = Loaded::default();
        for i in parent_first(events) {
            let DumpEvent { event, orphan } = &events[i];
            out.events += 1;
            let o = match (orphan, &event.kind) {
                (Some(orphan), EventKind::Stored { blocks, .. }) => {
                    let above = match (orphan.anchor, orphan.anchor_position()) {
                        _ if !orphan.is_consistent() => None,
                        (None, _) => Some(Above::Root),
                        (Some(hash), Some(position)) => Some(Above::Ancestor { hash, position }),
                        (Some(_), None) => None,
                    };
                    let o = match above {
                        Some(above) => self.store_under(event.worker, event.tier, above, &orphan.missing, blocks),
                        None => ApplyOutcome { unknown_parent: blocks.len() as u32, ..ApplyOutcome::default() },
                    };
                    out.orphans += u64::from(o.unknown_parent == 0);
                    o
                }
                _ => self.apply(event),
            };
            out.add(&o);
            seen(event, &o);
        }
        out
    }
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

//! A dump back into an index: the one loader that peer recovery and
//! snapshot restore share, fed one event at a time (`Loader`), so a dump
//! streamed from a peer is applied as it arrives.
//!
//! A dump is a set of stored chains, not a log: Dynamo lists its lower-tier
//! blocks one per event in hash-map order, children before parents, and
//! the index refuses a store whose parent the worker does not hold. So a
//! store is tried as it comes; refused for its parent (which changes
//! nothing), it is not counted but waits, keyed by (worker, hash it hangs
//! under), and is applied as soon as an event stores a block of that hash
//! for that worker (then what waited on its blocks, and so on). A dump of
//! ours lists each worker's blocks parents first, so nothing of it ever
//! waits. A remove or clear keeps its place: what still waits is applied
//! first, in arrival order (refused for an unknown parent unless an
//! earlier one placed its parent), as is what waits at the end. A parent
//! cycle (a malformed dump) ends that way too. What waits is bounded by
//! the caller (`Loader::with_waiting_max`): past it the load fails, and
//! the caller drops what was loaded.
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
use crate::event::{Event, EventKind, WorkerId};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

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

/// A load stopped because more blocks waited for their parents than the
/// caller allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooManyWaiting {
    pub max: u64,
}

impl std::fmt::Display for TooManyWaiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "more than {} blocks wait for parents the dump has not sent yet", self.max)
    }
}

/// Applies a dump's events as they come; see the module doc. Each call
/// names the index (always the same one) and a `seen` that gets each event
/// with what applying it did (for the caller's counters).
#[derive(Default)]
pub struct Loader {
    /// (worker, hash a store hangs under) -> arrival numbers of the stores waiting for it.
    waiting: FxHashMap<(WorkerId, u64), Vec<u64>>,
    /// Stores that wait, by arrival.
    held: BTreeMap<u64, DumpEvent>,
    held_blocks: u64,
    /// None: no bound.
    waiting_max: Option<u64>,
    arrived: u64,
    out: Loaded,
}

/// What a loader tells its caller of each event.
pub type Seen<'s> = &'s mut dyn FnMut(&Event, &ApplyOutcome);

impl Loader {
    /// A loader that fails once more than `max` blocks wait.
    pub fn with_waiting_max(max: u64) -> Self {
        Loader { waiting_max: Some(max), ..Loader::default() }
    }

    /// What was applied so far.
    pub fn loaded(&self) -> Loaded {
        self.out
    }

    /// Applies `e`, or keeps it until the block it hangs under arrives.
    pub fn push(&mut self, index: &super::Index, e: DumpEvent, seen: Seen<'_>) -> Result<(), TooManyWaiting> {
        let EventKind::Stored { parent, blocks } = &e.event.kind else {
            self.settle(index, seen);
            self.apply(index, &e, seen);
            return Ok(());
        };
        let above = match &e.orphan {
            Some(o) => o.anchor,
            None => *parent,
        };
        let Some(h) = above else {
            self.apply_and_release(index, e, seen);
            return Ok(());
        };
        // Tried first: a store refused for its parent changes nothing (but
        // the worker's slot), so it is not counted, and waits.
        let n = blocks.len() as u32;
        let o = self.store(index, &e);
        if n == 0 || o.unknown_parent < n {
            self.applied(&e, &o, seen);
            self.release(index, e, o, seen);
            return Ok(());
        }
        self.held_blocks += u64::from(n);
        if let Some(max) = self.waiting_max.filter(|&max| self.held_blocks > max) {
            return Err(TooManyWaiting { max });
        }
        self.arrived += 1;
        self.waiting.entry((e.event.worker, h)).or_default().push(self.arrived);
        self.held.insert(self.arrived, e);
        Ok(())
    }

    /// Applies what still waits, and returns what the load did.
    pub fn finish(mut self, index: &super::Index, seen: Seen<'_>) -> Loaded {
        self.settle(index, seen);
        self.out
    }

    /// Applies every waiting store, in arrival order.
    fn settle(&mut self, index: &super::Index, seen: Seen<'_>) {
        while let Some((_, e)) = self.held.pop_first() {
            self.held_blocks -= stored_blocks(&e);
            self.apply_and_release(index, e, seen);
        }
        self.waiting.clear();
    }

    /// Applies `e`, then every store that waited for a block it stored.
    fn apply_and_release(&mut self, index: &super::Index, e: DumpEvent, seen: Seen<'_>) {
        let o = self.apply(index, &e, seen);
        self.release(index, e, o, seen);
    }

    /// Applies, in turn, every store that waited for a block `e` stored
    /// (`o`), and what waited for theirs.
    fn release(&mut self, index: &super::Index, e: DumpEvent, o: ApplyOutcome, seen: Seen<'_>) {
        let mut stack = vec![(e, o)];
        while let Some((e, o)) = stack.pop() {
            if o.stored + o.duplicate == 0 || self.held.is_empty() {
                continue;
            }
            let EventKind::Stored { blocks, .. } = &e.event.kind else { continue };
            for b in blocks {
                let Some(arrivals) = self.waiting.remove(&(e.event.worker, b.engine_hash)) else { continue };
                for a in arrivals.into_iter().rev() {
                    if let Some(next) = self.held.remove(&a) {
                        self.held_blocks -= stored_blocks(&next);
                        let o = self.apply(index, &next, seen);
                        stack.push((next, o));
                    }
                }
            }
        }
    }

    /// Applies `e` and counts it.
    fn apply(&mut self, index: &super::Index, e: &DumpEvent, seen: Seen<'_>) -> ApplyOutcome {
        let o = self.store(index, e);
        self.applied(e, &o, seen);
        o
    }

    fn applied(&mut self, e: &DumpEvent, o: &ApplyOutcome, seen: Seen<'_>) {
        self.out.events += 1;
        if e.orphan.is_some() && matches!(e.event.kind, EventKind::Stored { .. }) {
            self.out.orphans += u64::from(o.unknown_parent == 0);
        }
        self.out.add(o);
        seen(&e.event, o);
    }

    /// Applies `e` to the index, uncounted.
    fn store(&mut self, index: &super::Index, e: &DumpEvent) -> ApplyOutcome {
        let DumpEvent { event, orphan } = e;
        match (orphan, &event.kind) {
            (Some(orphan), EventKind::Stored { blocks, .. }) => {
                let above = match (orphan.anchor, orphan.anchor_position()) {
                    _ if !orphan.is_consistent() => None,
                    (None, _) => Some(Above::Root),
                    (Some(hash), Some(position)) => Some(Above::Ancestor { hash, position }),
                    (Some(_), None) => None,
                };
                match above {
                    Some(above) => index.store_under(event.worker, event.tier, above, &orphan.missing, blocks),
                    None => ApplyOutcome { unknown_parent: blocks.len() as u32, ..ApplyOutcome::default() },
                }
            }
            _ => index.apply(event),
        }
    }
}

/// Blocks a store holds (0 for any other event).
fn stored_blocks(e: &DumpEvent) -> u64 {
    match &e.event.kind {
        EventKind::Stored { blocks, .. } => blocks.len() as u64,
        _ => 0,
    }
}

impl super::Index {
    /// Applies a dump's events, ours or a peer's, parents first; `seen`
    /// gets each event with what applying it did (for the caller's
    /// counters).
    pub fn load_dump(&self, events: &[DumpEvent], seen: impl FnMut(&Event, &ApplyOutcome)) -> Loaded {
        self.load_dump_owned(events.iter().cloned(), seen)
    }

    /// `load_dump` of events it may keep.
    pub fn load_dump_owned(
        &self,
        events: impl IntoIterator<Item = DumpEvent>,
        mut seen: impl FnMut(&Event, &ApplyOutcome),
    ) -> Loaded {
        let mut loader = Loader::default();
        for e in events {
            // No bound on what waits: it never fails.
            let _ = loader.push(self, e, &mut seen);
        }
        loader.finish(self, &mut seen)
    }
}

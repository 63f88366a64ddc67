//! What applied events did, counted for `/metrics` (counts only; applies
//! nothing): ours, `kv_indexer_events_applied_total{type}` and
//! `kv_indexer_blocks_total{outcome}` with every block outcome of the
//! index, and Dynamo's per-event families, so a dashboard built for
//! Dynamo's indexer reads ours unchanged (label values from
//! dynamo-kv-router 1.6.1, `src/indexer/metrics.rs`):
//!
//! - `dynamo_kvrouter_kv_cache_events_applied{event_type,status}`: one per
//!   event applied, `event_type` `stored|removed|cleared`, `status` `ok` or
//!   the event's first failure: `parent_block_not_found` (a store whose
//!   parent the worker does not hold), `block_not_found` (a remove naming a
//!   block the worker does not hold; the others still go), `invalid_block`
//!   (blocks past the deepest position indexed), `capacity_exhausted`
//!   (blocks refused at `--max-pairs` or a full index),
//!   `unsupported_residency_domain` (a peer's dump event of another
//!   residency domain, skipped). Dynamo's `allocation_failed`,
//!   `ownership_degree_overflow` and `indexer_invariant_violation` cannot
//!   happen here and stay 0.
//! - `dynamo_kvrouter_kv_cache_event_warnings{warning_kind="duplicate_store"}`:
//!   stores that named a block the worker already held.
//! - `dynamo_kvrouter_ckf_mutation_total{outcome}`: block-level outcomes
//!   finer than an event's status, as Dynamo's filter index counts them:
//!   `unknown_remove` (removed blocks the worker did not hold) and
//!   `capacity_exhausted` (stored blocks refused for room).

use crate::event::EventKind;
use crate::index::ApplyOutcome;
use crate::metrics::Prom;
use std::sync::atomic::{AtomicU64, Ordering};

/// `type` and `event_type` label values, in counter order.
const EVENT_TYPES: [&str; 3] = ["stored", "removed", "cleared"];
/// `kv_indexer_blocks_total` outcome label values, in counter order (as `blocks_of`).
const OUTCOMES: [&str; 9] = [
    "stored",
    "removed",
    "duplicate",
    "unknown_parent",
    "unknown_removed",
    "depth_exceeded",
    "rejected",
    "shed",
    "cleared",
];
/// `status` label values, in counter order.
const STATUSES: [&str; 9] = [
    "ok",
    "parent_block_not_found",
    "block_not_found",
    "invalid_block",
    "capacity_exhausted",
    "allocation_failed",
    "ownership_degree_overflow",
    "indexer_invariant_violation",
    "unsupported_residency_domain",
];

const OK: usize = 0;
const PARENT_NOT_FOUND: usize = 1;
const BLOCK_NOT_FOUND: usize = 2;
const INVALID_BLOCK: usize = 3;
const CAPACITY_EXHAUSTED: usize = 4;
const UNSUPPORTED_RESIDENCY: usize = 8;

/// Totals of what events did to the indexes.
#[derive(Default)]
pub struct ApplyCounters {
    /// Events by type.
    events: [AtomicU64; EVENT_TYPES.len()],
    /// Blocks by outcome.
    blocks: [AtomicU64; OUTCOMES.len()],
    /// Events by type and Dynamo's status.
    applied: [[AtomicU64; STATUSES.len()]; EVENT_TYPES.len()],
    duplicate_store: AtomicU64,
}

fn type_index(kind: &EventKind) -> usize {
    match kind {
        EventKind::Stored { .. } => 0,
        EventKind::Removed { .. } => 1,
        EventKind::Cleared => 2,
    }
}

/// An outcome's block counts, in `OUTCOMES` order.
fn blocks_of(o: &ApplyOutcome) -> [u32; OUTCOMES.len()] {
    [
        o.stored,
        o.removed,
        o.duplicate,
        o.unknown_parent,
        o.unknown_removed,
        o.depth_exceeded,
        o.rejected,
        o.shed,
        o.cleared,
    ]
}

/// The status Dynamo would give an event with outcome `o`.
fn status_index(kind: &EventKind, o: &ApplyOutcome) -> usize {
    match kind {
        EventKind::Stored { .. } if o.shed > 0 || o.rejected > 0 => CAPACITY_EXHAUSTED,
        EventKind::Stored { .. } if o.unknown_parent > 0 => PARENT_NOT_FOUND,
        EventKind::Stored { .. } if o.depth_exceeded > 0 => INVALID_BLOCK,
        EventKind::Removed { .. } if o.unknown_removed > 0 => BLOCK_NOT_FOUND,
        _ => OK,
    }
}

impl ApplyCounters {
    /// Counts one applied event.
    pub fn add(&self, kind: &EventKind, o: &ApplyOutcome) {
        let r = Ordering::Relaxed;
        let t = type_index(kind);
        self.events[t].fetch_add(1, r);
        for (c, n) in self.blocks.iter().zip(blocks_of(o)) {
            if n > 0 {
                c.fetch_add(u64::from(n), r);
            }
        }
        self.applied[t][status_index(kind, o)].fetch_add(1, r);
        if o.duplicate > 0 {
            self.duplicate_store.fetch_add(1, r);
        }
    }

    /// Adds every count of `other` (what a staged load counted, once it is kept).
    pub fn add_all(&self, other: &ApplyCounters) {
        let r = Ordering::Relaxed;
        let pairs = |a: &[AtomicU64], b: &[AtomicU64]| {
            for (x, y) in a.iter().zip(b) {
                x.fetch_add(y.load(r), r);
            }
        };
        pairs(&self.events, &other.events);
        pairs(&self.blocks, &other.blocks);
        for (a, b) in self.applied.iter().zip(&other.applied) {
            pairs(a, b);
        }
        self.duplicate_store.fetch_add(other.duplicate_store.load(r), r);
    }

    /// Counts events skipped for their residency domain, by type (stored, removed, cleared).
    pub fn add_unsupported_residency(&self, by_type: [u64; 3]) {
        for (t, n) in by_type.into_iter().enumerate() {
            self.applied[t][UNSUPPORTED_RESIDENCY].fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Writes our two families, then Dynamo's three. Every label pair is
    /// written, zeros too, as Dynamo's pre-bound counters are. Dynamo's
    /// names for the first two lack `_total`, which a counter must have to
    /// pass `promtool check metrics`, so they are typed `untyped`: the names
    /// and values a dashboard reads stay Dynamo's, and `rate()` works the same.
    pub fn render(&self, p: &mut Prom) {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64;
        let events = EVENT_TYPES.iter().zip(&self.events).map(|(t, c)| (*t, load(c)));
        p.labelled("kv_indexer_events_applied_total", "counter", "Events applied to indexes, by type.", "type", events);
        let blocks = OUTCOMES.iter().zip(&self.blocks).map(|(o, c)| (*o, load(c)));
        p.labelled("kv_indexer_blocks_total", "counter", "Blocks of applied events, by outcome.", "outcome", blocks);

        let name = "dynamo_kvrouter_kv_cache_events_applied";
        p.family(name, "untyped", "Total number of KV cache events applied to index");
        for (event_type, by_status) in EVENT_TYPES.iter().zip(&self.applied) {
            for (status, c) in STATUSES.iter().zip(by_status) {
                p.sample(name, &[("event_type", event_type), ("status", status)], load(c));
            }
        }
        let warnings = [("duplicate_store", load(&self.duplicate_store))];
        let help = "Total number of suspicious KV cache events seen by the router indexer";
        p.labelled("dynamo_kvrouter_kv_cache_event_warnings", "untyped", help, "warning_kind", warnings);
        let block =
            |outcome: &str| load(&self.blocks[OUTCOMES.iter().position(|o| *o == outcome).expect("an outcome")]);
        let mutations =
            [("unknown_remove", block("unknown_removed")), ("capacity_exhausted", block("rejected") + block("shed"))];
        let help = "Total number of CKF block-level mutation outcomes";
        p.labelled("dynamo_kvrouter_ckf_mutation_total", "counter", help, "outcome", mutations);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_of(kind: &EventKind, o: &ApplyOutcome) -> &'static str {
        STATUSES[status_index(kind, o)]
    }

    fn stored() -> EventKind {
        EventKind::Stored { parent: None, blocks: Vec::new() }
    }

    #[test]
    fn statuses_follow_dynamo() {
        let removed = EventKind::Removed { engine_hashes: Vec::new() };
        let o = |f: fn(&mut ApplyOutcome)| {
            let mut o = ApplyOutcome::default();
            f(&mut o);
            o
        };
        assert_eq!(status_of(&stored(), &o(|o| o.stored = 3)), "ok");
        assert_eq!(status_of(&stored(), &o(|o| o.unknown_parent = 2)), "parent_block_not_found");
        assert_eq!(status_of(&stored(), &o(|o| o.depth_exceeded = 1)), "invalid_block");
        assert_eq!(status_of(&stored(), &o(|o| o.shed = 1)), "capacity_exhausted");
        assert_eq!(status_of(&removed, &o(|o| o.unknown_removed = 1)), "block_not_found");
        assert_eq!(status_of(&removed, &o(|o| o.removed = 4)), "ok");
        assert_eq!(status_of(&EventKind::Cleared, &o(|o| o.cleared = 9)), "ok");
    }

    #[test]
    fn renders_every_label_pair() {
        let c = ApplyCounters::default();
        let mut dup = ApplyOutcome { duplicate: 2, ..Default::default() };
        c.add(&stored(), &dup);
        dup.duplicate = 0;
        c.add(&EventKind::Removed { engine_hashes: Vec::new() }, &ApplyOutcome { unknown_removed: 3, ..dup });
        c.add_unsupported_residency([0, 0, 2]);
        let mut p = Prom::default();
        c.render(&mut p);
        let t = p.text;
        assert_eq!(t.matches("dynamo_kvrouter_kv_cache_events_applied{").count(), 27);
        assert!(t.contains("dynamo_kvrouter_kv_cache_events_applied{event_type=\"stored\",status=\"ok\"} 1\n"), "{t}");
        assert!(t.contains("{event_type=\"removed\",status=\"block_not_found\"} 1\n"));
        assert!(t.contains("{event_type=\"cleared\",status=\"unsupported_residency_domain\"} 2\n"));
        assert!(t.contains("dynamo_kvrouter_kv_cache_event_warnings{warning_kind=\"duplicate_store\"} 1\n"));
        assert!(t.contains("dynamo_kvrouter_ckf_mutation_total{outcome=\"unknown_remove\"} 3\n"));
    }
}

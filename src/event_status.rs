//! Dynamo's per-event metric families, so a dashboard built for Dynamo's
//! indexer reads ours unchanged (label values from dynamo-kv-router 1.6.1,
//! `src/indexer/metrics.rs`):
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
//!
//! Our own `kv_indexer_events_applied_total` and `kv_indexer_blocks_total`
//! stay beside them with finer block outcomes.

use crate::event::EventKind;
use crate::index::ApplyOutcome;
use crate::metrics::Prom;
use std::sync::atomic::{AtomicU64, Ordering};

/// `event_type` label values, in counter order.
pub const EVENT_TYPES: [&str; 3] = ["stored", "removed", "cleared"];
/// `status` label values, in counter order.
pub const STATUSES: [&str; 9] = [
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

/// The counters behind Dynamo's families.
#[derive(Default)]
pub struct EventStatusCounters {
    applied: [[AtomicU64; STATUSES.len()]; EVENT_TYPES.len()],
    duplicate_store: AtomicU64,
    unknown_remove: AtomicU64,
    capacity_exhausted: AtomicU64,
}

fn type_index(kind: &EventKind) -> usize {
    match kind {
        EventKind::Stored { .. } => 0,
        EventKind::Removed { .. } => 1,
        EventKind::Cleared => 2,
    }
}

/// The status Dynamo would give an event with outcome `o`.
pub fn status_of(kind: &EventKind, o: &ApplyOutcome) -> &'static str {
    STATUSES[status_index(kind, o)]
}

fn status_index(kind: &EventKind, o: &ApplyOutcome) -> usize {
    match kind {
        EventKind::Stored { .. } if o.shed > 0 || o.rejected > 0 => CAPACITY_EXHAUSTED,
        EventKind::Stored { .. } if o.unknown_parent > 0 => PARENT_NOT_FOUND,
        EventKind::Stored { .. } if o.depth_exceeded > 0 => INVALID_BLOCK,
        EventKind::Removed { .. } if o.unknown_removed > 0 => BLOCK_NOT_FOUND,
        _ => OK,
    }
}

impl EventStatusCounters {
    /// Counts one applied event.
    pub fn add(&self, kind: &EventKind, o: &ApplyOutcome) {
        let r = Ordering::Relaxed;
        self.applied[type_index(kind)][status_index(kind, o)].fetch_add(1, r);
        if o.duplicate > 0 {
            self.duplicate_store.fetch_add(1, r);
        }
        if o.unknown_removed > 0 {
            self.unknown_remove.fetch_add(u64::from(o.unknown_removed), r);
        }
        if o.shed > 0 || o.rejected > 0 {
            self.capacity_exhausted.fetch_add(u64::from(o.shed) + u64::from(o.rejected), r);
        }
    }

    /// Counts `n` events of `kind` skipped for their residency domain.
    pub fn add_unsupported_residency(&self, kind: &EventKind, n: u64) {
        self.applied[type_index(kind)][UNSUPPORTED_RESIDENCY].fetch_add(n, Ordering::Relaxed);
    }

    /// Events of type `event_type` (index into `EVENT_TYPES`) with `status`.
    pub fn applied(&self, event_type: usize, status: usize) -> u64 {
        self.applied[event_type][status].load(Ordering::Relaxed)
    }

    /// Writes the three families. Every label pair is written, zeros too,
    /// as Dynamo's pre-bound counters are. Dynamo's names for the first two
    /// lack `_total`, which a counter must have to pass `promtool check
    /// metrics`, so they are typed `untyped`: the names and values a
    /// dashboard reads stay Dynamo's, and `rate()` works the same.
    pub fn render(&self, p: &mut Prom) {
        let name = "dynamo_kvrouter_kv_cache_events_applied";
        p.family(name, "untyped", "Total number of KV cache events applied to index");
        for (t, event_type) in EVENT_TYPES.iter().enumerate() {
            for (s, status) in STATUSES.iter().enumerate() {
                p.sample(name, &[("event_type", event_type), ("status", status)], self.applied(t, s) as f64);
            }
        }
        let name = "dynamo_kvrouter_kv_cache_event_warnings";
        p.family(name, "untyped", "Total number of suspicious KV cache events seen by the router indexer");
        let n = self.duplicate_store.load(Ordering::Relaxed);
        p.sample(name, &[("warning_kind", "duplicate_store")], n as f64);
        let name = "dynamo_kvrouter_ckf_mutation_total";
        p.family(name, "counter", "Total number of CKF block-level mutation outcomes");
        for (outcome, v) in [("unknown_remove", &self.unknown_remove), ("capacity_exhausted", &self.capacity_exhausted)]
        {
            p.sample(name, &[("outcome", outcome)], v.load(Ordering::Relaxed) as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let c = EventStatusCounters::default();
        let mut dup = ApplyOutcome { duplicate: 2, ..Default::default() };
        c.add(&stored(), &dup);
        dup.duplicate = 0;
        c.add(&EventKind::Removed { engine_hashes: Vec::new() }, &ApplyOutcome { unknown_removed: 3, ..dup });
        c.add_unsupported_residency(&EventKind::Cleared, 2);
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

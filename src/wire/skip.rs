//! Why an engine event was not turned into an index event, counted.
//!
//! Skipping is normal (lower-tier placeholders, sliding-window groups, blocks
//! owned elsewhere) and must stay visible: every skipped event bumps exactly
//! one counter, exported by name. Counters are atomics so one instance can be
//! shared by all listener threads.

use std::sync::atomic::{AtomicU64, Ordering};

/// A reason to skip an event (or the tail of a store, from one block on).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// A tag other than BlockStored / BlockRemoved / AllBlocksCleared.
    UnknownEventType,
    /// A store or remove that names no block.
    EmptyEvent,
    /// `locality == "REMOTE"`: the blocks are not on this worker.
    RemoteLocality,
    /// A locality other than LOCAL / REMOTE: fail closed.
    UnknownLocality,
    /// `ownership == "kvcr"`: blocks owned by a shared cache, not the worker.
    KvcrOwnership,
    /// An ownership value this decoder does not know: fail closed.
    UnknownOwnership,
    /// A `medium` with no known tier.
    UnknownMedium,
    /// A sliding-window, mamba or other non-full-attention cache group.
    NonMainAttention,
    /// A cache group other than the one indexed for this worker.
    OtherKvGroup,
    /// A lower-tier placeholder (no tokens or block size 0): cannot be placed in a prefix.
    PlaceholderStore,
    /// A LoRA id without a name: its local hashes cannot be computed.
    LoraWithoutName,
    /// A store whose hashes repeat or contain the parent: it would form a loop.
    SelfReferencingStore,
    /// The engine's block size is not a whole multiple of the index's.
    BlockSizeMismatch,
    /// `token_ids` does not hold exactly `blocks * block_size` tokens.
    TokenCountMismatch,
    /// `extra_keys` carry something not reproducible from tokens; skipped from that block on.
    OpaqueExtraKeys,
    /// The per-worker salt table is full; salted stores are skipped until blocks go away.
    SaltTableFull,
}

impl SkipReason {
    /// Every reason, in counter order.
    pub const ALL: [SkipReason; 16] = [
        SkipReason::UnknownEventType,
        SkipReason::EmptyEvent,
        SkipReason::RemoteLocality,
        SkipReason::UnknownLocality,
        SkipReason::KvcrOwnership,
        SkipReason::UnknownOwnership,
        SkipReason::UnknownMedium,
        SkipReason::NonMainAttention,
        SkipReason::OtherKvGroup,
        SkipReason::PlaceholderStore,
        SkipReason::LoraWithoutName,
        SkipReason::SelfReferencingStore,
        SkipReason::BlockSizeMismatch,
        SkipReason::TokenCountMismatch,
        SkipReason::OpaqueExtraKeys,
        SkipReason::SaltTableFull,
    ];

    /// The metric label for this reason.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::UnknownEventType => "unknown_event_type",
            SkipReason::EmptyEvent => "empty_event",
            SkipReason::RemoteLocality => "remote_locality",
            SkipReason::UnknownLocality => "unknown_locality",
            SkipReason::KvcrOwnership => "kvcr_ownership",
            SkipReason::UnknownOwnership => "unknown_ownership",
            SkipReason::UnknownMedium => "unknown_medium",
            SkipReason::NonMainAttention => "non_main_attention",
            SkipReason::OtherKvGroup => "other_kv_group",
            SkipReason::PlaceholderStore => "placeholder_store",
            SkipReason::LoraWithoutName => "lora_without_name",
            SkipReason::SelfReferencingStore => "self_referencing_store",
            SkipReason::BlockSizeMismatch => "block_size_mismatch",
            SkipReason::TokenCountMismatch => "token_count_mismatch",
            SkipReason::OpaqueExtraKeys => "opaque_extra_keys",
            SkipReason::SaltTableFull => "salt_table_full",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Skipped-event counters, one per [`SkipReason`]; shareable across threads.
#[derive(Debug, Default)]
pub struct SkipCounters {
    counts: [AtomicU64; SkipReason::ALL.len()],
}

impl SkipCounters {
    /// All counters at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one skipped event.
    pub fn add(&self, reason: SkipReason) {
        self.counts[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Events skipped for `reason` so far.
    pub fn get(&self, reason: SkipReason) -> u64 {
        self.counts[reason.index()].load(Ordering::Relaxed)
    }

    /// Events skipped for any reason so far.
    pub fn total(&self) -> u64 {
        SkipReason::ALL.iter().map(|&r| self.get(r)).sum()
    }

    /// Every reason with its count, in a fixed order.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        SkipReason::ALL.iter().map(|&r| (r.as_str(), self.get(r))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_per_reason_and_labels_unique() {
        let c = SkipCounters::new();
        c.add(SkipReason::PlaceholderStore);
        c.add(SkipReason::PlaceholderStore);
        c.add(SkipReason::SaltTableFull);
        assert_eq!(c.get(SkipReason::PlaceholderStore), 2);
        assert_eq!(c.get(SkipReason::SaltTableFull), 1);
        assert_eq!(c.total(), 3);
        let snap = c.snapshot();
        assert_eq!(snap.len(), SkipReason::ALL.len());
        let mut labels: Vec<_> = snap.iter().map(|(l, _)| *l).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), SkipReason::ALL.len());
        for (i, r) in SkipReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
    }
}

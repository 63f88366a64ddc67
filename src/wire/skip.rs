//! Why an engine event was not turned into an index event, counted.
//!
//! Skipping is normal (lower-tier placeholders, sliding-window groups, blocks
//! owned elsewhere) and must stay visible: every skipped event bumps exactly
//! one counter, exported by name. Counters are atomics so one instance can be
//! shared by all listener threads.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! skip_reasons {
    ($($(#[$doc:meta])* $name:ident => $label:literal,)*) => {
        /// A reason to skip an event (or the tail of a store, from one block on).
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
        pub enum SkipReason {
            $($(#[$doc])* $name,)*
        }

        impl SkipReason {
            /// Every reason, in counter order.
            pub const ALL: [SkipReason; [$(SkipReason::$name),*].len()] = [$(SkipReason::$name),*];

            /// The metric label for this reason.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(SkipReason::$name => $label,)*
                }
            }
        }
    };
}

skip_reasons! {
    /// A tag other than BlockStored / BlockRemoved / AllBlocksCleared.
    UnknownEventType => "unknown_event_type",
    /// A store or remove that names no block.
    EmptyEvent => "empty_event",
    /// `locality == "REMOTE"`: the blocks are not on this worker.
    RemoteLocality => "remote_locality",
    /// A locality other than LOCAL / REMOTE: fail closed.
    UnknownLocality => "unknown_locality",
    /// `ownership == "kvcr"`: blocks owned by a shared cache, not the worker.
    KvcrOwnership => "kvcr_ownership",
    /// An ownership value this decoder does not know: fail closed.
    UnknownOwnership => "unknown_ownership",
    /// A `medium` with no known tier.
    UnknownMedium => "unknown_medium",
    /// A sliding-window, mamba or other non-full-attention cache group.
    NonMainAttention => "non_main_attention",
    /// A cache group other than the one indexed for this worker.
    OtherKvGroup => "other_kv_group",
    /// A lower-tier placeholder (no tokens or block size 0): cannot be placed in a prefix.
    PlaceholderStore => "placeholder_store",
    /// A LoRA id without a name: its local hashes cannot be computed.
    LoraWithoutName => "lora_without_name",
    /// A store whose hashes repeat or contain the parent: it would form a loop.
    SelfReferencingStore => "self_referencing_store",
    /// The engine's block size is not a whole multiple of the index's.
    BlockSizeMismatch => "block_size_mismatch",
    /// `token_ids` does not hold exactly `blocks * block_size` tokens.
    TokenCountMismatch => "token_count_mismatch",
    /// `extra_keys` carry something not reproducible from tokens; skipped from that block on.
    OpaqueExtraKeys => "opaque_extra_keys",
    /// The per-worker salt table is full; salted stores are skipped until blocks go away.
    SaltTableFull => "salt_table_full",
    /// A store with a field that could not be read, or without a required one.
    MalformedStore => "malformed_store",
    /// A store holding multimodal blocks whose router tokens cannot be
    /// rebuilt: applied, but those blocks get a hash no query meets.
    UnmatchableMultimodal => "unmatchable_multimodal",
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
        self.counts[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Events skipped for `reason` so far.
    pub fn get(&self, reason: SkipReason) -> u64 {
        self.counts[reason as usize].load(Ordering::Relaxed)
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
            assert_eq!(*r as usize, i);
        }
    }
}

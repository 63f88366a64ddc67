//! Engine events as decoded from the wire, before any policy is applied.
//!
//! These mirror what vLLM and SGLang publish, normalised only where the wire
//! itself is ambiguous: hashes of every form are u64, empty strings are
//! absent, and `extra_keys` are already sorted into the cache salt, the
//! multimodal hashes a block's local hash must include, and the first block
//! whose keys cannot be reproduced from tokens. Which events to keep and how
//! to hash them is [`super::convert`]'s business.

/// One published batch: `[ts, events, data_parallel_rank?]`.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedBatch {
    /// Publisher's wall-clock time, seconds since the epoch.
    pub timestamp: f64,
    /// The rank named in the batch; overrides the listener's registered rank.
    pub dp_rank: Option<u32>,
    pub events: Vec<RawEvent>,
}

/// One event of a batch.
#[derive(Clone, Debug, PartialEq)]
pub enum RawEvent {
    Stored(RawStored),
    Removed(RawRemoved),
    Cleared,
    /// An event with a tag this decoder does not know; skipped and counted.
    Unknown,
}

impl RawEvent {
    /// Heap bytes the event holds (its vectors and strings), for bounding
    /// how much decoded input is kept waiting.
    pub fn heap_bytes(&self) -> usize {
        fn text(s: &Option<String>) -> usize {
            s.as_ref().map_or(0, String::capacity)
        }
        match self {
            RawEvent::Stored(s) => {
                let mm: usize =
                    s.block_mm_hashes.iter().map(|m| std::mem::size_of::<Vec<u64>>() + m.capacity() * 8).sum();
                let texts = [&s.lora_name, &s.medium, &s.cache_salt, &s.extra_keys_salt, &s.kv_cache_spec_kind];
                s.block_hashes.capacity() * 8
                    + s.token_ids.capacity() * 4
                    + mm
                    + texts.into_iter().chain([&s.locality, &s.ownership]).map(text).sum::<usize>()
            }
            RawEvent::Removed(r) => {
                r.block_hashes.capacity() * 8
                    + [&r.medium, &r.kv_cache_spec_kind, &r.locality, &r.ownership].into_iter().map(text).sum::<usize>()
            }
            RawEvent::Cleared | RawEvent::Unknown => 0,
        }
    }
}

/// A `BlockStored` event.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawStored {
    /// Engine hashes of the stored blocks, in chain order.
    pub block_hashes: Vec<u64>,
    /// Engine hash of the block before the first one; None at a chain start.
    pub parent_block_hash: Option<u64>,
    /// Tokens of all blocks, concatenated (`block_size` per block).
    pub token_ids: Vec<u32>,
    /// Tokens per block as the engine counts them.
    pub block_size: u32,
    /// Deprecated numeric LoRA id; set without `lora_name` it means a LoRA we cannot name.
    pub lora_id: Option<u64>,
    pub lora_name: Option<String>,
    pub medium: Option<String>,
    /// SGLang's request salt.
    pub cache_salt: Option<String>,
    /// The salt tagged `dynamo-cache-salt:` in the first block's `extra_keys` (vLLM).
    pub extra_keys_salt: Option<String>,
    /// Per block, the sorted multimodal hashes its local hash appends; empty
    /// when no block has any.
    pub block_mm_hashes: Vec<Vec<u64>>,
    /// Index of the first block whose `extra_keys` hold something that cannot
    /// be reproduced from tokens (an untagged salt, a native multimodal
    /// identifier, a prompt-embedding digest).
    pub opaque_extra_keys_from: Option<u32>,
    pub group_idx: Option<u32>,
    pub kv_cache_spec_kind: Option<String>,
    pub locality: Option<String>,
    pub ownership: Option<String>,
}

/// A `BlockRemoved` event.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawRemoved {
    pub block_hashes: Vec<u64>,
    pub medium: Option<String>,
    pub group_idx: Option<u32>,
    pub kv_cache_spec_kind: Option<String>,
    pub locality: Option<String>,
    pub ownership: Option<String>,
}

//! Engine events as decoded from the wire, before any policy is applied.
//!
//! These mirror what vLLM, SGLang and TensorRT-LLM publish, normalised only
//! where the wire itself is ambiguous: hashes of every form are u64, empty
//! strings are absent, and `extra_keys` are already sorted into the cache
//! salt, the multimodal hashes a block's local hash must include, and the
//! first block whose keys cannot be reproduced from tokens. TensorRT-LLM's
//! string tokens and `mm_keys` are kept as sent. Which events to keep and
//! how to hash them is [`super::convert`]'s business.

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
    /// A `BlockStored` with a field that could not be read (a token of an
    /// unknown type, a missing field); skipped and counted, the rest of the
    /// batch applies. (An unreadable remove fails the batch instead: skipping
    /// it would leave blocks listed that the worker dropped.)
    MalformedStore,
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
                    + s.multimodal.as_ref().map_or(0, |m| m.heap_bytes())
                    + texts.into_iter().chain([&s.locality, &s.ownership]).map(text).sum::<usize>()
            }
            RawEvent::Removed(r) => {
                r.block_hashes.capacity() * 8
                    + [&r.medium, &r.kv_cache_spec_kind, &r.locality, &r.ownership].into_iter().map(text).sum::<usize>()
            }
            RawEvent::Cleared | RawEvent::Unknown | RawEvent::MalformedStore => 0,
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
    /// Tokens of all blocks, concatenated (`block_size` per block); a
    /// token sent as a string reads 0 here (see `multimodal`).
    pub token_ids: Vec<u32>,
    /// TensorRT-LLM's multimodal additions, when the event has any.
    pub multimodal: Option<Box<RawMultimodal>>,
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

/// What TensorRT-LLM adds to a store holding multimodal items.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawMultimodal {
    /// Tokens sent as strings, by position in `token_ids`, ascending: the
    /// digest token that opens an item (the item's hex digest).
    pub string_tokens: Vec<(u32, String)>,
    /// `mm_keys`: per block, the multimodal runs it holds, in token order;
    /// None when the event sent none.
    pub mm_keys: Option<Vec<Vec<RawMmKey>>>,
}

impl RawMultimodal {
    fn heap_bytes(&self) -> usize {
        let strings: usize =
            self.string_tokens.iter().map(|(_, t)| std::mem::size_of::<(u32, String)>() + t.capacity()).sum();
        let keys: usize = self
            .mm_keys
            .iter()
            .flatten()
            .map(|b| {
                std::mem::size_of::<Vec<RawMmKey>>()
                    + b.iter().map(|k| std::mem::size_of::<RawMmKey>() + k.heap_bytes()).sum::<usize>()
            })
            .sum();
        std::mem::size_of::<Self>() + strings + keys
    }
}

/// One run of a multimodal item inside a block (a TensorRT-LLM `mm_key`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawMmKey {
    /// Hex digest of the item, TensorRT-LLM's own content hash.
    pub hash: String,
    /// Index of the run's first token among the item's embedding tokens
    /// (0: the run starts at the item's digest token).
    pub start_offset: u64,
    /// The item's identifier as the request named it, when it did.
    pub uuid: Option<String>,
}

impl RawMmKey {
    fn heap_bytes(&self) -> usize {
        self.hash.capacity() + self.uuid.as_ref().map_or(0, String::capacity)
    }
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

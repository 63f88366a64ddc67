//! Engine KV-event messages: bytes in, index events out.
//!
//! vLLM, SGLang and TensorRT-LLM publish `[topic, seq, payload]` ZMQ
//! messages whose payload is a msgpack batch of BlockStored / BlockRemoved /
//! AllBlocksCleared events, in two encodings (tagged maps in newer releases,
//! positional arrays in older ones) and with hashes as uint64, int64 or
//! bytes; TensorRT-LLM's stores may carry multimodal digest tokens and
//! `mm_keys`. This module turns
//! such messages into the index's [`Event`](crate::Event)s in two steps:
//!
//! 1. [`split_frames`] / [`split_replay_frames`] check the message shape and
//!    [`decode_payload`] decodes the batch into [`RawEvent`]s: faithful to the
//!    wire, with every length bounded and every malformed input an `Err`.
//! 2. A [`WorkerConverter`] per worker applies policy: skips what the worker
//!    does not hold (counted per reason in [`SkipCounters`]), maps media to
//!    tiers and computes each block's local hash from its tokens (for
//!    multimodal blocks, the tokens a router hashes: `multimodal.rs`).
//!
//! It owns no sockets and no threads; the ingest side feeds it bytes. It
//! knows nothing of the index beyond the event model.

mod convert;
mod decode;
mod error;
mod extra_keys;
mod frames;
mod medium;
mod msgpack;
mod multimodal;
mod raw;
mod skip;

pub use convert::{
    split_block_hash, RetainHeld, WorkerConverter, GROUPS_TRACKED_MAX, SALTED_BLOCKS_MAX, SPLIT_FACTOR_MAX,
};
pub use decode::{
    decode_payload, ENGINE_STRING_BYTES_MAX, EVENTS_PER_BATCH_MAX, PAYLOAD_BYTES_MAX, TOKENS_PER_EVENT_MAX,
};
pub use error::WireError;
pub use extra_keys::CACHE_SALT_TAG;
pub use frames::{split_frames, split_replay_frames, ReplayReply, REPLAY_END_SEQ};
pub use medium::tier_for_medium;
pub use msgpack::DEPTH_MAX;
pub use multimodal::OFFSET_CANDIDATES_MAX;
pub use raw::{DecodedBatch, RawEvent, RawMmKey, RawMultimodal, RawRemoved, RawStored};
pub use skip::{SkipCounters, SkipReason};

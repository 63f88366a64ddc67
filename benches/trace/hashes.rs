//! Which engine hashes the events carry to an index.
//!
//! The mock engines give every block an opaque hash under a per-engine seed,
//! as vLLM does by default (a random root hash per process): equal content on
//! two engines has unrelated hashes. With `PYTHONHASHSEED` set alike on every
//! engine, vLLM's root hash is fixed and equal content gets the same hash
//! everywhere; `shared_hash` stands for that: a fixed-seed mix of the block's
//! prefix key, equal on every engine and still opaque to the index.

use super::tokens::mix64;

/// Seed of the engine-independent opaque hashes.
const SHARED_ENGINE_SEED: u64 = 0x5EED_0FF1_8ED0;

/// The hashes an index is fed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum EngineHashes {
    /// Each engine's own opaque hashes (vLLM's default).
    Engine,
    /// Opaque hashes equal on every engine for equal prefixes.
    Shared,
}

impl EngineHashes {
    /// Parses `engine` or `shared`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "engine" => Some(Self::Engine),
            "shared" => Some(Self::Shared),
            _ => None,
        }
    }

    /// The name `parse` accepts.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Engine => "engine",
            Self::Shared => "shared",
        }
    }

    /// The hash of a block whose engine hash is `engine` and prefix key `seq`.
    pub fn of(self, engine: u64, seq: u64) -> u64 {
        match self {
            Self::Engine => engine,
            Self::Shared => shared_hash(seq),
        }
    }
}

/// The opaque hash every engine gives the block completing prefix `seq`.
pub fn shared_hash(seq: u64) -> u64 {
    mix64(seq ^ SHARED_ENGINE_SEED)
}

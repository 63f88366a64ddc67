//! kv-indexer: knows which KV-cache blocks every inference worker holds and
//! answers which worker holds the longest cached prefix of a request.

pub mod event;
pub mod hash;
pub mod index;

pub use event::{Event, EventKind, StorageTier, StoredBlock, WorkerId};

/// The crate version, as printed by `kv-indexer --version`.
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

//! kv-indexer: knows which KV-cache blocks every inference worker holds and
//! answers which worker holds the longest cached prefix of a request.

#[macro_use]
pub mod log;
pub mod config;
pub mod daemon;
pub mod dump;
pub mod endpoint;
pub mod event;
pub mod hash;
pub mod http;
pub mod index;
pub mod ingest;
pub mod json;
pub mod metrics;
pub mod peers;
pub mod predict;
pub mod registry;
pub mod snapshot;
pub mod wire;
pub mod workers_file;

pub use event::{Event, EventKind, StorageTier, StoredBlock, WorkerId};

/// The crate version, as printed by `kv-indexer --version`.
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

//! Local snapshots, so a lone indexer restarts warm.
//!
//! With `--snapshot-dir DIR` the daemon writes its whole state to
//! `DIR/snapshot.bin` every `--snapshot-interval-s` and on SIGTERM/SIGINT,
//! and reads it back at startup before anything else is applied.
//!
//! What a snapshot holds (`Snapshot`): per (model, tenant) index its block
//! size and its dump (`Index::dump_events`, loaded back by
//! `Index::load_dump`, as a peer's dump is); every
//! registration (instance, dp rank, endpoints, model, tenant, block size)
//! with its listener's sequence watermark. The watermark is what makes the
//! restart exact rather than merely warm: seeded back into ingest, the
//! engine's next batch after a gap asks its replay ring for precisely the
//! batches the daemon missed while it was down; a seq that went back says
//! the engine restarted and clears its workers (see `ingest`).
//!
//! Consistency: watermarks are read first, then the writer shards drain
//! what was queued, then the indexes are dumped. So the indexes reflect at
//! least every batch up to each watermark, possibly a few more; replaying
//! those again at startup is harmless (stores and removes are idempotent).
//! The reverse order could lose batches for good.
//!
//! Files: `codec` is the byte format (versioned, checksummed, every length
//! bounded; decoding is all or nothing), `file` the crash-safe write and
//! bounded read, `capture` takes a snapshot of a running registry,
//! `restore` merges one with the command line and applies it, `periodic`
//! is the background writer. Nothing here touches sockets or the index's
//! internals: it uses the registry's and ingest's public faces.

mod capture;
mod codec;
mod file;
mod periodic;
mod restore;

pub use file::SnapshotDir;
pub use periodic::Periodic;
pub use restore::{plan, restore};

use crate::dump::DumpEntry;
use crate::ingest::Watermark;
use crate::registry::RegisterArgs;

/// One registration as saved: what registers it again, and its watermark.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedRegistration {
    pub args: RegisterArgs,
    /// The listener's watermark: highest seq whose batch the indexes
    /// reflect, and that batch's digest.
    pub last_seq: Option<Watermark>,
}

/// One (model, tenant) index as saved: its block size and the blocks each
/// worker holds, as a `/dump` entry holds them.
pub type SavedIndex = DumpEntry;

/// A daemon's state at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Wall-clock time of the capture, ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// `kv-indexer --version` of the writer (for the operator; not checked).
    pub daemon_version: String,
    pub registrations: Vec<SavedRegistration>,
    pub indexes: Vec<SavedIndex>,
}

impl Snapshot {
    /// (block, worker) pairs over every index.
    pub fn pairs(&self) -> u64 {
        self.indexes.iter().map(SavedIndex::pairs).sum()
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

//! Local snapshots, so a lone indexer restarts warm.
//!
//! With `--snapshot-dir DIR` the daemon writes its whole state to
//! `DIR/snapshot.bin` every `--snapshot-interval-s` and on SIGTERM/SIGINT,
//! and reads it back at startup before anything else is applied.
//!
//! What a snapshot holds: every registration (instance, dp rank,
//! endpoints, model, tenant, block size) with its listener's sequence
//! watermark; per (model, tenant) index its block size and the blocks each
//! worker holds, as `/dump` lists them, loaded back as a peer's dump is
//! (`index::Loader`). The watermark is what makes the restart exact rather
//! than merely warm: seeded back into ingest, the engine's next batch
//! after a gap asks its replay ring for precisely the batches the daemon
//! missed while it was down; a seq that went back says the engine
//! restarted and clears its workers (see `ingest`).
//!
//! Consistency: watermarks are read first, then the writer shards drain
//! what was queued, then the indexes are read out. So the indexes reflect
//! at least every batch up to each watermark, possibly a few more;
//! replaying those again at startup is harmless (stores and removes are
//! idempotent). The reverse order could lose batches for good. Except
//! for a stream that starts over (clears its worker and refills it) in
//! between: its old watermark is saved with the refill's partial state
//! (docs/limits.md, "Known corners").
//!
//! Memory: both ways stream. A save reads the indexes out a worker at a
//! time into the file through a fixed buffer; a load reads the header and
//! registrations, decides what to keep (`plan`), then applies the events
//! as they are read into the indexes being built. Neither holds a second
//! copy of the state (formats 3 and 4, from older builds, are read whole).
//!
//! Files: `codec` is the byte format (versioned, checksummed, every count
//! bounded), `write` and `read` write and read it as a stream, `legacy`
//! reads formats 3 and 4 whole, `file` the crash-safe write and the
//! opening of the file, `capture` reads a running registry in order,
//! `plan` merges a snapshot's registrations with the command line into a
//! filter of its events, `restore` applies it all or nothing, `periodic`
//! is the background writer. Nothing here touches sockets or the index's
//! internals: it uses the registry's, ingest's and the dump's faces.

mod capture;
mod codec;
mod file;
mod legacy;
mod periodic;
mod plan;
mod read;
mod restore;
mod write;

pub use file::{Saved, SnapshotDir};
pub use periodic::Periodic;
pub use restore::restore;

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

/// A daemon's state at one moment, whole: what a format 3 or 4 file
/// decodes to (`legacy`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Wall-clock time of the capture, ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// `kv-indexer --version` of the writer (for the operator; not checked).
    pub daemon_version: String,
    pub registrations: Vec<SavedRegistration>,
    pub indexes: Vec<SavedIndex>,
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

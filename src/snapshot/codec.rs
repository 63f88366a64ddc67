//! The snapshot file format, written and read as a stream (`write.rs`,
//! `read.rs`): a header, the registrations, the index events in the
//! compact dump's record encoding (`dump::binary`, the one event codec),
//! and a trailer. All integers little-endian.
//!
//! ```text
//! header:
//!   magic            8 bytes  "KVIXSNAP"            (fixed offset 0, forever)
//!   format           u32      FORMAT_VERSION        (fixed offset 8, forever)
//!   version_len      u16      <= VERSION_BYTES_MAX
//!   version          bytes    writer's `kv-indexer --version`, UTF-8
//!   created_unix_ms  u64
//! registrations:
//!   u32 bytes (<= REGISTRATIONS_BYTES_MAX), then that many bytes:
//!   u32 registrations (<= REGISTRATIONS_MAX), each:
//!     u64 instance_id, u32 dp_rank, u32 block_size,
//!     addr endpoint, opt_addr replay_endpoint, name model_name, name tenant_id,
//!     u8 has_last_seq, [u64 last_seq, u8 has_digest, [u64 digest]]
//! events: the compact dump's records (`dump::binary`), as `/dump` writes
//!   them from the live indexes: per index an index record, then per
//!   worker a worker record and its events; ended by the end record's
//!   kind (a 0 byte) alone
//! trailer:
//!   u32 registrations, u32 indexes (<= registry::INDEXES_MAX),
//!   u64 events, u64 blocks (of stored events: the (block, worker) pairs)
//!   u64 xxh3-64 of every byte of the file before this field
//! name     = u32 len (1..=registry::NAME_BYTES_MAX), UTF-8 bytes
//! addr     = u32 len (1..=endpoint::ADDRESS_BYTES_MAX), UTF-8 bytes
//! opt_addr = u8 present, [addr]
//! ```
//!
//! Writing goes as the indexes are read out (`write.rs`): a fixed buffer
//! whatever the state's size, the checksum computed on the way. The limits
//! are the daemon's own, so everything it holds can be written and read
//! back: the registry refuses longer names and endpoints, and a stored
//! chain longer than an event may be is written as chained events.
//!
//! Reading (`read.rs`) checks, in order: magic (a foreign file), format (a
//! future one; magic and format never move, so any future layout is
//! recognised as such), the header, the registrations (every count
//! against its named limit and against the bytes left before anything is
//! allocated); then the events, each checked as `dump::binary` checks a
//! peer's and handed to the caller as soon as it is read; then the
//! trailer: its checksum, its counts against what came, and the end of the
//! file. So a file found bad past its registrations (truncated, corrupt, a
//! count past its limit) has handed the caller events it must drop:
//! `restore` stages them where nobody sees them, and keeps them only once
//! the trailer checked out.
//!
//! Older formats, still read: 4 and 3 (`legacy.rs`) had one header with
//! the body's length and checksum, then the whole body, the events in an
//! encoding of their own (format 3 without the watermarks' digests). They
//! come from builds that held the whole state in memory to write them, and
//! are read whole, as those builds read them, then handed to the caller
//! event by event like a stream. Formats 1 and 2 are refused (see
//! `SnapshotError::OldVersion`).

use super::SavedRegistration;
use crate::endpoint::ADDRESS_BYTES_MAX;
use crate::event::WorkerId;
use crate::ingest::{Watermark, BLOCK_SIZE_MAX, LISTENERS_MAX};
use crate::registry::{RegisterArgs, NAME_BYTES_MAX};
use rustc_hash::FxHashSet;
use std::fmt;

/// First bytes of every snapshot file.
pub const MAGIC: [u8; 8] = *b"KVIXSNAP";
/// The format this build writes: the streamed layout above. Format 4 (and
/// 3 before it, without digests) wrote a whole body behind one header.
pub const FORMAT_VERSION: u32 = 5;
/// The oldest format this build reads.
pub(super) const FORMAT_READ_MIN: u32 = 3;
/// Longest daemon version string in a header, in bytes.
pub const VERSION_BYTES_MAX: usize = 64;
/// Most registrations in a snapshot (one listener each).
pub const REGISTRATIONS_MAX: usize = LISTENERS_MAX;
/// Largest encoded registration: ids, block size, the longest endpoints
/// and names, flags, watermark and digest.
const REGISTRATION_BYTES_MAX: usize = 8 + 4 + 4 + 2 * (4 + ADDRESS_BYTES_MAX) + 1 + 2 * (4 + NAME_BYTES_MAX) + 18;
/// Largest registrations section (about 4.4 MB), read whole before the events.
pub const REGISTRATIONS_BYTES_MAX: usize = 4 + REGISTRATIONS_MAX * REGISTRATION_BYTES_MAX;
/// Bytes of the trailer: counts and the checksum.
pub const TRAILER_BYTES: usize = 4 + 4 + 8 + 8 + 8;

/// Why a snapshot file was not used. Each says what to do in `Display`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotError {
    /// Zero bytes: a write was cut short before anything reached the disk.
    Empty,
    /// Not a snapshot at all (bad magic).
    Foreign,
    /// Written by a newer build, in a format this one cannot read.
    FutureVersion { format: u32 },
    /// A format number no build ever wrote.
    UnknownVersion { format: u32 },
    /// Written by an older build in a format this one no longer reads.
    OldVersion { format: u32 },
    /// The file ends early.
    Truncated { have: u64, need: u64 },
    /// More bytes than the format holds.
    TrailingBytes { extra: u64 },
    /// A format 3 or 4 body would be larger than its limit, `max`.
    TooLarge { bytes: u64, max: u64 },
    /// The header cannot be read (format 4: does not match its checksum).
    CorruptHeader,
    /// The file does not match its checksum.
    Checksum,
    /// The content does not decode, or breaks a limit: at a byte, what.
    Malformed(String),
    /// What the file holds cannot be applied (`--max-pairs`).
    Refused(String),
    /// Reading the file failed.
    Io(String),
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::Empty => write!(f, "the file is empty"),
            SnapshotError::Foreign => write!(f, "not a kv-indexer snapshot (bad magic)"),
            SnapshotError::FutureVersion { format } => write!(
                f,
                "written by a newer kv-indexer in format {format}; this build reads up to format {FORMAT_VERSION}"
            ),
            SnapshotError::UnknownVersion { format } => write!(f, "unknown format {format}"),
            SnapshotError::OldVersion { format } => write!(
                f,
                "written by an older kv-indexer in format {format}, which kept blocks held without their \
                 prefix otherwise (format 1 left them out, format 2 under stand-in blocks); this build reads \
                 formats {FORMAT_READ_MIN} to {FORMAT_VERSION}"
            ),
            SnapshotError::Truncated { have, need } => {
                write!(f, "truncated: {have} bytes where at least {need} are needed")
            }
            SnapshotError::TrailingBytes { extra } => write!(f, "{extra} bytes past the end of the snapshot"),
            SnapshotError::TooLarge { bytes, max } => write!(f, "body of {bytes} bytes is over the {max} limit"),
            SnapshotError::CorruptHeader => write!(f, "corrupt header (the file is corrupt)"),
            SnapshotError::Checksum => write!(f, "checksum mismatch (the file is corrupt)"),
            SnapshotError::Malformed(what) => write!(f, "malformed: {what}"),
            SnapshotError::Refused(why) => write!(f, "not applied: {why}"),
            SnapshotError::Io(e) => write!(f, "cannot read it: {e}"),
        }
    }
}

impl SnapshotError {
    /// What the operator can do about it, in a few words.
    pub fn hint(&self) -> &'static str {
        match self {
            SnapshotError::Empty | SnapshotError::Truncated { .. } => {
                "a write was cut short; the next snapshot write replaces the file"
            }
            SnapshotError::Foreign => "check --snapshot-dir; the next snapshot write replaces the file",
            SnapshotError::FutureVersion { .. } => {
                "start the newer kv-indexer to use it; the next snapshot write here replaces it"
            }
            SnapshotError::Io(_) => "check the file's permissions",
            SnapshotError::OldVersion { .. } => {
                "peers (--peers) or the engines fill the index again; the next snapshot write replaces the file"
            }
            SnapshotError::Refused(_) => {
                "raise --max-pairs to start from it; peers (--peers) or the engines fill the index meanwhile"
            }
            _ => "the next snapshot write replaces the file",
        }
    }
}

impl std::error::Error for SnapshotError {}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Within the decoder's limits: the registry refuses longer names and endpoints.
    debug_assert!(s.len() <= NAME_BYTES_MAX.max(ADDRESS_BYTES_MAX), "{s:?}");
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The registrations: their count, then each (the bytes formats 4 and 5 share).
pub(super) fn put_registrations(out: &mut Vec<u8>, registrations: &[SavedRegistration]) {
    out.extend_from_slice(&(registrations.len() as u32).to_le_bytes());
    for SavedRegistration { args: r, last_seq } in registrations {
        out.extend_from_slice(&r.instance_id.to_le_bytes());
        out.extend_from_slice(&r.dp_rank.to_le_bytes());
        out.extend_from_slice(&r.block_size.to_le_bytes());
        put_str(out, &r.endpoint);
        out.push(r.replay_endpoint.is_some() as u8);
        if let Some(e) = &r.replay_endpoint {
            put_str(out, e);
        }
        put_str(out, &r.model_name);
        put_str(out, &r.tenant_id);
        out.push(last_seq.is_some() as u8);
        if let Some(Watermark { seq, digest }) = last_seq {
            out.extend_from_slice(&seq.to_le_bytes());
            out.push(digest.is_some() as u8);
            if let Some(digest) = digest {
                out.extend_from_slice(&digest.to_le_bytes());
            }
        }
    }
}

/// A bounds-checked cursor over bytes read whole (the registrations
/// section; a format 3 or 4 body).
pub(super) struct Reader<'a> {
    pub buf: &'a [u8],
    pub pos: usize,
    /// Offset of `buf` in the file, for error messages.
    pub base: u64,
}

pub(super) type Res<T> = Result<T, SnapshotError>;

impl<'a> Reader<'a> {
    pub fn malformed(&self, what: impl fmt::Display) -> SnapshotError {
        SnapshotError::Malformed(format!("at byte {}: {what}", self.base + self.pos as u64))
    }

    pub fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn take(&mut self, n: usize) -> Res<&'a [u8]> {
        if n > self.left() {
            return Err(self.malformed(format!("needs {n} bytes, {} left", self.left())));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn u8(&mut self) -> Res<u8> {
        Ok(self.take(1)?[0])
    }

    pub fn u32(&mut self) -> Res<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    pub fn u64(&mut self) -> Res<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    /// A watermark's seq, and its digest from format 4 on.
    fn watermark(&mut self, format: u32) -> Res<Watermark> {
        let seq = self.u64()?;
        let digest = if format >= 4 && self.flag("watermark digest")? { Some(self.u64()?) } else { None };
        Ok(Watermark { seq, digest })
    }

    pub fn flag(&mut self, what: &str) -> Res<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.malformed(format!("{what}: flag byte {b}"))),
        }
    }

    /// A count of items of at least `item_bytes` each: at most `max`, and
    /// no more than the bytes left can hold, so allocating it is safe.
    pub fn count(&mut self, n: u64, max: usize, item_bytes: usize, what: &str) -> Res<usize> {
        if n > max as u64 {
            return Err(self.malformed(format!("{n} {what}, over the limit of {max}")));
        }
        if n.saturating_mul(item_bytes as u64) > self.left() as u64 {
            return Err(self.malformed(format!("{n} {what} cannot fit in the {} bytes left", self.left())));
        }
        Ok(n as usize)
    }

    /// A non-empty UTF-8 string of at most `max` bytes.
    pub fn name(&mut self, what: &str, max: usize) -> Res<String> {
        let n = self.u32()? as u64;
        let n = self.count(n, max, 1, what)?;
        match std::str::from_utf8(self.take(n)?) {
            Ok("") => Err(self.malformed(format!("empty {what}"))),
            Ok(s) => Ok(s.to_string()),
            Err(_) => Err(self.malformed(format!("{what} is not UTF-8"))),
        }
    }

    pub fn block_size(&mut self) -> Res<u32> {
        let b = self.u32()?;
        if b == 0 || b > BLOCK_SIZE_MAX {
            return Err(self.malformed(format!("block_size {b} outside 1..={BLOCK_SIZE_MAX}")));
        }
        Ok(b)
    }
}

/// Smallest encoded registration: ids, block size, four empty strings, two flags.
const REGISTRATION_BYTES_MIN: usize = 8 + 4 + 4 + 4 + 1 + 4 + 4 + 1;

/// Reads the registrations (`put_registrations`) of a file in `format`.
pub(super) fn read_registrations(r: &mut Reader<'_>, format: u32) -> Res<Vec<SavedRegistration>> {
    let n = r.u32()? as u64;
    let n = r.count(n, REGISTRATIONS_MAX, REGISTRATION_BYTES_MIN, "registrations")?;
    let mut registrations = Vec::with_capacity(n);
    let mut keys: FxHashSet<WorkerId> = FxHashSet::default();
    for _ in 0..n {
        let (instance_id, dp_rank) = (r.u64()?, r.u32()?);
        let block_size = r.block_size()?;
        let endpoint = r.name("endpoint", ADDRESS_BYTES_MAX)?;
        let replay_endpoint =
            if r.flag("replay endpoint")? { Some(r.name("replay endpoint", ADDRESS_BYTES_MAX)?) } else { None };
        let model_name = r.name("model name", NAME_BYTES_MAX)?;
        let tenant_id = r.name("tenant id", NAME_BYTES_MAX)?;
        let last_seq = if r.flag("watermark")? { Some(r.watermark(format)?) } else { None };
        let args = RegisterArgs { instance_id, dp_rank, endpoint, replay_endpoint, model_name, tenant_id, block_size };
        if !keys.insert(args.worker()) {
            return Err(r.malformed(format!("worker {} registered twice", args.worker())));
        }
        registrations.push(SavedRegistration { args, last_seq });
    }
    Ok(registrations)
}

/// The format of a file from its first bytes (at least 12 unless the file
/// is shorter), once its magic is checked: one this build reads, or why not.
pub(super) fn check_format(prefix: &[u8]) -> Res<u32> {
    if prefix.is_empty() {
        return Err(SnapshotError::Empty);
    }
    let magic_len = MAGIC.len().min(prefix.len());
    if prefix[..magic_len] != MAGIC[..magic_len] {
        return Err(SnapshotError::Foreign);
    }
    if prefix.len() < 12 {
        return Err(SnapshotError::Truncated { have: prefix.len() as u64, need: 12 });
    }
    let format = u32::from_le_bytes(prefix[8..12].try_into().expect("4 bytes"));
    match format {
        0 => Err(SnapshotError::UnknownVersion { format }),
        f if f > FORMAT_VERSION => Err(SnapshotError::FutureVersion { format }),
        f if f < FORMAT_READ_MIN => Err(SnapshotError::OldVersion { format }),
        f => Ok(f),
    }
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;

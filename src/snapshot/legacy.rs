//! Formats 3 and 4, still read: one header announcing the body's length
//! and checksum, then the whole body, the events in an encoding of their
//! own. Builds that wrote them held the whole state in memory to do so;
//! they are read whole as those builds read them (bounded by
//! `BODY_BYTES_MAX`), then handed to the caller event by event, as a
//! format 5 file is. All integers little-endian.
//!
//! ```text
//! header:
//!   magic            8 bytes  "KVIXSNAP"
//!   format           u32      3 or 4
//!   version_len      u16      <= VERSION_BYTES_MAX
//!   version          bytes    writer's `kv-indexer --version`, UTF-8
//!   created_unix_ms  u64
//!   body_len         u64      <= BODY_BYTES_MAX; the file ends right after the body
//!   body_xxh3        u64      xxh3-64 of the body
//!   header_xxh3      u64      xxh3-64 of every header byte before this field
//! body:
//!   the registrations as format 5 writes them (`codec`; format 3 has no
//!     digest part: a watermark without a digest)
//!   u32 indexes (<= registry::INDEXES_MAX), each:
//!     name model_name, name tenant_id, u32 block_size,
//!     u32 workers, each: u64 instance_id, u32 dp_rank
//!     u64 events, each:
//!       u8 tag: bits 0-1 tier, bits 2-3 kind (0 stored, 1 removed, 2 cleared),
//!               bit 4 has_parent, bit 5 orphan (stored only), bits 6-7 zero
//!       u32 worker (position in the index's worker table)
//!       stored:  [u64 parent], [orphan], u32 n, n x (u64 engine_hash, u64 local_hash)
//!       removed: u32 n, n x u64 engine_hash     (n <= event::BLOCKS_PER_EVENT_MAX)
//!     orphan = u32 position, u8 has_anchor, [u64 anchor], u32 m, m x u64 local_hash
//! ```
//!
//! Decoding checks the header's checksum, the body's length against the
//! file's and its checksum, then every count against its limit and the
//! bytes left before anything is allocated: a complete `Snapshot` or an
//! error.

use super::codec::{check_format, read_registrations, Reader, Res, SnapshotError, VERSION_BYTES_MAX};
use super::{SavedIndex, Snapshot};
use crate::dump::binary::{
    KIND_CLEARED, KIND_REMOVED, KIND_STORED, TAG_HAS_PARENT, TAG_KIND_SHIFT, TAG_ORPHAN, TAG_RESERVED, TAG_TIER_MASK,
};
use crate::event::{Event, EventKind, StorageTier, StoredBlock, WorkerId, BLOCKS_PER_EVENT_MAX};
use crate::index::{DumpEvent, Orphan};
use crate::registry::{INDEXES_MAX, NAME_BYTES_MAX};
use rustc_hash::FxHashSet;
use std::io::Read;
use xxhash_rust::xxh3::xxh3_64;

/// Largest header: the fixed fields plus the longest version string.
pub const HEADER_BYTES_MAX: usize = 8 + 4 + 2 + VERSION_BYTES_MAX + 8 * 4;
/// Largest body accepted, in bytes (about 500 million (block, worker) pairs).
pub const BODY_BYTES_MAX: u64 = 8 << 30;
/// Most workers in one index's table.
pub const WORKERS_PER_INDEX_MAX: usize = 1 << 22;

/// What a header says, once checked.
struct Header {
    format: u32,
    daemon_version: String,
    created_unix_ms: u64,
    body_len: u64,
    body_xxh3: u64,
    len: usize,
}

/// Checks the header of a file image (or of its first bytes: a prefix that
/// holds the whole header is enough).
fn decode_header(bytes: &[u8]) -> Res<Header> {
    let format = check_format(bytes)?;
    if format > 4 {
        return Err(SnapshotError::Malformed(format!("format {format} is not read whole")));
    }
    let truncated = |need: usize| SnapshotError::Truncated { have: bytes.len() as u64, need: need as u64 };
    if bytes.len() < 14 {
        return Err(truncated(14));
    }
    let version_len = u16::from_le_bytes([bytes[12], bytes[13]]) as usize;
    if version_len > VERSION_BYTES_MAX {
        return Err(SnapshotError::CorruptHeader);
    }
    let len = 14 + version_len + 32;
    if bytes.len() < len {
        return Err(truncated(len));
    }
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let fixed = 14 + version_len;
    if xxh3_64(&bytes[..len - 8]) != u64_at(len - 8) {
        return Err(SnapshotError::CorruptHeader);
    }
    let daemon_version = std::str::from_utf8(&bytes[14..fixed]).map_err(|_| SnapshotError::CorruptHeader)?.to_string();
    let body_len = u64_at(fixed + 8);
    if body_len > BODY_BYTES_MAX {
        return Err(SnapshotError::TooLarge { bytes: body_len, max: BODY_BYTES_MAX });
    }
    let (created_unix_ms, body_xxh3) = (u64_at(fixed), u64_at(fixed + 16));
    Ok(Header { format, daemon_version, created_unix_ms, body_len, body_xxh3, len })
}

/// Reads the rest of a file of `len` bytes whose first bytes, `prefix`,
/// were read already, never more than its header announces, and decodes it.
pub(super) fn read_whole(prefix: &[u8], r: impl Read, len: u64) -> Res<Snapshot> {
    let io = |e: std::io::Error| SnapshotError::Io(e.to_string());
    let mut bytes = prefix.to_vec();
    let mut r = r.take(u64::MAX);
    let want = HEADER_BYTES_MAX.saturating_sub(bytes.len()) as u64;
    (&mut r).take(want).read_to_end(&mut bytes).map_err(io)?;
    let h = decode_header(&bytes)?;
    let need = h.len as u64 + h.body_len;
    if len > need {
        return Err(SnapshotError::TrailingBytes { extra: len - need });
    }
    // Bounded by the announced length, itself bounded by the header
    // check; `decode` says if the file is shorter.
    bytes.reserve_exact((len as usize).saturating_sub(bytes.len()));
    r.take(need.saturating_sub(bytes.len() as u64)).read_to_end(&mut bytes).map_err(io)?;
    decode(&bytes)
}

/// Decodes a complete file image, or says why it cannot be used.
pub fn decode(bytes: &[u8]) -> Res<Snapshot> {
    let h = decode_header(bytes)?;
    let need = h.len as u64 + h.body_len;
    let have = bytes.len() as u64;
    if have < need {
        return Err(SnapshotError::Truncated { have, need });
    }
    if have > need {
        return Err(SnapshotError::TrailingBytes { extra: have - need });
    }
    let body = &bytes[h.len..];
    if xxh3_64(body) != h.body_xxh3 {
        return Err(SnapshotError::Checksum);
    }
    let mut r = Reader { buf: body, pos: 0, base: h.len as u64 };
    let registrations = read_registrations(&mut r, h.format)?;
    let indexes = decode_indexes(&mut r)?;
    if r.pos != body.len() {
        return Err(r.malformed("bytes left after the last index"));
    }
    Ok(Snapshot { created_unix_ms: h.created_unix_ms, daemon_version: h.daemon_version, registrations, indexes })
}

/// Smallest encoded index: two strings, block size, two counts.
const INDEX_BYTES_MIN: usize = 4 + 4 + 4 + 4 + 8;
/// Smallest encoded event: tag and worker.
const EVENT_BYTES_MIN: usize = 1 + 4;
/// Most events in one index: as many as the largest body can hold.
const EVENTS_PER_INDEX_MAX: usize = (BODY_BYTES_MAX / EVENT_BYTES_MIN as u64) as usize;

fn decode_indexes(r: &mut Reader<'_>) -> Res<Vec<SavedIndex>> {
    let n = r.u32()? as u64;
    let n = r.count(n, INDEXES_MAX, INDEX_BYTES_MIN, "indexes")?;
    let mut indexes = Vec::with_capacity(n);
    let mut index_keys: FxHashSet<(String, String)> = FxHashSet::default();
    for _ in 0..n {
        let ix = decode_index(r)?;
        if !index_keys.insert((ix.model_name.clone(), ix.tenant_id.clone())) {
            return Err(r.malformed(format!("index model={:?} tenant={:?} twice", ix.model_name, ix.tenant_id)));
        }
        indexes.push(ix);
    }
    Ok(indexes)
}

fn decode_index(r: &mut Reader<'_>) -> Res<SavedIndex> {
    let model_name = r.name("model name", NAME_BYTES_MAX)?;
    let tenant_id = r.name("tenant id", NAME_BYTES_MAX)?;
    let block_size = r.block_size()?;
    let n = r.u32()? as u64;
    let n = r.count(n, WORKERS_PER_INDEX_MAX, 12, "workers")?;
    let mut workers = Vec::with_capacity(n);
    for _ in 0..n {
        workers.push(WorkerId::new(r.u64()?, r.u32()?));
    }
    let n = r.u64()?;
    let n = r.count(n, EVENTS_PER_INDEX_MAX, EVENT_BYTES_MIN, "events")?;
    let mut events = Vec::with_capacity(n);
    for _ in 0..n {
        events.push(decode_event(r, &workers)?);
    }
    Ok(SavedIndex { model_name, tenant_id, block_size, events })
}

fn decode_event(r: &mut Reader<'_>, workers: &[WorkerId]) -> Res<DumpEvent> {
    let tag = r.u8()?;
    let kind = (tag >> TAG_KIND_SHIFT) & 0b11;
    let has_parent = tag & TAG_HAS_PARENT != 0;
    let has_orphan = tag & TAG_ORPHAN != 0;
    if tag & TAG_RESERVED != 0 || kind > KIND_CLEARED || ((has_parent || has_orphan) && kind != KIND_STORED) {
        return Err(r.malformed(format!("bad event tag {tag:#04x}")));
    }
    let tier = StorageTier::ALL[(tag & TAG_TIER_MASK) as usize];
    let w = r.u32()? as usize;
    let Some(&worker) = workers.get(w) else {
        return Err(r.malformed(format!("worker {w} of a table of {}", workers.len())));
    };
    let mut orphan = None;
    let kind = match kind {
        KIND_STORED => {
            let parent = if has_parent { Some(r.u64()?) } else { None };
            if has_orphan {
                orphan = Some(decode_orphan(r)?);
            }
            let n = r.u32()? as u64;
            let n = r.count(n, BLOCKS_PER_EVENT_MAX, 16, "blocks")?;
            let mut blocks = Vec::with_capacity(n);
            for _ in 0..n {
                blocks.push(StoredBlock { engine_hash: r.u64()?, local_hash: r.u64()? });
            }
            EventKind::Stored { parent, blocks }
        }
        KIND_REMOVED => {
            let n = r.u32()? as u64;
            let n = r.count(n, BLOCKS_PER_EVENT_MAX, 8, "hashes")?;
            let mut engine_hashes = Vec::with_capacity(n);
            for _ in 0..n {
                engine_hashes.push(r.u64()?);
            }
            EventKind::Removed { engine_hashes }
        }
        _ => EventKind::Cleared,
    };
    Ok(DumpEvent { event: Event { worker, tier, kind }, orphan })
}

fn decode_orphan(r: &mut Reader<'_>) -> Res<Orphan> {
    let position = r.u32()?;
    let anchor = if r.flag("anchor")? { Some(r.u64()?) } else { None };
    let n = r.u32()? as u64;
    let n = r.count(n, BLOCKS_PER_EVENT_MAX, 8, "missing ancestors")?;
    let mut missing = Vec::with_capacity(n);
    for _ in 0..n {
        missing.push(r.u64()?);
    }
    let o = Orphan { position, anchor, missing };
    if !o.is_consistent() {
        return Err(r.malformed(format!("an orphan at position {position} with {n} missing ancestors")));
    }
    Ok(o)
}

#[cfg(test)]
#[path = "legacy_tests.rs"]
pub(super) mod tests;

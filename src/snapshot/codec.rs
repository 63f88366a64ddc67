//! The snapshot file format: a self-describing header, then a compact
//! length-prefixed binary body. All integers little-endian.
//!
//! ```text
//! header:
//!   magic            8 bytes  "KVIXSNAP"            (fixed offset 0, forever)
//!   format           u32      FORMAT_VERSION        (fixed offset 8, forever)
//!   version_len      u16      <= VERSION_BYTES_MAX
//!   version          bytes    writer's `kv-indexer --version`, UTF-8
//!   created_unix_ms  u64
//!   body_len         u64      <= BODY_BYTES_MAX; the file ends right after the body
//!   body_xxh3        u64      xxh3-64 of the body
//!   header_xxh3      u64      xxh3-64 of every header byte before this field
//! body:
//!   u32 registrations, each:
//!     u64 instance_id, u32 dp_rank, u32 block_size,
//!     addr endpoint, opt_addr replay_endpoint, name model_name, name tenant_id,
//!     u8 has_last_seq, [u64 last_seq, u8 has_digest, [u64 digest]]
//!       (format 3 has no digest part: a watermark without a digest)
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
//!              (m missing ancestors, consistent with the position: see `index::Orphan`)
//! name     = u32 len (1..=registry::NAME_BYTES_MAX), UTF-8 bytes
//! addr     = u32 len (1..=endpoint::ADDRESS_BYTES_MAX), UTF-8 bytes
//! opt_addr = u8 present, [addr]
//! ```
//!
//! The limits are the daemon's own, so everything it holds can be written
//! and read back: the registry refuses longer names and endpoints, and a
//! stored chain longer than an event may be is written as chained events.
//!
//! Decoding checks, in order: magic (a foreign file), format (a future
//! one; magic and format never move, so any future layout is recognised
//! as such), the header checksum, the body length against the file's
//! (truncated or trailing bytes), the body checksum, then the body, where
//! every count is checked against its named limit and against the bytes
//! left before anything is allocated. The result is a complete `Snapshot`
//! or an error: nothing is ever half-decoded.

use super::{SavedIndex, SavedRegistration, Snapshot};
use crate::endpoint::ADDRESS_BYTES_MAX;
use crate::event::{Event, EventKind, StorageTier, StoredBlock, WorkerId, BLOCKS_PER_EVENT_MAX};
use crate::index::{DumpEvent, Orphan};
use crate::ingest::{Watermark, BLOCK_SIZE_MAX, LISTENERS_MAX};
use crate::log::truncate_utf8;
use crate::registry::{RegisterArgs, INDEXES_MAX, NAME_BYTES_MAX};
use rustc_hash::{FxHashMap, FxHashSet};
use std::fmt;
use xxhash_rust::xxh3::xxh3_64;

/// First bytes of every snapshot file.
pub const MAGIC: [u8; 8] = *b"KVIXSNAP";
/// The format this build writes. Format 4 keeps beside each watermark the
/// digest of that batch's payload (a ring fill tells the same engine
/// process from a new one by it); format 3, which it still reads, did not.
/// Format 3 holds exactly the blocks each worker holds, orphans placed by
/// their missing ancestors' local hashes; format 2 carried stand-in
/// ancestor blocks, removed again after them; format 1 left orphans out.
pub const FORMAT_VERSION: u32 = 4;
/// The oldest format this build reads.
const FORMAT_READ_MIN: u32 = 3;
/// Longest daemon version string in a header, in bytes.
pub const VERSION_BYTES_MAX: usize = 64;
/// Largest header: the fixed fields plus the longest version string.
pub const HEADER_BYTES_MAX: usize = 8 + 4 + 2 + VERSION_BYTES_MAX + 8 * 4;
/// Largest body accepted, in bytes (about 500 million (block, worker) pairs).
pub const BODY_BYTES_MAX: u64 = 8 << 30;
/// Most registrations in a snapshot (one listener each).
pub const REGISTRATIONS_MAX: usize = LISTENERS_MAX;
/// Most workers in one index's table.
pub const WORKERS_PER_INDEX_MAX: usize = 1 << 22;

const TAG_TIER_MASK: u8 = 0b11;
const TAG_KIND_SHIFT: u8 = 2;
const TAG_HAS_PARENT: u8 = 1 << 4;
const TAG_ORPHAN: u8 = 1 << 5;
const TAG_RESERVED: u8 = 0b1100_0000;
const KIND_STORED: u8 = 0;
const KIND_REMOVED: u8 = 1;
const KIND_CLEARED: u8 = 2;

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
    /// More bytes than the header announces.
    TrailingBytes { extra: u64 },
    /// The body would be larger than `BODY_BYTES_MAX`.
    TooLarge { bytes: u64 },
    /// The header does not match its checksum (or cannot even be delimited).
    CorruptHeader,
    /// The body does not match its checksum.
    BodyChecksum,
    /// The body passed its checksum but does not decode (a writer bug).
    Malformed { offset: u64, what: String },
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
            SnapshotError::TrailingBytes { extra } => write!(f, "{extra} bytes past the end the header announces"),
            SnapshotError::TooLarge { bytes } => write!(f, "body of {bytes} bytes is over the {BODY_BYTES_MAX} limit"),
            SnapshotError::CorruptHeader => write!(f, "header checksum mismatch (the file is corrupt)"),
            SnapshotError::BodyChecksum => write!(f, "body checksum mismatch (the file is corrupt)"),
            SnapshotError::Malformed { offset, what } => write!(f, "malformed body at byte {offset}: {what}"),
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
            _ => "the next snapshot write replaces the file",
        }
    }
}

impl std::error::Error for SnapshotError {}

/// Encodes a snapshot as a complete file image.
pub fn encode(s: &Snapshot) -> Vec<u8> {
    let body = encode_body(s);
    let mut out = Vec::with_capacity(HEADER_BYTES_MAX + body.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    let version = truncate_utf8(&s.daemon_version, VERSION_BYTES_MAX);
    out.extend_from_slice(&(version.len() as u16).to_le_bytes());
    out.extend_from_slice(version.as_bytes());
    out.extend_from_slice(&s.created_unix_ms.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&xxh3_64(&body).to_le_bytes());
    let header_sum = xxh3_64(&out);
    out.extend_from_slice(&header_sum.to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Within the decoder's limits: the registry refuses longer names and endpoints.
    debug_assert!(s.len() <= NAME_BYTES_MAX.max(ADDRESS_BYTES_MAX), "{s:?}");
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn encode_body(s: &Snapshot) -> Vec<u8> {
    let pairs: u64 = s.pairs();
    let mut out = Vec::with_capacity(64 + pairs as usize * 16 + s.registrations.len() * 128);
    out.extend_from_slice(&(s.registrations.len() as u32).to_le_bytes());
    for r in &s.registrations {
        put_registration(&mut out, r);
    }
    out.extend_from_slice(&(s.indexes.len() as u32).to_le_bytes());
    for ix in &s.indexes {
        put_str(&mut out, &ix.model_name);
        put_str(&mut out, &ix.tenant_id);
        out.extend_from_slice(&ix.block_size.to_le_bytes());
        let table = put_workers(&mut out, &ix.events);
        // The count is patched in once the events are written: a stored
        // chain longer than an event may be is written as chained events.
        let count_at = out.len();
        out.extend_from_slice(&0u64.to_le_bytes());
        let events: u64 = ix.events.iter().map(|e| put_event(&mut out, e, &table)).sum();
        out[count_at..count_at + 8].copy_from_slice(&events.to_le_bytes());
    }
    out
}

fn put_registration(out: &mut Vec<u8>, SavedRegistration { args: r, last_seq }: &SavedRegistration) {
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

/// Writes the index's worker table, in order of first event; each worker's
/// row in it.
fn put_workers(out: &mut Vec<u8>, events: &[DumpEvent]) -> FxHashMap<WorkerId, u32> {
    let mut table: FxHashMap<WorkerId, u32> = FxHashMap::default();
    let mut workers: Vec<WorkerId> = Vec::new();
    for e in events {
        table.entry(e.event.worker).or_insert_with(|| {
            workers.push(e.event.worker);
            (workers.len() - 1) as u32
        });
    }
    out.extend_from_slice(&(workers.len() as u32).to_le_bytes());
    for w in &workers {
        out.extend_from_slice(&w.instance_id.to_le_bytes());
        out.extend_from_slice(&w.dp_rank.to_le_bytes());
    }
    table
}

/// Writes one dump event; the events written. A stored chain longer than
/// an event may be is written as chained events, each under the last block
/// of the one before (applied in order they store the same chain).
fn put_event(out: &mut Vec<u8>, DumpEvent { event: e, orphan }: &DumpEvent, table: &FxHashMap<WorkerId, u32>) -> u64 {
    let head = |out: &mut Vec<u8>, kind: u8, parent: Option<u64>, orphan: Option<&Orphan>| {
        let tag = e.tier.index() as u8
            | kind << TAG_KIND_SHIFT
            | if parent.is_some() { TAG_HAS_PARENT } else { 0 }
            | if orphan.is_some() { TAG_ORPHAN } else { 0 };
        out.push(tag);
        out.extend_from_slice(&table[&e.worker].to_le_bytes());
        if let Some(p) = parent {
            out.extend_from_slice(&p.to_le_bytes());
        }
        if let Some(o) = orphan {
            put_orphan(out, o);
        }
    };
    match &e.kind {
        EventKind::Stored { parent, blocks } => {
            let (mut parent, mut orphan, mut events) = (*parent, orphan.as_ref(), 0);
            // An empty store is still one event.
            for piece in blocks.chunks(BLOCKS_PER_EVENT_MAX).chain(blocks.is_empty().then_some(&[][..])) {
                head(out, KIND_STORED, parent, orphan.take());
                out.extend_from_slice(&(piece.len() as u32).to_le_bytes());
                for b in piece {
                    out.extend_from_slice(&b.engine_hash.to_le_bytes());
                    out.extend_from_slice(&b.local_hash.to_le_bytes());
                }
                parent = piece.last().map(|b| b.engine_hash);
                events += 1;
            }
            events
        }
        EventKind::Removed { engine_hashes } => {
            // From engines, already within the event limit.
            head(out, KIND_REMOVED, None, None);
            out.extend_from_slice(&(engine_hashes.len() as u32).to_le_bytes());
            for h in engine_hashes {
                out.extend_from_slice(&h.to_le_bytes());
            }
            1
        }
        EventKind::Cleared => {
            head(out, KIND_CLEARED, None, None);
            1
        }
    }
}

fn put_orphan(out: &mut Vec<u8>, o: &Orphan) {
    // Missing ancestors lie above the orphan, so there are fewer than the
    // deepest position indexed: within the event limit at the default.
    debug_assert!(o.missing.len() <= BLOCKS_PER_EVENT_MAX);
    out.extend_from_slice(&o.position.to_le_bytes());
    out.push(o.anchor.is_some() as u8);
    if let Some(a) = o.anchor {
        out.extend_from_slice(&a.to_le_bytes());
    }
    out.extend_from_slice(&(o.missing.len() as u32).to_le_bytes());
    for l in &o.missing {
        out.extend_from_slice(&l.to_le_bytes());
    }
}

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
fn decode_header(bytes: &[u8]) -> Result<Header, SnapshotError> {
    if bytes.is_empty() {
        return Err(SnapshotError::Empty);
    }
    let truncated = |need: usize| SnapshotError::Truncated { have: bytes.len() as u64, need: need as u64 };
    let magic_len = MAGIC.len().min(bytes.len());
    if bytes[..magic_len] != MAGIC[..magic_len] {
        return Err(SnapshotError::Foreign);
    }
    if bytes.len() < 14 {
        return Err(truncated(14));
    }
    let format = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if format > FORMAT_VERSION {
        return Err(SnapshotError::FutureVersion { format });
    }
    if format == 0 {
        return Err(SnapshotError::UnknownVersion { format });
    }
    if format < FORMAT_READ_MIN {
        return Err(SnapshotError::OldVersion { format });
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
        return Err(SnapshotError::TooLarge { bytes: body_len });
    }
    let (created_unix_ms, body_xxh3) = (u64_at(fixed), u64_at(fixed + 16));
    Ok(Header { format, daemon_version, created_unix_ms, body_len, body_xxh3, len })
}

/// The file size a header announces, from the first bytes of a file (for a
/// bounded read). Errors as `decode` would report them.
pub(crate) fn announced_len(prefix: &[u8]) -> Result<u64, SnapshotError> {
    let h = decode_header(prefix)?;
    Ok(h.len as u64 + h.body_len)
}

/// Decodes a complete file image, or says why it cannot be used.
pub fn decode(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
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
        return Err(SnapshotError::BodyChecksum);
    }
    let mut r = Reader { buf: body, pos: 0, base: h.len as u64 };
    let (registrations, indexes) = decode_body(&mut r, h.format)?;
    if r.pos != body.len() {
        return Err(r.malformed("bytes left after the last index"));
    }
    Ok(Snapshot { created_unix_ms: h.created_unix_ms, daemon_version: h.daemon_version, registrations, indexes })
}

/// A bounds-checked cursor over the body.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Offset of the body in the file, for error messages.
    base: u64,
}

type Res<T> = Result<T, SnapshotError>;

impl<'a> Reader<'a> {
    fn malformed(&self, what: impl Into<String>) -> SnapshotError {
        SnapshotError::Malformed { offset: self.base + self.pos as u64, what: what.into() }
    }

    fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Res<&'a [u8]> {
        if n > self.left() {
            return Err(self.malformed(format!("needs {n} bytes, {} left", self.left())));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self) -> Res<u8> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Res<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Res<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    /// A watermark's seq, and its digest from format 4 on.
    fn watermark(&mut self, format: u32) -> Res<Watermark> {
        let seq = self.u64()?;
        let digest = if format >= 4 && self.flag("watermark digest")? { Some(self.u64()?) } else { None };
        Ok(Watermark { seq, digest })
    }

    fn flag(&mut self, what: &str) -> Res<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.malformed(format!("{what}: flag byte {b}"))),
        }
    }

    /// A count of items of at least `item_bytes` each: at most `max`, and
    /// no more than the bytes left can hold, so allocating it is safe.
    fn count(&mut self, n: u64, max: usize, item_bytes: usize, what: &str) -> Res<usize> {
        if n > max as u64 {
            return Err(self.malformed(format!("{n} {what}, over the limit of {max}")));
        }
        if n.saturating_mul(item_bytes as u64) > self.left() as u64 {
            return Err(self.malformed(format!("{n} {what} cannot fit in the {} bytes left", self.left())));
        }
        Ok(n as usize)
    }

    /// A non-empty UTF-8 string of at most `max` bytes.
    fn name(&mut self, what: &str, max: usize) -> Res<String> {
        let n = self.u32()? as u64;
        let n = self.count(n, max, 1, what)?;
        match std::str::from_utf8(self.take(n)?) {
            Ok("") => Err(self.malformed(format!("empty {what}"))),
            Ok(s) => Ok(s.to_string()),
            Err(_) => Err(self.malformed(format!("{what} is not UTF-8"))),
        }
    }

    fn block_size(&mut self) -> Res<u32> {
        let b = self.u32()?;
        if b == 0 || b > BLOCK_SIZE_MAX {
            return Err(self.malformed(format!("block_size {b} outside 1..={BLOCK_SIZE_MAX}")));
        }
        Ok(b)
    }
}

/// Smallest encoded registration: ids, block size, four empty strings, two flags.
const REGISTRATION_BYTES_MIN: usize = 8 + 4 + 4 + 4 + 1 + 4 + 4 + 1;
/// Smallest encoded index: two strings, block size, two counts.
const INDEX_BYTES_MIN: usize = 4 + 4 + 4 + 4 + 8;
/// Smallest encoded event: tag and worker.
const EVENT_BYTES_MIN: usize = 1 + 4;
/// Most events in one index: as many as the largest body can hold.
const EVENTS_PER_INDEX_MAX: usize = (BODY_BYTES_MAX / EVENT_BYTES_MIN as u64) as usize;

fn decode_body(r: &mut Reader<'_>, format: u32) -> Res<(Vec<SavedRegistration>, Vec<SavedIndex>)> {
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
    Ok((registrations, indexes))
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
#[path = "codec_tests.rs"]
mod tests;

//! The compact peer format: what a kv-indexer peer asks for with
//! `Accept: application/vnd.kv-indexer.dump` (`MEDIA_TYPE`), about 16
//! bytes a (block, worker) pair against JSON's 91, written and read as a
//! stream. The same events as the JSON dump, the same meaning (see the
//! module doc of `dump`); the event encoding is the snapshot file's.
//! All integers little-endian.
//!
//! ```text
//! magic    8 bytes "KVIXDUMP", then u32 format (FORMAT, 1)
//! records, each a u8 kind, then:
//!   1 index:  name model_name, name tenant_id, u32 block_size
//!   2 worker: u64 instance_id, u32 dp_rank (the events after it are its own)
//!   3 event:  u8 tag: bits 0-1 tier, bits 2-3 kind (0 stored, 1 removed,
//!                     2 cleared), bit 4 has_parent, bit 5 orphan, bits 6-7 zero
//!             stored:  [u64 parent], [orphan], u32 n, n x (u64 engine_hash, u64 local_hash)
//!             removed: u32 n, n x u64 engine_hash
//!   0 end:    u64 events, u64 xxh3-64 of every byte up to this record's kind
//! orphan = u32 position, u8 has_anchor, [u64 anchor], u32 m, m x u64 local_hash
//! name   = u32 len (1..=NAME_BYTES_READ_MAX), UTF-8 bytes
//! ```
//!
//! Reading checks every count against its limit before anything is
//! allocated (`BLOCKS_PER_EVENT_MAX` blocks or missing ancestors an event,
//! a block size of at most `BLOCK_SIZE_MAX`, names of at most
//! `NAME_BYTES_READ_MAX` bytes; the registry then refuses names past its
//! own limit), an event only after a worker and a worker only after an
//! index; the end record's count and checksum must match, and nothing may
//! follow it. A dump cut short has no end record: refused, whatever it
//! held. So a reader that stops on an error has handed its sink only
//! events of a dump it then refuses, and the caller drops them.
//!
//! A snapshot file (`snapshot::codec`) embeds the same records, ended by
//! the end record's kind alone: its own trailer follows, and it hashes the
//! whole file itself (`Writer::records`, `read_records` on a `Source` that
//! read its header too).

use super::{DumpSink, ReadFailed};
use crate::event::{Event, EventKind, StorageTier, StoredBlock, WorkerId, BLOCKS_PER_EVENT_MAX};
use crate::index::{DumpEvent, Orphan};
use crate::json::BodyError;
use std::io::Read;
use xxhash_rust::xxh3::Xxh3;

/// The `Accept` and `Content-Type` of the compact format.
pub const MEDIA_TYPE: &str = "application/vnd.kv-indexer.dump";
/// First bytes of a compact dump.
pub const MAGIC: [u8; 8] = *b"KVIXDUMP";
/// The format this build writes and reads.
pub const FORMAT: u32 = 1;
/// Longest model or tenant name read (the registry's own limit is lower).
pub const NAME_BYTES_READ_MAX: usize = 4096;

const REC_END: u8 = 0;
const REC_INDEX: u8 = 1;
const REC_WORKER: u8 = 2;
const REC_EVENT: u8 = 3;

// An event's tag byte, shared with the snapshot formats read whole
// (`snapshot::legacy`).
pub(crate) const TAG_TIER_MASK: u8 = 0b11;
pub(crate) const TAG_KIND_SHIFT: u8 = 2;
pub(crate) const TAG_HAS_PARENT: u8 = 1 << 4;
pub(crate) const TAG_ORPHAN: u8 = 1 << 5;
pub(crate) const TAG_RESERVED: u8 = 0b1100_0000;
pub(crate) const KIND_STORED: u8 = 0;
pub(crate) const KIND_REMOVED: u8 = 1;
pub(crate) const KIND_CLEARED: u8 = 2;

/// Writes a compact dump piece by piece, keeping the count and checksum
/// its end record needs.
pub struct Writer {
    /// None: records only, for a format that hashes them itself.
    hash: Option<Xxh3>,
    counts: Counts,
    worker: Option<WorkerId>,
}

/// What a writer wrote so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub indexes: u64,
    /// Events as a reader counts them (a chain longer than an event may be
    /// counts once a piece).
    pub events: u64,
    /// Blocks of stored events: the (block, worker) pairs of a dump of ours.
    pub blocks: u64,
}

impl Default for Writer {
    fn default() -> Self {
        Writer { hash: Some(Xxh3::new()), counts: Counts::default(), worker: None }
    }
}

impl Writer {
    /// A writer of records only, for a format that embeds them (a
    /// snapshot): no magic (`start` writes nothing), nothing hashed, and
    /// its end record is the kind alone (the embedding format's trailer
    /// follows).
    pub fn records() -> Writer {
        Writer { hash: None, counts: Counts::default(), worker: None }
    }

    pub fn counts(&self) -> Counts {
        self.counts
    }

    fn hashed(&mut self, bytes: &[u8]) {
        if let Some(h) = &mut self.hash {
            h.update(bytes);
        }
    }

    /// The magic and format.
    pub fn start(&mut self, out: &mut Vec<u8>) {
        if self.hash.is_none() {
            return;
        }
        let at = out.len();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&FORMAT.to_le_bytes());
        self.hashed(&out[at..]);
    }

    pub fn index(&mut self, out: &mut Vec<u8>, model_name: &str, tenant_id: &str, block_size: u32) {
        let at = out.len();
        out.push(REC_INDEX);
        put_name(out, model_name);
        put_name(out, tenant_id);
        out.extend_from_slice(&block_size.to_le_bytes());
        self.worker = None;
        self.counts.indexes += 1;
        self.hashed(&out[at..]);
    }

    /// One event (a worker record first when its worker is not the last one's).
    pub fn event(&mut self, out: &mut Vec<u8>, DumpEvent { event: e, orphan }: &DumpEvent) {
        let at = out.len();
        if self.worker != Some(e.worker) {
            out.push(REC_WORKER);
            out.extend_from_slice(&e.worker.instance_id.to_le_bytes());
            out.extend_from_slice(&e.worker.dp_rank.to_le_bytes());
            self.worker = Some(e.worker);
        }
        let head = |out: &mut Vec<u8>, kind: u8, parent: Option<u64>, orphan: Option<&Orphan>| {
            out.push(REC_EVENT);
            out.push(
                e.tier.index() as u8
                    | kind << TAG_KIND_SHIFT
                    | if parent.is_some() { TAG_HAS_PARENT } else { 0 }
                    | if orphan.is_some() { TAG_ORPHAN } else { 0 },
            );
            if let Some(p) = parent {
                out.extend_from_slice(&p.to_le_bytes());
            }
            if let Some(o) = orphan {
                put_orphan(out, o);
            }
        };
        match &e.kind {
            EventKind::Stored { parent, blocks } => {
                // A chain longer than an event may be goes as chained events.
                let (mut parent, mut orphan) = (*parent, orphan.as_ref());
                for piece in blocks.chunks(BLOCKS_PER_EVENT_MAX).chain(blocks.is_empty().then_some(&[][..])) {
                    head(out, KIND_STORED, parent, orphan.take());
                    out.extend_from_slice(&(piece.len() as u32).to_le_bytes());
                    for b in piece {
                        out.extend_from_slice(&b.engine_hash.to_le_bytes());
                        out.extend_from_slice(&b.local_hash.to_le_bytes());
                    }
                    parent = piece.last().map(|b| b.engine_hash);
                    self.counts.events += 1;
                }
                self.counts.blocks += blocks.len() as u64;
            }
            EventKind::Removed { engine_hashes } => {
                head(out, KIND_REMOVED, None, None);
                out.extend_from_slice(&(engine_hashes.len() as u32).to_le_bytes());
                for h in engine_hashes {
                    out.extend_from_slice(&h.to_le_bytes());
                }
                self.counts.events += 1;
            }
            EventKind::Cleared => {
                head(out, KIND_CLEARED, None, None);
                self.counts.events += 1;
            }
        }
        self.hashed(&out[at..]);
    }

    /// The end record (of a records-only writer, its kind alone).
    pub fn end(&mut self, out: &mut Vec<u8>) {
        out.push(REC_END);
        if let Some(hash) = &mut self.hash {
            hash.update(&[REC_END]);
            out.extend_from_slice(&self.counts.events.to_le_bytes());
            out.extend_from_slice(&hash.digest().to_le_bytes());
        }
    }
}

fn put_name(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_orphan(out: &mut Vec<u8>, o: &Orphan) {
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

/// A reader that hashes what it hands out and counts bytes, for errors:
/// a compact dump's, or a snapshot file's (which reads its own header
/// and trailer through it too).
pub(crate) struct Source<R> {
    r: R,
    hash: Xxh3,
    offset: u64,
    /// What is read, for errors ("compact dump", "snapshot").
    what: &'static str,
    /// Why the input stopped giving bytes, if it did.
    stopped: Option<Stopped>,
}

/// Why a `Source`'s input stopped giving bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// It ended where a read needed this many bytes in all.
    CutShort { need: u64 },
    /// Reading failed.
    Io(String),
}

type Res<T> = Result<T, ReadFailed>;

impl<R: Read> Source<R> {
    pub(crate) fn new(r: R, what: &'static str) -> Source<R> {
        Source { r, hash: Xxh3::new(), offset: 0, what, stopped: None }
    }

    /// A source whose first bytes, `read`, came from `r` already.
    pub(crate) fn resumed(r: R, read: &[u8], what: &'static str) -> Source<R> {
        let mut s = Source::new(r, what);
        s.hash.update(read);
        s.offset = read.len() as u64;
        s
    }

    /// Bytes read so far.
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// The xxh3-64 of every byte read so far.
    pub(crate) fn digest(&self) -> u64 {
        self.hash.digest()
    }

    /// Why the input stopped giving bytes, if a read failed for it.
    pub(crate) fn stopped(&self) -> Option<&Stopped> {
        self.stopped.as_ref()
    }

    fn io_error(&mut self, e: std::io::Error) -> ReadFailed {
        self.stopped = Some(Stopped::Io(e.to_string()));
        ReadFailed::Dump(BodyError::Malformed(format!("reading the {}: {e}", self.what)))
    }

    pub(crate) fn malformed(&self, offset: u64, what: impl std::fmt::Display) -> ReadFailed {
        ReadFailed::Dump(BodyError::Malformed(format!("{} at byte {offset}: {what}", self.what)))
    }

    fn bytes<const N: usize>(&mut self) -> Res<[u8; N]> {
        let mut b = [0u8; N];
        self.fill(&mut b)?;
        Ok(b)
    }

    pub(crate) fn fill(&mut self, b: &mut [u8]) -> Res<()> {
        match self.r.read_exact(b) {
            Ok(()) => {
                self.hash.update(b);
                self.offset += b.len() as u64;
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                self.stopped = Some(Stopped::CutShort { need: self.offset + b.len() as u64 });
                Err(self.malformed(self.offset, "truncated: the dump ends before its end record"))
            }
            Err(e) => Err(self.io_error(e)),
        }
    }

    pub(crate) fn u8(&mut self) -> Res<u8> {
        Ok(self.bytes::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Res<u16> {
        Ok(u16::from_le_bytes(self.bytes()?))
    }

    pub(crate) fn u32(&mut self) -> Res<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    pub(crate) fn u64(&mut self) -> Res<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    /// Whether the input ends here (nothing read past it is hashed).
    pub(crate) fn at_end(&mut self) -> Res<bool> {
        let mut rest = [0u8; 1];
        loop {
            return match self.r.read(&mut rest) {
                Ok(n) => Ok(n == 0),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => Err(self.io_error(e)),
            };
        }
    }

    fn count(&mut self, max: usize, what: &str) -> Res<usize> {
        let at = self.offset;
        let n = self.u32()? as usize;
        if n > max {
            return Err(self.malformed(at, format!("{n} {what}, over the limit of {max}")));
        }
        Ok(n)
    }

    fn name(&mut self, what: &str) -> Res<String> {
        let at = self.offset;
        let n = self.u32()? as usize;
        if n == 0 || n > NAME_BYTES_READ_MAX {
            return Err(self.malformed(at, format!("a {what} of {n} bytes, outside 1..={NAME_BYTES_READ_MAX}")));
        }
        let mut b = vec![0u8; n];
        self.fill(&mut b)?;
        String::from_utf8(b).map_err(|_| self.malformed(at, format!("the {what} is not UTF-8")))
    }

    fn hashes(&mut self, n: usize) -> Res<Vec<u64>> {
        (0..n).map(|_| self.u64()).collect()
    }
}

/// Reads a compact dump from `r` as it arrives, handing each index and
/// event to `sink`; refuses a malformed or truncated one (see the module
/// doc); returns the events read.
pub fn read_compact(r: impl Read, sink: &mut dyn DumpSink) -> Result<u64, ReadFailed> {
    let mut s = Source::new(r, "compact dump");
    let magic: [u8; 8] = s.bytes()?;
    if magic != MAGIC {
        return Err(s.malformed(0, "not a compact dump (bad magic)"));
    }
    let format = s.u32()?;
    if format != FORMAT {
        return Err(s.malformed(8, format!("format {format}; this build reads format {FORMAT}")));
    }
    let events = read_records(&mut s, sink)?;
    let at = s.offset - 1;
    let digest = s.digest();
    let (count, sum) = (s.u64()?, s.u64()?);
    if count != events {
        return Err(s.malformed(at, format!("the end record counts {count} events; {events} came")));
    }
    if sum != digest {
        return Err(s.malformed(at, "checksum mismatch"));
    }
    if !s.at_end()? {
        return Err(s.malformed(s.offset, "bytes after the end record"));
    }
    Ok(events)
}

/// Reads index, worker and event records, handing each index and event to
/// `sink`, through the end record's kind; returns the events read.
pub(crate) fn read_records<R: Read>(s: &mut Source<R>, sink: &mut dyn DumpSink) -> Res<u64> {
    let (mut in_index, mut worker, mut events) = (false, None, 0u64);
    loop {
        let at = s.offset;
        match s.u8()? {
            REC_END => return Ok(events),
            REC_INDEX => {
                let model = s.name("model name")?;
                let tenant = s.name("tenant id")?;
                let block_size = s.u32()?;
                if block_size == 0 || block_size > crate::ingest::BLOCK_SIZE_MAX {
                    let max = crate::ingest::BLOCK_SIZE_MAX;
                    return Err(s.malformed(at, format!("block_size {block_size} outside 1..={max}")));
                }
                sink.index(&model, &tenant, block_size).map_err(ReadFailed::Sink)?;
                (in_index, worker) = (true, None);
            }
            REC_WORKER if in_index => worker = Some(WorkerId::new(s.u64()?, s.u32()?)),
            REC_EVENT => {
                let Some(worker) = worker else { return Err(s.malformed(at, "an event before its worker")) };
                let e = read_event(s, worker)?;
                events += 1;
                sink.event(e).map_err(ReadFailed::Sink)?;
            }
            REC_WORKER => return Err(s.malformed(at, "a worker before its index")),
            k => return Err(s.malformed(at, format!("unknown record kind {k}"))),
        }
    }
}

fn read_event<R: Read>(s: &mut Source<R>, worker: WorkerId) -> Res<DumpEvent> {
    let at = s.offset;
    let tag = s.u8()?;
    let kind = (tag >> TAG_KIND_SHIFT) & 0b11;
    let (has_parent, has_orphan) = (tag & TAG_HAS_PARENT != 0, tag & TAG_ORPHAN != 0);
    if tag & TAG_RESERVED != 0 || kind > KIND_CLEARED || ((has_parent || has_orphan) && kind != KIND_STORED) {
        return Err(s.malformed(at, format!("bad event tag {tag:#04x}")));
    }
    let tier = StorageTier::ALL[(tag & TAG_TIER_MASK) as usize];
    let mut orphan = None;
    let kind = match kind {
        KIND_STORED => {
            let parent = if has_parent { Some(s.u64()?) } else { None };
            if has_orphan {
                let at = s.offset;
                let position = s.u32()?;
                let anchor = match s.u8()? {
                    0 => None,
                    1 => Some(s.u64()?),
                    b => return Err(s.malformed(at, format!("anchor flag byte {b}"))),
                };
                let m = s.count(BLOCKS_PER_EVENT_MAX, "missing ancestors")?;
                let o = Orphan { position, anchor, missing: s.hashes(m)? };
                if !o.is_consistent() {
                    let what = format!("an orphan at position {position} with {m} missing ancestors");
                    return Err(s.malformed(at, what));
                }
                orphan = Some(o);
            }
            let n = s.count(BLOCKS_PER_EVENT_MAX, "blocks")?;
            let mut blocks = Vec::with_capacity(n);
            for _ in 0..n {
                let raw: [u8; 16] = s.bytes()?;
                let (e, l) = raw.split_at(8);
                blocks.push(StoredBlock {
                    engine_hash: u64::from_le_bytes(e.try_into().expect("8 bytes")),
                    local_hash: u64::from_le_bytes(l.try_into().expect("8 bytes")),
                });
            }
            EventKind::Stored { parent, blocks }
        }
        KIND_REMOVED => {
            let n = s.count(BLOCKS_PER_EVENT_MAX, "hashes")?;
            EventKind::Removed { engine_hashes: s.hashes(n)? }
        }
        _ => EventKind::Cleared,
    };
    Ok(DumpEvent { event: Event { worker, tier, kind }, orphan })
}

#[cfg(test)]
#[path = "binary_tests.rs"]
mod tests;

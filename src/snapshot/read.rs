//! Reading a snapshot file (format: `codec`) as a stream: `open` reads and
//! checks the header and the registrations, which `restore::plan` needs
//! first; `Opened::load` then hands the events to a `DumpSink` one by one
//! as they are read, and checks the trailer last. Held at once: the
//! registrations, a read buffer (the caller's) and one event.
//!
//! A file found bad in `load` has handed the sink events already; the
//! caller drops them (`restore` stages them where nobody sees them).
//! Formats 3 and 4 are read whole in `open` (`legacy`), and `load` hands
//! their events over the same way.

use super::codec::{
    check_format, read_registrations, Reader, Res, SnapshotError, FORMAT_VERSION, REGISTRATIONS_BYTES_MAX,
    TRAILER_BYTES, VERSION_BYTES_MAX,
};
use super::{legacy, SavedIndex, SavedRegistration};
use crate::dump::binary::{read_records, Source, Stopped};
use crate::dump::{DumpSink, ReadFailed};
use crate::index::DumpEvent;
use crate::registry::INDEXES_MAX;
use std::io::Read;

/// A snapshot's header and registrations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    pub format: u32,
    /// Wall-clock time of the capture, ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// `kv-indexer --version` of the writer (for the operator; not checked).
    pub daemon_version: String,
    pub registrations: Vec<SavedRegistration>,
}

/// An opened snapshot: its head read, its events still to `load`.
pub struct Opened<R> {
    pub head: Head,
    events: Events<R>,
}

enum Events<R> {
    /// Format 5: the rest of the file, `len` bytes in all.
    Stream { src: Box<Source<R>>, len: u64 },
    /// Formats 3 and 4, decoded whole.
    Whole(Vec<SavedIndex>),
}

/// What the events of a snapshot held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadedFile {
    pub indexes: u64,
    pub events: u64,
    /// Blocks of stored events: the (block, worker) pairs.
    pub blocks: u64,
}

/// Opens the snapshot in `r`, a file of `len` bytes: reads and checks its
/// header and registrations (see `codec`).
pub fn open<R: Read>(mut r: R, len: u64) -> Res<Opened<R>> {
    let mut prefix = [0u8; 12];
    let got = read_up_to(&mut r, &mut prefix).map_err(|e| SnapshotError::Io(e.to_string()))?;
    let format = check_format(&prefix[..got])?;
    if format < FORMAT_VERSION {
        let s = legacy::read_whole(&prefix, r, len)?;
        let head = Head {
            format,
            created_unix_ms: s.created_unix_ms,
            daemon_version: s.daemon_version,
            registrations: s.registrations,
        };
        return Ok(Opened { head, events: Events::Whole(s.indexes) });
    }
    let mut src = Source::resumed(r, &prefix, "snapshot");
    let head = read_head(&mut src, format, len).map_err(|e| failed(&src, e, len))??;
    Ok(Opened { head, events: Events::Stream { src: Box::new(src), len } })
}

/// Reads into `buf` until it is full or the input ends; the bytes read.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// The error a `Source`'s failure means for a file of `len` bytes.
fn failed<R: Read>(src: &Source<R>, e: ReadFailed, len: u64) -> SnapshotError {
    match (src.stopped(), e) {
        (Some(Stopped::CutShort { need }), _) => SnapshotError::Truncated { have: len, need: *need },
        (Some(Stopped::Io(e)), _) => SnapshotError::Io(e.clone()),
        (None, ReadFailed::Sink(why)) => SnapshotError::Refused(why),
        (None, ReadFailed::Dump(e)) => SnapshotError::Malformed(e.message().to_string()),
    }
}

/// The header past the format, then the registrations. The outer error is
/// the source's, the inner one the content's.
fn read_head<R: Read>(src: &mut Source<R>, format: u32, len: u64) -> Result<Res<Head>, ReadFailed> {
    let version_len = src.u16()? as usize;
    if version_len > VERSION_BYTES_MAX {
        return Ok(Err(SnapshotError::CorruptHeader));
    }
    let mut version = vec![0u8; version_len];
    src.fill(&mut version)?;
    let Ok(daemon_version) = String::from_utf8(version) else { return Ok(Err(SnapshotError::CorruptHeader)) };
    let created_unix_ms = src.u64()?;
    let at = src.offset();
    let section = src.u32()? as usize;
    if section > REGISTRATIONS_BYTES_MAX {
        let what = format!("a registrations section of {section} bytes, over the limit of {REGISTRATIONS_BYTES_MAX}");
        return Ok(Err(SnapshotError::Malformed(format!("at byte {at}: {what}"))));
    }
    let need = src.offset() + section as u64 + TRAILER_BYTES as u64;
    if need > len {
        return Ok(Err(SnapshotError::Truncated { have: len, need }));
    }
    let mut bytes = vec![0u8; section];
    src.fill(&mut bytes)?;
    let mut r = Reader { buf: &bytes, pos: 0, base: at + 4 };
    let registrations = match read_registrations(&mut r, format) {
        Ok(_) if r.pos != bytes.len() => return Ok(Err(r.malformed("bytes left after the registrations"))),
        Ok(regs) => regs,
        Err(e) => return Ok(Err(e)),
    };
    Ok(Ok(Head { format, created_unix_ms, daemon_version, registrations }))
}

impl<R: Read> Opened<R> {
    /// Hands every event to `sink` as it is read, each index first, and
    /// checks the rest of the file; what the events held, or why the file
    /// is bad (the sink then holds events of a file to drop).
    pub fn load(self, sink: &mut dyn DumpSink) -> Res<LoadedFile> {
        match self.events {
            Events::Whole(indexes) => {
                let mut counted = Counted { sink, out: LoadedFile::default(), over: None };
                for ix in indexes {
                    counted.index(&ix.model_name, &ix.tenant_id, ix.block_size).map_err(SnapshotError::Refused)?;
                    for e in ix.events {
                        counted.event(e).map_err(SnapshotError::Refused)?;
                    }
                }
                Ok(counted.out)
            }
            Events::Stream { mut src, len } => {
                let mut counted = Counted { sink, out: LoadedFile::default(), over: None };
                let read = read_records(&mut src, &mut counted);
                if let Some(over) = counted.over.take() {
                    return Err(over);
                }
                read.map_err(|e| failed(&src, e, len))?;
                let out = counted.out;
                let registrations = self.head.registrations.len() as u64;
                trailer(&mut src, out, registrations, len).map_err(|e| failed(&src, e, len))??;
                Ok(out)
            }
        }
    }
}

/// Checks the trailer against what came, and the file's end.
fn trailer<R: Read>(
    src: &mut Source<R>,
    came: LoadedFile,
    registrations: u64,
    len: u64,
) -> Result<Res<()>, ReadFailed> {
    let at = src.offset();
    let counts = [u64::from(src.u32()?), u64::from(src.u32()?), src.u64()?, src.u64()?];
    let digest = src.digest();
    if src.u64()? != digest {
        return Ok(Err(SnapshotError::Checksum));
    }
    let expected = [registrations, came.indexes, came.events, came.blocks];
    if counts != expected {
        let what = format!("the trailer counts {counts:?} (registrations, indexes, events, blocks); {expected:?} came");
        return Ok(Err(SnapshotError::Malformed(format!("at byte {at}: {what}"))));
    }
    if !src.at_end()? {
        return Ok(Err(SnapshotError::TrailingBytes { extra: len.saturating_sub(src.offset()).max(1) }));
    }
    Ok(Ok(()))
}

/// A sink that counts what passes to the caller's, and refuses more
/// indexes than a daemon keeps.
struct Counted<'s> {
    sink: &'s mut dyn DumpSink,
    out: LoadedFile,
    /// A limit the file broke (a malformed file, not a refusal).
    over: Option<SnapshotError>,
}

impl DumpSink for Counted<'_> {
    fn index(&mut self, model_name: &str, tenant_id: &str, block_size: u32) -> Result<(), String> {
        self.out.indexes += 1;
        if self.out.indexes > INDEXES_MAX as u64 {
            let what = format!("more than {INDEXES_MAX} indexes");
            self.over = Some(SnapshotError::Malformed(what.clone()));
            return Err(what);
        }
        self.sink.index(model_name, tenant_id, block_size)
    }

    fn event(&mut self, event: DumpEvent) -> Result<(), String> {
        self.out.events += 1;
        if let crate::event::EventKind::Stored { blocks, .. } = &event.event.kind {
            self.out.blocks += blocks.len() as u64;
        }
        self.sink.event(event)
    }
}

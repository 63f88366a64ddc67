//! Writing a snapshot file (format: `codec`) as the indexes are read out:
//! the header and registrations, then the compact records of the live
//! indexes piece by piece (`dump::stream`, as `/dump` writes them), each
//! piece hashed and handed to the writer before the next is read, then the
//! trailer. What it holds at once: one piece (`dump::stream::PIECE_BYTES`,
//! or one worker's events when larger) and the registrations.

use super::codec::{put_registrations, FORMAT_VERSION, MAGIC, REGISTRATIONS_BYTES_MAX, VERSION_BYTES_MAX};
use super::SavedRegistration;
use crate::dump::binary::Counts;
use crate::dump::stream::{DumpStream, PIECE_BYTES};
use crate::log::truncate_utf8;
use std::io::Write;
use xxhash_rust::xxh3::Xxh3;

/// What a written file holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Written {
    pub bytes: u64,
    pub registrations: usize,
    /// Indexes, events, and blocks (the (block, worker) pairs).
    pub counts: Counts,
}

/// Writes a whole snapshot file to `out`: the header, `registrations`, the
/// records of `events` (a `DumpStream::records`) as they are read out, and
/// the trailer. `out` should be buffered no more than a piece: each piece
/// is written whole.
pub fn write(
    out: &mut impl Write,
    created_unix_ms: u64,
    daemon_version: &str,
    registrations: &[SavedRegistration],
    mut events: DumpStream,
) -> std::io::Result<Written> {
    let mut hash = Xxh3::new();
    let mut bytes = 0u64;
    let mut emit = |buf: &mut Vec<u8>| -> std::io::Result<()> {
        hash.update(buf);
        out.write_all(buf)?;
        bytes += buf.len() as u64;
        buf.clear();
        Ok(())
    };
    let mut buf = Vec::with_capacity(PIECE_BYTES * 2);
    buf.extend_from_slice(&MAGIC);
    buf.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    let version = truncate_utf8(daemon_version, VERSION_BYTES_MAX);
    buf.extend_from_slice(&(version.len() as u16).to_le_bytes());
    buf.extend_from_slice(version.as_bytes());
    buf.extend_from_slice(&created_unix_ms.to_le_bytes());
    let at = buf.len();
    buf.extend_from_slice(&0u32.to_le_bytes());
    put_registrations(&mut buf, registrations);
    let section = buf.len() - at - 4;
    // Within the reader's limit: the registry holds at most LISTENERS_MAX
    // registrations, each within the name and address limits.
    debug_assert!(section <= REGISTRATIONS_BYTES_MAX);
    buf[at..at + 4].copy_from_slice(&(section as u32).to_le_bytes());
    emit(&mut buf)?;
    while events.fill(&mut buf) {
        emit(&mut buf)?;
    }
    let counts = events.counts();
    buf.extend_from_slice(&(registrations.len() as u32).to_le_bytes());
    buf.extend_from_slice(&(counts.indexes as u32).to_le_bytes());
    buf.extend_from_slice(&counts.events.to_le_bytes());
    buf.extend_from_slice(&counts.blocks.to_le_bytes());
    emit(&mut buf)?;
    let sum = hash.digest().to_le_bytes();
    out.write_all(&sum)?;
    Ok(Written { bytes: bytes + sum.len() as u64, registrations: registrations.len(), counts })
}

//! `/dump` written piece by piece from the live indexes, JSON or compact,
//! so a dump's memory is one worker's events and one piece, whatever the
//! index holds. A snapshot writes its events the same way, as the compact
//! records alone (`DumpStream::records`).
//!
//! What a dump taken while events land promises: per index, each worker's
//! events are exactly the blocks it held at one instant, the instant its
//! turn came (`Index::dump_cursor`); different workers, and different
//! indexes, are read at different instants. A worker placed in an index
//! after that index's turn began is not listed; one removed before its
//! turn is not either. Each worker is listed at most once per index.
//! Indexes are those that existed when the dump began, in (model, tenant)
//! order; each index is held (not copied) until its turn ends.

use super::binary;
use crate::index::{DumpCursor, Index};
use std::sync::Arc;

/// Which encoding a dump is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Compact,
}

/// A piece is handed out once it holds this many bytes (or the dump ends);
/// one worker's events are never split, so a piece can be larger.
pub const PIECE_BYTES: usize = 1 << 20;

/// One index to dump: its names, block size, and the index itself.
pub struct Source {
    pub model_name: String,
    pub tenant_id: String,
    pub index: Arc<Index>,
}

/// A dump being written.
pub struct DumpStream {
    format: Format,
    sources: std::vec::IntoIter<Source>,
    /// The index whose workers are being written, and where its cursor stands.
    current: Option<(Arc<Index>, DumpCursor)>,
    started: bool,
    done: bool,
    /// JSON: entries written, and events of the current entry (its `event_id`).
    entries: u64,
    event_id: u64,
    compact: binary::Writer,
    piece_bytes: usize,
}

impl DumpStream {
    pub fn new(format: Format, sources: Vec<Source>) -> DumpStream {
        DumpStream {
            format,
            sources: sources.into_iter(),
            current: None,
            started: false,
            done: false,
            entries: 0,
            event_id: 0,
            compact: binary::Writer::default(),
            piece_bytes: PIECE_BYTES,
        }
    }

    /// The compact records alone, for a format that embeds them (a
    /// snapshot, `binary::Writer::records`): no magic, and the end record
    /// is its kind alone.
    pub fn records(sources: Vec<Source>) -> DumpStream {
        DumpStream { compact: binary::Writer::records(), ..DumpStream::new(Format::Compact, sources) }
    }

    /// What the compact writer wrote so far (JSON: nothing).
    pub fn counts(&self) -> binary::Counts {
        self.compact.counts()
    }

    /// The same stream in pieces of `bytes` (tests cut a small dump into many).
    #[cfg(test)]
    pub fn with_piece_bytes(mut self, bytes: usize) -> DumpStream {
        self.piece_bytes = bytes;
        self
    }

    /// Appends the next piece to `out` (at least `PIECE_BYTES` unless the
    /// dump ends in it); false once the dump is complete.
    pub fn fill(&mut self, out: &mut Vec<u8>) -> bool {
        if self.done {
            return false;
        }
        if !self.started {
            self.started = true;
            match self.format {
                Format::Json => out.push(b'{'),
                Format::Compact => self.compact.start(out),
            }
        }
        while out.len() < self.piece_bytes {
            if let Some((index, cursor)) = &mut self.current {
                match cursor.next_worker(index) {
                    Some(events) => {
                        for e in &events {
                            match self.format {
                                Format::Json => {
                                    if self.event_id > 0 {
                                        out.push(b',');
                                    }
                                    super::write_event(out, e, self.event_id);
                                    self.event_id += 1;
                                }
                                Format::Compact => self.compact.event(out, e),
                            }
                        }
                        continue;
                    }
                    None => {
                        self.current = None;
                        if self.format == Format::Json {
                            out.extend_from_slice(b"]}");
                        }
                    }
                }
            }
            let Some(next) = self.sources.next() else {
                match self.format {
                    Format::Json => out.push(b'}'),
                    Format::Compact => self.compact.end(out),
                }
                self.done = true;
                return true;
            };
            let block_size = next.index.block_size();
            match self.format {
                Format::Json => {
                    if self.entries > 0 {
                        out.push(b',');
                    }
                    super::write_entry_head(out, &next.model_name, &next.tenant_id, block_size);
                }
                Format::Compact => self.compact.index(out, &next.model_name, &next.tenant_id, block_size),
            }
            self.entries += 1;
            self.event_id = 0;
            let cursor = next.index.dump_cursor();
            self.current = Some((next.index, cursor));
        }
        true
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;

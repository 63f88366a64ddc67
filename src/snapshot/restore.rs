//! Applying a snapshot at startup, merged with the command line.
//!
//! `plan` decides from the registrations what of the snapshot is kept;
//! `restore` then streams the file's events through the plan's filter
//! (`Filtered`) into fresh indexes nobody sees yet (`registry::staging`,
//! which refuses the whole file once `--max-pairs` sheds a store), and
//! checks the file to its end. A file that turns out bad (truncated,
//! corrupt, a count past its limit, `--max-pairs` reached) leaves nothing
//! applied, not even a counter: one warning names the file and why, and
//! the daemon starts as without a snapshot. Otherwise the indexes are put
//! in place, then watermarks are seeded, then the command line's workers
//! are registered (a failure is fatal, as without a snapshot), then the
//! snapshot's other registrations (a failure is logged and skipped).
//! Listeners hold what engines send until the ready gate opens.
//!
//! Memory: the registry is empty at startup, so the staged indexes are
//! the only copy of the state; besides them, a read buffer, one event and
//! the workers each index names.
//!
//! With `--peers` too, a peer's dump is applied after this (see
//! `recovery`): it replaces the snapshot's blocks of every worker it names,
//! since a live peer saw what happened while this daemon was down; the
//! seeded watermarks stay, and replaying from them over the peer's state
//! converges the same way (stores and removes are idempotent).

use super::codec::SnapshotError;
use super::plan::{plan, resized_note, Filter, IndexFilter, IndexKey};
use super::read::Opened;
use crate::dump::DumpSink;
use crate::event::WorkerId;
use crate::index::DumpEvent;
use crate::registry::staging::Staging;
use crate::registry::{RegisterArgs, Registry};
use rustc_hash::{FxHashMap, FxHashSet};
use std::io::Read;
use std::path::Path;

/// What `restore` did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Restored {
    pub indexes: usize,
    pub pairs: u64,
    pub registrations: usize,
    pub watermarks: usize,
}

/// The events of a snapshot on their way to `inner`, less those the plan
/// drops; remembers, per index, the kept workers no key names.
pub struct Filtered<'a> {
    filter: &'a Filter,
    inner: &'a mut dyn DumpSink,
    /// The index being read, and how its events go (None: dropped).
    current: Option<(IndexKey, Option<&'a super::plan::Drops>)>,
    /// Per index, kept workers that are no registered key.
    pub unregistered: FxHashMap<IndexKey, FxHashSet<WorkerId>>,
    /// Indexes dropped as they came, for the log.
    pub notes: Vec<String>,
    last: Option<WorkerId>,
}

impl<'a> Filtered<'a> {
    pub fn new(filter: &'a Filter, inner: &'a mut dyn DumpSink) -> Filtered<'a> {
        Filtered { filter, inner, current: None, unregistered: FxHashMap::default(), notes: Vec::new(), last: None }
    }
}

impl DumpSink for Filtered<'_> {
    fn index(&mut self, model_name: &str, tenant_id: &str, block_size: u32) -> Result<(), String> {
        self.last = None;
        self.current = None;
        let drops = match self.filter.index(model_name, tenant_id, block_size) {
            IndexFilter::Dropped => return Ok(()),
            IndexFilter::Resized(b) => {
                self.notes.push(resized_note(model_name, tenant_id, block_size, b));
                return Ok(());
            }
            IndexFilter::Keep(drops) => drops,
        };
        self.current = Some(((model_name.to_owned(), tenant_id.to_owned()), drops));
        self.inner.index(model_name, tenant_id, block_size)
    }

    fn event(&mut self, event: DumpEvent) -> Result<(), String> {
        let Some((key, drops)) = &self.current else { return Ok(()) };
        let w = event.event.worker;
        if drops.is_some_and(|d| d.drops(w, self.filter)) {
            return Ok(());
        }
        if self.last != Some(w) {
            self.last = Some(w);
            if !self.filter.registered(w) {
                self.unregistered.entry(key.clone()).or_default().insert(w);
            }
        }
        self.inner.event(event)
    }
}

/// Applies the snapshot `opened` (read from `path`) to a fresh registry
/// (ready gate closed), merged with the command line's workers:
/// `--workers` entries, then workers-file entries (`file`). `Ok(Err(why))`
/// when the file turned out bad: nothing of it is applied (logged), and
/// the caller registers its workers as without a snapshot. Err only when
/// a command-line worker cannot be registered, as without a snapshot.
pub fn restore<R: Read>(
    registry: &Registry,
    path: &Path,
    opened: Opened<R>,
    command_line: Vec<RegisterArgs>,
    file: Vec<RegisterArgs>,
) -> Result<Result<Restored, SnapshotError>, String> {
    let t = std::time::Instant::now();
    let plan = plan(&opened.head, command_line, file);
    let mut staging = Staging::new(registry, "snapshot").refusing_shed();
    let mut filtered = Filtered::new(&plan.filter, &mut staging);
    let loaded = opened.load(&mut filtered);
    let Filtered { unregistered, notes, .. } = filtered;
    let kept = match loaded.and_then(|_| staging.keep(false).map_err(SnapshotError::Refused)) {
        Ok(kept) => kept,
        Err(e) => {
            crate::warn!("ignoring snapshot {}: {e}; starting without it ({})", path.display(), e.hint());
            return Ok(Err(e));
        }
    };
    for note in plan.notes.iter().chain(&notes) {
        crate::warn!("snapshot: {note}");
    }
    let mut out = Restored { indexes: kept.indexes, pairs: kept.loaded.blocks_stored, ..Restored::default() };
    for (worker, last, extra) in plan.watermarks(&unregistered) {
        match registry.ingest().seed_watermark(worker, last, &extra) {
            Ok(()) => out.watermarks += 1,
            Err(e) => crate::warn!("snapshot: watermark of worker {worker} not seeded: {e}"),
        }
    }
    for args in plan.command_line {
        registry.register(args).map_err(|e| format!("--workers: {e}"))?;
        out.registrations += 1;
    }
    for args in plan.saved {
        let worker = args.worker();
        match registry.register(args) {
            Ok(()) => out.registrations += 1,
            Err(e) => crate::warn!("snapshot: registration of worker {worker} not restored: {e}"),
        }
    }
    let age_s = super::now_unix_ms().saturating_sub(plan.created_unix_ms) / 1_000;
    crate::info!(
        "snapshot restored: {} index(es), {} pairs, {} registration(s), {} watermark(s) in {} ms \
         (written {age_s} s ago by kv-indexer {})",
        out.indexes,
        out.pairs,
        out.registrations,
        out.watermarks,
        t.elapsed().as_millis(),
        plan.daemon_version
    );
    Ok(Ok(out))
}

#[cfg(test)]
#[path = "restore_tests.rs"]
mod tests;

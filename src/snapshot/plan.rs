//! What of a snapshot to keep, given the command line: decided from the
//! registrations alone, before any event is read, as a `Filter` the
//! events then stream through (`restore`).
//!
//! Merge rules (the command line is the operator's current intent):
//! - A snapshot index whose (model, tenant) the command line names with
//!   another block size is dropped whole, with its registrations.
//! - A registration for a key (instance, dp rank) the command line also
//!   lists keeps the command line's endpoint. If the endpoints are equal
//!   the watermark is kept, and so is the snapshot's replay endpoint for a
//!   `--workers` entry, which cannot name one (a workers-file line states
//!   its own: without one it has none); if not, the worker is treated as a
//!   new engine: its snapshot blocks are dropped and its stream starts
//!   fresh, and so are the blocks of the other ranks of its instance that
//!   are no registered key (ranks named inside its batches).
//! - A registration whose instance the command line puts under another
//!   (model, tenant) is dropped with that instance's blocks in its old index.
//! - Every other registration is restored as it was, watermark included.
//!
//! Blocks of workers with no registration (from a peer's dump) are kept.
//! A seeded watermark also names the ranks of its instance, in its index,
//! that are no registered key (`Filter::extra_ranks`, known once the
//! events went through): a restart the ring shows clears them too.

use super::read::Head;
use super::SavedRegistration;
use crate::event::WorkerId;
use crate::ingest::Watermark;
use crate::registry::RegisterArgs;
use rustc_hash::{FxHashMap, FxHashSet};

pub(super) type IndexKey = (String, String);

/// What `restore` will do.
#[derive(Debug, Default)]
pub struct Plan {
    /// Which events of the snapshot to keep.
    pub filter: Filter,
    /// Listener keys, their index and watermark, to seed once loaded.
    pub seeded: Vec<(WorkerId, IndexKey, Watermark)>,
    /// The command line's workers, merged with their snapshot entries.
    pub command_line: Vec<RegisterArgs>,
    /// Keys among them whose entry states its replay endpoint (the workers
    /// file's), which the snapshot's does not fill in.
    stated: FxHashSet<WorkerId>,
    /// The snapshot's other registrations.
    pub saved: Vec<RegisterArgs>,
    /// One line per merge decision worth telling the operator.
    pub notes: Vec<String>,
    /// Snapshot age, writer version: for the log.
    pub created_unix_ms: u64,
    pub daemon_version: String,
}

/// Which events of a snapshot are kept, by index.
#[derive(Debug, Default)]
pub struct Filter {
    dropped_indexes: FxHashSet<IndexKey>,
    /// Block sizes the command line gives indexes.
    sizes: FxHashMap<IndexKey, u32>,
    by_index: FxHashMap<IndexKey, Drops>,
    /// Every registered key, to tell a listener's extra ranks from other keys.
    keys: FxHashSet<WorkerId>,
}

/// What goes of one index's events.
#[derive(Debug, Default)]
pub struct Drops {
    /// Workers treated as new engines.
    workers: FxHashSet<WorkerId>,
    /// Their instances: ranks of these that are no registered key go too.
    streams: FxHashSet<u64>,
    /// Instances moved to another index: every rank goes.
    instances: FxHashSet<u64>,
}

/// How the events of one index go through a `Filter`.
pub enum IndexFilter<'f> {
    /// The whole index is dropped, with its registrations (a note says so).
    Dropped,
    /// The whole index is dropped: the command line gives it this block
    /// size, and no registration of the snapshot is on it.
    Resized(u32),
    /// Events are kept but those of dropped workers.
    Keep(Option<&'f Drops>),
}

impl Filter {
    /// How the events of index (`model`, `tenant`) of `block_size` go.
    pub fn index(&self, model: &str, tenant: &str, block_size: u32) -> IndexFilter<'_> {
        let key = (model.to_string(), tenant.to_string());
        if self.dropped_indexes.contains(&key) {
            return IndexFilter::Dropped;
        }
        match self.sizes.get(&key) {
            Some(&b) if b != block_size => IndexFilter::Resized(b),
            _ => IndexFilter::Keep(self.by_index.get(&key)),
        }
    }

    /// Whether `worker` is a registered key.
    pub fn registered(&self, worker: WorkerId) -> bool {
        self.keys.contains(&worker)
    }
}

impl Drops {
    /// Whether `w`'s events go (`keys`: the filter's registered keys).
    pub fn drops(&self, w: WorkerId, filter: &Filter) -> bool {
        self.instances.contains(&w.instance_id)
            || self.workers.contains(&w)
            || (self.streams.contains(&w.instance_id) && !filter.registered(w))
    }
}

impl Plan {
    /// Each seeded watermark with the other ranks its stream wrote to:
    /// those of `unregistered` (kept workers no key names, by index) of
    /// its instance.
    pub fn watermarks(
        &self,
        unregistered: &FxHashMap<IndexKey, FxHashSet<WorkerId>>,
    ) -> Vec<(WorkerId, Watermark, Vec<u32>)> {
        let mut out = Vec::with_capacity(self.seeded.len());
        for (key, index, last) in &self.seeded {
            let mut extra: Vec<u32> = unregistered
                .get(index)
                .into_iter()
                .flatten()
                .filter(|w| w.instance_id == key.instance_id)
                .map(|w| w.dp_rank)
                .collect();
            extra.sort_unstable();
            out.push((*key, *last, extra));
        }
        out
    }
}

/// Decides what of a snapshot (`head`: its registrations) to keep given
/// the command line's workers: `--workers` entries, then workers-file
/// entries (`file`).
pub fn plan(head: &Head, command_line: Vec<RegisterArgs>, file: Vec<RegisterArgs>) -> Plan {
    let stated = file.iter().map(RegisterArgs::worker).collect();
    let mut p = Plan {
        command_line: command_line.into_iter().chain(file).collect(),
        stated,
        created_unix_ms: head.created_unix_ms,
        daemon_version: head.daemon_version.clone(),
        ..Plan::default()
    };
    for c in &p.command_line {
        p.filter.sizes.entry((c.model_name.clone(), c.tenant_id.clone())).or_insert(c.block_size);
    }
    drop_resized_indexes(&mut p, &head.registrations);
    merge_registrations(&mut p, &head.registrations);
    p.filter.keys = p.command_line.iter().chain(&p.saved).map(RegisterArgs::worker).collect();
    p
}

fn same_index(a: &RegisterArgs, model: &str, tenant: &str) -> bool {
    a.model_name == model && a.tenant_id == tenant
}

/// The note for an index the command line gives another block size.
pub(super) fn resized_note(model: &str, tenant: &str, saved: u32, command_line: u32) -> String {
    format!(
        "snapshot index model={model:?} tenant={tenant:?} has block_size {saved} but the command line says \
         {command_line}; its blocks and registrations are dropped"
    )
}

/// Drops the indexes the command line gives another block size than the
/// snapshot's registrations on them (a registration's is its index's);
/// `Filter::index` drops those with no registration as they come.
fn drop_resized_indexes(p: &mut Plan, registrations: &[SavedRegistration]) {
    for r in registrations.iter().map(|r| &r.args) {
        let key = (r.model_name.clone(), r.tenant_id.clone());
        if p.filter.dropped_indexes.contains(&key) {
            continue;
        }
        if let Some(&b) = p.filter.sizes.get(&key).filter(|&&b| b != r.block_size) {
            p.notes.push(resized_note(&r.model_name, &r.tenant_id, r.block_size, b));
            p.filter.dropped_indexes.insert(key);
        }
    }
}

fn merge_registrations(p: &mut Plan, registrations: &[SavedRegistration]) {
    for SavedRegistration { args: r, last_seq } in registrations {
        let key = (r.model_name.clone(), r.tenant_id.clone());
        if p.filter.dropped_indexes.contains(&key) {
            continue;
        }
        let w = r.worker();
        if let Some(c) = p
            .command_line
            .iter()
            .find(|c| c.instance_id == w.instance_id && !same_index(c, &r.model_name, &r.tenant_id))
        {
            p.notes.push(format!(
                "instance {} moved from model={:?} tenant={:?} to model={:?} tenant={:?} on the command line; \
                 its snapshot blocks are dropped",
                w.instance_id, r.model_name, r.tenant_id, c.model_name, c.tenant_id
            ));
            p.filter.by_index.entry(key).or_default().instances.insert(w.instance_id);
            continue;
        }
        match p.command_line.iter_mut().find(|c| c.instance_id == w.instance_id && c.dp_rank == w.dp_rank) {
            Some(c) if c.endpoint == r.endpoint => {
                if c.replay_endpoint.is_none() && !p.stated.contains(&w) {
                    c.replay_endpoint = r.replay_endpoint.clone();
                }
                if let Some(last) = last_seq {
                    p.seeded.push((w, key, *last));
                }
            }
            Some(c) => {
                p.notes.push(format!(
                    "worker {w} has endpoint {} on the command line, {} in the snapshot; \
                     treating it as a new engine (its snapshot blocks are dropped)",
                    c.endpoint, r.endpoint
                ));
                let drops = p.filter.by_index.entry(key).or_default();
                drops.workers.insert(w);
                drops.streams.insert(w.instance_id);
            }
            None => {
                p.saved.push(r.clone());
                if let Some(last) = last_seq {
                    p.seeded.push((w, key, *last));
                }
            }
        }
    }
}

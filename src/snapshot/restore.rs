//! Applying a snapshot at startup, merged with the command line.
//!
//! `plan` is pure: it decides what of the snapshot is kept. `restore`
//! applies a plan to an empty registry whose ready gate is closed:
//! indexes first (their events), then watermarks are seeded, then the
//! command line's workers are registered (a failure is fatal, as without a
//! snapshot), then the snapshot's other registrations (a failure is logged
//! and skipped). Listeners hold what engines send until the gate opens.
//!
//! Merge rules (the command line is the operator's current intent):
//! - A snapshot index whose (model, tenant) the command line names with
//!   another block size is dropped whole, with its registrations.
//! - A registration for a key (instance, dp rank) the command line also
//!   lists keeps the command line's endpoint. If the endpoints are equal
//!   the watermark is kept, and so is the snapshot's replay endpoint for a
//!   `--workers` entry, which cannot name one (a workers-file line states
//!   its own: without one it has none); if not, the worker is treated as a
//!   new engine: its snapshot blocks are dropped and its stream starts fresh.
//! - A registration whose instance the command line puts under another
//!   (model, tenant) is dropped with that instance's blocks in its old index.
//! - Every other registration is restored as it was, watermark included.
//!
//! Blocks of workers with no registration (from a peer's dump) are kept.
//!
//! With `--peers` too, a peer's dump is applied after this (see
//! `recovery`): it replaces the snapshot's blocks of every worker it names,
//! since a live peer saw what happened while this daemon was down, and a
//! kv-indexer peer's watermark replaces the seeded one of each key it
//! names (`registry::watermarks`); the other seeded watermarks stay, and
//! replaying from them over the peer's state converges the same way
//! (stores and removes are idempotent).

use super::{SavedIndex, SavedRegistration, Snapshot};
use crate::event::WorkerId;
use crate::ingest::Watermark;
use crate::registry::{RegisterArgs, Registry};
use rustc_hash::FxHashSet;

/// What `restore` will do.
#[derive(Debug, Default)]
pub struct Plan {
    /// Indexes to rebuild, with the events of dropped workers removed.
    pub indexes: Vec<SavedIndex>,
    /// Listener key, watermark, and the other dp ranks that stream wrote to.
    pub watermarks: Vec<(WorkerId, Watermark, Vec<u32>)>,
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

/// What `restore` did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Restored {
    pub indexes: usize,
    pub pairs: u64,
    pub registrations: usize,
    pub watermarks: usize,
}

/// Decides what of `snapshot` to keep given the command line's workers:
/// `--workers` entries, then workers-file entries (`file`).
pub fn plan(snapshot: Snapshot, command_line: Vec<RegisterArgs>, file: Vec<RegisterArgs>) -> Plan {
    let stated = file.iter().map(RegisterArgs::worker).collect();
    let mut p = Plan {
        command_line: command_line.into_iter().chain(file).collect(),
        stated,
        created_unix_ms: snapshot.created_unix_ms,
        daemon_version: snapshot.daemon_version,
        ..Plan::default()
    };
    let (mut indexes, dropped_indexes) = drop_resized_indexes(&mut p, snapshot.indexes);
    let mut merge = merge_registrations(&mut p, &snapshot.registrations, &dropped_indexes);
    // Every registered key, to tell a listener's extra ranks from other keys.
    let keys: FxHashSet<WorkerId> = p.command_line.iter().chain(&p.saved).map(RegisterArgs::worker).collect();
    drop_blocks(&mut indexes, &mut merge, &keys);
    for SavedRegistration { args: r, last_seq } in merge.seeded {
        let Some(last) = *last_seq else { continue };
        let mut extra: Vec<u32> = Vec::new();
        for w in events_of(&indexes, &r.model_name, &r.tenant_id) {
            if w.instance_id == r.instance_id && !keys.contains(&w) && !extra.contains(&w.dp_rank) {
                extra.push(w.dp_rank);
            }
        }
        p.watermarks.push((r.worker(), last, extra));
    }
    p.indexes = indexes;
    p
}

type IndexKey = (String, String);

fn same_index(a: &RegisterArgs, model: &str, tenant: &str) -> bool {
    a.model_name == model && a.tenant_id == tenant
}

/// The workers of the events of index (`model`, `tenant`) in `indexes`.
fn events_of<'a>(indexes: &'a [SavedIndex], model: &str, tenant: &str) -> impl Iterator<Item = WorkerId> + 'a {
    let ix = indexes.iter().find(|ix| ix.model_name == model && ix.tenant_id == tenant);
    ix.into_iter().flat_map(|ix| ix.events.iter().map(|e| e.event.worker))
}

/// Drops the indexes the command line gives another block size; the kept
/// ones and the keys of the dropped.
fn drop_resized_indexes(p: &mut Plan, saved: Vec<SavedIndex>) -> (Vec<SavedIndex>, FxHashSet<IndexKey>) {
    let mut dropped = FxHashSet::default();
    let mut indexes = Vec::new();
    for ix in saved {
        match p.command_line.iter().find(|c| same_index(c, &ix.model_name, &ix.tenant_id)) {
            Some(c) if c.block_size != ix.block_size => {
                p.notes.push(format!(
                    "snapshot index model={:?} tenant={:?} has block_size {} but the command line says {}; \
                     its blocks and registrations are dropped",
                    ix.model_name, ix.tenant_id, ix.block_size, c.block_size
                ));
                dropped.insert((ix.model_name, ix.tenant_id));
            }
            _ => indexes.push(ix),
        }
    }
    (indexes, dropped)
}

/// The registrations merged with the command line: whose watermarks are
/// seeded, and whose snapshot blocks must go, by index.
#[derive(Default)]
struct Merge<'a> {
    seeded: Vec<&'a SavedRegistration>,
    dropped_workers: FxHashSet<(String, String, WorkerId)>,
    dropped_instances: FxHashSet<(String, String, u64)>,
}

fn merge_registrations<'a>(
    p: &mut Plan,
    registrations: &'a [SavedRegistration],
    dropped_indexes: &FxHashSet<IndexKey>,
) -> Merge<'a> {
    let mut m = Merge::default();
    for saved in registrations {
        let r = &saved.args;
        if dropped_indexes.contains(&(r.model_name.clone(), r.tenant_id.clone())) {
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
            m.dropped_instances.insert((r.model_name.clone(), r.tenant_id.clone(), w.instance_id));
            continue;
        }
        match p.command_line.iter_mut().find(|c| c.instance_id == w.instance_id && c.dp_rank == w.dp_rank) {
            Some(c) if c.endpoint == r.endpoint => {
                if c.replay_endpoint.is_none() && !p.stated.contains(&w) {
                    c.replay_endpoint = r.replay_endpoint.clone();
                }
                m.seeded.push(saved);
            }
            Some(c) => {
                p.notes.push(format!(
                    "worker {w} has endpoint {} on the command line, {} in the snapshot; \
                     treating it as a new engine (its snapshot blocks are dropped)",
                    c.endpoint, r.endpoint
                ));
                m.dropped_workers.insert((r.model_name.clone(), r.tenant_id.clone(), w));
            }
            None => {
                p.saved.push(r.clone());
                m.seeded.push(saved);
            }
        }
    }
    m
}

/// Removes the events of dropped instances and workers from `indexes`; a
/// dropped worker's stream may have written other ranks too (not
/// registered keys of their own): those go with it.
fn drop_blocks(indexes: &mut [SavedIndex], m: &mut Merge<'_>, keys: &FxHashSet<WorkerId>) {
    for (model, tenant, w) in m.dropped_workers.clone() {
        for worker in events_of(indexes, &model, &tenant) {
            if worker.instance_id == w.instance_id && !keys.contains(&worker) {
                m.dropped_workers.insert((model.clone(), tenant.clone(), worker));
            }
        }
    }
    for ix in indexes {
        let (model, tenant) = (ix.model_name.clone(), ix.tenant_id.clone());
        ix.events.retain(|e| {
            !m.dropped_instances.contains(&(model.clone(), tenant.clone(), e.event.worker.instance_id))
                && !m.dropped_workers.contains(&(model.clone(), tenant.clone(), e.event.worker))
        });
    }
}

/// Applies `plan` to a fresh registry (ready gate closed). Err only when a
/// command-line worker cannot be registered, as without a snapshot.
pub fn restore(registry: &Registry, mut plan: Plan) -> Result<Restored, String> {
    for note in &plan.notes {
        crate::warn!("snapshot: {note}");
    }
    let t = std::time::Instant::now();
    let mut out = Restored::default();
    for ix in std::mem::take(&mut plan.indexes) {
        let handle = match registry.index_or_create(&ix.model_name, &ix.tenant_id, ix.block_size) {
            Ok(h) => h,
            Err(e) => {
                crate::warn!("snapshot: skipping index model={:?} tenant={:?}: {e}", ix.model_name, ix.tenant_id);
                continue;
            }
        };
        out.indexes += 1;
        out.pairs += ix.pairs();
        // Each index's events go as they are applied.
        handle.load(ix.events);
    }
    for (worker, last, extra) in &plan.watermarks {
        match registry.ingest().seed_watermark(*worker, *last, extra) {
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
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, StorageTier, StoredBlock};
    use crate::index::DumpEvent;

    fn reg(instance: u64, rank: u32, endpoint: &str, model: &str, last: Option<u64>) -> SavedRegistration {
        let mut args = cli(instance, rank, endpoint, model, 4);
        args.replay_endpoint = Some(format!("{endpoint}9"));
        SavedRegistration { args, last_seq: last.map(|seq| Watermark { seq, digest: None }) }
    }

    fn cli(instance: u64, rank: u32, endpoint: &str, model: &str, block_size: u32) -> RegisterArgs {
        RegisterArgs {
            instance_id: instance,
            dp_rank: rank,
            endpoint: endpoint.into(),
            replay_endpoint: None,
            model_name: model.into(),
            tenant_id: "default".into(),
            block_size,
        }
    }

    fn store(instance: u64, rank: u32, hash: u64) -> DumpEvent {
        let b = StoredBlock { engine_hash: hash, local_hash: hash };
        Event::stored(WorkerId::new(instance, rank), StorageTier::Device, None, vec![b]).into()
    }

    fn snapshot() -> Snapshot {
        Snapshot {
            created_unix_ms: 0,
            daemon_version: "t".into(),
            registrations: vec![
                reg(1, 0, "tcp://a:1", "m", Some(10)),
                reg(2, 0, "tcp://b:1", "m", Some(20)),
                reg(3, 0, "tcp://c:1", "m", None),
                reg(4, 0, "tcp://d:1", "m", Some(40)),
                reg(5, 0, "tcp://e:1", "other", Some(50)),
            ],
            indexes: vec![
                SavedIndex {
                    model_name: "m".into(),
                    tenant_id: "default".into(),
                    block_size: 4,
                    // Instance 1 also wrote rank 7 (a rank inside its batches); 9 is unregistered.
                    events: vec![store(1, 0, 1), store(1, 7, 2), store(2, 0, 3), store(4, 0, 4), store(9, 0, 5)],
                },
                SavedIndex {
                    model_name: "other".into(),
                    tenant_id: "default".into(),
                    block_size: 8,
                    events: vec![store(5, 0, 6)],
                },
            ],
        }
    }

    fn workers(p: &Plan, model: &str) -> Vec<WorkerId> {
        let ix = p.indexes.iter().find(|ix| ix.model_name == model).unwrap();
        ix.events.iter().map(|e| e.event.worker).collect()
    }

    #[test]
    fn without_a_command_line_everything_is_restored() {
        let p = plan(snapshot(), vec![], vec![]);
        assert_eq!(p.saved.len(), 5);
        assert!(p.notes.is_empty());
        assert_eq!(workers(&p, "m").len(), 5);
        let w = |i| p.watermarks.iter().find(|(w, ..)| w.instance_id == i).cloned();
        let at = |seq| Watermark { seq, digest: None };
        assert_eq!(w(1), Some((WorkerId::new(1, 0), at(10), vec![7])), "extra rank 7 is cleared with rank 0");
        assert_eq!(w(2), Some((WorkerId::new(2, 0), at(20), vec![])));
        assert_eq!(w(3), None, "no watermark: a fresh stream");
    }

    #[test]
    fn a_workers_file_entry_states_its_own_replay_endpoint() {
        // The same key and endpoint from the workers file, without a
        // replay endpoint: it has none, whatever the snapshot saved.
        let p = plan(snapshot(), vec![], vec![cli(1, 0, "tcp://a:1", "m", 4)]);
        assert_eq!(p.command_line[0].replay_endpoint, None);
        assert!(p.watermarks.iter().any(|(w, s, _)| w.instance_id == 1 && s.seq == 10), "its watermark is kept");
    }

    #[test]
    fn command_line_wins_on_the_same_key() {
        let p = plan(
            snapshot(),
            vec![
                cli(1, 0, "tcp://a:1", "m", 4),     // same endpoint: replay endpoint and watermark kept
                cli(2, 0, "tcp://moved:1", "m", 4), // new endpoint: a new engine
            ],
            vec![],
        );
        assert_eq!(p.command_line[0].replay_endpoint.as_deref(), Some("tcp://a:19"));
        assert_eq!(p.command_line[1].endpoint, "tcp://moved:1");
        assert_eq!(p.command_line[1].replay_endpoint, None);
        assert_eq!(p.saved.iter().map(|a| a.instance_id).collect::<Vec<_>>(), vec![3, 4, 5]);
        assert!(p.watermarks.iter().any(|(w, s, _)| w.instance_id == 1 && s.seq == 10));
        assert!(!p.watermarks.iter().any(|(w, ..)| w.instance_id == 2));
        assert!(!workers(&p, "m").contains(&WorkerId::new(2, 0)), "the moved engine starts cold");
        assert_eq!(p.notes.len(), 1);
    }

    #[test]
    fn a_block_size_change_drops_the_index_and_a_moved_instance_its_blocks() {
        let p = plan(snapshot(), vec![cli(4, 1, "tcp://x:1", "other", 16)], vec![]);
        assert!(p.indexes.iter().all(|ix| ix.model_name != "other"), "block size 8 vs 16: dropped");
        assert!(p.saved.iter().all(|a| a.model_name != "other"));
        // Instance 4 moved to "other": its registration and blocks under "m" go.
        assert!(p.saved.iter().all(|a| a.instance_id != 4));
        assert!(!workers(&p, "m").contains(&WorkerId::new(4, 0)));
        assert!(workers(&p, "m").contains(&WorkerId::new(9, 0)), "unregistered workers stay");
        assert_eq!(p.notes.len(), 2);
    }

    #[test]
    fn a_new_endpoint_drops_the_extra_ranks_of_its_stream() {
        let p = plan(snapshot(), vec![cli(1, 0, "tcp://new:1", "m", 4)], vec![]);
        let ws = workers(&p, "m");
        assert!(!ws.contains(&WorkerId::new(1, 0)) && !ws.contains(&WorkerId::new(1, 7)));
    }
}

//! Restoring: the plan's merge rules applied to events as they stream by;
//! a snapshot through the daemon's registry and back (blocks,
//! registrations, watermarks with digests); and files cut anywhere,
//! mutated, or over `--max-pairs`, which leave nothing applied.

use super::*;
use crate::dump::{Collect, DumpEntry};
use crate::event::{Event, EventKind, StorageTier, StoredBlock};
use crate::index::{Budget, DumpEvent};
use crate::ingest::{Ingest, IngestConfig, Watermark};
use crate::metrics::Prom;
use crate::snapshot::plan::Plan;
use crate::snapshot::read::{open, Head};
use crate::snapshot::write::write;
use crate::snapshot::{SavedIndex, SavedRegistration, Snapshot};
use crate::test_rng::Rng;
use std::collections::BTreeSet;
use std::sync::Arc;

fn reg(instance: u64, rank: u32, endpoint: &str, model: &str, last: Option<u64>) -> SavedRegistration {
    let mut args = cli(instance, rank, endpoint, model, if model == "other" { 8 } else { 4 });
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
            // No registration: only its block size can drop it.
            SavedIndex { model_name: "loose".into(), tenant_id: "default".into(), block_size: 2, events: vec![] },
        ],
    }
}

/// A plan for `s` and the command line, `s`'s events streamed through its
/// filter: the plan, what was kept, the watermarks, the notes.
struct Planned {
    plan: Plan,
    kept: Vec<DumpEntry>,
    watermarks: Vec<(WorkerId, Watermark, Vec<u32>)>,
    notes: Vec<String>,
}

fn planned(s: Snapshot, command_line: Vec<RegisterArgs>, file: Vec<RegisterArgs>) -> Planned {
    let head = Head {
        format: 5,
        created_unix_ms: s.created_unix_ms,
        daemon_version: s.daemon_version.clone(),
        registrations: s.registrations.clone(),
    };
    let plan = plan(&head, command_line, file);
    let mut sink = Collect::default();
    let mut f = Filtered::new(&plan.filter, &mut sink);
    for ix in s.indexes {
        f.index(&ix.model_name, &ix.tenant_id, ix.block_size).unwrap();
        for e in ix.events {
            f.event(e).unwrap();
        }
    }
    let Filtered { unregistered, notes, .. } = f;
    let watermarks = plan.watermarks(&unregistered);
    Planned { plan, kept: sink.0, watermarks, notes }
}

impl Planned {
    fn workers(&self, model: &str) -> Vec<WorkerId> {
        let ix = self.kept.iter().find(|ix| ix.model_name == model).unwrap();
        ix.events.iter().map(|e| e.event.worker).collect()
    }

    fn has(&self, model: &str) -> bool {
        self.kept.iter().any(|ix| ix.model_name == model)
    }
}

#[test]
fn without_a_command_line_everything_is_restored() {
    let p = planned(snapshot(), vec![], vec![]);
    assert_eq!(p.plan.saved.len(), 5);
    assert!(p.plan.notes.is_empty() && p.notes.is_empty());
    assert_eq!(p.workers("m").len(), 5);
    assert!(p.has("other") && p.has("loose"));
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
    let p = planned(snapshot(), vec![], vec![cli(1, 0, "tcp://a:1", "m", 4)]);
    assert_eq!(p.plan.command_line[0].replay_endpoint, None);
    assert!(p.watermarks.iter().any(|(w, s, _)| w.instance_id == 1 && s.seq == 10), "its watermark is kept");
}

#[test]
fn command_line_wins_on_the_same_key() {
    let p = planned(
        snapshot(),
        vec![
            cli(1, 0, "tcp://a:1", "m", 4),     // same endpoint: replay endpoint and watermark kept
            cli(2, 0, "tcp://moved:1", "m", 4), // new endpoint: a new engine
        ],
        vec![],
    );
    assert_eq!(p.plan.command_line[0].replay_endpoint.as_deref(), Some("tcp://a:19"));
    assert_eq!(p.plan.command_line[1].endpoint, "tcp://moved:1");
    assert_eq!(p.plan.command_line[1].replay_endpoint, None);
    assert_eq!(p.plan.saved.iter().map(|a| a.instance_id).collect::<Vec<_>>(), vec![3, 4, 5]);
    assert!(p.watermarks.iter().any(|(w, s, _)| w.instance_id == 1 && s.seq == 10));
    assert!(!p.watermarks.iter().any(|(w, ..)| w.instance_id == 2));
    assert!(!p.workers("m").contains(&WorkerId::new(2, 0)), "the moved engine starts cold");
    assert_eq!(p.plan.notes.len(), 1);
}

#[test]
fn a_block_size_change_drops_the_index_and_a_moved_instance_its_blocks() {
    let p = planned(snapshot(), vec![cli(4, 1, "tcp://x:1", "other", 16), cli(6, 0, "tcp://y:1", "loose", 4)], vec![]);
    assert!(!p.has("other"), "block size 8 vs 16: dropped");
    assert!(p.plan.saved.iter().all(|a| a.model_name != "other"));
    assert!(!p.has("loose"), "block size 2 vs 4, though no registration is on it");
    // Instance 4 moved to "other": its registration and blocks under "m" go.
    assert!(p.plan.saved.iter().all(|a| a.instance_id != 4));
    assert!(!p.workers("m").contains(&WorkerId::new(4, 0)));
    assert!(p.workers("m").contains(&WorkerId::new(9, 0)), "unregistered workers stay");
    assert_eq!(p.plan.notes.len(), 2);
    assert_eq!(p.notes.len(), 1, "the index without registrations, as it came: {:?}", p.notes);
}

#[test]
fn a_new_endpoint_drops_the_extra_ranks_of_its_stream() {
    let p = planned(snapshot(), vec![cli(1, 0, "tcp://new:1", "m", 4)], vec![]);
    let ws = p.workers("m");
    assert!(!ws.contains(&WorkerId::new(1, 0)) && !ws.contains(&WorkerId::new(1, 7)));
    assert!(ws.contains(&WorkerId::new(9, 0)) && ws.contains(&WorkerId::new(2, 0)));
}

// Through the daemon's registry.

fn registry(budget: Budget) -> (Arc<Ingest>, Registry) {
    let cfg = IngestConfig {
        listener_threads: 1,
        shard_threads: 1,
        pin_threads: false,
        ready_gate_open: false,
        ..IngestConfig::default()
    };
    let ingest = Arc::new(Ingest::start(cfg).unwrap());
    let r = Registry::new(ingest.clone(), 0, Arc::new(budget));
    (ingest, r)
}

fn chain(instance: u64, rank: u32, tier: StorageTier, parent: Option<u64>, first: u64, n: u64) -> Event {
    let blocks = (first..first + n).map(|h| StoredBlock { engine_hash: h, local_hash: h * 5 + 2 }).collect();
    Event::stored(WorkerId::new(instance, rank), tier, parent, blocks)
}

/// Registrations of the source daemon: instance 1 (two ranks) and 2 on
/// "m", 3 on "n", with watermarks, digests among them.
fn registrations() -> Vec<(RegisterArgs, Option<Watermark>)> {
    let r = |instance, rank, port: u16, model: &str, replay: bool| RegisterArgs {
        instance_id: instance,
        dp_rank: rank,
        endpoint: format!("tcp://127.0.0.1:{port}"),
        replay_endpoint: replay.then(|| format!("tcp://127.0.0.1:{}", port + 1)),
        model_name: model.into(),
        tenant_id: "default".into(),
        block_size: 4,
    };
    vec![
        (r(1, 0, 41_000, "m", true), Some(Watermark { seq: 41, digest: Some(0xd1) })),
        (r(1, 1, 41_010, "m", true), Some(Watermark { seq: 7, digest: None })),
        (r(2, 0, 41_020, "m", false), None),
        (r(3, 0, 41_030, "n", true), Some(Watermark { seq: u64::MAX - 1, digest: Some(u64::MAX) })),
    ]
}

/// A running registry with blocks in two registered indexes (several
/// tiers, an orphan, a rank no key names) and one no registration is on.
fn source() -> (Arc<Ingest>, Registry) {
    let (ingest, r) = registry(Budget::unlimited());
    for (args, last) in registrations() {
        if let Some(last) = last {
            ingest.seed_watermark(args.worker(), last, &[]).unwrap();
        }
        r.register(args).unwrap();
    }
    let m = r.index("m", "default").unwrap();
    for i in 0..6u64 {
        m.apply(&chain(1, (i % 2) as u32, StorageTier::Device, None, 100 * i, 3 + i));
    }
    m.apply(&chain(1, 0, StorageTier::HostPinned, Some(1), 9_000, 2));
    m.apply(&chain(1, 5, StorageTier::Device, None, 5_000, 4)); // a rank inside instance 1's batches
    m.apply(&chain(2, 0, StorageTier::Device, None, 7_000, 5));
    m.apply(&Event::removed(WorkerId::new(2, 0), StorageTier::Device, vec![7_001]));
    r.index("n", "default").unwrap().apply(&chain(3, 0, StorageTier::Disk, None, 1, 3));
    r.index_or_create("loose", "t", 8).unwrap().apply(&chain(9, 0, StorageTier::Device, None, 11, 2));
    (ingest, r)
}

/// A snapshot file of `r`, as a stop writes it.
fn file_of(r: &Registry) -> Vec<u8> {
    let c = super::super::capture::capture(r).unwrap();
    let mut out = Vec::new();
    write(&mut out, 1, "test", &c.registrations, c.events).unwrap();
    out
}

/// Each index's blocks, whatever the order of its workers.
fn state(r: &Registry) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for h in r.indexes() {
        let ix = h.index();
        out.insert(format!("{}:{} block_size {}", h.model_name, h.tenant_id, ix.block_size()));
        for e in ix.dump_events() {
            out.insert(format!("{}:{} {e:?}", h.model_name, h.tenant_id));
        }
    }
    out
}

fn registered(r: &Registry) -> BTreeSet<String> {
    r.registrations()
        .iter()
        .map(|g| format!("{} {} {:?} {} {}", g.worker, g.endpoint, g.replay_endpoint, g.model_name, g.tenant_id))
        .collect()
}

fn watermarks(i: &Ingest) -> Vec<(WorkerId, Watermark)> {
    let mut w = i.watermarks();
    w.sort_by_key(|(w, _)| *w);
    w
}

fn counters(r: &Registry) -> String {
    let mut p = Prom { text: String::new() };
    r.counters.render(&mut p);
    p.text
}

fn restore_bytes(r: &Registry, bytes: &[u8], command_line: Vec<RegisterArgs>) -> Result<Restored, SnapshotError> {
    let opened = open(bytes, bytes.len() as u64)?;
    restore(r, Path::new("snapshot.bin"), opened, command_line, vec![]).expect("the command line registers")
}

/// Nothing of a snapshot is in `r`: no index, no registration, no pair,
/// no counted event, no watermark.
fn untouched(r: &Registry, i: &Ingest, fresh_counters: &str) -> bool {
    r.indexes().is_empty()
        && r.registrations().is_empty()
        && r.budget.pairs() == 0
        && counters(r) == fresh_counters
        && i.watermarks().is_empty()
}

#[test]
fn a_snapshot_round_trips_through_the_registry() {
    let (ia, a) = source();
    let bytes = file_of(&a);
    let (ib, b) = registry(Budget::unlimited());
    let restored = restore_bytes(&b, &bytes, vec![]).unwrap();
    assert_eq!(state(&b), state(&a), "every index's blocks, the orphan and the loose index too");
    assert_eq!(registered(&b), registered(&a));
    assert_eq!(watermarks(&ib), watermarks(&ia), "watermarks and their digests");
    assert_eq!(watermarks(&ib).len(), 3);
    let pairs = a.budget.pairs();
    assert_eq!(restored, Restored { indexes: 3, pairs, registrations: 4, watermarks: 3 });
    assert_eq!(b.budget.pairs(), pairs);
    // Loaded events count as a peer's dump's do, once kept.
    let stored = format!("kv_indexer_blocks_total{{outcome=\"stored\"}} {pairs}\n");
    assert!(counters(&b).contains(&stored), "{}", counters(&b));
    ia.shutdown();
    ib.shutdown();
}

#[test]
fn a_file_cut_anywhere_or_damaged_leaves_nothing_applied() {
    let (ia, a) = source();
    let bytes = file_of(&a);
    let (ib, b) = registry(Budget::unlimited());
    let fresh = counters(&b);
    // Every length: each record boundary, and every byte between.
    for len in 0..bytes.len() {
        let e = restore_bytes(&b, &bytes[..len], vec![]).expect_err("a prefix must not restore");
        assert!(matches!(e, SnapshotError::Truncated { .. } | SnapshotError::Empty), "{len}: {e:?}");
        assert!(untouched(&b, &ib, &fresh), "cut at {len}: something was applied");
    }
    // A flipped bit of a block hash is found by the checksum, at the end.
    let hash = 9_000u64.to_le_bytes();
    let at = bytes.windows(8).position(|w| w == hash).unwrap();
    let mut flipped = bytes.clone();
    flipped[at] ^= 0x01;
    assert_eq!(restore_bytes(&b, &flipped, vec![]).err(), Some(SnapshotError::Checksum));
    assert!(untouched(&b, &ib, &fresh));
    // Random damage: bytes changed, the file cut and junk added.
    let mut rng = Rng(0x0b5e55ed);
    for round in 0..300 {
        let mut bad = bytes.clone();
        for _ in 0..1 + rng.next() % 3 {
            let i = (rng.next() as usize) % bad.len();
            bad[i] ^= 1 + (rng.next() % 255) as u8;
        }
        if round % 2 == 0 {
            bad.truncate((rng.next() as usize) % bad.len());
            bad.extend((0..rng.next() % 40).map(|_| rng.next() as u8));
        }
        if bad != bytes {
            assert!(restore_bytes(&b, &bad, vec![]).is_err(), "round {round}");
            assert!(untouched(&b, &ib, &fresh), "round {round}: something was applied");
        }
    }
    // The same registry then takes the whole file.
    restore_bytes(&b, &bytes, vec![]).unwrap();
    assert_eq!(state(&b), state(&a));
    ia.shutdown();
    ib.shutdown();
}

#[test]
fn the_plan_drops_an_index_and_a_worker_while_the_events_stream() {
    let (ia, a) = source();
    let bytes = file_of(&a);
    let (ib, b) = registry(Budget::unlimited());
    // "n" has block size 8 now; instance 1 rank 0 is a new engine on another port.
    let n = RegisterArgs { block_size: 8, ..registrations()[3].0.clone() };
    let moved = RegisterArgs { endpoint: "tcp://127.0.0.1:42000".into(), ..registrations()[0].0.clone() };
    let restored = restore_bytes(&b, &bytes, vec![moved, n]).unwrap();
    assert!(b.index("n", "default").unwrap().index().dump_events().is_empty(), "the resized index starts empty");
    let m = b.index("m", "default").unwrap().index().dump_events();
    let workers: BTreeSet<WorkerId> = m.iter().map(|e| e.event.worker).collect();
    let want: BTreeSet<WorkerId> = [WorkerId::new(1, 1), WorkerId::new(2, 0)].into();
    assert_eq!(workers, want, "rank 0 and rank 5 of its stream go; its registered rank 1 stays");
    assert!(b.index("loose", "t").is_some(), "an index no registration is on stays");
    let seeded: Vec<WorkerId> = watermarks(&ib).into_iter().map(|(w, _)| w).collect();
    assert_eq!(seeded, vec![WorkerId::new(1, 1)], "the new engine and the resized index start fresh");
    let kept_pairs = b.budget.pairs();
    assert_eq!(restored.pairs, kept_pairs);
    assert!(kept_pairs < a.budget.pairs());
    ia.shutdown();
    ib.shutdown();
}

#[test]
fn a_snapshot_past_max_pairs_leaves_nothing_applied() {
    let (ia, a) = source();
    let bytes = file_of(&a);
    let pairs = a.budget.pairs();
    let (ib, b) = registry(Budget::new(pairs - 1));
    let fresh = counters(&b);
    let e = restore_bytes(&b, &bytes, vec![]).unwrap_err();
    assert!(matches!(&e, SnapshotError::Refused(why) if why.contains(&format!("--max-pairs {}", pairs - 1))), "{e:?}");
    assert!(e.hint().contains("raise --max-pairs"));
    assert!(untouched(&b, &ib, &fresh), "nothing of it stays, and its pairs are free again");
    // At the cap it loads (the cap bounds entries too: an orphan's missing
    // ancestors are entries no worker holds).
    let (ic, c) = registry(Budget::new(pairs.max(a.budget.entries())));
    restore_bytes(&c, &bytes, vec![]).unwrap();
    assert_eq!(state(&c), state(&a));
    for i in [ia, ib, ic] {
        i.shutdown();
    }
}

/// A format 4 file (from a build that held the whole copy) still restores.
#[test]
fn a_format_4_file_restores() {
    let mut s = snapshot();
    s.registrations.truncate(0);
    s.indexes[0].events.retain(|e| matches!(e.event.kind, EventKind::Stored { .. }));
    let bytes = crate::snapshot::legacy::tests::encode(&s);
    let (i, r) = registry(Budget::unlimited());
    let restored = restore_bytes(&r, &bytes, vec![]).unwrap();
    assert_eq!((restored.indexes, restored.pairs), (3, 6));
    assert_eq!(r.index("m", "default").unwrap().index().dump_events().len(), 5);
    i.shutdown();
}

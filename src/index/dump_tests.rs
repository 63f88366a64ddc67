//! Dump and load: a dump lists exactly the blocks each worker holds, each
//! once, orphans with where they hang; loading it rebuilds the same pairs
//! and holes.

use super::*;
use crate::index::{Index, IndexConfig, Matches};
use std::collections::BTreeSet;

const DEV: StorageTier = StorageTier::Device;
const HOST: StorageTier = StorageTier::HostPinned;
const DISK: StorageTier = StorageTier::Disk;
const EXT: StorageTier = StorageTier::External;

fn w(i: u64) -> WorkerId {
    WorkerId::new(i, 0)
}

/// Local hash of the block at `pos` of the test chain.
fn l(pos: u64) -> u64 {
    100 + pos
}

/// Blocks at positions `from..` with these engine hashes, on the test chain.
fn at(from: u64, hashes: &[u64]) -> Vec<StoredBlock> {
    hashes.iter().enumerate().map(|(i, &h)| StoredBlock { engine_hash: h, local_hash: l(from + i as u64) }).collect()
}

type Held = BTreeSet<(WorkerId, usize, u64)>;

/// An index and what its workers hold, kept beside it.
struct Fixture {
    ix: Index,
    held: Held,
}

impl Fixture {
    fn new() -> Self {
        Fixture { ix: Index::new(IndexConfig { jump: 2, ..IndexConfig::new(4) }), held: Held::new() }
    }

    fn store(&mut self, worker: WorkerId, tier: StorageTier, parent: Option<u64>, blocks: Vec<StoredBlock>) {
        let n = blocks.len() as u32;
        let o = self.ix.apply(&Event::stored(worker, tier, parent, blocks.clone()));
        assert_eq!(o.stored + o.duplicate, n, "{worker} {tier:?} {parent:?} {blocks:?}: {o:?}");
        self.held.extend(blocks.iter().map(|b| (worker, tier.index(), b.engine_hash)));
    }

    fn remove(&mut self, worker: WorkerId, tier: StorageTier, hashes: &[u64]) {
        let o = self.ix.apply(&Event::removed(worker, tier, hashes.to_vec()));
        assert_eq!(o.removed as usize, hashes.len());
        for h in hashes {
            self.held.remove(&(worker, tier.index(), *h));
        }
    }
}

/// The dump read as a list: every block a held (worker, tier, hash), each once.
fn listed(events: &[DumpEvent]) -> Held {
    let mut out = Held::new();
    for d in events {
        let EventKind::Stored { blocks, .. } = &d.event.kind else { panic!("not a store: {d:?}") };
        for b in blocks {
            assert!(out.insert((d.event.worker, d.event.tier.index(), b.engine_hash)), "listed twice: {d:?}");
        }
    }
    out
}

fn orphan_of(events: &[DumpEvent], worker: WorkerId, hash: u64) -> (Option<u64>, Orphan) {
    let d = events
        .iter()
        .find(|d| {
            d.event.worker == worker
                && matches!(&d.event.kind, EventKind::Stored { blocks, .. } if blocks[0].engine_hash == hash)
        })
        .unwrap_or_else(|| panic!("no event starts with {hash}"));
    let EventKind::Stored { parent, .. } = &d.event.kind else { unreachable!() };
    (*parent, d.orphan.clone().unwrap_or_else(|| panic!("{hash} is no orphan: {d:?}")))
}

fn canonical(events: Vec<DumpEvent>) -> Vec<String> {
    let mut v: Vec<String> = events.iter().map(|e| format!("{e:?}")).collect();
    v.sort();
    v
}

fn sorted(mut m: Matches) -> Matches {
    m.workers.sort_by_key(|x| x.worker);
    m
}

/// Loads `ix`'s dump into a fresh index and checks it is the same index.
fn rebuilt(ix: &Index, queries: &[Vec<u64>]) -> Index {
    let copy = Index::new(IndexConfig::new(4));
    let dump = ix.dump_events();
    let loaded = copy.load_dump(&dump, |_, _| {});
    assert_eq!(loaded.blocks_refused, 0, "{loaded:?}");
    assert_eq!(loaded.orphans, dump.iter().filter(|d| d.orphan.is_some()).count() as u64);
    copy.check_consistency();
    assert_eq!(copy.stats().pairs, ix.stats().pairs, "the same pairs");
    assert_eq!(copy.stats().entries, ix.stats().entries, "the same blocks, holes included");
    assert_eq!(canonical(copy.dump_events()), canonical(dump), "the rebuilt index dumps the same");
    for q in queries {
        assert_eq!(sorted(copy.find_matches(q)), sorted(ix.find_matches(q)), "query {q:?}");
    }
    copy
}

/// Every prefix of the test chain, and of a branch at position 2.
fn queries() -> Vec<Vec<u64>> {
    let mut out: Vec<Vec<u64>> = (1..=12).map(|n| (0..n).map(l).collect()).collect();
    out.extend((3..=5).map(|n| (0..n).map(|p| if p == 2 { 200 } else { l(p) }).collect()));
    out
}

#[test]
fn every_held_block_is_listed_once_and_orphans_in_every_tier_say_where_they_hang() {
    let mut f = Fixture::new();
    // Worker 1: the chain on the device, copied to the host; the device
    // keeps its first two blocks, the host three in the middle; a disk
    // block and two external ones after them, each losing its parent.
    f.store(w(1), DEV, None, at(0, &[10, 11, 12, 13, 14, 15, 16, 17]));
    f.store(w(1), HOST, None, at(0, &[20, 21, 22, 23, 24, 25, 26, 27]));
    f.store(w(1), DISK, Some(27), at(8, &[38]));
    f.store(w(1), EXT, Some(38), at(9, &[48, 49]));
    f.remove(w(1), DEV, &[12, 13, 14, 15, 16, 17]);
    f.remove(w(1), HOST, &[20, 21, 22, 23, 27]);
    f.remove(w(1), EXT, &[48]);
    // Worker 2: a device hole at position 2, whose block the host keeps.
    f.store(w(2), DEV, None, at(0, &[60, 61, 62, 63, 64, 65]));
    f.store(w(2), HOST, Some(61), at(2, &[72]));
    f.remove(w(2), DEV, &[62]);
    // Worker 3: host blocks at position 2 of two branches whose shared
    // prefix it no longer holds anywhere.
    f.store(w(3), HOST, None, at(0, &[80, 81, 82, 83]));
    f.store(w(3), HOST, Some(81), vec![StoredBlock { engine_hash: 84, local_hash: 200 }]);
    f.remove(w(3), HOST, &[80, 81]);

    let dump = f.ix.dump_events();
    assert_eq!(listed(&dump), f.held, "exactly the held blocks");
    let uses = |worker: WorkerId, h: u64| f.held.iter().any(|&(x, _, y)| x == worker && y == h);

    // Host 24 at position 4: positions 2 and 3 are held nowhere, 1 on the device.
    let (parent, o) = orphan_of(&dump, w(1), 24);
    assert_eq!(o, Orphan { position: 4, anchor: Some(11), missing: vec![l(2), l(3)] });
    assert!(!uses(w(1), parent.unwrap()), "an unheld parent gets a hash the worker does not use");
    // Disk 38 at position 8: its parent (host 27) is gone, host 26 is held.
    let (_, o) = orphan_of(&dump, w(1), 38);
    assert_eq!(o, Orphan { position: 8, anchor: Some(26), missing: vec![l(7)] });
    // External 49 at position 10: external 48 is gone, disk 38 is held.
    let (_, o) = orphan_of(&dump, w(1), 49);
    assert_eq!(o, Orphan { position: 10, anchor: Some(38), missing: vec![l(9)] });
    // Device 63 after the hole: the parent is named, by the host's hash.
    let (parent, o) = orphan_of(&dump, w(2), 63);
    assert_eq!((parent, o), (Some(72), Orphan { position: 3, anchor: Some(61), missing: vec![l(2)] }));
    // Worker 3: the first branch lists the missing prefix from the root,
    // the second hangs under the first one's ancestor at position 1.
    let (p82, o) = orphan_of(&dump, w(3), 82);
    assert_eq!(o, Orphan { position: 2, anchor: None, missing: vec![l(0), l(1)] });
    let (p84, o) = orphan_of(&dump, w(3), 84);
    assert_eq!(o, Orphan { position: 2, anchor: Some(82), missing: vec![] });
    assert_eq!(p82, p84, "siblings name their parent alike");
    // Orphans start events; their children follow in the same event.
    let d = dump.iter().find(|d| d.orphan.as_ref().is_some_and(|o| o.position == 4)).unwrap();
    assert!(matches!(&d.event.kind, EventKind::Stored { blocks, .. } if blocks.len() == 3), "{d:?}");

    rebuilt(&f.ix, &queries());
}

#[test]
fn aliases_and_dp_ranks_are_listed_and_rebuilt() {
    let mut f = Fixture::new();
    // Worker 4 names position 1 by two hashes; then loses position 0.
    f.store(w(4), DEV, None, at(0, &[90, 91, 92]));
    f.store(w(4), DEV, Some(90), at(1, &[95]));
    f.store(w(4), DEV, Some(95), at(2, &[96]));
    // Two ranks of one instance with the same hashes; rank 1 has a hole.
    let (r0, r1) = (WorkerId::new(5, 0), WorkerId::new(5, 1));
    f.store(r0, DEV, None, at(0, &[500, 501, 502, 503]));
    f.store(r1, DEV, None, at(0, &[500, 501, 502, 503]));
    f.remove(r1, DEV, &[501]);
    let q = queries();
    let before = rebuilt(&f.ix, &q);
    assert_eq!(listed(&before.dump_events()), f.held);

    f.remove(w(4), DEV, &[90]);
    let dump = f.ix.dump_events();
    assert_eq!(listed(&dump), f.held);
    let (_, o) = orphan_of(&dump, w(4), 91);
    assert_eq!(o, Orphan { position: 1, anchor: None, missing: vec![l(0)] });
    let (_, o) = orphan_of(&dump, w(4), 95);
    assert_eq!(o, Orphan { position: 1, anchor: Some(91), missing: vec![] });
    assert!(dump.iter().all(|d| d.event.worker != r0 || d.orphan.is_none()), "rank 0 has no hole");
    let (_, o) = orphan_of(&dump, r1, 502);
    assert_eq!(o, Orphan { position: 2, anchor: Some(500), missing: vec![l(1)] });
    let copy = rebuilt(&f.ix, &q);
    // The alias still counts: removing one of its hashes keeps the block.
    copy.apply(&Event::removed(w(4), DEV, vec![95]));
    f.ix.apply(&Event::removed(w(4), DEV, vec![95]));
    assert_eq!(copy.stats().pairs, f.ix.stats().pairs);
    assert_eq!(canonical(copy.dump_events()), canonical(f.ix.dump_events()));
}

#[test]
fn an_orphan_that_does_not_fit_the_index_is_never_placed() {
    let ix = Index::new(IndexConfig::new(4));
    let store = |parent, blocks| Event::stored(w(1), HOST, parent, blocks);
    let orphan = |hash: u64, position, anchor, missing: Vec<u64>| DumpEvent {
        event: store(Some(7), at(position as u64, &[hash])),
        orphan: Some(Orphan { position, anchor, missing }),
    };
    let dump = vec![
        DumpEvent::plain(store(None, at(0, &[10, 11, 12]))),
        // The anchor is at position 0, not 1.
        orphan(20, 3, Some(10), vec![l(2)]),
        // An anchor the worker does not use.
        orphan(21, 3, Some(99), vec![l(2)]),
        // Fine: under 11 at position 1; lists position 2.
        orphan(22, 3, Some(11), vec![200]),
        // Under 22's ancestor at position 1: block 11, which 22's orphan
        // names as its own anchor (a dump of ours names 11 there).
        orphan(23, 2, Some(22), vec![]),
        // Under 22's missing ancestor at position 2.
        orphan(24, 4, Some(22), vec![201]),
        // Positions that do not add up.
        orphan(25, 3, None, vec![l(0)]),
    ];
    let loaded = ix.load_dump(&dump, |_, _| {});
    assert_eq!((loaded.orphans, loaded.blocks_refused), (3, 3), "{loaded:?}");
    let held: Vec<u64> = listed(&ix.dump_events()).into_iter().map(|(_, _, h)| h).collect();
    assert_eq!(held, vec![10, 11, 12, 22, 23, 24]);
    ix.check_consistency();
    assert_eq!(ix.stats().pairs, 5, "23 names 12's block (an alias); missing ancestors are held by nobody");
    let m = ix.find_matches(&[l(0), l(1), 200, l(3)]);
    assert_eq!(m.workers[0].host, 2, "22 hangs under a hole at position 2");
}

#[test]
fn chains_listed_children_first_are_all_applied() {
    let store = |tier, parent, hashes: &[u64]| {
        let blocks = hashes.iter().map(|&h| StoredBlock { engine_hash: h, local_hash: h ^ 0xABCD }).collect();
        DumpEvent::plain(Event::stored(w(1), tier, parent, blocks))
    };
    // As Dynamo dumps a lower tier: one block per event, in no order.
    let events = vec![
        store(DEV, Some(10), &[11]),
        store(HOST, Some(21), &[22]),
        store(HOST, Some(11), &[20]),
        store(HOST, Some(20), &[21]),
        store(DEV, None, &[10]),
    ];
    let ix = Index::new(IndexConfig::new(16));
    let loaded = ix.load_dump(&events, |_, _| {});
    assert_eq!((loaded.blocks_stored, loaded.blocks_refused), (5, 0), "every block of the dump is applied");
}

#[test]
fn removes_and_clears_keep_their_place_and_cycles_end() {
    let store = |parent, hash| {
        DumpEvent::plain(Event::stored(w(1), DEV, parent, vec![StoredBlock { engine_hash: hash, local_hash: hash }]))
    };
    let events = vec![
        store(Some(2), 1),
        store(Some(1), 2),
        DumpEvent::plain(Event::removed(w(1), DEV, vec![1])),
        store(Some(3), 4),
        store(None, 3),
        DumpEvent::plain(Event::cleared(w(2))),
    ];
    let ix = Index::new(IndexConfig::new(16));
    let loaded = ix.load_dump(&events, |_, _| {});
    // The cycle 1 <-> 2 stores nothing; 3 then 4 do.
    assert_eq!((loaded.events, loaded.blocks_stored, loaded.blocks_refused), (6, 2, 2));
    assert_eq!(listed(&ix.dump_events()).len(), 2);
}

#[test]
fn an_orphan_names_its_parent_only_by_a_hash_no_other_block_of_its_worker_has() {
    let mut f = Fixture::new();
    // The host holds position 1 under 700, which the device uses for another block.
    f.store(w(6), DEV, None, at(0, &[600, 601, 602]));
    f.store(w(6), HOST, Some(600), at(1, &[700]));
    f.store(w(6), DEV, None, vec![StoredBlock { engine_hash: 700, local_hash: 999 }]);
    // Worker 7 names its parent by a hash that is its own alone.
    f.store(w(7), DEV, None, at(0, &[800, 801, 802]));
    f.store(w(7), HOST, Some(800), at(1, &[810]));
    f.remove(w(6), DEV, &[601]);
    f.remove(w(7), DEV, &[801]);
    let dump = f.ix.dump_events();
    assert_eq!(listed(&dump), f.held);
    let (parent, o) = orphan_of(&dump, w(6), 602);
    assert_eq!(o, Orphan { position: 2, anchor: Some(600), missing: vec![l(1)] });
    let parent = parent.unwrap();
    assert!(f.held.iter().all(|&(x, _, h)| x != w(6) || h != parent), "700 would resolve to the other block");
    assert_eq!(orphan_of(&dump, w(7), 802).0, Some(810));
    rebuilt(&f.ix, &queries());
}

/// While a dump loads, a dump taken or a query made meanwhile never sees
/// a block a worker does not hold: an orphan's missing ancestors are on
/// the path, never held, not even for a moment.
#[test]
fn a_dump_or_a_query_during_a_load_never_sees_a_block_not_held() {
    let mut f = Fixture::new();
    f.store(w(1), DEV, None, at(0, &[10, 11, 12, 13]));
    f.store(w(1), HOST, Some(11), at(2, &[22, 23]));
    f.store(w(2), DEV, None, at(0, &[30, 31]));
    f.remove(w(1), DEV, &[11, 12]);
    f.remove(w(1), HOST, &[22]);
    let source = f.ix.dump_events();
    assert_eq!(source.iter().filter(|d| d.orphan.is_some()).count(), 2);
    let copy = std::sync::Arc::new(Index::new(IndexConfig::new(4)));
    let qs = queries();
    // A dump only adds blocks, so every answer during the load is at most the answer after it.
    let after: Vec<Matches> = qs.iter().map(|q| f.ix.find_matches(q)).collect();
    let mut steps = 0;
    let c = copy.clone();
    copy.load_dump(&source, |_, _| {
        let mid = listed(&c.dump_events());
        assert!(mid.is_subset(&f.held), "listed, not held: {:?}", mid.difference(&f.held).collect::<Vec<_>>());
        for (q, end) in qs.iter().zip(&after) {
            for m in c.find_matches(q).workers {
                let most =
                    end.workers.iter().find(|x| x.worker == m.worker).map_or((0, 0, 0), |x| (x.device, x.host, x.disk));
                assert!(
                    m.device <= most.0 && m.host <= most.1 && m.disk <= most.2,
                    "{q:?}: {m:?}, at the end {most:?}"
                );
            }
        }
        steps += 1;
    });
    assert!(steps > 2);
    assert_eq!(listed(&copy.dump_events()), f.held);
}

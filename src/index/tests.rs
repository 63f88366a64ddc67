use super::*;
use crate::event::{StorageTier, StoredBlock};
use crate::hash::{local_hashes_into, BASE_SEED};

const DEV: StorageTier = StorageTier::Device;

fn w(i: u64) -> WorkerId {
    WorkerId::new(i, 0)
}

fn blocks(pairs: &[(u64, u64)]) -> Vec<StoredBlock> {
    pairs.iter().map(|&(engine_hash, local_hash)| StoredBlock { engine_hash, local_hash }).collect()
}

fn depth(m: &Matches, worker: WorkerId) -> (u32, u32, u32) {
    m.workers.iter().find(|x| x.worker == worker).map_or((0, 0, 0), |x| (x.device, x.host, x.disk))
}

fn dev(m: &Matches, worker: WorkerId) -> u32 {
    depth(m, worker).0
}

fn index() -> Index {
    Index::new(IndexConfig { jump: 4, ..IndexConfig::new(4) })
}

#[test]
fn shared_chunk_at_the_same_position_is_told_apart() {
    // "Predict | Learn | Predict" on worker 1; "Other | Learn | Predict" on worker 2.
    let toks = |words: &[u32]| {
        let t: Vec<u32> = words.iter().flat_map(|&x| [x, x + 1, x + 2, x + 3]).collect();
        let mut l = Vec::new();
        local_hashes_into(&t, 4, BASE_SEED, &mut l);
        l
    };
    let (predict, learn, other) = (100, 200, 300);
    let a = toks(&[predict, learn, predict]);
    let b = toks(&[other, learn, predict]);
    assert_eq!(a[1..], b[1..], "the later chunks collide");
    let ix = index();
    // Arbitrary engine hashes; worker 2 even reuses worker 1's numbers for other content.
    ix.apply(&Event::stored(w(1), DEV, None, blocks(&[(7, a[0]), (8, a[1]), (9, a[2])])));
    ix.apply(&Event::stored(w(2), DEV, None, blocks(&[(9, b[0]), (7, b[1]), (8, b[2])])));
    let m = ix.find_matches(&a);
    assert_eq!((dev(&m, w(1)), dev(&m, w(2))), (3, 0));
    let m = ix.find_matches(&b);
    assert_eq!((dev(&m, w(1)), dev(&m, w(2))), (0, 3));
    // A query starting with the colliding chunk at position 0 matches nobody's deeper blocks.
    let m = ix.find_matches(&a[1..]);
    assert!(m.workers.is_empty());
}

#[test]
fn stores_are_idempotent_and_orphans_are_refused() {
    let ix = index();
    let ev = Event::stored(w(1), DEV, None, blocks(&[(1, 11), (2, 12)]));
    let first = ix.apply(&ev);
    assert_eq!(first.stored, 2);
    let before = ix.stats();
    let again = ix.apply(&ev);
    assert_eq!((again.stored, again.duplicate), (0, 2));
    assert_eq!(ix.stats(), before);
    let orphan = ix.apply(&Event::stored(w(1), DEV, Some(999), blocks(&[(3, 13)])));
    assert_eq!(orphan.unknown_parent, 1);
    assert_eq!(ix.stats(), before);
    assert_eq!(dev(&ix.find_matches(&[13]), w(1)), 0, "never guessed into position 0");
}

#[test]
fn remove_skips_unknown_hashes_and_removes_the_rest() {
    let ix = index();
    ix.apply(&Event::stored(w(1), DEV, None, blocks(&[(1, 11), (2, 12), (3, 13)])));
    let out = ix.apply(&Event::removed(w(1), DEV, vec![42, 3, 43]));
    assert_eq!((out.removed, out.unknown_removed), (1, 2));
    assert_eq!(dev(&ix.find_matches(&[11, 12, 13]), w(1)), 2);
}

#[test]
fn removing_a_middle_block_cuts_the_prefix_and_restoring_it_heals() {
    let ix = index();
    let locals: Vec<u64> = (0..20).map(|i| 1000 + i).collect();
    let bl: Vec<(u64, u64)> = locals.iter().enumerate().map(|(i, &l)| (i as u64 + 1, l)).collect();
    ix.apply(&Event::stored(w(1), DEV, None, blocks(&bl)));
    assert_eq!(dev(&ix.find_matches(&locals), w(1)), 20);
    ix.apply(&Event::removed(w(1), DEV, vec![6])); // position 5
    assert_eq!(dev(&ix.find_matches(&locals), w(1)), 5, "jumps never skip the hole");
    ix.apply(&Event::stored(w(1), DEV, Some(5), blocks(&[(6, locals[5])])));
    assert_eq!(dev(&ix.find_matches(&locals), w(1)), 20, "descendants reattach");
    // Removing the descendants then the parent leaves nothing.
    ix.apply(&Event::removed(w(1), DEV, (1..=20).collect()));
    assert_eq!(ix.stats().entries, 0);
    assert_eq!(ix.stats().pairs, 0);
}

#[test]
fn every_depth_is_found_by_the_jump_and_binary_search() {
    let ix = Index::new(IndexConfig { jump: 8, ..IndexConfig::new(4) });
    let locals: Vec<u64> = (0..70).map(|i| 500 + i).collect();
    for d in 1..=70u64 {
        let bl: Vec<(u64, u64)> = (0..d as usize).map(|i| (i as u64 + 1, locals[i])).collect();
        ix.apply(&Event::stored(w(d), DEV, None, blocks(&bl)));
    }
    let m = ix.find_matches(&locals);
    for d in 1..=70u64 {
        assert_eq!(dev(&m, w(d)), d as u32, "worker {d}");
    }
    let m = ix.find_matches(&locals[..33]);
    for d in 1..=70u64 {
        assert_eq!(dev(&m, w(d)), d.min(33) as u32);
    }
}

#[test]
fn clear_and_worker_removal_reclaim_everything() {
    let ix = index();
    let empty = ix.stats().bytes;
    for i in 0..100u64 {
        let bl: Vec<(u64, u64)> = (0..200u64).map(|k| (i * 1000 + k, k * 7 + i % 3)).collect();
        ix.apply(&Event::stored(w(i), DEV, None, blocks(&bl)));
        ix.apply(&Event::stored(w(i), StorageTier::HostPinned, None, blocks(&bl[..10])));
    }
    let peak = ix.stats().bytes;
    assert!(ix.stats().entries > 0);
    for i in 0..100u64 {
        if i % 2 == 0 {
            ix.apply(&Event::cleared(w(i)));
        } else {
            assert!(ix.remove_worker(w(i)));
        }
    }
    let s = ix.stats();
    assert_eq!((s.entries, s.pairs, ix.check_consistency()), (0, 0, 0));
    for i in (0..100u64).step_by(2) {
        assert!(ix.remove_worker(w(i)));
    }
    assert_eq!(ix.stats().workers, 0);
    let s = ix.stats();
    // What stays is the per-position table headers of the depths reached (bounded by depth, not churn).
    let headers = 2 * 256 * 48;
    assert!(
        s.bytes <= empty + headers as u64,
        "memory falls back near the empty baseline: {} vs {} (peak {peak})",
        s.bytes,
        empty
    );
}

#[test]
fn lower_tiers_are_cumulative_and_chain_from_device() {
    let ix = index();
    let l = [1u64, 2, 3, 4, 5, 6];
    // Worker 1: device 0..2, host 2..4, disk 4..5, external 5..6.
    ix.apply(&Event::stored(w(1), DEV, None, blocks(&[(10, 1), (11, 2)])));
    ix.apply(&Event::stored(w(1), StorageTier::HostPinned, Some(11), blocks(&[(12, 3), (13, 4)])));
    ix.apply(&Event::stored(w(1), StorageTier::Disk, Some(13), blocks(&[(14, 5)])));
    ix.apply(&Event::stored(w(1), StorageTier::External, Some(14), blocks(&[(15, 6)])));
    // Worker 2: host only, from position 0.
    ix.apply(&Event::stored(w(2), StorageTier::HostPinned, None, blocks(&[(20, 1), (21, 2), (22, 3)])));
    let m = ix.find_matches(&l);
    assert_eq!(depth(&m, w(1)), (2, 4, 6));
    assert_eq!(depth(&m, w(2)), (0, 3, 3));
    // A device store needs a device parent.
    let out = ix.apply(&Event::stored(w(2), DEV, Some(22), blocks(&[(23, 4)])));
    assert_eq!(out.unknown_parent, 1);
    // Removing the host block at position 2 cuts host and everything after it.
    ix.apply(&Event::removed(w(1), StorageTier::HostPinned, vec![12]));
    assert_eq!(depth(&ix.find_matches(&l), w(1)), (2, 2, 2));
}

#[test]
fn past_the_inline_width_workers_still_match_exactly() {
    let ix = index();
    let locals: Vec<u64> = (0..10).map(|i| 77 + i).collect();
    for i in 0..1100u64 {
        let d = (i % 10 + 1) as usize;
        let bl: Vec<(u64, u64)> = (0..d).map(|k| (i * 100 + k as u64, locals[k])).collect();
        ix.apply(&Event::stored(WorkerId::new(i, (i % 3) as u32), DEV, None, blocks(&bl)));
    }
    let m = ix.find_matches(&locals);
    assert_eq!(m.workers.len(), 1100);
    for x in &m.workers {
        assert_eq!(x.device as u64, x.worker.instance_id % 10 + 1);
    }
    for i in 0..1100u64 {
        ix.remove_worker(WorkerId::new(i, (i % 3) as u32));
    }
    assert_eq!(ix.stats().entries, 0);
}

#[test]
fn dump_rebuilds_an_identical_index() {
    let ix = index();
    ix.apply(&Event::stored(w(1), DEV, None, blocks(&[(1, 11), (2, 12), (3, 13)])));
    ix.apply(&Event::stored(w(1), DEV, Some(1), blocks(&[(4, 22)])));
    ix.apply(&Event::stored(w(1), StorageTier::HostPinned, Some(3), blocks(&[(5, 14)])));
    ix.apply(&Event::stored(WorkerId::new(2, 1), DEV, None, blocks(&[(9, 11), (8, 12)])));
    ix.apply(&Event::removed(w(1), DEV, vec![2])); // 13 becomes unreachable
    let copy = index();
    let loaded = copy.load_dump(&ix.dump_events(), |_, _| {});
    assert_eq!((loaded.blocks_refused, loaded.orphans), (0, 1), "13 hangs under a hole");
    for q in [vec![11, 12, 13, 14], vec![11, 22], vec![11, 12]] {
        assert_eq!(ix.find_matches(&q), copy.find_matches(&q), "query {q:?}");
    }
    assert_eq!(copy.dump_events().len(), ix.dump_events().len());
}

#[test]
fn long_events_span_many_pieces_and_runs() {
    let ix = index();
    let locals: Vec<u64> = (0..1000u64).map(|i| 50_000 + i).collect();
    let mine = |w: u64, n: usize| {
        blocks(&locals[..n].iter().enumerate().map(|(i, &l)| (w << 32 | i as u64, l)).collect::<Vec<_>>())
    };
    // A prefill far longer than a piece, then another worker following most of it and going on.
    assert_eq!(ix.apply(&Event::stored(w(1), DEV, None, mine(1, 700))).stored, 700);
    assert_eq!(ix.apply(&Event::stored(w(2), DEV, None, mine(2, 1000))).stored, 1000);
    let m = ix.find_matches(&locals);
    assert_eq!((dev(&m, w(1)), dev(&m, w(2))), (700, 1000));
    // The same events again change nothing.
    assert_eq!(ix.apply(&Event::stored(w(2), DEV, None, mine(2, 1000))).duplicate, 1000);
    // Decode steps one block at a time on top, then evictions from the tail.
    let extra: Vec<u64> = (0..300u64).map(|i| 90_000 + i).collect();
    let mut parent = (2u64 << 32) | 999;
    for (i, &l) in extra.iter().enumerate() {
        let h = (2u64 << 32) | (1000 + i as u64);
        assert_eq!(ix.apply(&Event::stored(w(2), DEV, Some(parent), blocks(&[(h, l)]))).stored, 1);
        parent = h;
    }
    let all: Vec<u64> = locals.iter().chain(&extra).copied().collect();
    assert_eq!(dev(&ix.find_matches(&all), w(2)), 1300);
    let tail: Vec<u64> = (0..500u64).rev().map(|i| (2u64 << 32) | (800 + i)).collect();
    assert_eq!(ix.apply(&Event::removed(w(2), DEV, tail)).removed, 500);
    let m = ix.find_matches(&all);
    assert_eq!((dev(&m, w(1)), dev(&m, w(2))), (700, 800));
    ix.check_consistency();
    assert_eq!(ix.stats().pairs, 700 + 800);
    ix.apply(&Event::cleared(w(1)));
    ix.apply(&Event::cleared(w(2)));
    assert_eq!((ix.stats().entries, ix.stats().pairs), (0, 0));
}

#[test]
fn an_event_naming_a_hash_twice_is_stored_as_if_cut_before_the_repeat() {
    // Each case: what the worker held before, then one event; the same event
    // cut before each repeat, applied in parts, must leave the same index.
    type Pairs = Vec<(u64, u64)>;
    let cases: Vec<(Pairs, Pairs)> = vec![
        (vec![], vec![(1, 11), (2, 12), (1, 13)]),
        (vec![], vec![(7, 11), (7, 11), (8, 12)]),
        (vec![(5, 11)], vec![(6, 12), (5, 13), (6, 14), (9, 15)]),
        (vec![(5, 11), (6, 12)], vec![(5, 11), (6, 12), (5, 11), (6, 12)]),
        (vec![(5, 11)], vec![(5, 12), (5, 13)]),
        (vec![(5, 11), (6, 12)], vec![(6, 13), (5, 14), (6, 15)]),
    ];
    let queries: Vec<Vec<u64>> = vec![
        vec![11, 12, 13],
        vec![11, 11, 12],
        vec![11, 12, 13, 14, 15],
        vec![11, 12, 11, 12],
        vec![12, 13],
        vec![13, 14, 15],
    ];
    for (before, event) in cases {
        let whole = index();
        let parts = index();
        for ix in [&whole, &parts] {
            if !before.is_empty() {
                ix.apply(&Event::stored(w(1), DEV, None, blocks(&before)));
            }
        }
        whole.apply(&Event::stored(w(1), DEV, None, blocks(&event)));
        let (mut start, mut parent) = (0, None);
        for k in 1..=event.len() {
            if k == event.len() || event[start..k].iter().any(|b| b.0 == event[k].0) {
                parts.apply(&Event::stored(w(1), DEV, parent, blocks(&event[start..k])));
                parent = Some(event[k - 1].0);
                start = k;
            }
        }
        for q in &queries {
            assert_eq!(dev(&whole.find_matches(q), w(1)), dev(&parts.find_matches(q), w(1)), "{event:?} {q:?}");
        }
        let dump = |ix: &Index| {
            let mut d: Vec<String> = ix.dump_events().iter().map(|e| format!("{e:?}")).collect();
            d.sort();
            d
        };
        assert_eq!(dump(&whole), dump(&parts), "{event:?}");
        assert_eq!(whole.stats().pairs, parts.stats().pairs);
        whole.check_consistency();
    }
}

/// The members of the device tier of the index's only run.
fn only_run_members(ix: &Index) -> *const members::Members {
    let tree = ix.tree.lock();
    let runs: Vec<u32> = tree.live_runs().collect();
    assert_eq!(runs.len(), 1, "one run");
    ix.shared.runs.at(runs[0], &tree.writer).members[0].load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn decode_steps_and_tail_evictions_make_no_new_structure() {
    let ix = index();
    let local = |i: u64| 1000 + i;
    let (one, two) = (w(1), w(2));
    let prefill: Vec<(u64, u64)> = (1..=8).map(|i| (i, local(i))).collect();
    ix.apply(&Event::stored(one, DEV, None, blocks(&prefill)));
    // Another worker holds the first half of the same prefix.
    let half: Vec<(u64, u64)> = (1..=4).map(|i| (50 + i, local(i))).collect();
    ix.apply(&Event::stored(two, DEV, None, blocks(&half)));
    let members = only_run_members(&ix);
    // Decoding: one block an event, each extending the run.
    for i in 9..=40 {
        ix.apply(&Event::stored(one, DEV, Some(i - 1), blocks(&[(i, local(i))])));
        assert_eq!(only_run_members(&ix), members, "decode step {i} kept the members");
    }
    // Evicting from the end, one block an event.
    for i in (20..=40).rev() {
        ix.apply(&Event::removed(one, DEV, vec![i]));
        assert_eq!(only_run_members(&ix), members, "eviction of {i} kept the members");
    }
    let query: Vec<u64> = (1..=40).map(local).collect();
    let m = ix.find_matches(&query);
    assert_eq!((dev(&m, one), dev(&m, two)), (19, 4));
    assert_eq!(ix.stats().entries, 19, "the evicted blocks are gone");
    // The bits left past the end never come back: another worker extends
    // the run with the same content, and the first worker is not credited.
    let rest: Vec<(u64, u64)> = (5..=24).map(|i| (50 + i, local(i))).collect();
    ix.apply(&Event::stored(two, DEV, Some(54), blocks(&rest)));
    let m = ix.find_matches(&query);
    assert_eq!((dev(&m, one), dev(&m, two)), (19, 24));
    ix.check_consistency();
}

/// Every block of a store ends in exactly one outcome, however it is
/// refused: past the deepest position, or over the shared budget.
#[test]
fn every_refused_block_is_counted_once() {
    let bl: Vec<(u64, u64)> = (0..300u64).map(|i| (i + 1, 7_000 + i)).collect();
    let deep = Index::new(IndexConfig { depth_max: 100, ..IndexConfig::new(4) });
    let o = deep.apply(&Event::stored(w(1), DEV, None, blocks(&bl)));
    assert_eq!((o.stored, o.depth_exceeded), (100, 200), "{o:?}");
    let full = Index::new(IndexConfig { budget: Arc::new(Budget::new(100)), ..IndexConfig::new(4) });
    let o = full.apply(&Event::stored(w(1), DEV, None, blocks(&bl)));
    assert_eq!((o.stored, o.shed), (100, 200), "{o:?}");
    // Following existing blocks (another worker's) then refused mid-way.
    let o = full.apply(&Event::stored(w(2), DEV, None, blocks(&bl)));
    assert_eq!(o.stored + o.shed, 300, "{o:?}");
}

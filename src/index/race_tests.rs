//! The reader/writer protocol one step at a time: one thread is stopped at
//! each pause point in turn (`pause`) while another runs a query or an
//! event to its end, and the answers are held to the promise: a worker is
//! never credited with more than it held at one instant while the query
//! ran, and a worker whose state did not change is answered exactly.

use super::pause::{self, Point};
use super::*;
use crate::event::StoredBlock;

const DEV: StorageTier = StorageTier::Device;
const HOST: StorageTier = StorageTier::HostPinned;

fn w(i: u64) -> WorkerId {
    WorkerId::new(i, 0)
}

fn blocks(pairs: &[(u64, u64)]) -> Vec<StoredBlock> {
    pairs.iter().map(|&(engine_hash, local_hash)| StoredBlock { engine_hash, local_hash }).collect()
}

fn depths(m: &Matches, worker: WorkerId) -> (u32, u32, u32) {
    m.workers.iter().find(|x| x.worker == worker).map_or((0, 0, 0), |x| (x.device, x.host, x.disk))
}

fn dev(m: &Matches, worker: WorkerId) -> u32 {
    depths(m, worker).0
}

fn index() -> Arc<Index> {
    Arc::new(Index::new(IndexConfig { jump: 2, ..IndexConfig::new(4) }))
}

type Other = Box<dyn FnOnce() + Send>;

/// How far a run of `main` went: the pause points it reached, of any kind
/// and where it held no lock.
struct Reached {
    points: usize,
    open: usize,
}

/// Runs `main` on this thread. At its `k`-th pause point (counting every
/// point for `Point::Locked`, only open ones for `Point::Open`), each
/// `(k, kind, other)` runs `other` to its end on a thread of its own.
fn interleave<R>(main: impl FnOnce() -> R, others: Vec<(usize, Point, Other)>) -> (R, Reached) {
    let state = Arc::new(parking_lot::Mutex::new((0usize, 0usize)));
    let mut others: Vec<Option<(usize, Point, Other)>> = others.into_iter().map(Some).collect();
    let seen = state.clone();
    let hook = move |p: Point| {
        let (all, open) = {
            let mut s = seen.lock();
            let now = *s;
            s.0 += 1;
            if p == Point::Open {
                s.1 += 1;
            }
            now
        };
        for slot in others.iter_mut() {
            let due = match slot {
                Some((k, Point::Locked, _)) => *k == all,
                Some((k, Point::Open, _)) => p == Point::Open && *k == open,
                None => false,
            };
            if due {
                let (_, _, f) = slot.take().expect("due");
                std::thread::spawn(f).join().expect("the other side ran to its end");
            }
        }
    };
    let r = pause::with_hook(hook, main);
    let (points, open) = *state.lock();
    (r, Reached { points, open })
}

/// A query to run at a pause point; its answer lands in the returned cell.
fn query(ix: &Arc<Index>, q: &[u64]) -> (Other, Arc<parking_lot::Mutex<Option<Matches>>>) {
    let out = Arc::new(parking_lot::Mutex::new(None));
    let (ix, q, o) = (ix.clone(), q.to_vec(), out.clone());
    (Box::new(move || *o.lock() = Some(ix.find_matches_unlocked(&q))), out)
}

/// Builds a fresh index with `setup`, then applies `event` with a query of
/// `q` run at each pause point in turn; `check(point, answer)`.
fn at_every_point(setup: impl Fn(&Index), event: &Event, q: &[u64], check: impl Fn(usize, &Matches)) -> usize {
    for k in 0.. {
        let ix = index();
        setup(&ix);
        let (other, answer) = query(&ix, q);
        let (_, reached) = interleave(|| ix.apply(event), vec![(k, Point::Locked, other)]);
        if k >= reached.points {
            return k;
        }
        let answer = answer.lock().take().expect("the query ran");
        check(k, &answer);
        ix.check_consistency();
    }
    unreachable!()
}

/// Case 1: W holds p0, p1, p2 under h0, h1, h2 and sends a store under h2
/// that names p3 with h1. W held depth 3 before and 1 after (p0, p2, p3);
/// no reader may see 4. V, who holds p0..p3 all along, is answered exactly.
#[test]
fn a_hash_reused_for_other_content_never_shows_a_depth_never_held() {
    let p: Vec<u64> = (100..104).collect();
    let (v, wk) = (w(1), w(2));
    let setup = |ix: &Index| {
        ix.apply(&Event::stored(v, DEV, None, blocks(&[(1, p[0]), (2, p[1]), (3, p[2]), (4, p[3])])));
        ix.apply(&Event::stored(wk, DEV, None, blocks(&[(10, p[0]), (11, p[1]), (12, p[2])])));
    };
    let reuse = Event::stored(wk, DEV, Some(12), blocks(&[(11, p[3])]));
    let points = at_every_point(setup, &reuse, &p, |k, m| {
        assert_eq!(dev(m, v), 4, "point {k}: V did not change");
        assert!(dev(m, wk) <= 3, "point {k}: W credited {} blocks, held 3 then 1", dev(m, wk));
    });
    assert!(points > 3, "the event has steps to stop at ({points})");
}

/// Case 1, a range at a time: a store whose reused hashes name blocks in
/// two runs, at offsets that make several ranges (`clear_ranges`), while
/// it places its own blocks on blocks another worker holds (in a run of
/// their own, so a walk can see W's old blocks and then its new ones). W held depth 8
/// on `p` before and 1 after, 4 on `s` before and 1 after: no reader may
/// see more, whichever range it stops at. A clear of W, also a range at a
/// time, never shows more than W held either. V is answered exactly.
#[test]
fn a_store_releasing_reused_hashes_a_range_at_a_time_never_over_reports() {
    let p: Vec<u64> = (500..513).collect();
    let s: Vec<u64> = (600..604).collect();
    let (v, wk) = (w(1), w(2));
    let setup = |ix: &Index| {
        let vp: Vec<(u64, u64)> = p.iter().enumerate().map(|(i, &l)| (1 + i as u64, l)).collect();
        let vs: Vec<(u64, u64)> = s.iter().enumerate().map(|(i, &l)| (41 + i as u64, l)).collect();
        // p8.. in a run of its own (p7 is not the tail of p0's run), so a
        // walk passes a point between W's old blocks and its new ones.
        let mut first = vp[..8].to_vec();
        first.push((99, 9_999));
        ix.apply(&Event::stored(v, DEV, None, blocks(&first)));
        ix.apply(&Event::stored(v, DEV, Some(8), blocks(&vp[8..])));
        ix.apply(&Event::stored(v, DEV, None, blocks(&vs)));
        let wp: Vec<(u64, u64)> = p[..8].iter().enumerate().map(|(i, &l)| (10 + i as u64, l)).collect();
        let ws: Vec<(u64, u64)> = s.iter().enumerate().map(|(i, &l)| (30 + i as u64, l)).collect();
        ix.apply(&Event::stored(wk, DEV, None, blocks(&wp)));
        ix.apply(&Event::stored(wk, DEV, None, blocks(&ws)));
        ix.apply(&Event::stored(wk, HOST, Some(17), blocks(&[(70, p[8]), (71, p[9])])));
    };
    // Hashes 11, 12, 14, 15 named p1, p2, p4, p5 (two ranges of run p); 31 named s1.
    let reuse =
        Event::stored(wk, DEV, Some(17), blocks(&[(11, p[8]), (12, p[9]), (14, p[10]), (15, p[11]), (31, p[12])]));
    for (q, before) in [(&p, 8), (&s, 4)] {
        let exact = if q == &p { 13 } else { 4 };
        let points = at_every_point(setup, &reuse, q, |k, m| {
            assert_eq!(dev(m, v), exact, "point {k}: V did not change");
            assert!(dev(m, wk) <= before, "point {k}: W credited {} blocks, held {before} then 1", dev(m, wk));
            assert!(depths(m, wk).1 <= 10, "point {k}: W's host depth {:?}", depths(m, wk));
        });
        assert!(points > 5, "the event has steps to stop at ({points})");
        let ix = index();
        setup(&ix);
        ix.apply(&reuse);
        assert_eq!(dev(&ix.find_matches(q), wk), 1, "W after the store");
        ix.check_consistency();
        let points = at_every_point(setup, &Event::cleared(wk), q, |k, m| {
            assert_eq!(dev(m, v), exact, "point {k}: V did not change");
            let (d, h, _) = depths(m, wk);
            assert!(d <= before && h <= if q == &p { 10 } else { 4 }, "point {k}: W credited {:?}", depths(m, wk));
        });
        assert!(points > 3, "the clear has steps to stop at ({points})");
        // The store lands at every point of a query's walk, and a query
        // that starts at every point of the store stops at every point of
        // its walk while the rest of the store runs.
        let mut walked = 0;
        for j in 0.. {
            let ix = index();
            setup(&ix);
            let x = ix.clone();
            let e = reuse.clone();
            let store: Other = Box::new(move || {
                x.apply(&e);
            });
            let (m, reached) = interleave(|| ix.find_matches_unlocked(q), vec![(j, Point::Open, store)]);
            if j >= reached.open {
                break;
            }
            walked += 1;
            assert_eq!(dev(&m, v), exact, "walk point {j}: V did not change");
            assert!(dev(&m, wk) <= before, "walk point {j}: W credited {}, held {before} then 1", dev(&m, wk));
        }
        assert!(walked > 2, "the walk has points to stop at ({walked})");
        let mut straddled = 0;
        for k in 0..48 {
            for j in 0..16 {
                let ix = index();
                setup(&ix);
                let (x, e) = (ix.clone(), reuse.clone());
                let first = move || {
                    x.apply(&e);
                };
                let Some((m, _)) = straddle(&ix, q, k, j, first, || {}) else { continue };
                straddled += 1;
                assert_eq!(dev(&m, v), exact, "points {k}, {j}: V did not change");
                assert!(dev(&m, wk) <= before, "points {k}, {j}: W credited {}, held {before} then 1", dev(&m, wk));
            }
        }
        assert!(straddled > 10, "{straddled}");
    }
}

/// Case 2: a query straddles two events of W, each of which only takes bits
/// back or only sets them: W removes p0 (a hole: depth 0), then stores q2
/// under p1 (still depth 0 for [p0, p1, q2]). W held 2 at most while the
/// query ran. The query is stopped at every point of its walk; the two
/// events land at every pair of points.
#[test]
fn a_hole_then_a_deeper_store_never_show_a_depth_never_held() {
    let (p0, p1, p2, q2) = (200, 201, 202, 302);
    let (v, x, wk) = (w(1), w(2), w(3));
    let q = [p0, p1, q2];
    let mut pairs = 0;
    for i in 0.. {
        let mut last = None;
        for j in i.. {
            let ix = index();
            ix.apply(&Event::stored(v, DEV, None, blocks(&[(1, p0), (2, p1), (3, p2)])));
            ix.apply(&Event::stored(x, DEV, None, blocks(&[(11, p0), (12, p1), (13, q2)])));
            ix.apply(&Event::stored(wk, DEV, None, blocks(&[(21, p0), (22, p1)])));
            let (a, b) = (ix.clone(), ix.clone());
            let hole: Other = Box::new(move || {
                a.apply(&Event::removed(wk, DEV, vec![21]));
            });
            let deeper: Other = Box::new(move || {
                b.apply(&Event::stored(wk, DEV, Some(22), blocks(&[(23, q2)])));
            });
            let (m, reached) =
                interleave(|| ix.find_matches(&q), vec![(i, Point::Open, hole), (j, Point::Open, deeper)]);
            if j >= reached.open {
                last = Some(j);
                break;
            }
            pairs += 1;
            assert_eq!(dev(&m, x), 3, "points {i}, {j}: X did not change");
            assert!(dev(&m, wk) <= 2, "points {i}, {j}: W credited {} blocks, held 2 then 0", dev(&m, wk));
            ix.check_consistency();
        }
        if last == Some(i) {
            break;
        }
    }
    assert!(pairs > 3, "the walk has points to stop at ({pairs} pairs)");
}

/// Case 4: a store that follows blocks W already holds (new engine hashes
/// for them: aliases) while another worker appends to the same run. W's
/// bits past the run's end (left by a tail it let go alone) must never make
/// a block appended meanwhile count as one W held: every record of W names
/// a block W's bit is on.
#[test]
fn a_store_that_follows_held_blocks_never_takes_an_appended_one_for_held() {
    const L: u64 = 200;
    const CUT: u64 = 150;
    let a = |i: u64| 5_000 + i;
    let (wk, x) = (w(1), w(2));
    let setup = |ix: &Index| {
        // W holds 0..L and L+1..L+3 (a hole at L); letting go of the tail
        // and then of CUT..L cuts the run to CUT and leaves W's bits past it.
        let all: Vec<(u64, u64)> = (0..L + 3).map(|i| (i + 1, a(i))).collect();
        ix.apply(&Event::stored(wk, DEV, None, blocks(&all)));
        ix.apply(&Event::removed(wk, DEV, vec![L + 1]));
        ix.apply(&Event::removed(wk, DEV, vec![L + 2, L + 3]));
        ix.apply(&Event::removed(wk, DEV, (CUT + 1..=L).collect()));
    };
    // W: a0 under hash 6 (which named a5: reused), then a1..=CUT under new hashes.
    let mut again = vec![(6, a(0))];
    again.extend((1..=CUT).map(|i| (10_000 + i, a(i))));
    let w_again = Event::stored(wk, DEV, None, blocks(&again));
    let x_store = Event::stored(x, DEV, None, blocks(&(0..=CUT).map(|i| (20_000 + i, a(i))).collect::<Vec<_>>()));
    let q: Vec<u64> = (0..=CUT).map(a).collect();
    let mut k = 0;
    loop {
        let ix = index();
        setup(&ix);
        let b = ix.clone();
        let xs = x_store.clone();
        let other: Other = Box::new(move || {
            b.apply(&xs);
        });
        let (_, reached) = interleave(|| ix.apply(&w_again), vec![(k, Point::Open, other)]);
        if k >= reached.open {
            break;
        }
        ix.check_consistency();
        let m = ix.find_matches(&q);
        assert_eq!((dev(&m, wk), dev(&m, x)), (CUT as u32 + 1, CUT as u32 + 1), "open point {k}");
        k += 1;
    }
    assert!(k >= 3, "the store has open points ({k})");
}

/// An event naming one hash twice, long enough to be placed in pieces:
/// the earlier block is on the path but not held. Another worker lets go
/// of the same run at every point where the store holds no lock; the block
/// the store stands on is never trimmed from under it.
#[test]
fn a_long_store_naming_a_hash_twice_keeps_its_path_while_others_trim() {
    let a = |i: u64| 9_000 + i;
    let (wk, x) = (w(1), w(2));
    let setup = |ix: &Index| {
        let bl: Vec<(u64, u64)> = (0..130).map(|i| (50_000 + i, a(i))).collect();
        ix.apply(&Event::stored(x, DEV, None, blocks(&bl)));
    };
    // Block 127's hash is named again by block 200.
    let bl: Vec<(u64, u64)> = (0..300).map(|i| (if i == 200 { 127 } else { i }, a(i))).collect();
    let w_store = Event::stored(wk, DEV, None, blocks(&bl));
    let x_gone = Event::removed(x, DEV, (120..130).map(|i| 50_000 + i).collect());
    let q: Vec<u64> = (0..300).map(a).collect();
    let mut k = 0;
    loop {
        let ix = index();
        setup(&ix);
        let (b, e) = (ix.clone(), x_gone.clone());
        let other: Other = Box::new(move || {
            b.apply(&e);
        });
        let (_, reached) = interleave(|| ix.apply(&w_store), vec![(k, Point::Open, other)]);
        if k >= reached.open {
            break;
        }
        ix.check_consistency();
        let m = ix.find_matches(&q);
        assert_eq!((dev(&m, wk), dev(&m, x)), (127, 120), "open point {k}");
        k += 1;
    }
    assert!(k >= 3, "the store has open points ({k})");
}

/// A dump's orphan placed under its missing ancestors (as a load does):
/// at no point of the store is any of them credited to the worker.
#[test]
fn an_orphans_missing_ancestors_are_never_credited() {
    let (p0, x1, x2, b3) = (700, 701, 702, 703);
    let wk = w(1);
    let setup = |ix: &Index| {
        ix.apply(&Event::stored(wk, DEV, None, blocks(&[(1, p0)])));
    };
    let q = [p0, x1, x2, b3];
    for k in 0.. {
        let ix = index();
        setup(&ix);
        let (other, answer) = query(&ix, &q);
        let above = writer::Above::Ancestor { hash: 1, position: 0 };
        let (o, reached) = interleave(
            || ix.store_under(wk, DEV, above, &[x1, x2], &blocks(&[(4, b3)])),
            vec![(k, Point::Locked, other)],
        );
        if k >= reached.points {
            assert!(k > 3, "the store has points to stop at ({k})");
            break;
        }
        assert_eq!((o.stored, o.duplicate), (1, 0), "only the orphan's own block is counted");
        let got = answer.lock().take().expect("ran");
        assert!(dev(&got, wk) <= 1, "point {k}: credited {}", dev(&got, wk));
        assert_eq!(dev(&ix.find_matches(&q), wk), 1, "a hole at positions 1 and 2");
        assert_eq!(ix.stats().pairs, 2);
        ix.check_consistency();
    }
}

/// Lower tiers: W moves a block from the device to host memory (removes it
/// from one tier, stores it in the other) while a query runs: the host
/// depth it is credited is one it held at one instant.
#[test]
fn a_block_moving_between_tiers_is_never_counted_twice() {
    let p: Vec<u64> = (400..404).collect();
    let wk = w(1);
    let setup = |ix: &Index| {
        let all: Vec<(u64, u64)> = p.iter().enumerate().map(|(i, &l)| (i as u64 + 1, l)).collect();
        ix.apply(&Event::stored(wk, DEV, None, blocks(&all[..2])));
        ix.apply(&Event::stored(wk, HOST, None, blocks(&all[..1])));
    };
    // Before: device p0 p1, host p0: (2, 2, 2). Remove p1 from device: (1, 1, 1).
    // Then host p1 and p2 under p0: (1, 3, 3). Then device p0 goes: (0, 3, 3).
    let events = [
        Event::removed(wk, DEV, vec![2]),
        Event::stored(wk, HOST, Some(1), blocks(&[(2, p[1]), (3, p[2])])),
        Event::removed(wk, DEV, vec![1]),
    ];
    let max_host = 3;
    for (n, e) in events.iter().enumerate() {
        at_every_point(
            |ix| {
                setup(ix);
                for e in &events[..n] {
                    ix.apply(e);
                }
            },
            e,
            &p,
            |k, m| {
                let (d, h, _) = depths(m, wk);
                assert!(d <= 2 && h <= max_host, "event {n} point {k}: {:?}", depths(m, wk));
            },
        );
    }
}

use crate::test_rng::Rng;

/// One step of a script: an event, or a worker leaving the index.
#[derive(Clone, Debug)]
enum Op {
    Apply(Event),
    Leave(WorkerId),
}

impl Op {
    fn run(&self, ix: &Index) {
        match self {
            Op::Apply(e) => {
                ix.apply(e);
            }
            Op::Leave(w) => {
                ix.remove_worker(*w);
            }
        }
    }

    fn worker(&self) -> WorkerId {
        match self {
            Op::Apply(e) => e.worker,
            Op::Leave(w) => *w,
        }
    }
}

/// A random script over three workers and a three-chunk alphabet (so
/// chunks collide), every tier, with stores (new hashes, hashes reused for
/// other content, several blocks), removes anywhere (holes), clears and
/// workers leaving.
fn random_script(rng: &mut Rng, len: usize) -> Script {
    let workers = [w(1), w(2), w(3)];
    let mut used: Vec<Vec<u64>> = vec![Vec::new(); 3];
    // Per worker, each hash's path of local hashes from the root.
    let mut paths: Vec<std::collections::HashMap<u64, Vec<u64>>> = vec![Default::default(); 3];
    let mut parent_of: Vec<std::collections::HashMap<u64, u64>> = vec![Default::default(); 3];
    let mut prefixes = Vec::new();
    let mut next_hash = 0u64;
    let mut ops = Vec::new();
    let mut k = 0;
    while ops.len() < len {
        // Mostly the same worker as the step before: the steps a query
        // straddles are then often one worker's remove and store.
        if rng.below(5) < 2 {
            k = rng.below(3) as usize;
        }
        let wk = workers[k];
        let tier = if rng.below(4) == 0 { StorageTier::ALL[1 + rng.below(3) as usize] } else { DEV };
        let roll = rng.below(100);
        let deep: Vec<u64> = used[k].iter().copied().filter(|h| parent_of[k].contains_key(h)).collect();
        if roll < 12 && !deep.is_empty() {
            // A hole, then a store past it: remove a block's parent, then
            // extend the block.
            let h = deep[rng.below(deep.len() as u64) as usize];
            ops.push(Op::Apply(Event::removed(wk, DEV, vec![parent_of[k][&h]])));
            next_hash += 1;
            let local_hash = 1 + rng.below(3);
            if let Some(mut p) = paths[k].get(&h).cloned() {
                p.push(local_hash);
                prefixes.push(p);
            }
            ops.push(Op::Apply(Event::stored(
                wk,
                DEV,
                Some(h),
                vec![StoredBlock { engine_hash: next_hash, local_hash }],
            )));
            continue;
        }
        let op = if roll < 60 || used[k].is_empty() {
            let parent = if used[k].is_empty() || rng.below(4) == 0 {
                None
            } else {
                Some(used[k][rng.below(used[k].len() as u64) as usize])
            };
            let mut path = parent.map_or(Some(Vec::new()), |p| paths[k].get(&p).cloned());
            let mut above = parent;
            let n = 1 + rng.below(4);
            let bl: Vec<StoredBlock> = (0..n)
                .map(|_| {
                    let engine_hash = if !used[k].is_empty() && rng.below(5) == 0 {
                        used[k][rng.below(used[k].len() as u64) as usize]
                    } else {
                        next_hash += 1;
                        used[k].push(next_hash);
                        next_hash
                    };
                    let local_hash = 1 + rng.below(3);
                    if let Some(p) = above {
                        parent_of[k].insert(engine_hash, p);
                    }
                    above = Some(engine_hash);
                    if let Some(p) = &mut path {
                        p.push(local_hash);
                        paths[k].insert(engine_hash, p.clone());
                        prefixes.push(p.clone());
                    }
                    StoredBlock { engine_hash, local_hash }
                })
                .collect();
            Op::Apply(Event::stored(wk, tier, parent, bl))
        } else if roll < 92 {
            let hashes = (0..1 + rng.below(3)).map(|_| used[k][rng.below(used[k].len() as u64) as usize]).collect();
            Op::Apply(Event::removed(wk, tier, hashes))
        } else if roll < 97 {
            Op::Apply(Event::cleared(wk))
        } else {
            Op::Leave(wk)
        };
        ops.push(op);
    }
    Script { ops, prefixes }
}

/// A random script and the prefixes its stores name.
struct Script {
    ops: Vec<Op>,
    prefixes: Vec<Vec<u64>>,
}

impl Script {
    /// A query: mostly a prefix a store named, often one block longer, so
    /// queries follow the paths holes and extensions were made on.
    fn query(&self, rng: &mut Rng) -> Vec<u64> {
        let mut q = if self.prefixes.is_empty() || rng.below(5) == 0 {
            (0..1 + rng.below(5)).map(|_| 1 + rng.below(3)).collect()
        } else {
            self.prefixes[rng.below(self.prefixes.len() as u64) as usize].clone()
        };
        if rng.below(2) == 0 {
            q.push(1 + rng.below(3));
        }
        q
    }
}

/// Every worker's depths after `ops`, applied one at a time to a new index
/// (whose sequential answers the model tests hold exact).
fn oracle(ops: &[Op], q: &[u64]) -> Vec<WorkerMatch> {
    let ix = index();
    ops.iter().for_each(|op| op.run(&ix));
    ix.find_matches(q).workers
}

fn depth_of(ms: &[WorkerMatch], worker: WorkerId) -> [u32; 3] {
    ms.iter().find(|m| m.worker == worker).map_or([0; 3], |m| [m.device, m.host, m.disk])
}

/// Holds `got` to the promise against the states the query overlapped:
/// per worker and tier at most the largest of them; exact for a worker
/// the overlapped steps did not touch.
fn check_bracket(got: &Matches, states: &[Vec<WorkerMatch>], touched: &[WorkerId], what: &str) {
    for wk in [w(1), w(2), w(3)] {
        let g = depth_of(&got.workers, wk);
        let seen: Vec<[u32; 3]> = states.iter().map(|s| depth_of(s, wk)).collect();
        if touched.contains(&wk) {
            for t in 0..3 {
                let most = seen.iter().map(|d| d[t]).max().unwrap_or(0);
                assert!(g[t] <= most, "{what}: {wk} credited {g:?}, held {seen:?}");
            }
        } else {
            assert_eq!(g, seen[0], "{what}: {wk} did not change");
        }
    }
}

/// Random scripts of every event kind: a query runs at every pause point of
/// every step (writer stopped), and every step lands at every pause point
/// of a query's walk (reader stopped), two consecutive steps at every pair
/// of points.
#[test]
fn random_steps_at_every_point_never_over_report() {
    let seeds: u64 = std::env::var("KV_INDEXER_RACE_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(12);
    let mut checks = 0u64;
    for seed in 1..=seeds {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let script = random_script(&mut rng, 30);
        let ops = &script.ops;
        if std::env::var_os("KV_INDEXER_RACE_TRACE").is_some() {
            ops.iter().enumerate().for_each(|(i, op)| eprintln!("seed {seed} step {i}: {op:?}"));
        }
        for i in 0..ops.len() {
            let q = script.query(&mut rng);
            let states: Vec<Vec<WorkerMatch>> = (i..=(i + 2).min(ops.len())).map(|n| oracle(&ops[..n], &q)).collect();
            let touched: Vec<WorkerId> = ops[i..(i + 2).min(ops.len())].iter().map(Op::worker).collect();
            // The writer stopped at each point of step i.
            for k in 0.. {
                let ix = index();
                ops[..i].iter().for_each(|op| op.run(&ix));
                let (other, answer) = query(&ix, &q);
                let (_, reached) = interleave(|| ops[i].run(&ix), vec![(k, Point::Locked, other)]);
                if k >= reached.points {
                    break;
                }
                let got = answer.lock().take().expect("ran");
                check_bracket(&got, &states[..2], &touched[..1], &format!("seed {seed} step {i} point {k}"));
                checks += 1;
            }
            // The query stopped at each point (pair of points) of its walk.
            let two = i + 1 < ops.len();
            for a in 0.. {
                let mut last = None;
                for b in a.. {
                    let ix = index();
                    ops[..i].iter().for_each(|op| op.run(&ix));
                    let mut others: Vec<(usize, Point, Other)> = Vec::new();
                    let (x, first) = (ix.clone(), ops[i].clone());
                    others.push((a, Point::Open, Box::new(move || first.run(&x))));
                    if two {
                        let (y, second) = (ix.clone(), ops[i + 1].clone());
                        others.push((b, Point::Open, Box::new(move || second.run(&y))));
                    }
                    let (got, reached) = interleave(|| ix.find_matches(&q), others);
                    if b >= reached.open || !two {
                        last = Some(b);
                    }
                    if a >= reached.open {
                        break;
                    }
                    let n = if two { 3 } else { 2 };
                    check_bracket(&got, &states[..n], &touched, &format!("seed {seed} step {i} points {a}, {b}"));
                    checks += 1;
                    if last.is_some() {
                        break;
                    }
                }
                if last == Some(a) || last.is_none() {
                    break;
                }
            }
        }
    }
    assert!(checks > 1000, "{checks} interleavings checked");
}

/// a tail W alone held is cut (its bits stay past the new end)
/// and V appends other content there, reusing the freed chunk, while a
/// query holds the run's old length and members: the old members pair W's
/// bits with V's chains. Only the run's cut count tells the walk to look
/// again; W held 16 of this path before and after, never 20.
#[test]
fn a_cut_then_an_append_under_an_old_length_is_walked_again() {
    let a = |i: u64| 7_000 + i;
    let b = |i: u64| 8_000 + i;
    let (wk, v) = (w(1), w(2));
    // The query follows a0..a15 then b16..b19 (V's new blocks).
    let q: Vec<u64> = (0..16).map(a).chain((16..20).map(b)).collect();
    let mut checked = 0;
    for k in 0.. {
        let ix = index();
        ix.apply(&Event::stored(wk, DEV, None, blocks(&(0..20).map(|i| (i + 1, a(i))).collect::<Vec<_>>())));
        // Slots 1..=63 go to others, so V sits in the second group: the
        // first walk then settles W's group by its summary words alone.
        for f in 0..63 {
            ix.apply(&Event::stored(w(1000 + f), DEV, None, blocks(&[(1, 9_999)])));
        }
        ix.apply(&Event::stored(v, DEV, None, blocks(&(0..16).map(|i| (100 + i + 1, a(i))).collect::<Vec<_>>())));
        assert_eq!((dev(&ix.find_matches(&q), wk), dev(&ix.find_matches(&q), v)), (16, 16));
        let x = ix.clone();
        let events: Other = Box::new(move || {
            // W lets go of its tail a16..a19 (only W holds it: a cut).
            x.apply(&Event::removed(wk, DEV, vec![17, 18, 19, 20]));
            // V extends its a15 with b16..b19: appended where W's tail was.
            x.apply(&Event::stored(v, DEV, Some(116), blocks(&(16..20).map(|i| (200 + i, b(i))).collect::<Vec<_>>())));
        });
        let (m, reached) = interleave(|| ix.find_matches_unlocked(&q), vec![(k, Point::Open, events)]);
        if k >= reached.open {
            break;
        }
        checked += 1;
        assert!(dev(&m, wk) <= 16, "open point {k}: W credited {} blocks, held 16 then 16", dev(&m, wk));
        ix.check_consistency();
    }
    assert!(checked >= 2, "{checked}");
}

/// three phases. `first` runs on this thread; at its `k`-th pause
/// point a query starts on another thread and runs to its `j`-th open
/// point, where it waits; `first` runs to its end, then `then`, then the
/// query finishes. So a query can start inside an event and straddle the
/// rest of it and the next one.
fn straddle(
    ix: &Arc<Index>,
    q: &[u64],
    k: usize,
    j: usize,
    first: impl FnOnce(),
    then: impl FnOnce(),
) -> Option<(Matches, bool)> {
    use std::sync::mpsc;
    let (to_main, from_query) = mpsc::channel::<bool>();
    let (to_query, from_main) = mpsc::channel::<()>();
    let from_main = Arc::new(parking_lot::Mutex::new(from_main));
    let mut handle = None;
    let mut pending = Some((ix.clone(), q.to_vec(), to_main, from_main));
    let mut seen = 0usize;
    let started = pause::with_hook(
        move |_p| {
            let now = seen;
            seen += 1;
            if now == k {
                let (ix, q, to_main, from_main) = pending.take().expect("once");
                let h = std::thread::spawn(move || {
                    let mut opens = 0usize;
                    let tm = to_main.clone();
                    let fm = from_main.clone();
                    let m = pause::with_hook(
                        move |p| {
                            if p == Point::Open {
                                if opens == j {
                                    tm.send(true).unwrap();
                                    fm.lock().recv().unwrap();
                                }
                                opens += 1;
                            }
                        },
                        || ix.find_matches_unlocked(&q),
                    );
                    // Never stopped: the query ended first.
                    let _ = to_main.send(false);
                    m
                });
                HANDLE.with(|c| *c.borrow_mut() = Some(h));
                // Wait until the query stops (or ends).
                let stopped = from_query.recv().unwrap_or(false);
                STOPPED.with(|c| c.set(stopped));
            }
        },
        || {
            first();
            true
        },
    );
    let _ = started;
    HANDLE.with(|c| handle = c.borrow_mut().take());
    let h = handle?;
    let stopped = STOPPED.with(|c| c.get());
    then();
    let _ = to_query.send(());
    Some((h.join().expect("query"), stopped))
}

thread_local! {
    static STOPPED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static HANDLE: std::cell::RefCell<Option<std::thread::JoinHandle<Matches>>> = const { std::cell::RefCell::new(None) };
}

/// the query takes the run's view while W's remove is inside the
/// cut (between the new length and the new cut count, whichever comes
/// first), then W's remove ends and V appends other content where W's tail
/// was. W held 16 of this path before and after, never 20.
#[test]
fn a_view_taken_inside_a_cut_is_walked_again() {
    let a = |i: u64| 7_000 + i;
    let b = |i: u64| 8_000 + i;
    let (wk, v) = (w(1), w(2));
    let q: Vec<u64> = (0..16).map(a).chain((16..20).map(b)).collect();
    let setup = || {
        let ix = index();
        ix.apply(&Event::stored(wk, DEV, None, blocks(&(0..20).map(|i| (i + 1, a(i))).collect::<Vec<_>>())));
        for f in 0..63 {
            ix.apply(&Event::stored(w(1000 + f), DEV, None, blocks(&[(1, 9_999)])));
        }
        ix.apply(&Event::stored(v, DEV, None, blocks(&(0..16).map(|i| (100 + i + 1, a(i))).collect::<Vec<_>>())));
        ix
    };
    let mut checked = 0;
    for k in 0..64 {
        for j in 0..12 {
            let ix = setup();
            let (x, y) = (ix.clone(), ix.clone());
            let m = straddle(
                &ix,
                &q,
                k,
                j,
                move || {
                    x.apply(&Event::removed(wk, DEV, vec![17, 18, 19, 20]));
                },
                move || {
                    y.apply(&Event::stored(
                        v,
                        DEV,
                        Some(116),
                        blocks(&(16..20).map(|i| (200 + i, b(i))).collect::<Vec<_>>()),
                    ));
                },
            );
            let Some((m, _)) = m else { continue };
            checked += 1;
            assert!(dev(&m, wk) <= 16, "points {k}, {j}: W credited {} blocks, held 16 then 16", dev(&m, wk));
            ix.check_consistency();
        }
    }
    assert!(checked > 10, "{checked}");
}

/// random scripts; a query starts at every point of step i, stops
/// at every open point of its walk while step i ends and step i + 1 runs.
#[test]
fn random_steps_straddled_never_over_report() {
    let seeds: u64 = std::env::var("KV_INDEXER_RACE_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    let mut checks = 0u64;
    for seed in 1..=seeds {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let script = random_script(&mut rng, 30);
        let ops = &script.ops;
        for i in 0..ops.len() - 1 {
            let q = script.query(&mut rng);
            let states: Vec<Vec<WorkerMatch>> = (i..=i + 2).map(|n| oracle(&ops[..n], &q)).collect();
            let touched: Vec<WorkerId> = ops[i..i + 2].iter().map(Op::worker).collect();
            for k in 0.. {
                let mut reached = false;
                for j in 0.. {
                    let ix = index();
                    ops[..i].iter().for_each(|op| op.run(&ix));
                    let (x, y) = (ix.clone(), ix.clone());
                    let (a, b) = (ops[i].clone(), ops[i + 1].clone());
                    let r = straddle(&ix, &q, k, j, move || a.run(&x), move || b.run(&y));
                    let Some((m, stopped)) = r else { break };
                    reached = true;
                    check_bracket(&m, &states, &touched, &format!("seed {seed} step {i} points {k}, {j}"));
                    checks += 1;
                    if !stopped {
                        break;
                    }
                }
                if !reached {
                    break;
                }
            }
        }
    }
    assert!(checks > 100, "{checks}");
}

/// a query starts while W leaves (its slot still named W in the
/// query's table), W's slot goes to V, who stores a deeper prefix, and the
/// query walks on: V's bits in the slot are never W's answer.
#[test]
fn a_slot_given_away_mid_query_never_answers_for_the_old_worker() {
    let a = |i: u64| 6_000 + i;
    let (wk, v) = (w(1), w(2));
    let q: Vec<u64> = (0..20).map(a).collect();
    let mut checked = 0;
    for k in 0..16 {
        for j in 0..12 {
            let ix = index();
            ix.apply(&Event::stored(wk, DEV, None, blocks(&(0..4).map(|i| (i + 1, a(i))).collect::<Vec<_>>())));
            let (x, y) = (ix.clone(), ix.clone());
            let r = straddle(
                &ix,
                &q,
                k,
                j,
                move || {
                    x.remove_worker(wk);
                },
                move || {
                    y.apply(&Event::stored(
                        v,
                        DEV,
                        None,
                        blocks(&(0..20).map(|i| (100 + i, a(i))).collect::<Vec<_>>()),
                    ));
                },
            );
            let Some((m, _)) = r else { continue };
            checked += 1;
            assert!(dev(&m, wk) <= 4, "points {k}, {j}: W credited {} blocks, held 4 then left", dev(&m, wk));
        }
    }
    assert!(checked > 5, "{checked}");
}

/// A dump taken a worker at a time (`DumpCursor`) while a writer of
/// another worker is stopped at each point where it holds no lock of the
/// index: the other workers are dumped meanwhile, each exactly as it
/// holds, and the stopped worker, dumped after its event, as it holds
/// then: each at one instant, none waiting for the stopped writer.
#[test]
fn a_dump_a_worker_at_a_time_runs_while_a_writer_is_stopped_anywhere_open() {
    let chain = |first: u64, n: u64| blocks(&(first..first + n).map(|h| (h, h * 10)).collect::<Vec<_>>());
    let events = [
        Event::stored(w(1), DEV, Some(103), chain(104, 6)),
        Event::removed(w(1), DEV, vec![102, 103]),
        Event::stored(w(1), HOST, Some(101), chain(102, 3)),
        Event::cleared(w(1)),
    ];
    for event in &events {
        let mut k = 0;
        loop {
            let ix = index();
            // Slots in order: workers 0 and 2 first, worker 1 last.
            ix.apply(&Event::stored(w(0), DEV, None, chain(1, 5)));
            ix.apply(&Event::stored(w(2), HOST, None, chain(1, 3)));
            ix.apply(&Event::stored(w(1), DEV, None, chain(100, 4)));
            let (before_0, before_2) = (worker_dump(&ix, w(0)), worker_dump(&ix, w(2)));
            let cursor = Arc::new(parking_lot::Mutex::new(ix.dump_cursor()));
            let got = Arc::new(parking_lot::Mutex::new(Vec::new()));
            let (c, g, x) = (cursor.clone(), got.clone(), ix.clone());
            let others: Vec<(usize, Point, Other)> = vec![(
                k,
                Point::Open,
                Box::new(move || {
                    let mut c = c.lock();
                    for _ in 0..2 {
                        g.lock().push(c.next_worker(&x).expect("workers 0 and 2"));
                    }
                }),
            )];
            let (_, reached) = interleave(|| ix.apply(event), others);
            if k >= reached.open {
                break;
            }
            let got = got.lock();
            assert_eq!(got.len(), 2, "point {k}: the dump ran while the writer was stopped");
            assert_eq!((got[0].clone(), got[1].clone()), (before_0.clone(), before_2.clone()), "point {k}");
            let last = cursor.lock().next_worker(&ix).expect("worker 1");
            assert_eq!(last, worker_dump(&ix, w(1)), "point {k}: worker 1 as it holds after its event");
            assert!(cursor.lock().next_worker(&ix).is_none());
            k += 1;
        }
        // A clear runs under the tree lock from end to end.
        assert!(k > 0 || matches!(event.kind, EventKind::Cleared), "{event:?} passed no open point");
    }
}

/// One worker's events in a whole dump.
fn worker_dump(ix: &Index, worker: WorkerId) -> Vec<DumpEvent> {
    ix.dump_events().into_iter().filter(|e| e.event.worker == worker).collect()
}

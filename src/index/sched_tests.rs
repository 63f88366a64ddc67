//! A cooperative scheduler over pause points. Several writer
//! threads (one worker each) and query threads run one at a time; at every
//! pause point the running thread may hand the turn to another, so a query
//! can straddle any stretch of a writer's event (not only one point) and
//! events can land anywhere in a walk. Every answer is held to the promise
//! against each worker's own exact states over the steps it overlapped.

use super::pause;
use super::*;
use crate::event::StoredBlock;
use parking_lot::Condvar;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum St {
    Ready,
    Done,
}

use crate::test_rng::Rng;

struct S {
    turn: usize,
    status: Vec<St>,
    writer: Vec<bool>,
    holder: Option<usize>,
    rng: Rng,
    switch_pct: u64,
    started: Vec<usize>,
    finished: Vec<usize>,
    steps: u64,
}

pub(super) struct Sched {
    m: Mutex<S>,
    cv: Condvar,
}

impl Sched {
    fn eligible(s: &S, j: usize) -> bool {
        s.status[j] == St::Ready && (!s.writer[j] || s.holder.is_none() || s.holder == Some(j))
    }

    fn pick_other(s: &mut S, me: usize) -> Option<usize> {
        let c: Vec<usize> = (0..s.status.len()).filter(|&j| j != me && Self::eligible(s, j)).collect();
        if c.is_empty() {
            None
        } else {
            Some(c[s.rng.below(c.len() as u64) as usize])
        }
    }

    fn wait_turn(&self, s: &mut parking_lot::MutexGuard<'_, S>, me: usize) {
        while s.turn != me {
            self.cv.wait(s);
        }
    }

    /// A pause point of thread `me`.
    fn point(&self, me: usize, p: pause::Point, force: bool) {
        let mut s = self.m.lock();
        s.steps += 1;
        if s.writer[me] {
            match p {
                pause::Point::Locked => s.holder = Some(me),
                pause::Point::Open => {
                    if s.holder == Some(me) {
                        s.holder = None
                    }
                }
            }
        }
        let switch = force || s.rng.below(100) < s.switch_pct;
        if switch {
            if let Some(j) = Self::pick_other(&mut s, me) {
                s.turn = j;
                self.cv.notify_all();
                self.wait_turn(&mut s, me);
            }
        }
    }

    fn done(&self, me: usize) {
        let mut s = self.m.lock();
        s.status[me] = St::Done;
        if s.holder == Some(me) {
            s.holder = None;
        }
        if let Some(j) = Self::pick_other(&mut s, me) {
            s.turn = j;
        }
        self.cv.notify_all();
    }
}

#[derive(Clone, Debug)]
pub(super) enum Op {
    Apply(Event),
    Leave(WorkerId),
}

impl Op {
    pub(super) fn run(&self, ix: &Index) {
        match self {
            Op::Apply(e) => {
                ix.apply(e);
            }
            Op::Leave(w) => {
                ix.remove_worker(*w);
            }
        }
    }
}

fn sb(engine_hash: u64, local_hash: u64) -> StoredBlock {
    StoredBlock { engine_hash, local_hash }
}

/// A random script for one worker. `long` is a long path of locals that
/// long stores follow (so they span pieces and share runs). Every stored
/// block's path of locals goes into `prefixes` (queries are made of them).
pub(super) fn script(
    rng: &mut Rng,
    wk: WorkerId,
    len: usize,
    long: &[u64],
    base: u64,
    prefixes: &mut Vec<Vec<u64>>,
) -> Vec<Op> {
    use std::collections::HashMap;
    let mut used: Vec<u64> = Vec::new();
    // hash -> (parent hash, local, path)
    let mut known: HashMap<u64, (Option<u64>, u64, Vec<u64>)> = HashMap::new();
    let mut next_hash = base;
    let mut ops = Vec::new();
    for _ in 0..len {
        let tier = if rng.below(4) == 0 { StorageTier::ALL[1 + rng.below(3) as usize] } else { StorageTier::Device };
        let roll = rng.below(100);
        let op = if roll < 8 && !used.is_empty() {
            // Decode: extend the latest block by a few.
            let parent = *used.last().unwrap();
            let mut path = known.get(&parent).map(|k| k.2.clone()).unwrap_or_default();
            let mut prev = Some(parent);
            let bl: Vec<StoredBlock> = (0..1 + rng.below(3))
                .map(|_| {
                    next_hash += 1;
                    used.push(next_hash);
                    let local = 1 + rng.below(3);
                    path.push(local);
                    prefixes.push(path.clone());
                    known.insert(next_hash, (prev, local, path.clone()));
                    prev = Some(next_hash);
                    sb(next_hash, local)
                })
                .collect();
            Op::Apply(Event::stored(wk, StorageTier::Device, Some(parent), bl))
        } else if roll < 14 && !used.is_empty() {
            // Evict the newest few (tails).
            let k = (1 + rng.below(5)).min(used.len() as u64) as usize;
            let hashes: Vec<u64> = used[used.len() - k..].iter().rev().copied().collect();
            let tier =
                if rng.below(3) == 0 { StorageTier::ALL[1 + rng.below(3) as usize] } else { StorageTier::Device };
            Op::Apply(Event::removed(wk, tier, hashes))
        } else if roll < 20 && !used.is_empty() {
            // Offload a known stretch to a lower tier, same hashes.
            let start = rng.below(used.len() as u64) as usize;
            let end = (start + 1 + rng.below(6) as usize).min(used.len());
            let t = StorageTier::ALL[1 + rng.below(3) as usize];
            let first = used[start];
            match known.get(&first).cloned() {
                Some((parent, _, _)) => {
                    let mut bl = Vec::new();
                    let mut prev = parent;
                    for &h in &used[start..end] {
                        match known.get(&h) {
                            Some((p, local, _)) if *p == prev => {
                                bl.push(sb(h, *local));
                                prev = Some(h);
                            }
                            _ => break,
                        }
                    }
                    Op::Apply(Event::stored(wk, t, parent, bl))
                }
                None => Op::Apply(Event::cleared(wk)),
            }
        } else if roll < 28 && !known.is_empty() {
            // Store again a block known before (fills holes), with its parent.
            let h = used[rng.below(used.len() as u64) as usize];
            match known.get(&h).cloned() {
                Some((parent, local, _)) => Op::Apply(Event::stored(wk, tier, parent, vec![sb(h, local)])),
                None => Op::Apply(Event::cleared(wk)),
            }
        } else if roll < 65 || used.is_empty() {
            let parent = if used.is_empty() || rng.below(4) == 0 {
                None
            } else {
                // recent ones more often
                let k = used.len() as u64;
                let lim = if rng.below(2) == 0 { k.min(4) } else { k };
                let back = rng.below(lim);
                Some(used[(k - 1 - back) as usize])
            };
            let longish = rng.below(10) == 0;
            let n = if longish { 100 + rng.below(200) } else { 1 + rng.below(4) };
            let mut path = parent.and_then(|p| known.get(&p).map(|k| k.2.clone())).unwrap_or_default();
            let mut prev = parent;
            let mut bl: Vec<StoredBlock> = Vec::new();
            for i in 0..n {
                let engine_hash = if !used.is_empty() && rng.below(if longish { 60 } else { 6 }) == 0 {
                    used[rng.below(used.len() as u64) as usize]
                } else {
                    next_hash += 1;
                    used.push(next_hash);
                    next_hash
                };
                let local = if longish && parent.is_none() { long[i as usize] } else { 1 + rng.below(3) };
                path.push(local);
                prefixes.push(path.clone());
                known.insert(engine_hash, (prev, local, path.clone()));
                prev = Some(engine_hash);
                bl.push(sb(engine_hash, local));
            }
            if rng.below(6) == 0 && bl.len() > 1 {
                // one hash named twice
                let a = rng.below(bl.len() as u64) as usize;
                let b = rng.below(bl.len() as u64) as usize;
                bl[b].engine_hash = bl[a].engine_hash;
            }
            Op::Apply(Event::stored(wk, tier, parent, bl))
        } else if roll < 92 {
            let many = rng.below(6) == 0;
            let k = if many { 1 + rng.below(200) } else { 1 + rng.below(3) };
            let hashes = (0..k).map(|_| used[rng.below(used.len() as u64) as usize]).collect();
            Op::Apply(Event::removed(wk, tier, hashes))
        } else if roll < 97 {
            Op::Apply(Event::cleared(wk))
        } else {
            Op::Leave(wk)
        };
        ops.push(op);
    }
    ops
}

pub(super) fn depth_of(ms: &[WorkerMatch], worker: WorkerId) -> [u32; 3] {
    ms.iter().find(|m| m.worker == worker).map_or([0; 3], |m| [m.device, m.host, m.disk])
}

pub(super) struct Case {
    pub workers: Vec<WorkerId>,
    pub scripts: Vec<Vec<Op>>,
    pub queries: Vec<Vec<u64>>,
    /// states[w][n][q]: worker w's depths for query q after its first n ops.
    pub states: Vec<Vec<Vec<[u32; 3]>>>,
    pub jump: usize,
    pub depth_max: usize,
}

pub(super) fn make_case(seed: u64, nw: usize, len: usize, nq: usize) -> Case {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let long: Vec<u64> = (0..400).map(|_| 1 + rng.below(3)).collect();
    let workers: Vec<WorkerId> = (0..nw as u64).map(|i| WorkerId::new(i + 1, 0)).collect();
    let mut prefixes = Vec::new();
    let scripts: Vec<Vec<Op>> = workers
        .iter()
        .enumerate()
        .map(|(i, &wk)| script(&mut rng, wk, len, &long, (i as u64 + 1) << 32, &mut prefixes))
        .collect();
    let queries: Vec<Vec<u64>> = (0..nq)
        .map(|_| {
            let r = rng.below(10);
            if r == 0 {
                long[..(1 + rng.below(400)) as usize].to_vec()
            } else if r < 8 && !prefixes.is_empty() {
                let mut q = prefixes[rng.below(prefixes.len() as u64) as usize].clone();
                for _ in 0..rng.below(3) {
                    q.push(1 + rng.below(3));
                }
                q
            } else {
                (0..1 + rng.below(6)).map(|_| 1 + rng.below(3)).collect()
            }
        })
        .collect();
    let jump = [1usize, 2, 3, 64][rng.below(4) as usize];
    let depth_max = [0usize, 0, 150, 5][rng.below(4) as usize];
    let states = workers
        .iter()
        .zip(&scripts)
        .map(|(&wk, ops)| {
            let ix = Index::new(IndexConfig { jump, depth_max, ..IndexConfig::new(4) });
            let mut per_n = Vec::new();
            let snap =
                |ix: &Index| queries.iter().map(|q| depth_of(&ix.find_matches(q).workers, wk)).collect::<Vec<_>>();
            per_n.push(snap(&ix));
            for op in ops {
                op.run(&ix);
                per_n.push(snap(&ix));
            }
            per_n
        })
        .collect();
    Case { workers, scripts, queries, states, jump, depth_max }
}

/// Runs a case under one random schedule; returns the violations found.
/// `fillers` other workers take the first slots, so that with 62 or more
/// the case's workers sit in a second group of slots.
pub(super) fn run_case(case: &Case, sched_seed: u64, switch_pct: u64, fillers: u64) -> Vec<String> {
    let (queriers, per_querier) = (2, 60);
    let ix = Arc::new(Index::new(IndexConfig { jump: case.jump, depth_max: case.depth_max, ..IndexConfig::new(4) }));
    for f in 0..fillers {
        ix.apply(&Event::stored(WorkerId::new(10_000 + f, 0), StorageTier::Device, None, vec![sb(1, 99_999)]));
    }
    let nw = case.workers.len();
    let n = nw + queriers;
    let sched = Arc::new(Sched {
        m: Mutex::new(S {
            turn: (sched_seed % n as u64) as usize,
            status: vec![St::Ready; n],
            writer: (0..n).map(|i| i < nw).collect(),
            holder: None,
            rng: Rng(sched_seed.wrapping_mul(0xD6E8_FEB8_6659_FD93) | 1),
            switch_pct,
            started: vec![0; nw],
            finished: vec![0; nw],
            steps: 0,
        }),
        cv: Condvar::new(),
    });
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    std::thread::scope(|scope| {
        for t in 0..n {
            let (ix, sched, errors) = (ix.clone(), sched.clone(), errors.clone());
            scope.spawn(move || {
                {
                    let mut s = sched.m.lock();
                    sched.wait_turn(&mut s, t);
                }
                let sc = sched.clone();
                let hook = move |p: pause::Point| sc.point(t, p, false);
                pause::with_hook(hook, || {
                    if t < nw {
                        for op in &case.scripts[t] {
                            sched.m.lock().started[t] += 1;
                            op.run(&ix);
                            sched.m.lock().finished[t] += 1;
                        }
                    } else {
                        let mut qr = Rng((sched_seed ^ (t as u64 * 0x1234_5678_9ABC)) | 1);
                        for _ in 0..per_querier {
                            let qi = qr.below(case.queries.len() as u64) as usize;
                            let q = &case.queries[qi];
                            let f0 = sched.m.lock().finished.clone();
                            let me = t;
                            let sc2 = sched.clone();
                            let got = CHAIN_SCRATCH.with(|s| {
                                let mut chains = s.borrow_mut();
                                let mut chains = chain::Chains::new(q, &mut chains, ix.jump);
                                query::find(&ix.shared, &mut chains, ix.jump, || loop {
                                    if let Some(g) = ix.tree.try_lock() {
                                        sc2.m.lock().holder = Some(me);
                                        return Some(g);
                                    }
                                    sc2.point(me, pause::Point::Open, true);
                                })
                            });
                            let s1 = sched.m.lock().started.clone();
                            for (wi, &wk) in case.workers.iter().enumerate() {
                                let g = depth_of(&got.workers, wk);
                                let seen: Vec<[u32; 3]> = (f0[wi]..=s1[wi]).map(|k| case.states[wi][k][qi]).collect();
                                for tier in 0..3 {
                                    let most = seen.iter().map(|d| d[tier]).max().unwrap();
                                    if g[tier] > most {
                                        errors.lock().push(format!(
                                            "OVER: query {qi} {q:?} worker {wk} got {g:?} held {seen:?} (steps {}..={})",
                                            f0[wi], s1[wi]
                                        ));
                                    }
                                }
                                if f0[wi] == s1[wi] && g != seen[0] {
                                    errors.lock().push(format!(
                                        "INEXACT: query {qi} {q:?} worker {wk} got {g:?} held {:?} (quiet at step {})",
                                        seen[0], f0[wi]
                                    ));
                                }
                            }
                            // The query holds no lock any more.
                            let mut s = sched.m.lock();
                            if s.holder == Some(me) {
                                s.holder = None;
                            }
                        }
                    }
                });
                sched.done(t);
            });
        }
    });
    ix.check_consistency();
    for (wi, &wk) in case.workers.iter().enumerate() {
        for (qi, q) in case.queries.iter().enumerate() {
            let g = depth_of(&ix.find_matches(q).workers, wk);
            let want = case.states[wi][case.scripts[wi].len()][qi];
            if g != want {
                errors.lock().push(format!("FINAL: query {qi} worker {wk} got {g:?} want {want:?}"));
            }
        }
    }
    let e = errors.lock().clone();
    e
}

/// Seeds per test; `KV_INDEXER_RACE_SEEDS` for more.
fn seeds() -> u64 {
    std::env::var("KV_INDEXER_RACE_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20)
}

#[test]
fn scheduled_interleavings_keep_the_promise() {
    let mut all = Vec::new();
    for seed in 1..=seeds() {
        let case = make_case(seed, 3, 25, 40);
        for r in 0..5 {
            let pct = [5, 20, 50][(r % 3) as usize];
            let errs = run_case(&case, seed * 1000 + r, pct, [0, 62][(r % 2) as usize]);
            for e in errs.iter().take(3) {
                eprintln!("seed {seed} sched {r} pct {pct}: {e}");
            }
            if !errs.is_empty() {
                all.push((seed, r));
            }
        }
    }
    assert!(all.is_empty(), "violations in {:?}", all);
}

/// Hostile sequences, one thread, a tight shared budget and small depth
/// limits: the layout stays consistent after every step.
#[test]
fn hostile_sequences_keep_the_layout() {
    for seed in 1..=seeds() {
        let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
        let long: Vec<u64> = (0..400).map(|_| 1 + rng.below(3)).collect();
        let cap = [0u64, 50, 300, 1000][rng.below(4) as usize];
        let budget = Arc::new(if cap == 0 { Budget::unlimited() } else { Budget::new(cap) });
        let b2 = budget.clone();
        let depth_max = [0usize, 150, 7][rng.below(3) as usize];
        let ix = Index::new(IndexConfig { jump: 1 + rng.below(4) as usize, depth_max, budget, ..IndexConfig::new(4) });
        let workers: Vec<WorkerId> = (0..4).map(|i| WorkerId::new(i + 1, 0)).collect();
        let mut prefixes = Vec::new();
        let scripts: Vec<Vec<Op>> = workers
            .iter()
            .enumerate()
            .map(|(i, &wk)| script(&mut rng, wk, 60, &long, (i as u64 + 1) << 32, &mut prefixes))
            .collect();
        let mut at = [0usize; 4];
        loop {
            let live: Vec<usize> = (0..4).filter(|&i| at[i] < scripts[i].len()).collect();
            if live.is_empty() {
                break;
            }
            let i = live[rng.below(live.len() as u64) as usize];
            let op = &scripts[i][at[i]];
            at[i] += 1;
            op.run(&ix);
            ix.check_consistency();
            let st = ix.stats();
            assert_eq!(
                (b2.pairs(), b2.entries()),
                (st.pairs, st.entries),
                "seed {seed}: budget counts what the index holds after {op:?}"
            );
            let mut per_tier = [0u64; 4];
            for cell in ix.workers.read().cells() {
                if let Some(w) = cell.lock().as_ref() {
                    for (pairs, records) in per_tier.iter_mut().zip(&w.records) {
                        let mut ids: Vec<u32> = records.iter().map(|(_, id)| id).collect();
                        ids.sort_unstable();
                        ids.dedup();
                        *pairs += ids.len() as u64;
                    }
                }
            }
            let counted: Vec<u64> =
                ix.shared.tier_pairs.iter().map(|a| a.load(std::sync::atomic::Ordering::Relaxed)).collect();
            assert_eq!(counted, per_tier.to_vec(), "seed {seed}: tier pairs after {op:?}");
        }
        for &wk in &workers {
            ix.remove_worker(wk);
        }
        let s = ix.stats();
        assert_eq!((s.entries, s.pairs), (0, 0), "seed {seed}");
    }
}

/// Sequential differential check of long events (pieces), repeated and
/// reused hashes, tiers, against the exact model of tests/index_support.
#[test]
fn long_events_match_the_exact_model() {
    #[path = "../../benches/trace/dynamo_hash.rs"]
    mod dynamo_hash;
    use dynamo_hash::{chain_hash, sequence_hashes_into};
    use std::collections::HashMap;
    type Tiers = [HashMap<u64, (u32, u64)>; 4];
    fn apply_model(tiers: &mut Tiers, e: &Event) {
        let tier = e.tier as usize;
        match &e.kind {
            EventKind::Stored { parent, blocks } => {
                let pr = match parent {
                    None => None,
                    Some(h) => {
                        let order: Vec<usize> = if tier == 0 {
                            vec![0]
                        } else {
                            std::iter::once(tier).chain((0..4).filter(|&t| t != tier)).collect()
                        };
                        match order.iter().find_map(|&t| tiers[t].get(h)) {
                            Some(&r) => Some(r),
                            None => return,
                        }
                    }
                };
                let (mut level, mut chain) = match pr {
                    None => (0u32, None),
                    Some((l, c)) => (l + 1, Some(c)),
                };
                for b in blocks {
                    let c = chain.map_or(b.local_hash, |pc| chain_hash(pc, b.local_hash));
                    tiers[tier].insert(b.engine_hash, (level, c));
                    chain = Some(c);
                    level += 1;
                }
            }
            EventKind::Removed { engine_hashes } => {
                for h in engine_hashes {
                    tiers[tier].remove(h);
                }
            }
            EventKind::Cleared => *tiers = Default::default(),
        }
    }
    fn depths(tiers: &Tiers, seqs: &[u64]) -> [u32; 3] {
        let holds = |t: usize, l: u32, c: u64| tiers[t].values().any(|&(a, b)| a == l && b == c);
        let run = |t: usize, from: u32| {
            let mut d = from;
            while (d as usize) < seqs.len() && holds(t, d, seqs[d as usize]) {
                d += 1;
            }
            d - from
        };
        let device = run(0, 0);
        let host = device + run(1, device);
        let disk = host + run(2, host);
        [device, host, disk + run(3, disk)]
    }
    for seed in 1..=seeds() {
        let case = make_case(seed, 3, 25, 30);
        if case.depth_max != 0 {
            continue;
        }
        for (wi, &wk) in case.workers.iter().enumerate() {
            let mut tiers: Tiers = Default::default();
            for (n, op) in case.scripts[wi].iter().enumerate() {
                match op {
                    Op::Apply(e) => apply_model(&mut tiers, e),
                    Op::Leave(_) => tiers = Default::default(),
                }
                for (qi, q) in case.queries.iter().enumerate() {
                    let mut s = Vec::new();
                    sequence_hashes_into(q, &mut s);
                    let want = depths(&tiers, &s);
                    let got = case.states[wi][n + 1][qi];
                    assert_eq!(got, want, "seed {seed} worker {wk} after op {n} {op:?} query {q:?}");
                }
            }
        }
    }
}

//! Readers query while writer threads apply events, and every answer is
//! held to the index's promise: a worker is never credited with more than
//! it held at one instant while the query ran, and a worker whose blocks
//! did not change meanwhile is answered exactly.
//!
//! Each worker has a writer thread that replays a random script of every
//! event kind (multi-block stores, stores under unknown parents, hashes
//! reused for other content, removes anywhere, clears, lower tiers, the
//! worker leaving the index) and publishes how many steps it started and
//! finished; the exact model gives the worker's depths after every step. A
//! reader brackets each query between the steps finished before it and the
//! steps started after it and checks every worker against the model's
//! depths over that bracket: never above their largest, per tier, and
//! equal when no step ran inside it. Seeds are fixed and each script is a
//! fixed number of steps, so a run is bounded; more seeds on demand:
//! `KV_INDEXER_RACE_SEEDS=50 cargo test --release --test index_concurrent`.

mod index_support;

use index_support::{apply, depths, random_event_of, random_query, seqs, Rng, Tiers};
use kv_indexer::index::{Index, IndexConfig};
use kv_indexer::{Event, EventKind, StorageTier, StoredBlock, WorkerId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

const CHAIN: usize = 40;

fn locals() -> Vec<u64> {
    (0..CHAIN as u64).map(|i| 1000 + i % 7).collect()
}

/// One step of a worker's script: an event, or the worker leaving.
enum Step {
    Apply(Event),
    Leave,
}

/// A worker's script and its blocks after each step (`states[s]`: after
/// `s` steps).
struct Script {
    worker: WorkerId,
    steps: Vec<Step>,
    states: Vec<Arc<Tiers>>,
}

/// A random script of `len` steps for `worker`; the prefixes its stores
/// name (their blocks' local hashes from the root) go into `prefixes`.
fn script(rng: &mut Rng, worker: WorkerId, len: usize, next_hash: &mut u64, prefixes: &mut Vec<Vec<u64>>) -> Script {
    let mut tiers: Tiers = Default::default();
    let mut states = vec![Arc::new(tiers.clone())];
    let mut steps = Vec::with_capacity(len);
    let mut path_of: HashMap<u64, Vec<u64>> = HashMap::new();
    for _ in 0..len {
        if rng.chance(1) {
            tiers = Default::default();
            steps.push(Step::Leave);
        } else {
            let e = random_event_of(rng, Some(&tiers), worker, next_hash);
            if let EventKind::Stored { parent, blocks } = &e.kind {
                if let Some(mut path) = parent.map_or(Some(Vec::new()), |p| path_of.get(&p).cloned()) {
                    for b in blocks {
                        path.push(b.local_hash);
                        path_of.insert(b.engine_hash, path.clone());
                        prefixes.push(path.clone());
                    }
                }
            }
            apply(&mut tiers, &e);
            steps.push(Step::Apply(e));
        }
        states.push(Arc::new(tiers.clone()));
    }
    Script { worker, steps, states }
}

/// Per worker, the steps it started and finished; and the queries checked.
struct Progress {
    started: Vec<AtomicUsize>,
    finished: Vec<AtomicUsize>,
    checked: AtomicUsize,
    /// Readers still running: a reader whose check failed stops, and the
    /// writers must not wait for it.
    readers: AtomicUsize,
}

/// Counts a reader out when it ends, however it ends.
struct ReaderGone(Arc<Progress>);

impl Drop for ReaderGone {
    fn drop(&mut self) {
        self.0.readers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Queries checked while every writer is halfway through its script: each
/// writer waits there for them, so the readers overlap the writes however
/// the threads are scheduled.
const OVERLAP_MIN: usize = 50;

fn run(seed: u64, workers: u64, steps: usize, readers: usize, jump: usize) -> u64 {
    let mut rng = Rng(seed);
    let mut next_hash = 0u64;
    let mut prefixes = Vec::new();
    let scripts: Arc<Vec<Script>> = Arc::new(
        (0..workers)
            .map(|i| script(&mut rng, WorkerId::new(i / 2, (i % 2) as u32), steps, &mut next_hash, &mut prefixes))
            .collect(),
    );
    let prefixes = Arc::new(prefixes);
    let n = scripts.len();
    let progress = Arc::new(Progress {
        started: (0..n).map(|_| AtomicUsize::new(0)).collect(),
        finished: (0..n).map(|_| AtomicUsize::new(0)).collect(),
        checked: AtomicUsize::new(0),
        readers: AtomicUsize::new(readers),
    });
    let ix = Arc::new(Index::new(IndexConfig { jump, ..IndexConfig::new(4) }));
    let done = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..n)
        .map(|k| {
            let (ix, scripts, progress) = (ix.clone(), scripts.clone(), progress.clone());
            std::thread::spawn(move || {
                let s = &scripts[k];
                for (i, step) in s.steps.iter().enumerate() {
                    if i == s.steps.len() / 2 {
                        while progress.checked.load(Ordering::SeqCst) < OVERLAP_MIN
                            && progress.readers.load(Ordering::SeqCst) > 0
                        {
                            std::thread::yield_now();
                        }
                    }
                    progress.started[k].store(i + 1, Ordering::SeqCst);
                    match step {
                        Step::Apply(e) => {
                            ix.apply(e);
                        }
                        Step::Leave => {
                            ix.remove_worker(s.worker);
                        }
                    }
                    progress.finished[k].store(i + 1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..readers)
        .map(|r| {
            let (ix, scripts, progress, done) = (ix.clone(), scripts.clone(), progress.clone(), done.clone());
            let prefixes = prefixes.clone();
            std::thread::spawn(move || {
                let _gone = ReaderGone(progress.clone());
                let mut rng = Rng(seed ^ (0x5EED + r as u64));
                let mut checked = 0u64;
                while !done.load(Ordering::SeqCst) {
                    // Mostly a prefix some store named, often one block longer.
                    let mut q = if prefixes.is_empty() || rng.chance(10) {
                        random_query(&mut rng)
                    } else {
                        prefixes[rng.below(prefixes.len() as u64) as usize].clone()
                    };
                    if rng.chance(50) {
                        q.push(1 + rng.below(3));
                    }
                    let qs = seqs(&q);
                    let before: Vec<usize> = progress.finished.iter().map(|a| a.load(Ordering::SeqCst)).collect();
                    let m = ix.find_matches(&q);
                    let after: Vec<usize> = progress.started.iter().map(|a| a.load(Ordering::SeqCst)).collect();
                    for (k, s) in scripts.iter().enumerate() {
                        let got = m
                            .workers
                            .iter()
                            .find(|x| x.worker == s.worker)
                            .map_or((0, 0, 0), |x| (x.device, x.host, x.disk));
                        let held: Vec<(u32, u32, u32)> =
                            (before[k]..=after[k]).map(|i| depths(&s.states[i], &qs)).collect();
                        let what = || {
                            format!(
                                "seed {seed}: {} answered {got:?} for {q:?}, held {held:?} over steps {}..={}",
                                s.worker, before[k], after[k]
                            )
                        };
                        if before[k] == after[k] {
                            assert_eq!(got, held[0], "{}", what());
                        } else {
                            let most = |f: fn(&(u32, u32, u32)) -> u32| held.iter().map(f).max().unwrap_or(0);
                            assert!(
                                got.0 <= most(|d| d.0) && got.1 <= most(|d| d.1) && got.2 <= most(|d| d.2),
                                "{}",
                                what()
                            );
                        }
                    }
                    checked += 1;
                    progress.checked.fetch_add(1, Ordering::SeqCst);
                }
                checked
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    done.store(true, Ordering::SeqCst);
    let checked: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    ix.check_consistency();
    for s in scripts.iter() {
        let end = s.states.last().expect("a state after every step");
        for _ in 0..20 {
            let q = random_query(&mut rng);
            let got = ix
                .find_matches(&q)
                .workers
                .iter()
                .find(|x| x.worker == s.worker)
                .map_or((0, 0, 0), |x| (x.device, x.host, x.disk));
            assert_eq!(got, depths(end, &seqs(&q)), "seed {seed}: {} at the end", s.worker);
        }
    }
    checked
}

fn seeds() -> u64 {
    std::env::var("KV_INDEXER_RACE_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(5)
}

/// Six workers in one group of slots: the readers settle them by the
/// group's summary words or slot by slot.
#[test]
fn answers_stay_within_what_each_worker_held_one_group() {
    for i in 0..seeds() {
        let checked = run(0x1234_5678 + i * 7919, 6, 2500, 2, 1 + (i % 4) as usize);
        assert!(checked >= OVERLAP_MIN as u64, "{checked} queries checked");
    }
}

/// Seventy workers, over two groups of slots.
#[test]
fn answers_stay_within_what_each_worker_held_two_groups() {
    for i in 0..seeds() {
        let checked = run(0x9ABC_DEF1 + i * 7919, 70, 300, 2, 2 + (i % 3) as usize);
        assert!(checked >= OVERLAP_MIN as u64, "{checked} queries checked");
    }
}

/// A slot freed by one worker and taken by another while queries run: the
/// new worker's bits are never credited to the old one. A holds the first
/// 10 blocks of a prefix, B all of it, each in turn in the same slot.
#[test]
fn a_reused_slot_never_lends_its_bits_to_the_worker_that_left() {
    const SHORT: usize = 10;
    let ix = Arc::new(Index::new(IndexConfig::new(4)));
    let (a, b) = (WorkerId::new(1, 0), WorkerId::new(2, 0));
    let l = locals();
    let store = |w: WorkerId, n: usize| {
        let blocks = (0..n).map(|i| StoredBlock { engine_hash: i as u64 + 1, local_hash: l[i] }).collect();
        Event::stored(w, StorageTier::Device, None, blocks)
    };
    let (store_a, store_b) = (store(a, SHORT), store(b, CHAIN));
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (ix, done, q) = (ix.clone(), done.clone(), l.clone());
            std::thread::spawn(move || {
                let mut seen_b = 0u64;
                while !done.load(Ordering::SeqCst) {
                    for m in ix.find_matches(&q).workers {
                        assert!(
                            m.worker == b || m.device as usize <= SHORT,
                            "{:?} credited {} blocks",
                            m.worker,
                            m.device
                        );
                        seen_b += (m.worker == b) as u64;
                    }
                }
                seen_b
            })
        })
        .collect();
    for _ in 0..3000 {
        ix.apply(&store_a);
        assert!(ix.remove_worker(a));
        ix.apply(&store_b);
        assert!(ix.remove_worker(b));
    }
    done.store(true, Ordering::SeqCst);
    for r in readers {
        r.join().unwrap();
    }
    let s = ix.stats();
    assert_eq!((s.entries, s.pairs), (0, 0));
}

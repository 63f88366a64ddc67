//! Readers query while writer threads apply events. Each worker's writer
//! runs a script of single-block events and publishes how many steps it has
//! applied; a reader brackets each query between two readings of those
//! counters and checks that every worker's depth is one the worker had at
//! some step inside that bracket. The workers share the same content, so
//! they contend on the same entries.

use kv_indexer::index::{Index, IndexConfig};
use kv_indexer::{Event, StorageTier, StoredBlock, WorkerId};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

const CHAIN: usize = 40;
const ROUNDS: usize = 400;
const WORKERS: usize = 6;

fn locals() -> Vec<u64> {
    (0..CHAIN as u64).map(|i| 1000 + i % 7).collect()
}

/// The script of one worker: (event, depth after it).
fn script(worker: WorkerId) -> Vec<(Event, u32)> {
    let l = locals();
    let h = |i: usize| worker.instance_id * 1_000_000 + i as u64 + 1;
    let store = |i: usize| {
        let parent = if i == 0 { None } else { Some(h(i - 1)) };
        Event::stored(worker, StorageTier::Device, parent, vec![StoredBlock { engine_hash: h(i), local_hash: l[i] }])
    };
    let remove = |i: usize| Event::removed(worker, StorageTier::Device, vec![h(i)]);
    let mut out = Vec::new();
    for round in 0..ROUNDS {
        for i in 0..CHAIN {
            out.push((store(i), i as u32 + 1));
        }
        let cut = 5 + (round * 7 + worker.instance_id as usize) % 30;
        out.push((remove(cut), cut as u32));
        out.push((store(cut), CHAIN as u32));
        for i in (0..CHAIN).rev() {
            out.push((remove(i), i as u32));
        }
    }
    out
}

#[test]
fn readers_only_see_states_the_writers_went_through() {
    let ix = Arc::new(Index::new(IndexConfig { jump: 8, ..IndexConfig::new(4) }));
    let workers: Vec<WorkerId> = (0..WORKERS as u64).map(|i| WorkerId::new(i + 1, 0)).collect();
    let scripts: Vec<Arc<Vec<(Event, u32)>>> = workers.iter().map(|&w| Arc::new(script(w))).collect();
    let applied: Arc<Vec<AtomicUsize>> = Arc::new((0..WORKERS).map(|_| AtomicUsize::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));

    let writers: Vec<_> = (0..WORKERS)
        .map(|k| {
            let (ix, s, applied) = (ix.clone(), scripts[k].clone(), applied.clone());
            std::thread::spawn(move || {
                for (e, _) in s.iter() {
                    ix.apply(e);
                    applied[k].fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (ix, scripts, applied, done) = (ix.clone(), scripts.clone(), applied.clone(), done.clone());
            let workers = workers.clone();
            std::thread::spawn(move || {
                let q = locals();
                let mut checked = 0u64;
                while !done.load(Ordering::SeqCst) {
                    let before: Vec<usize> = applied.iter().map(|a| a.load(Ordering::SeqCst)).collect();
                    let m = ix.find_matches(&q);
                    let after: Vec<usize> = applied.iter().map(|a| a.load(Ordering::SeqCst)).collect();
                    for k in 0..WORKERS {
                        let got = m.workers.iter().find(|x| x.worker == workers[k]).map_or(0, |x| x.device);
                        let depth_at = |step: usize| if step == 0 { 0 } else { scripts[k][step - 1].1 };
                        // Steps applied lie in [before, after + 1] while the query ran.
                        let last = (after[k] + 1).min(scripts[k].len());
                        let ok = (before[k]..=last).any(|s| depth_at(s) == got);
                        assert!(ok, "worker {k}: depth {got} never held between steps {} and {last}", before[k]);
                    }
                    checked += 1;
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
    assert!(checked > 0);
    let s = ix.stats();
    assert_eq!((s.entries, s.pairs), (0, 0));
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

//! The pair cap inside the index: indexes sharing one `Budget` never hold
//! more pairs or entries than its cap, a refused store is counted as shed
//! and leaves answers a subset of the truth (never a block a worker lacks),
//! removes and clears always apply, and freed room takes stores again.

use kv_indexer::index::{Budget, Index, IndexConfig, WorkerMatch};
use kv_indexer::{Event, StorageTier, StoredBlock, WorkerId};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

const DEV: StorageTier = StorageTier::Device;

fn w(i: u64) -> WorkerId {
    WorkerId::new(i, 0)
}

fn capped(budget: &Arc<Budget>) -> Index {
    Index::new(IndexConfig { jump: 4, budget: budget.clone(), ..IndexConfig::new(4) })
}

/// A store of blocks `(engine hash, local hash)`.
fn store(worker: WorkerId, parent: Option<u64>, bl: &[(u64, u64)]) -> Event {
    let blocks = bl.iter().map(|&(engine_hash, local_hash)| StoredBlock { engine_hash, local_hash }).collect();
    Event::stored(worker, DEV, parent, blocks)
}

fn device(ix: &Index, locals: &[u64], worker: WorkerId) -> u32 {
    ix.find_matches(locals).workers.iter().find(|m| m.worker == worker).map_or(0, |m| m.device)
}

#[test]
fn indexes_share_the_cap_and_freed_room_takes_stores_again() {
    let budget = Arc::new(Budget::new(5));
    let (a, b) = (capped(&budget), capped(&budget));
    assert_eq!(a.apply(&store(w(1), None, &[(1, 11), (2, 12), (3, 13), (4, 14)])).stored, 4);
    let out = b.apply(&store(w(2), None, &[(1, 21), (2, 22), (3, 23)]));
    assert_eq!((out.stored, out.shed), (1, 2), "the second index gets what is left of the cap");
    assert_eq!((budget.pairs(), budget.entries()), (5, 5));
    assert_eq!(device(&b, &[21, 22, 23], w(2)), 1, "the refused blocks are not claimed");
    // Children of a refused block are refused as unknown parent.
    assert_eq!(b.apply(&store(w(2), Some(3), &[(4, 24)])).unknown_parent, 1);

    // Removes apply at the cap, and the room they free takes stores again.
    assert_eq!(a.apply(&Event::removed(w(1), DEV, vec![4, 3])).removed, 2);
    assert_eq!(budget.pairs(), 3);
    assert_eq!(b.apply(&store(w(2), Some(1), &[(2, 22), (3, 23)])).stored, 2);
    assert_eq!(device(&b, &[21, 22, 23], w(2)), 3);
    assert_eq!(a.apply(&store(w(1), Some(2), &[(3, 13)])).shed, 1, "full again");

    // Clears apply at the cap; dropping an index returns its room.
    assert_eq!(b.apply(&Event::cleared(w(2))).cleared, 3);
    assert_eq!(budget.pairs(), 2);
    drop(a);
    assert_eq!((budget.pairs(), budget.entries()), (0, 0));
}

#[test]
fn a_reused_hash_refused_at_the_cap_drops_the_old_block() {
    let budget = Arc::new(Budget::new(2));
    let ix = capped(&budget);
    ix.apply(&store(w(1), None, &[(1, 11), (2, 12)]));
    // The engine reuses hash 2 for other content while the cap is full.
    let out = ix.apply(&store(w(1), Some(1), &[(2, 99)]));
    assert_eq!(out.shed, 1);
    assert_eq!(device(&ix, &[11, 12], w(1)), 1, "the old content is not claimed any more");
    assert_eq!(device(&ix, &[11, 99], w(1)), 1, "nor the new one, which was refused");
    assert_eq!(budget.pairs(), 1);
}

#[test]
fn entries_kept_as_parents_count_against_the_cap() {
    let budget = Arc::new(Budget::new(6));
    let ix = capped(&budget);
    ix.apply(&store(w(1), None, &[(1, 11), (2, 12), (3, 13), (4, 14), (5, 15)]));
    // Ancestors go first: their entries stay as the leaf's parents.
    ix.apply(&Event::removed(w(1), DEV, vec![1, 2, 3, 4]));
    assert_eq!((budget.pairs(), budget.entries()), (1, 5));
    let out = ix.apply(&store(w(2), None, &[(1, 31), (2, 32), (3, 33)]));
    assert_eq!((out.stored, out.shed), (1, 2), "one pair fits but only one more entry does");
    assert_eq!((budget.pairs(), budget.entries()), (2, 6));
    assert_eq!((ix.stats().pairs, ix.stats().entries), (2, 6));
}

/// What each worker holds, per tier, to draw valid events from.
type Held = HashMap<WorkerId, [BTreeSet<u64>; 4]>;

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn random_event(rng: &mut Rng, held: &mut Held, next_hash: &mut u64) -> Event {
    let worker = w(rng.below(6));
    let tier = if rng.below(100) < 75 { DEV } else { StorageTier::HostPinned };
    let t = tier as usize;
    let mine = held.entry(worker).or_default();
    let roll = rng.below(100);
    if roll < 2 {
        *mine = Default::default();
        return Event::cleared(worker);
    }
    let here: Vec<u64> = mine[t].iter().copied().collect();
    if roll < 40 && !here.is_empty() {
        let hashes: Vec<u64> = (0..1 + rng.below(3)).map(|_| here[rng.below(here.len() as u64) as usize]).collect();
        for h in &hashes {
            mine[t].remove(h);
        }
        return Event::removed(worker, tier, hashes);
    }
    let parent = (!here.is_empty() && rng.below(100) < 70).then(|| here[rng.below(here.len() as u64) as usize]);
    let blocks: Vec<StoredBlock> = (0..1 + rng.below(5))
        .map(|_| {
            *next_hash += 1;
            mine[t].insert(*next_hash);
            // A tiny alphabet of chunks: workers share prefixes all the time.
            StoredBlock { engine_hash: *next_hash, local_hash: 1 + rng.below(3) }
        })
        .collect();
    Event::stored(worker, tier, parent, blocks)
}

fn find(ix: &Index, q: &[u64]) -> HashMap<WorkerId, WorkerMatch> {
    ix.find_matches(q).workers.into_iter().map(|m| (m.worker, m)).collect()
}

/// The same random stream into an uncapped index (the truth; `index_model`
/// checks it against an exact model) and into two indexes sharing a small
/// cap: every answer of the capped ones is at most the truth, in every tier.
#[test]
fn random_streams_under_a_cap_answer_a_subset_of_the_truth() {
    for seed in 1..=4u64 {
        let cap = 40 + seed * 15;
        let budget = Arc::new(Budget::new(cap));
        let truth = [Index::new(IndexConfig { jump: 4, ..IndexConfig::new(4) }), Index::new(IndexConfig::new(4))];
        let under = [capped(&budget), capped(&budget)];
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut held: [Held; 2] = Default::default();
        let mut next_hash = 0u64;
        let mut shed = 0u64;
        for step in 0..4_000 {
            let i = rng.below(2) as usize;
            let e = random_event(&mut rng, &mut held[i], &mut next_hash);
            truth[i].apply(&e);
            shed += under[i].apply(&e).shed as u64;
            let total = under[0].stats().pairs + under[1].stats().pairs;
            assert_eq!(budget.pairs(), total, "seed {seed} step {step}: the budget counts every pair");
            assert_eq!(budget.entries(), under[0].stats().entries + under[1].stats().entries);
            assert!(budget.pairs() <= cap && budget.entries() <= cap, "seed {seed} step {step}: over the cap");
            for _ in 0..2 {
                let q: Vec<u64> = (0..rng.below(12)).map(|_| 1 + rng.below(3)).collect();
                let (got, want) = (find(&under[i], &q), find(&truth[i], &q));
                for (worker, m) in &got {
                    let t = want.get(worker).unwrap_or_else(|| panic!("seed {seed} step {step}: {worker} not held"));
                    assert!(
                        m.device <= t.device && m.host <= t.host && m.disk <= t.disk,
                        "seed {seed} step {step}: query {q:?} claims {m:?}, truth {t:?}"
                    );
                }
            }
        }
        assert!(shed > 0, "seed {seed}: the stream reached the cap");
        for (ix, h) in under.iter().zip(&held) {
            for &worker in h.keys() {
                ix.apply(&Event::cleared(worker));
            }
        }
        assert_eq!((budget.pairs(), budget.entries()), (0, 0), "seed {seed}: clears return every pair and entry");
    }
}

//! What the index tests share: an exact model of every worker's blocks
//! (per tier, engine hash -> (position, prefix chain)), the depths it gives
//! a query, and random events of every kind over a tiny alphabet (so
//! chunks collide all the time).
#![allow(dead_code)]

#[path = "../../benches/trace/dynamo_hash.rs"]
mod dynamo_hash;

use dynamo_hash::chain_hash;
use kv_indexer::index::WorkerMatch;
use kv_indexer::{Event, EventKind, StorageTier, StoredBlock, WorkerId};
use std::collections::{BTreeMap, HashMap};

/// Deterministic xorshift so failures replay.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// One worker's blocks per tier: engine hash -> (position, chain, local).
pub type Tiers = [HashMap<u64, (u32, u64, u64)>; 4];

/// Applies one event of a worker to its blocks.
pub fn apply(tiers: &mut Tiers, e: &Event) {
    let tier = e.tier as usize;
    match &e.kind {
        EventKind::Stored { parent, blocks } => {
            let parent_rec = match parent {
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
            let (mut level, mut chain) = match parent_rec {
                None => (0u32, None),
                Some((l, c, _)) => (l + 1, Some(c)),
            };
            for b in blocks {
                let c = chain.map_or(b.local_hash, |pc| chain_hash(pc, b.local_hash));
                tiers[tier].insert(b.engine_hash, (level, c, b.local_hash));
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

fn holds(tiers: &Tiers, tier: usize, level: u32, chain: u64) -> bool {
    tiers[tier].values().any(|&(l, c, _)| l == level && c == chain)
}

/// The worker's depths for a query given as its sequence hashes:
/// (device, host, disk), cumulative as the index answers them.
pub fn depths(tiers: &Tiers, seqs: &[u64]) -> (u32, u32, u32) {
    let run = |tier: usize, from: u32| {
        let mut d = from;
        while (d as usize) < seqs.len() && holds(tiers, tier, d, seqs[d as usize]) {
            d += 1;
        }
        d - from
    };
    let device = run(0, 0);
    let host = device + run(1, device);
    let disk_end = host + run(2, host);
    (device, host, disk_end + run(3, disk_end))
}

/// The query's sequence hashes, the model's identity of a prefix.
pub fn seqs(locals: &[u64]) -> Vec<u64> {
    let mut s = Vec::new();
    dynamo_hash::sequence_hashes_into(locals, &mut s);
    s
}

/// The model: every worker's blocks.
#[derive(Default)]
pub struct Model {
    pub workers: BTreeMap<WorkerId, Tiers>,
}

impl Model {
    pub fn apply(&mut self, e: &Event) {
        if matches!(e.kind, EventKind::Stored { .. }) {
            apply(self.workers.entry(e.worker).or_default(), e);
        } else if let Some(t) = self.workers.get_mut(&e.worker) {
            apply(t, e);
        }
    }

    pub fn find(&self, locals: &[u64]) -> Vec<WorkerMatch> {
        let seqs = seqs(locals);
        let mut out = Vec::new();
        for (&w, tiers) in &self.workers {
            let (device, host, disk) = depths(tiers, &seqs);
            if disk > 0 {
                out.push(WorkerMatch { worker: w, device, host, disk });
            }
        }
        out
    }

    pub fn pairs(&self) -> u64 {
        let mut n = 0;
        for tiers in self.workers.values() {
            for t in tiers {
                let mut uniq: Vec<(u32, u64)> = t.values().map(|&(l, c, _)| (l, c)).collect();
                uniq.sort_unstable();
                uniq.dedup();
                n += uniq.len() as u64;
            }
        }
        n
    }
}

const TIERS: [StorageTier; 4] = StorageTier::ALL;

/// A random event of worker `w`, whose blocks are `held`: stores of one to
/// six blocks (sometimes at the root, sometimes under an unknown parent,
/// sometimes reusing a hash for other content), removes of held and
/// unknown hashes, and now and then a clear.
pub fn random_event_of(rng: &mut Rng, held: Option<&Tiers>, w: WorkerId, next_hash: &mut u64) -> Event {
    // Mostly device, so deep device chains form; lower tiers often enough to matter.
    let tier = if rng.chance(70) { StorageTier::Device } else { TIERS[1 + rng.below(3) as usize] };
    let all: Vec<u64> = held.map(|t| t.iter().flat_map(|m| m.keys().copied()).collect()).unwrap_or_default();
    // Engines use one hash for one content: reuse (for other content) only within a tier.
    let here: Vec<u64> = held.map(|t| t[tier as usize].keys().copied().collect()).unwrap_or_default();
    let roll = rng.below(100);
    if roll < 60 || all.is_empty() {
        let parent = if all.is_empty() || rng.chance(25) {
            None
        } else if rng.chance(4) {
            Some(1_000_000 + rng.below(1000)) // unknown parent
        } else {
            Some(all[rng.below(all.len() as u64) as usize])
        };
        let n = 1 + rng.below(6) as usize;
        let blocks = (0..n)
            .map(|_| {
                let engine_hash = if !here.is_empty() && rng.chance(8) {
                    here[rng.below(here.len() as u64) as usize]
                } else {
                    *next_hash += 1;
                    *next_hash
                };
                StoredBlock { engine_hash, local_hash: 1 + rng.below(3) }
            })
            .collect();
        Event::stored(w, tier, parent, blocks)
    } else if roll < 97 {
        let mut hashes: Vec<u64> = (0..1 + rng.below(4)).map(|_| all[rng.below(all.len() as u64) as usize]).collect();
        if rng.chance(20) {
            hashes.push(2_000_000 + rng.below(100));
        }
        Event::removed(w, tier, hashes)
    } else {
        Event::cleared(w)
    }
}

/// A random event of a random worker of `workers`.
pub fn random_event(rng: &mut Rng, model: &Model, workers: &[WorkerId], next_hash: &mut u64) -> Event {
    let w = workers[rng.below(workers.len() as u64) as usize];
    random_event_of(rng, model.workers.get(&w), w, next_hash)
}

/// A random query over the same alphabet.
pub fn random_query(rng: &mut Rng) -> Vec<u64> {
    (0..rng.below(14)).map(|_| 1 + rng.below(3)).collect()
}

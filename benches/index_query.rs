//! In-process index benchmark: query latency for a 128-block query over 64
//! workers holding about a million (block, worker) pairs, per jump size, and
//! single-thread apply rate; then a deep query at the default jump, 8,192
//! blocks through eight runs, the deepest matches of the trace workloads
//! (where a query's time is computing its chains and crossing runs).
//! `cargo bench --bench index_query [-- --queries N]`.

use kv_indexer::index::{Index, IndexConfig, JUMP_DEFAULT};
use kv_indexer::{Event, StorageTier, StoredBlock, WorkerId};
use std::time::Instant;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

const WORKERS: u64 = 64;
const QUERY_BLOCKS: usize = 128;
const PAIRS_PER_WORKER: usize = 16_000;

/// Builds the index; returns it, the store rate (blocks/s), the pair count,
/// and the events, so their removal can be timed too.
fn build(jump: usize, rng: &mut Rng, query: &[u64]) -> (Index, f64, u64, Vec<Event>) {
    let ix = Index::new(IndexConfig { jump, ..IndexConfig::new(16) });
    let mut events = Vec::new();
    for w in 0..WORKERS {
        let worker = WorkerId::new(w, 0);
        let mut h = w << 40;
        // The query's prefix at a random depth (a quarter hold all of it).
        let depth = if w % 4 == 0 { QUERY_BLOCKS } else { (rng.next() % QUERY_BLOCKS as u64) as usize };
        let blocks: Vec<StoredBlock> = query[..depth]
            .iter()
            .map(|&l| {
                h += 1;
                StoredBlock { engine_hash: h, local_hash: l }
            })
            .collect();
        events.push(Event::stored(worker, StorageTier::Device, None, blocks));
        // Other conversations: chains of 64 blocks sharing a system prompt of 16.
        let mut held = depth;
        while held < PAIRS_PER_WORKER {
            let mut blocks = Vec::with_capacity(64);
            for k in 0..64u64 {
                h += 1;
                let local = if k < 16 { 9_000 + k } else { rng.next() };
                blocks.push(StoredBlock { engine_hash: h, local_hash: local });
            }
            held += 64;
            events.push(Event::stored(worker, StorageTier::Device, None, blocks));
        }
    }
    let blocks: usize = events
        .iter()
        .map(|e| match &e.kind {
            kv_indexer::EventKind::Stored { blocks, .. } => blocks.len(),
            _ => 0,
        })
        .sum();
    let t = Instant::now();
    for e in &events {
        ix.apply(e);
    }
    let rate = blocks as f64 / t.elapsed().as_secs_f64();
    let pairs = ix.stats().pairs;
    (ix, rate, pairs, events)
}

/// Removes every stored block, tail first per event as engines evict; returns blocks/s.
fn remove_all(ix: &Index, events: &[Event]) -> f64 {
    let removes: Vec<Event> = events
        .iter()
        .filter_map(|e| match &e.kind {
            kv_indexer::EventKind::Stored { blocks, .. } => Some(Event::removed(
                e.worker,
                StorageTier::Device,
                blocks.iter().rev().map(|b| b.engine_hash).collect(),
            )),
            _ => None,
        })
        .collect();
    let n: usize = removes
        .iter()
        .map(|e| match &e.kind {
            kv_indexer::EventKind::Removed { engine_hashes } => engine_hashes.len(),
            _ => 0,
        })
        .sum();
    let t = Instant::now();
    for e in &removes {
        ix.apply(e);
    }
    let rate = n as f64 / t.elapsed().as_secs_f64();
    assert_eq!(ix.stats().pairs, 0);
    rate
}

const DEEP_BLOCKS: usize = 8192;
const DEEP_WORKERS: usize = 8;

/// Worker `k` holds the first `(k + 1) / 8` of a deep prefix and then a
/// branch of its own, so the prefix is cut into eight runs of 1,024 blocks
/// (each worker's branch starts where the next run does); the query is the
/// whole prefix. Returns the index and the query.
fn build_deep(rng: &mut Rng) -> (Index, Vec<u64>) {
    let ix = Index::new(IndexConfig::new(16));
    let prefix: Vec<u64> = (0..DEEP_BLOCKS).map(|_| rng.next()).collect();
    let mut h = 0u64;
    for k in 0..DEEP_WORKERS {
        let held = DEEP_BLOCKS / DEEP_WORKERS * (k + 1);
        let locals = prefix[..held].iter().copied().chain((0..64).map(|_| rng.next()));
        let blocks = locals
            .map(|local_hash| {
                h += 1;
                StoredBlock { engine_hash: h, local_hash }
            })
            .collect();
        ix.apply(&Event::stored(WorkerId::new(k as u64, 0), StorageTier::Device, None, blocks));
    }
    (ix, prefix)
}

fn deep(queries: usize, rng: &mut Rng) {
    let (ix, query) = build_deep(rng);
    let deepest = ix.find_matches(&query).workers.iter().map(|m| m.device).max();
    assert_eq!(deepest, Some(DEEP_BLOCKS as u32));
    let mut lat = Vec::with_capacity(queries);
    for _ in 0..queries {
        let t = Instant::now();
        let m = ix.find_matches(&query);
        lat.push(t.elapsed().as_nanos() as u64);
        assert_eq!(m.workers.len(), DEEP_WORKERS);
    }
    lat.sort_unstable();
    println!(
        "deep query: {DEEP_BLOCKS} blocks through {DEEP_WORKERS} runs, {DEEP_WORKERS} workers, jump {JUMP_DEFAULT}: \
         p50 {} ns, p99 {} ns ({:.2} ns a block at p50)",
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        percentile(&lat, 0.5) as f64 / DEEP_BLOCKS as f64
    );
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn main() {
    let mut queries = 200_000usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--queries" {
            queries = args.next().and_then(|s| s.parse().ok()).expect("--queries N");
        }
    }
    let mut rng = Rng(0x1234_5678);
    let query: Vec<u64> = (0..QUERY_BLOCKS as u64).map(|i| 77_000 + i).collect();
    println!("index_query: {WORKERS} workers, {QUERY_BLOCKS}-block query, {queries} queries per jump size");
    println!(
        "{:>5} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12} {:>10} {:>8}",
        "jump", "p50 ns", "p99 ns", "p999 ns", "mean ns", "stores/s", "removes/s", "pairs", "B/pair"
    );
    for jump in [1, 4, 8, 16, 32, 64] {
        let (ix, rate, pairs, events) = build(jump, &mut rng, &query);
        let bytes = ix.stats().bytes;
        let mut lat = Vec::with_capacity(queries);
        let mut sink = 0u64;
        for _ in 0..queries {
            let t = Instant::now();
            let m = ix.find_matches(&query);
            lat.push(t.elapsed().as_nanos() as u64);
            sink += m.workers.len() as u64;
        }
        assert_eq!(sink as usize, queries * ix.find_matches(&query).workers.len());
        lat.sort_unstable();
        let mean = lat.iter().sum::<u64>() / lat.len() as u64;
        let remove_rate = remove_all(&ix, &events);
        println!(
            "{:>5} {:>9} {:>9} {:>9} {:>9} {:>12.0} {:>12.0} {:>10} {:>8.1}",
            jump,
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            percentile(&lat, 0.999),
            mean,
            rate,
            remove_rate,
            pairs,
            bytes as f64 / pairs as f64
        );
    }
    deep(queries / 10, &mut rng);
}

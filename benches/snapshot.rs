//! Snapshot benchmark: write and load time and file size for about a
//! million (block, worker) pairs (64 workers x 16,384 blocks by default),
//! through the daemon's own code paths (capture with shard sync, encode,
//! crash-safe write with fsync; read, decode, restore into a fresh registry).
//!
//! `cargo bench --bench snapshot [-- --workers N --blocks N --dir PATH --rounds N]`
//! (`--dir` picks the file system; default: the system temp dir).

use kv_indexer::ingest::{Ingest, IngestConfig};
use kv_indexer::registry::Registry;
use kv_indexer::snapshot::{self, SnapshotDir};
use kv_indexer::{Event, StorageTier, StoredBlock, WorkerId};
use std::path::PathBuf;
use std::sync::Arc;
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

/// Blocks of the system prompt every worker holds once, at the root.
const PROMPT: u64 = 16;
/// Blocks per conversation, chained to the system prompt.
const CONVERSATION: u64 = 48;

fn registry() -> Arc<Registry> {
    let cfg = IngestConfig { listener_threads: 1, shard_threads: 2, pin_threads: false, ..IngestConfig::default() };
    Arc::new(Registry::new(Arc::new(Ingest::start(cfg).expect("ingest")), 0))
}

/// Fills index `m:default` with `workers` x `blocks` pairs: per worker a
/// shared system prompt, then conversations hanging off it (no aliases).
fn fill(registry: &Registry, workers: u64, blocks: u64) -> u64 {
    let h = registry.index_or_create("m", "default", 16).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut pairs = 0;
    for w in 0..workers {
        let worker = WorkerId::new(w, 0);
        let mut engine = w << 40;
        let mut chain = |n: u64, shared: bool, rng: &mut Rng| -> Vec<StoredBlock> {
            (0..n)
                .map(|k| {
                    engine += 1;
                    let local = if shared { 9_000 + k } else { rng.next() };
                    StoredBlock { engine_hash: engine, local_hash: local }
                })
                .collect()
        };
        let prompt = chain(PROMPT.min(blocks), true, &mut rng);
        let root = prompt.last().map(|b| b.engine_hash);
        let mut held = prompt.len() as u64;
        pairs += h.apply(&Event::stored(worker, StorageTier::Device, None, prompt)).stored as u64;
        while held < blocks {
            let blocks = chain(CONVERSATION.min(blocks - held), false, &mut rng);
            held += blocks.len() as u64;
            pairs += h.apply(&Event::stored(worker, StorageTier::Device, root, blocks)).stored as u64;
        }
    }
    pairs
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    kv_indexer::log::set_level(kv_indexer::log::Level::Warn);
    let mut workers = 64u64;
    let mut blocks = 16_384u64;
    let mut rounds = 5usize;
    let mut dir = std::env::temp_dir().join(format!("kvi-snapshot-bench-{}", std::process::id()));
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--workers" => workers = args.next().and_then(|v| v.parse().ok()).expect("--workers N"),
            "--blocks" => blocks = args.next().and_then(|v| v.parse().ok()).expect("--blocks N"),
            "--rounds" => rounds = args.next().and_then(|v| v.parse().ok()).expect("--rounds N"),
            "--dir" => dir = PathBuf::from(args.next().expect("--dir PATH")).join("kvi-snapshot-bench"),
            _ => {} // cargo bench passes --bench
        }
    }
    let source = registry();
    let pairs = fill(&source, workers, blocks);
    let snapdir = SnapshotDir::open(&dir).expect("snapshot dir");

    let (mut capture, mut encode, mut write, mut save) = (vec![], vec![], vec![], vec![]);
    let (mut read, mut decode, mut apply, mut load) = (vec![], vec![], vec![], vec![]);
    let mut bytes = 0;
    for _ in 0..rounds.max(1) {
        // Write path, piece by piece, then as the daemon does it.
        let t = Instant::now();
        let snap = snapshot::capture(&source).expect("capture");
        capture.push(ms(t));
        let t = Instant::now();
        let image = snapshot::encode(&snap);
        encode.push(ms(t));
        bytes = image.len() as u64;
        drop(image);
        let t = Instant::now();
        snapdir.write(&snap).expect("write");
        write.push(ms(t));
        drop(snap);
        let stats = snapdir.save(&source).expect("save");
        save.push(stats.capture_ms + stats.write_ms);

        // Load path: read, decode, restore into a fresh registry.
        let t0 = Instant::now();
        let t = Instant::now();
        let image = std::fs::read(snapdir.path()).expect("read");
        read.push(ms(t));
        let t = Instant::now();
        let snap = snapshot::decode(&image).expect("decode");
        decode.push(ms(t));
        drop(image);
        let target = registry();
        let t = Instant::now();
        let restored = snapshot::restore(&target, snapshot::plan(snap, vec![])).expect("restore");
        apply.push(ms(t));
        load.push(ms(t0));
        assert_eq!(restored.pairs, pairs);
        assert_eq!(target.index("m", "default").unwrap().index.stats().pairs, pairs);
    }
    let _ = std::fs::remove_dir_all(&dir);

    println!(
        "snapshot of {workers} workers x {blocks} blocks = {pairs} (block, worker) pairs, {rounds} rounds, medians"
    );
    println!("file {}: {:.1} MB, {:.1} bytes/pair", dir.display(), bytes as f64 / 1e6, bytes as f64 / pairs as f64);
    println!("| step | ms |");
    println!("|---|---:|");
    for (name, v) in [
        ("capture (watermarks, shard sync, dump_events)", &mut capture),
        ("encode", &mut encode),
        ("write (temp file, fsync, rename, fsync dir)", &mut write),
        ("**save total** (what a stop costs)", &mut save),
        ("read file", &mut read),
        ("decode (checksums, bounds)", &mut decode),
        ("restore (apply events to a fresh index)", &mut apply),
        ("**load total**", &mut load),
    ] {
        println!("| {name} | {:.1} |", median(v));
    }
}

//! Ingest throughput and latency, on real sockets over loopback.
//!
//! - decode: batches/s and blocks/s one thread decodes (frame check +
//!   msgpack decode, the listener's per-message work);
//! - shard apply: blocks/s one thread converts and applies to the real
//!   `Index` (a shard's per-batch work);
//! - pipeline: one listener thread and one shard fed by one publisher as
//!   fast as it can send, applying to an `Index`, timed until every block
//!   has been applied;
//! - latency: publish one batch, spin until the index has applied it.
//!
//! Run: `cargo bench --bench ingest` (set `INGEST_BENCH_QUICK=1` for a
//! short run).

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kv_indexer::index::{Index, IndexConfig};
use kv_indexer::ingest::{EventSink, Ingest, IngestConfig, ListenerSpec};
use kv_indexer::wire::{decode_payload, split_frames, SkipCounters, WorkerConverter};
use kv_indexer::{Event, StorageTier, WorkerId};
use support::publisher::{Encoding, HashForm, PublisherConfig, TestEvent, TestPublisher};

const BLOCK_SIZE: u32 = 16;
const EVENTS_PER_BATCH: usize = 4;
const BLOCKS_PER_STORE: usize = 4;

/// Applies to a real index and counts the blocks it stored.
struct CountingSink {
    index: Index,
    blocks_stored: AtomicU64,
    events: AtomicU64,
}

impl CountingSink {
    fn new() -> Self {
        let index = Index::new(IndexConfig::new(BLOCK_SIZE));
        Self { index, blocks_stored: AtomicU64::new(0), events: AtomicU64::new(0) }
    }
}

impl EventSink for CountingSink {
    fn apply(&self, event: &Event) {
        let outcome = self.index.apply(event);
        self.blocks_stored.fetch_add(u64::from(outcome.stored), Ordering::Relaxed);
        self.events.fetch_add(1, Ordering::Relaxed);
    }
    fn remove_worker(&self, worker: WorkerId) {
        self.index.remove_worker(worker);
    }
}

fn publisher(encoding: Encoding, ring: Option<usize>) -> TestPublisher {
    TestPublisher::new(PublisherConfig {
        encoding,
        hash_form: HashForm::Uint,
        block_size: BLOCK_SIZE,
        ring_capacity: ring,
        ..PublisherConfig::default()
    })
}

/// A batch of chained stores: `EVENTS_PER_BATCH` stores of `BLOCKS_PER_STORE` blocks.
fn store_batch(p: &mut TestPublisher, parent: &mut Option<u64>) -> Vec<TestEvent> {
    (0..EVENTS_PER_BATCH)
        .map(|_| {
            let e = p.new_store(StorageTier::Device, *parent, BLOCKS_PER_STORE);
            if let TestEvent::Stored { hashes, .. } = &e {
                *parent = hashes.last().copied();
            }
            e
        })
        .collect()
}

fn frames_of(p: &mut TestPublisher, n: usize) -> Vec<Vec<Vec<u8>>> {
    let mut parent = None;
    (0..n)
        .map(|seq| {
            if seq % 64 == 0 {
                parent = None;
            }
            let events = store_batch(p, &mut parent);
            let payload = p.encode_batch(&events);
            vec![b"kv".to_vec(), (seq as u64).to_be_bytes().to_vec(), payload]
        })
        .collect()
}

fn rate(count: f64, elapsed: Duration) -> String {
    let per_s = count / elapsed.as_secs_f64();
    if per_s >= 1e6 {
        format!("{:.2} M/s", per_s / 1e6)
    } else {
        format!("{:.1} k/s", per_s / 1e3)
    }
}

fn bench_decode_and_apply(batches: usize) {
    let blocks_per_batch = (EVENTS_PER_BATCH * BLOCKS_PER_STORE) as f64;
    for encoding in [Encoding::Tagged, Encoding::Positional] {
        let mut p = publisher(encoding, None);
        let messages = frames_of(&mut p, batches);
        let start = Instant::now();
        let mut decoded = Vec::with_capacity(batches);
        for frames in &messages {
            let (_, payload) = split_frames(frames).expect("frames");
            decoded.push(decode_payload(payload).expect("payload"));
        }
        let elapsed = start.elapsed();
        println!(
            "decode  {encoding:?}: {batches} batches in {elapsed:.2?}: {} batches, {} blocks",
            rate(batches as f64, elapsed),
            rate(batches as f64 * blocks_per_batch, elapsed)
        );

        let sink = CountingSink::new();
        let skips = SkipCounters::default();
        let mut converter = WorkerConverter::new(BLOCK_SIZE);
        let worker = WorkerId::new(1, 0);
        let mut out = Vec::new();
        let start = Instant::now();
        for batch in &decoded {
            out.clear();
            converter.convert(worker, &batch.events, &mut out, &skips, &|_, _| {});
            for e in &out {
                sink.apply(e);
            }
        }
        let elapsed = start.elapsed();
        let blocks = sink.blocks_stored.load(Ordering::Relaxed);
        assert_eq!(blocks as f64, batches as f64 * blocks_per_batch, "blocks lost in conversion");
        println!("shard   {encoding:?}: convert + apply to an Index: {} blocks", rate(blocks as f64, elapsed));
    }
}

fn start_pipeline(sink: &Arc<CountingSink>, p: &mut TestPublisher) -> Ingest {
    let ingest =
        Ingest::start(IngestConfig { listener_threads: 1, shard_threads: 1, ..IngestConfig::default() }).unwrap();
    ingest
        .add_listener(ListenerSpec {
            worker: WorkerId::new(1, 0),
            endpoint: p.endpoint.clone(),
            replay_endpoint: p.replay_endpoint.clone(),
            block_size: BLOCK_SIZE,
            sink: sink.clone() as Arc<dyn EventSink>,
        })
        .unwrap();
    assert!(p.wait_subscribed(1));
    ingest
}

fn bench_pipeline(batches: usize) {
    let mut p = publisher(Encoding::Tagged, None);
    let sink = Arc::new(CountingSink::new());
    let ingest = start_pipeline(&sink, &mut p);
    // Encoded up front so the publisher's own work is only the send.
    let messages = frames_of(&mut p, batches);
    let want = (batches * EVENTS_PER_BATCH * BLOCKS_PER_STORE) as u64;
    let start = Instant::now();
    for frames in messages {
        p.send_raw(frames);
    }
    let deadline = start + Duration::from_secs(120);
    // Sleeping, not spinning: on a small machine a spinning waiter steals
    // the core the pipeline runs on.
    while sink.blocks_stored.load(Ordering::Relaxed) < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(200));
    }
    let elapsed = start.elapsed();
    let got = sink.blocks_stored.load(Ordering::Relaxed);
    let c = ingest.counters();
    println!(
        "pipeline: {batches} batches sent back to back, applied in {elapsed:.2?}: {} batches, {} blocks \
         (blocks {got}/{want}, gaps {}, lost {})",
        rate(batches as f64, elapsed),
        rate(got as f64, elapsed),
        c.gaps_detected,
        c.batches_lost
    );
}

fn bench_latency(samples: usize) {
    let mut p = publisher(Encoding::Tagged, None);
    let sink = Arc::new(CountingSink::new());
    let _ingest = start_pipeline(&sink, &mut p);
    let mut lat = Vec::with_capacity(samples);
    let mut parent = None;
    for i in 0..samples {
        if i % 64 == 0 {
            parent = None;
        }
        let events = store_batch(&mut p, &mut parent);
        let before = sink.events.load(Ordering::Relaxed);
        let start = Instant::now();
        p.publish(events);
        let deadline = start + Duration::from_secs(5);
        while sink.events.load(Ordering::Relaxed) < before + EVENTS_PER_BATCH as u64 {
            if Instant::now() > deadline {
                panic!("batch {i} never became visible");
            }
            std::thread::yield_now();
        }
        lat.push(start.elapsed());
    }
    lat.sort();
    let pct = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize];
    println!(
        "latency publish -> applied to the index ({samples} samples, idle pipeline): p50 {:.1?} p99 {:.1?} max {:.1?}",
        pct(0.5),
        pct(0.99),
        lat[lat.len() - 1]
    );
}

fn main() {
    let quick = std::env::var_os("INGEST_BENCH_QUICK").is_some();
    let scale = if quick { 1 } else { 10 };
    bench_decode_and_apply(20_000 * scale);
    bench_pipeline(20_000 * scale);
    bench_latency(500 * scale);
}

//! CPU time of the `/query` codec: parse the body, write the response.
//!
//! Cases: an 800-block query (12,800 tokens at block size 16) and a
//! 128-block one (2,048 tokens), each answered with 64 matched workers
//! (32 instances x 2 ranks). Bodies are laid out as Python's `json.dumps`
//! writes them (`", "` separators), token ids uniform in 0..150,000.
//!
//! For scale, each case is also run through a serde_json path shaped like
//! Dynamo's service: a derived request struct, then the response built as
//! nested `HashMap`s and serialized; and the parse alone through the
//! leanest serde parses: `serde_parse_us`, a derived struct borrowing its
//! strings, tokens into a `Vec<u32>`; `serde_raw_us`, the same with the
//! token list kept as a raw value (serde_json checks it and says where it
//! is) and its digits then read straight into a reusable buffer by a plain
//! loop. They are the measure of whether the hand parser of the hot bodies
//! pays.
//!
//! For context, `hash_us` is the next step of a `/query`, the local block
//! hashes of the parsed tokens (not part of the codec).
//!
//! Time is the thread's CPU time (Linux `/proc/thread-self/schedstat`;
//! wall time elsewhere), the median of 15 batches, per operation.
//! Run: `cargo bench --bench http_codec`.

use kv_indexer::hash::{local_hashes_into, seed_for};
use kv_indexer::http::codec::{parse_query, write_query_response};
use kv_indexer::index::{Matches, WorkerMatch};
use kv_indexer::WorkerId;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::hint::black_box;
use std::time::Instant;

const BLOCK_SIZE: u32 = 16;
const BATCHES: usize = 15;
const BATCH_TARGET_NS: u64 = 60_000_000;

/// Nanoseconds this thread has spent on a CPU.
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| {
            static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
            START.get_or_init(Instant::now).elapsed().as_nanos() as u64
        })
}

/// Median CPU ns per call of `f`.
fn measure(mut f: impl FnMut()) -> f64 {
    // Warm up and size a batch to about BATCH_TARGET_NS.
    let t = cpu_ns();
    let mut calls = 0u64;
    while cpu_ns() - t < BATCH_TARGET_NS / 4 {
        f();
        calls += 1;
    }
    let per_batch = (calls * 4).max(1);
    let mut samples: Vec<f64> = (0..BATCHES)
        .map(|_| {
            let t = cpu_ns();
            for _ in 0..per_batch {
                f();
            }
            (cpu_ns() - t) as f64 / per_batch as f64
        })
        .collect();
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[BATCHES / 2]
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn body(blocks: usize, r: &mut Rng) -> Vec<u8> {
    let tokens: Vec<String> = (0..blocks * BLOCK_SIZE as usize).map(|_| (r.next() % 150_000).to_string()).collect();
    format!(
        r#"{{"token_ids": [{}], "model_name": "meta-llama/Llama-3.1-8B-Instruct", "tenant_id": "default"}}"#,
        tokens.join(", ")
    )
    .into_bytes()
}

fn matches(blocks: usize, r: &mut Rng) -> Matches {
    let workers = (0..64u64)
        .map(|i| {
            let device = (r.next() % (blocks as u64 / 2)) as u32;
            let host = device + (r.next() % (blocks as u64 / 4)) as u32;
            let disk = host + (r.next() % (blocks as u64 / 4)) as u32;
            WorkerMatch { worker: WorkerId::new(1_000_000 + i / 2, (i % 2) as u32), device, host, disk }
        })
        .collect();
    Matches { workers }
}

// ---- the serde_json baseline, shaped like Dynamo's service ----

#[derive(Deserialize)]
#[allow(dead_code)]
struct SerdeQuery {
    token_ids: Vec<u32>,
    model_name: String,
    #[serde(default)]
    tenant_id: Option<String>,
    lora_name: Option<String>,
    cache_salt: Option<String>,
}

#[derive(Serialize, Default)]
struct SerdeSummary {
    longest_matched: u32,
    gpu: u32,
    dp: HashMap<String, u32>,
    cpu: u32,
    disk: u32,
}

#[derive(Serialize)]
struct SerdeResponse {
    scores: HashMap<String, HashMap<String, u32>>,
    frequencies: Vec<usize>,
    instances: HashMap<String, SerdeSummary>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct SerdeQueryBorrowed<'a> {
    token_ids: Vec<u32>,
    #[serde(borrow)]
    model_name: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    tenant_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    lora_name: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    cache_salt: Option<std::borrow::Cow<'a, str>>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct SerdeQueryRaw<'a> {
    #[serde(borrow)]
    token_ids: &'a serde_json::value::RawValue,
    #[serde(borrow)]
    model_name: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    tenant_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    lora_name: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    cache_salt: Option<std::borrow::Cow<'a, str>>,
}

/// The raw list's integers into `out`: serde_json has checked the list is
/// JSON, so only digits and separators need telling apart.
fn raw_tokens(raw: &str, out: &mut Vec<u32>) {
    out.clear();
    let mut v: Option<u32> = None;
    for &c in raw.as_bytes() {
        if c.is_ascii_digit() {
            v = Some(v.unwrap_or(0) * 10 + u32::from(c - b'0'));
        } else if let Some(x) = v.take() {
            out.push(x);
        }
    }
}

fn serde_path(body: &[u8], m: &Matches) -> Vec<u8> {
    let req: SerdeQuery = serde_json::from_slice(body).unwrap();
    black_box(&req);
    let mut scores: HashMap<String, HashMap<String, u32>> = HashMap::new();
    let mut instances: HashMap<String, SerdeSummary> = HashMap::new();
    for w in &m.workers {
        let id = w.worker.instance_id.to_string();
        if w.device > 0 {
            scores.entry(id.clone()).or_default().insert(w.worker.dp_rank.to_string(), w.device * BLOCK_SIZE);
        }
        let s = instances.entry(id).or_default();
        s.dp.insert(w.worker.dp_rank.to_string(), w.device * BLOCK_SIZE);
        s.gpu = s.gpu.max(w.device * BLOCK_SIZE);
        s.cpu = s.cpu.max(w.host * BLOCK_SIZE);
        s.disk = s.disk.max(w.disk * BLOCK_SIZE);
        s.longest_matched = s.gpu.max(s.cpu).max(s.disk);
    }
    let resp = SerdeResponse { scores, frequencies: vec![], instances };
    serde_json::to_vec(&serde_json::json!(resp)).unwrap()
}

fn main() {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    println!(
        "case                     body_bytes  parse_us  serde_parse_us  serde_raw_us  write_us  parse+write_us  serde_path_us  ratio  hash_us"
    );
    for blocks in [800usize, 128] {
        let body = body(blocks, &mut r);
        let m = matches(blocks, &mut r);
        let mut tokens: Vec<u32> = Vec::new();
        let mut out: Vec<u8> = Vec::new();

        // Both paths must say the same thing before their speed matters.
        parse_query(&body, &mut tokens).unwrap();
        write_query_response(&mut out, &m, &[], &[], BLOCK_SIZE, tokens.len() / BLOCK_SIZE as usize);
        let ours: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let theirs: serde_json::Value = serde_json::from_slice(&serde_path(&body, &m)).unwrap();
        assert_eq!(ours, theirs);

        let parse = measure(|| {
            let q = parse_query(black_box(&body), &mut tokens).unwrap();
            black_box(q);
        });
        let serde_parse = measure(|| {
            let q: SerdeQueryBorrowed = serde_json::from_slice(black_box(&body)).unwrap();
            black_box(q);
        });
        let serde_raw = measure(|| {
            let q: SerdeQueryRaw = serde_json::from_slice(black_box(&body)).unwrap();
            raw_tokens(q.token_ids.get(), &mut tokens);
            black_box((q, &tokens));
        });
        assert_eq!(tokens.len(), blocks * BLOCK_SIZE as usize);
        let write = measure(|| {
            out.clear();
            write_query_response(&mut out, black_box(&m), &[], &[], BLOCK_SIZE, blocks);
            black_box(&out);
        });
        let both = measure(|| {
            let q = parse_query(black_box(&body), &mut tokens).unwrap();
            black_box(q);
            out.clear();
            write_query_response(&mut out, black_box(&m), &[], &[], BLOCK_SIZE, tokens.len() / 16);
            black_box(&out);
        });
        let serde = measure(|| {
            black_box(serde_path(black_box(&body), &m));
        });
        let mut locals: Vec<u64> = Vec::new();
        let seed = seed_for(None, None);
        let hash = measure(|| {
            locals.clear();
            local_hashes_into(black_box(&tokens), BLOCK_SIZE as usize, seed, &mut locals);
            black_box(&locals);
        });
        println!(
            "{:<24} {:>10}  {:>8.1}  {:>14.1}  {:>12.1}  {:>8.1}  {:>14.1}  {:>13.1}  {:>5.1}x  {:>7.1}",
            format!("{blocks} blocks, 64 workers"),
            body.len(),
            parse / 1e3,
            serde_parse / 1e3,
            serde_raw / 1e3,
            write / 1e3,
            both / 1e3,
            serde / 1e3,
            serde / both,
            hash / 1e3
        );
    }
}

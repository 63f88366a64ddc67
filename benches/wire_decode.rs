//! Decode throughput of engine KV-event batches on one thread.
//!
//! Builds batches shaped like what vLLM and SGLang publish (tagged maps and
//! positional arrays; uint64, int64 and bytes hashes; token ids of realistic
//! magnitude) and measures, per shape, `decode_payload` alone and decode plus
//! `WorkerConverter::convert` (which hashes every block's tokens). Prints
//! batches/s, blocks/s and MB/s of payload.
//!
//! Run: `cargo bench --bench wire_decode` (WIRE_BENCH_MS sets the time per case).

#[path = "../tests/wire_support/mod.rs"]
mod wire_support;

use std::hint::black_box;
use std::time::{Duration, Instant};

use kv_indexer::wire::{decode_payload, split_frames, SkipCounters, WorkerConverter};
use kv_indexer::WorkerId;
use rmp::encode::{write_array_len, write_bin, write_f64, write_map_len, write_nil, write_sint, write_str, write_uint};

const BLOCK_SIZE: u32 = 16;
const MEASURE_MS_DEFAULT: u64 = 1_000;

#[derive(Clone, Copy)]
enum Encoding {
    /// vLLM >= 0.24 / SGLang >= 0.5.20.
    Map,
    /// vLLM <= 0.23.
    Tuple,
}

#[derive(Clone, Copy)]
enum HashForm {
    Uint,
    Signed,
    Bytes,
}

struct Shape {
    name: &'static str,
    encoding: Encoding,
    hashes: HashForm,
    stores: u32,
    blocks_per_store: u32,
    removes: u32,
}

/// A deterministic stream of plausible values (token ids up to a 150k vocabulary).
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn write_hash(b: &mut Vec<u8>, form: HashForm, h: u64) {
    match form {
        HashForm::Uint => {
            write_uint(b, h).unwrap();
        }
        HashForm::Signed => {
            write_sint(b, h as i64).unwrap();
        }
        HashForm::Bytes => {
            let mut bytes = [0x5a; 32];
            bytes[24..].copy_from_slice(&h.to_be_bytes());
            write_bin(b, &bytes).unwrap();
        }
    }
}

fn build(shape: &Shape, g: &mut Gen) -> (Vec<u8>, u64) {
    let mut b = Vec::new();
    write_array_len(&mut b, 3).unwrap();
    write_f64(&mut b, 1.7e9).unwrap();
    write_array_len(&mut b, shape.stores + shape.removes).unwrap();
    let mut blocks = 0u64;
    for _ in 0..shape.stores {
        let n = shape.blocks_per_store;
        blocks += u64::from(n);
        let hashes: Vec<u64> = (0..n).map(|_| g.next() | (1 << 63)).collect();
        let parent = g.next();
        let tokens: Vec<u64> = (0..n * BLOCK_SIZE).map(|_| g.next() % 150_000).collect();
        let field = |b: &mut Vec<u8>, name: &str| {
            if let Encoding::Map = shape.encoding {
                write_str(b, name).unwrap();
            }
        };
        match shape.encoding {
            Encoding::Map => {
                write_map_len(&mut b, 10).unwrap();
                write_str(&mut b, "type").unwrap();
            }
            Encoding::Tuple => {
                write_array_len(&mut b, 12).unwrap();
            }
        }
        write_str(&mut b, "BlockStored").unwrap();
        field(&mut b, "block_hashes");
        write_array_len(&mut b, n).unwrap();
        for &h in &hashes {
            write_hash(&mut b, shape.hashes, h);
        }
        field(&mut b, "parent_block_hash");
        write_hash(&mut b, shape.hashes, parent);
        field(&mut b, "token_ids");
        write_array_len(&mut b, n * BLOCK_SIZE).unwrap();
        for &t in &tokens {
            write_uint(&mut b, t).unwrap();
        }
        field(&mut b, "block_size");
        write_uint(&mut b, u64::from(BLOCK_SIZE)).unwrap();
        field(&mut b, "lora_id");
        write_nil(&mut b).unwrap();
        field(&mut b, "medium");
        write_str(&mut b, "GPU").unwrap();
        field(&mut b, "lora_name");
        write_nil(&mut b).unwrap();
        if let Encoding::Tuple = shape.encoding {
            write_nil(&mut b).unwrap(); // extra_keys
        }
        field(&mut b, "group_idx");
        write_uint(&mut b, 0).unwrap();
        field(&mut b, "kv_cache_spec_kind");
        write_str(&mut b, "full_attention").unwrap();
        if let Encoding::Tuple = shape.encoding {
            write_nil(&mut b).unwrap(); // sliding window
        }
    }
    for _ in 0..shape.removes {
        match shape.encoding {
            Encoding::Map => {
                write_map_len(&mut b, 3).unwrap();
                write_str(&mut b, "type").unwrap();
                write_str(&mut b, "BlockRemoved").unwrap();
                write_str(&mut b, "block_hashes").unwrap();
            }
            Encoding::Tuple => {
                write_array_len(&mut b, 3).unwrap();
                write_str(&mut b, "BlockRemoved").unwrap();
            }
        }
        write_array_len(&mut b, 4).unwrap();
        for _ in 0..4 {
            write_hash(&mut b, shape.hashes, g.next());
        }
        if let Encoding::Map = shape.encoding {
            write_str(&mut b, "medium").unwrap();
        }
        write_str(&mut b, "GPU").unwrap();
        blocks += 4;
    }
    write_uint(&mut b, 0).unwrap();
    (b, blocks)
}

struct Row {
    name: String,
    bytes: f64,
    blocks: f64,
    decode: (f64, f64),
    convert: (f64, f64),
}

/// Rounds each case's time is split into; the best round is reported, which
/// filters out time the thread spent descheduled on a shared machine.
const ROUNDS: u32 = 10;

/// Runs `f` over `payloads` round-robin for about `budget`; returns the best
/// round's batches/s and blocks/s.
fn measure(payloads: &[(Vec<u8>, u64)], budget: Duration, mut f: impl FnMut(&[u8])) -> (f64, f64) {
    // Warm up caches and allocator.
    for (p, _) in payloads {
        f(p);
    }
    let blocks_per_pass: u64 = payloads.iter().map(|(_, n)| n).sum();
    let mut best = (0.0f64, 0.0f64);
    for _ in 0..ROUNDS {
        let start = Instant::now();
        let mut passes = 0u64;
        while start.elapsed() < budget / ROUNDS {
            for (p, _) in payloads {
                f(p);
            }
            passes += 1;
        }
        let secs = start.elapsed().as_secs_f64();
        let rate = (passes * payloads.len() as u64) as f64 / secs;
        if rate > best.0 {
            best = (rate, (passes * blocks_per_pass) as f64 / secs);
        }
    }
    best
}

fn run_case(name: String, payloads: Vec<(Vec<u8>, u64)>, budget: Duration) -> Row {
    let skips = SkipCounters::new();
    let mut conv = WorkerConverter::new(BLOCK_SIZE);
    let worker = WorkerId::new(1, 0);
    let mut out = Vec::new();
    let decode = measure(&payloads, budget, |p| {
        black_box(decode_payload(black_box(p)).unwrap());
    });
    let convert = measure(&payloads, budget, |p| {
        let batch = decode_payload(black_box(p)).unwrap();
        out.clear();
        conv.convert(worker, &batch.events, &mut out, &skips, &|_, _| {});
        black_box(&out);
    });
    let count = payloads.len() as f64;
    Row {
        name,
        bytes: payloads.iter().map(|(p, _)| p.len() as f64).sum::<f64>() / count,
        blocks: payloads.iter().map(|(_, b)| *b as f64).sum::<f64>() / count,
        decode,
        convert,
    }
}

fn main() {
    let budget = Duration::from_millis(
        std::env::var("WIRE_BENCH_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(MEASURE_MS_DEFAULT),
    );
    let shapes = [
        Shape {
            name: "vllm map, prefill 16x32 blk",
            encoding: Encoding::Map,
            hashes: HashForm::Uint,
            stores: 16,
            blocks_per_store: 32,
            removes: 4,
        },
        Shape {
            name: "vllm map, decode step 1x1 blk",
            encoding: Encoding::Map,
            hashes: HashForm::Uint,
            stores: 1,
            blocks_per_store: 1,
            removes: 1,
        },
        Shape {
            name: "vllm map, bytes hashes 16x32",
            encoding: Encoding::Map,
            hashes: HashForm::Bytes,
            stores: 16,
            blocks_per_store: 32,
            removes: 4,
        },
        Shape {
            name: "vllm tuple, prefill 16x32 blk",
            encoding: Encoding::Tuple,
            hashes: HashForm::Uint,
            stores: 16,
            blocks_per_store: 32,
            removes: 4,
        },
        Shape {
            name: "sglang map, int64 64x1 blk",
            encoding: Encoding::Map,
            hashes: HashForm::Signed,
            stores: 64,
            blocks_per_store: 1,
            removes: 8,
        },
    ];
    let mut rows = Vec::new();
    for shape in &shapes {
        let mut g = Gen(0x2545_f491_4f6c_dd1d);
        let payloads: Vec<_> = (0..64).map(|_| build(shape, &mut g)).collect();
        rows.push(run_case(shape.name.to_string(), payloads, budget));
    }
    let captured: Vec<(Vec<u8>, u64)> = wire_support::load_all()
        .iter()
        .flat_map(|f| f.live.iter())
        .map(|m| {
            let (_, payload) = split_frames(m).unwrap();
            let blocks = decode_payload(payload)
                .unwrap()
                .events
                .iter()
                .map(|e| match e {
                    kv_indexer::wire::RawEvent::Stored(s) => s.block_hashes.len() as u64,
                    kv_indexer::wire::RawEvent::Removed(r) => r.block_hashes.len() as u64,
                    _ => 0,
                })
                .sum();
            (payload.to_vec(), blocks)
        })
        .collect();
    rows.push(run_case("captured fixtures (mixed)".into(), captured, budget));

    println!(
        "{:<32} {:>9} {:>7} | {:>12} {:>13} {:>8} | {:>12} {:>13}",
        "batch shape", "bytes", "blocks", "decode b/s", "decode blk/s", "MB/s", "+convert b/s", "+convert blk/s"
    );
    for r in &rows {
        println!(
            "{:<32} {:>9.0} {:>7.0} | {:>12.0} {:>13.0} {:>8.1} | {:>12.0} {:>13.0}",
            r.name,
            r.bytes,
            r.blocks,
            r.decode.0,
            r.decode.1,
            r.decode.0 * r.bytes / 1e6,
            r.convert.0,
            r.convert.1
        );
    }
}

//! Where the index's time goes, without threads: applies a trace
//! workload's op stream (the same as `trace_replay`'s) on one thread and
//! reports nanoseconds per stored, removed and queried block, and the
//! p50 and p99 of whole queries.
//!
//! `cargo bench --bench trace_apply -- [--trace PATH] [--rounds N]` plus the
//! workload options of `trace_replay` (`--help`).

mod trace;

use std::time::Instant;

use kv_indexer::index::{Index, IndexConfig};
use trace::args::{parse, OPTIONS_HELP};
use trace::backend::Backend;
use trace::ours::Ours;
use trace::workload::{generate, OpKind};

const SAMPLE_TRACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/data/sample_trace.jsonl");
const ROUNDS_MAX: usize = 100;

fn main() {
    let help = format!("trace_apply: a trace's op stream applied on one thread\n\n  --rounds N            repetitions [3]\n{OPTIONS_HELP}");
    let mut rounds = 3usize;
    let args = match parse(SAMPLE_TRACE, &help, &mut |name, v| match name {
        "rounds" => {
            rounds = v
                .parse()
                .ok()
                .filter(|n| (1..=ROUNDS_MAX).contains(n))
                .ok_or(format!("--rounds wants 1..={ROUNDS_MAX}"))?;
            Ok(true)
        }
        _ => Ok(false),
    }) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("trace_apply: {e}");
            std::process::exit(2);
        }
    };
    let requests = trace::mooncake::load(&args.trace).unwrap_or_else(|e| {
        eprintln!("trace_apply: {e}");
        std::process::exit(1);
    });
    let wl = generate(&requests, &args.cfg).unwrap_or_else(|e| {
        eprintln!("trace_apply: {e}");
        std::process::exit(1);
    });
    let builder = Ours::new(&wl, 1, args.our_hashes);
    let events: Vec<_> = wl
        .ops
        .iter()
        .enumerate()
        .map(|(i, op)| op.is_event().then(|| builder.build_event(op, &wl, i as u64)))
        .collect();
    let s = &wl.stats;
    println!(
        "trace {}: {} stored, {} removed, {} query blocks ({} block ops)",
        args.trace,
        s.stored_blocks,
        s.removed_blocks,
        s.query_blocks,
        s.block_ops()
    );
    println!("round  store_ns/blk  remove_ns/blk  query_ns/blk  query_p50_us  query_p99_us  block_ops/s  index_B/pair");
    for round in 0..rounds {
        let ix = Index::new(IndexConfig::new(wl.config.block_size as u32));
        let (mut store, mut remove, mut query) = (0f64, 0f64, 0f64);
        let mut each_query: Vec<f64> = Vec::with_capacity(wl.ops.len());
        for (op, event) in wl.ops.iter().zip(&events) {
            let t = Instant::now();
            match op.kind {
                OpKind::Query => {
                    std::hint::black_box(ix.find_matches(&wl.query_locals[op.start..op.start + op.len as usize]));
                    let d = t.elapsed().as_secs_f64();
                    query += d;
                    each_query.push(d);
                }
                OpKind::Stored { .. } => {
                    ix.apply(event.as_ref().expect("built"));
                    store += t.elapsed().as_secs_f64();
                }
                OpKind::Removed => {
                    ix.apply(event.as_ref().expect("built"));
                    remove += t.elapsed().as_secs_f64();
                }
            }
        }
        let st = ix.stats();
        each_query.sort_by(f64::total_cmp);
        let at = |q: f64| each_query.get((each_query.len() as f64 * q) as usize).map_or(0.0, |d| d * 1e6);
        println!(
            "{round:>5}  {:>12.1}  {:>13.1}  {:>12.1}  {:>12.2}  {:>12.2}  {:>10.1}M  {:>12.1}",
            store * 1e9 / s.stored_blocks as f64,
            remove * 1e9 / s.removed_blocks as f64,
            query * 1e9 / s.query_blocks as f64,
            at(0.5),
            at(0.99),
            s.block_ops() as f64 / (store + remove + query) / 1e6,
            st.bytes as f64 / st.pairs.max(1) as f64
        );
    }
}

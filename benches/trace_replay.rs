//! Replays a Mooncake trace through mock engines and kv-indexer's index,
//! sweeping the offered rate, and checks the index against the engines.
//!
//! `cargo bench --bench trace_replay -- [--trace PATH] [--block-size 16]
//! [--workers 64] [--gpu-blocks 16384] [--dup K] [--rates 1M,2M,...]
//! [--json out.json] [--svg out.svg]`; see `--help`. With no argument it
//! runs on the committed sample trace. Exits non-zero when the index
//! disagrees with the engines on any sampled query.

mod trace;

use std::time::Instant;

use serde_json::json;

use trace::args::{parse, CommonArgs, OPTIONS_HELP};
use trace::ours::Ours;
use trace::report::{mib, print_runs, print_workload, rate, run_json, summarize, svg};
use trace::sweep::sweep;
use trace::workload::generate;

/// The committed sample trace, cut from the conversation trace.
const SAMPLE_TRACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/data/sample_trace.jsonl");

const HELP_HEAD: &str = "trace_replay: replay a Mooncake trace through kv-indexer at swept offered rates\n\n";

fn main() {
    let help = format!("{HELP_HEAD}{OPTIONS_HELP}");
    let args = match parse(SAMPLE_TRACE, &help, &mut |_, _| Ok(false)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("trace_replay: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(args) {
        eprintln!("trace_replay: {e}");
        std::process::exit(1);
    }
}

fn run(args: CommonArgs) -> Result<(), String> {
    let requests = trace::mooncake::load(&args.trace)?;
    let requests = trace::mooncake::duplicate(&requests, args.dup)?;
    let t = Instant::now();
    let wl = generate(&requests, &args.cfg)?;
    let gen_s = t.elapsed().as_secs_f64();
    drop(requests);
    print_workload(&args.trace, &wl, gen_s);
    println!(
        "  dup {}, {} hashes, writers {}, readers {}, max lag {} events/worker, {} verify samples",
        args.dup,
        args.our_hashes.as_str(),
        args.writers,
        args.driver.readers,
        args.driver.max_lag_events,
        wl.samples.len()
    );

    let make = || Ours::new(&wl, args.writers, args.our_hashes);
    let mut each = |r: &trace::report::RunRecord| {
        eprintln!(
            "  offered {:>8} -> achieved {:>8} ({:.2}s), p99 {:.1} us, mismatches {}",
            rate(r.stats.offered_ops_per_s),
            rate(r.stats.achieved_ops_per_s),
            r.stats.elapsed_s,
            r.stats.service_ns.p99 as f64 / 1e3,
            r.mismatches
        );
    };
    let runs = sweep(&make, &wl, &args.rates, &args.driver, &mut each);
    print_runs("kv-indexer", &runs);
    let summary = summarize(&runs);
    println!("\nsaturation: {} block ops/s achieved (best of {} runs)", rate(summary.saturation_ops_per_s), runs.len());
    match summary.sustainable.map(|i| &runs[i]) {
        Some(r) => {
            let s = &r.stats;
            println!(
                "highest sustainable offered rate {}: query p50/p99/p999 {:.1}/{:.1}/{:.1} us",
                rate(s.offered_ops_per_s),
                s.service_ns.p50 as f64 / 1e3,
                s.service_ns.p99 as f64 / 1e3,
                s.service_ns.p999 as f64 / 1e3
            );
            let q = &r.quiet_service_ns;
            println!(
                "same lookups on the drained index, one thread, no writers: p50/p99/p999 {:.1}/{:.1}/{:.1} us",
                q.p50 as f64 / 1e3,
                q.p99 as f64 / 1e3,
                q.p999 as f64 / 1e3
            );
            if let Some(m) = r.memory {
                println!(
                    "index: {} live pairs, {} bytes, {:.1} B/pair; RSS before {:.1} MiB, peak {:.1} MiB, after {:.1} MiB",
                    m.pairs,
                    m.bytes,
                    if m.pairs > 0 { m.bytes as f64 / m.pairs as f64 } else { 0.0 },
                    mib(r.rss_before_bytes),
                    mib(r.rss_peak_bytes),
                    mib(r.rss_after_bytes)
                );
            }
        }
        None => println!("no run kept up: lower the rates"),
    }

    if let Some(path) = &args.json {
        let out = json!({
            "trace": args.trace,
            "block_size": args.cfg.block_size,
            "workers": args.cfg.workers,
            "gpu_blocks": args.cfg.gpu_blocks,
            "dup": args.dup,
            "assign": args.cfg.assign.as_str(),
            "decode_us_per_token": args.cfg.decode_us_per_token,
            "decode_events": args.cfg.decode_events,
            "our_hashes": args.our_hashes.as_str(),
            "writers": args.writers,
            "readers": args.driver.readers,
            "max_lag_events": args.driver.max_lag_events,
            "generate_s": gen_s,
            "workload": trace::report::workload_json(&wl.stats),
            "saturation_block_ops_per_s": summary.saturation_ops_per_s,
            "sustainable_run": summary.sustainable,
            "runs": runs.iter().map(run_json).collect::<Vec<_>>(),
        });
        let text = serde_json::to_string_pretty(&out).expect("json");
        std::fs::write(path, text).map_err(|e| format!("cannot write {path}: {e}"))?;
        println!("wrote {path}");
    }
    if let Some(path) = &args.svg {
        let pts = runs.iter().map(|r| (r.stats.offered_ops_per_s, r.stats.achieved_ops_per_s)).collect();
        let title = format!(
            "kv-indexer trace replay: bs {}, {} workers, dup {}",
            args.cfg.block_size, args.cfg.workers, args.dup
        );
        std::fs::write(path, svg(&title, &[("kv-indexer".into(), pts)]))
            .map_err(|e| format!("cannot write {path}: {e}"))?;
        println!("wrote {path}");
    }

    let problems: u64 = runs.iter().map(|r| r.event_problems).sum();
    let mismatches: u64 = runs.iter().map(|r| r.mismatches).sum();
    let pairs_ok = runs.iter().filter_map(|r| r.memory).all(|m| m.pairs == wl.stats.live_pairs_end);
    println!(
        "verification: {} samples a run ({} with a cached prefix), mismatches = {mismatches}, event problems = {problems}, live pairs {}",
        wl.samples.len(),
        runs.first().map_or(0, |r| r.verify_samples_with_hits),
        if pairs_ok { "match the engines" } else { "DIFFER from the engines" }
    );
    if mismatches > 0 || problems > 0 || !pairs_ok {
        return Err("FAILED: the index disagrees with the mock engines (see above)".into());
    }
    Ok(())
}

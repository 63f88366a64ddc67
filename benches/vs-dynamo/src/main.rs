//! Replays one trace workload through kv-indexer and Dynamo's radix tree
//! (each with per-engine and with shared engine hashes) and Dynamo's
//! positional indexer, with the same thread counts, and prints one table
//! with ratios.
//!
//! Every backend runs in a fresh child process (this binary again, with
//! `--backend NAME`), so RSS figures belong to one index each; with
//! `--repeat N` the backends alternate N times and medians are reported. The
//! workload, driver and checks are the trace-replay benchmark's own
//! (`benches/trace`), so every backend sees the identical op stream.

#[path = "../../trace/mod.rs"]
mod trace;

mod dynamo;
mod heap;

#[global_allocator]
static ALLOCATOR: heap::Counting = heap::Counting;

use std::process::Command;

use serde_json::{json, Value};

use trace::args::{parse, CommonArgs, OPTIONS_HELP};
use trace::hashes::EngineHashes;
use trace::ours::Ours;
use trace::report::{print_runs, print_workload, rate, run_json, svg, workload_json};
use trace::sweep::sweep;
use trace::workload::generate;

const SAMPLE_TRACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/sample_trace.jsonl");
const BACKENDS: [&str; 5] =
    ["kv-indexer", "kv-indexer-shared", "dynamo-radix", "dynamo-radix-shared", "dynamo-positional"];
/// Most repetitions of the backend cycle.
const REPEAT_MAX: usize = 50;

const HELP_HEAD: &str = "\
vs-dynamo: the trace-replay workload through kv-indexer and Dynamo's indexers

backends: kv-indexer and dynamo-radix are fed each engine's own hashes (vLLM's
default); kv-indexer-shared and dynamo-radix-shared hashes equal on every engine;
dynamo-positional Dynamo's sequence hashes. Ratios are against the first backend.

extra options:
  --backends LIST       which backends, in order [all: kv-indexer,kv-indexer-shared,
                        dynamo-radix,dynamo-radix-shared,dynamo-positional]
  --repeat N            fresh-process repetitions of each backend [1]
  --backend NAME        run one backend only (one of the above)
  --child-out PATH      (with --backend) where to write that run's JSON
  --heap 1              (with --backend) count heap bytes (slows the run; for memory only)
  --from PATH           print the table of a saved --json result instead of running

";

fn main() {
    let help = format!("{HELP_HEAD}{OPTIONS_HELP}");
    let mut backend = None;
    let mut child_out = None;
    let mut repeat = 1usize;
    let mut from = None;
    let mut heap_child = false;
    let mut backends: Vec<String> = BACKENDS.iter().map(|b| b.to_string()).collect();
    let parsed = parse(SAMPLE_TRACE, &help, &mut |name, v| {
        match name {
            "backend" if BACKENDS.contains(&v) => backend = Some(v.to_string()),
            "backend" => return Err(format!("--backend wants one of {BACKENDS:?}")),
            "backends" => {
                backends = v.split(',').map(|b| b.trim().to_string()).collect();
                if let Some(b) = backends.iter().find(|b| !BACKENDS.contains(&b.as_str())) {
                    return Err(format!("--backends: unknown backend {b:?}; want some of {BACKENDS:?}"));
                }
            }
            "child-out" => child_out = Some(v.to_string()),
            "from" => from = Some(v.to_string()),
            "heap" => heap_child = v == "1",
            "repeat" => {
                repeat = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=REPEAT_MAX).contains(n))
                    .ok_or(format!("--repeat wants 1..={REPEAT_MAX}"))?
            }
            _ => return Ok(false),
        }
        Ok(true)
    });
    if heap_child {
        heap::enable();
        trace::mem::set_heap_probe(heap::live);
    }
    let result = parsed.and_then(|args| match backend {
        Some(b) => child(&b, &args, child_out.as_deref()),
        None if args.raw.iter().any(|a| a == "--our-hashes") => {
            Err("--our-hashes: choose kv-indexer (engine hashes) or kv-indexer-shared with --backends".into())
        }
        None => parent(&args, &backends, repeat, from.as_deref()),
    });
    if let Err(e) = result {
        eprintln!("vs-dynamo: {e}");
        std::process::exit(1);
    }
}

/// Runs one backend's sweep and writes its JSON.
fn child(name: &str, args: &CommonArgs, out: Option<&str>) -> Result<(), String> {
    let requests = trace::mooncake::load(&args.trace)?;
    let requests = trace::mooncake::duplicate(&requests, args.dup)?;
    let t = std::time::Instant::now();
    let wl = generate(&requests, &args.cfg)?;
    let gen_s = t.elapsed().as_secs_f64();
    drop(requests);
    print_workload(&args.trace, &wl, gen_s);
    let mut each = |r: &trace::report::RunRecord| {
        eprintln!(
            "  [{name}] offered {:>8} -> achieved {:>8}, p99 {:.1} us, mismatches {}",
            rate(r.stats.offered_ops_per_s),
            rate(r.stats.achieved_ops_per_s),
            r.stats.service_ns.p99 as f64 / 1e3,
            r.mismatches
        );
    };
    let (w, d, rates) = (args.writers, &args.driver, &args.rates);
    let runs = match name {
        "kv-indexer" => sweep(&|| Ours::new(&wl, w, EngineHashes::Engine), &wl, rates, d, &mut each),
        "kv-indexer-shared" => sweep(&|| Ours::new(&wl, w, EngineHashes::Shared), &wl, rates, d, &mut each),
        "dynamo-radix" => sweep(&|| dynamo::radix(&wl, w), &wl, rates, d, &mut each),
        "dynamo-radix-shared" => sweep(&|| dynamo::radix_shared(&wl, w), &wl, rates, d, &mut each),
        _ => sweep(&|| dynamo::positional(&wl, w), &wl, rates, d, &mut each),
    };
    print_runs(name, &runs);
    let out_json = json!({
        "backend": name,
        "workload": workload_json(&wl.stats),
        "generate_s": gen_s,
        "runs": runs.iter().map(run_json).collect::<Vec<_>>(),
    });
    if let Some(path) = out {
        std::fs::write(path, out_json.to_string()).map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

fn spawn(args: &CommonArgs, name: &str, rep: usize, extra: &[&str]) -> Result<Value, String> {
    let out = std::env::temp_dir().join(format!("vs-dynamo-{}-{name}-{rep}.json", std::process::id()));
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let status = Command::new(exe)
        .args(&args.raw)
        .args(extra)
        .args(["--backend", name, "--child-out"])
        .arg(&out)
        .status()
        .map_err(|e| format!("cannot start child for {name}: {e}"))?;
    if !status.success() {
        return Err(format!("child for {name} failed: {status}"));
    }
    let text = std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let _ = std::fs::remove_file(&out);
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

fn f(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(0.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Per-backend figures of one repetition.
struct Figures {
    saturation: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    /// Index bytes per live pair from the index's own accounting (ours only).
    index_bytes_per_pair: Option<f64>,
    /// (RSS after drain - RSS before the index) per live pair.
    rss_bytes_per_pair: f64,
    rss_peak_mib: f64,
    mismatches: u64,
}

fn figures(v: &Value, common_rate: Option<f64>, live_pairs: f64) -> Figures {
    let runs = v["runs"].as_array().cloned().unwrap_or_default();
    let saturation = runs.iter().map(|r| f(r, "achieved_block_ops_per_s")).fold(0.0, f64::max);
    let at =
        common_rate.and_then(|rate| runs.iter().find(|r| (f(r, "offered_block_ops_per_s") - rate).abs() < 1e-6 * rate));
    let lat = |k: &str| at.map_or(0.0, |r| r["query_service_ns"][k].as_f64().unwrap_or(0.0) / 1e3);
    let mem_run = at.or(runs.first());
    let (idx_bpp, rss_bpp, peak) = mem_run.map_or((None, 0.0, 0.0), |r| {
        let bytes = r["index_bytes"].as_f64().filter(|b| *b > 0.0);
        let delta = f(r, "rss_after_bytes") - f(r, "rss_before_bytes");
        (bytes.map(|b| b / live_pairs.max(1.0)), delta / live_pairs.max(1.0), f(r, "rss_peak_bytes") / (1 << 20) as f64)
    });
    Figures {
        saturation,
        p50_us: lat("p50"),
        p99_us: lat("p99"),
        p999_us: lat("p999"),
        index_bytes_per_pair: idx_bpp,
        rss_bytes_per_pair: rss_bpp,
        rss_peak_mib: peak,
        mismatches: runs.iter().map(|r| r["mismatches"].as_u64().unwrap_or(0)).sum(),
    }
}

/// The offered rate at which latencies are compared in one repetition: the
/// highest rate every backend sustained that is at most half the lowest
/// saturation (a comfortable load for all, as Dynamo's bench advises), else
/// the highest rate every backend sustained.
fn comparison_rate(results: &[Value]) -> Option<f64> {
    let runs = |v: &Value| v["runs"].as_array().cloned().unwrap_or_default();
    let sets: Vec<Vec<f64>> = results
        .iter()
        .map(|v| {
            runs(v)
                .iter()
                .filter(|r| r["sustainable"].as_bool() == Some(true))
                .map(|r| f(r, "offered_block_ops_per_s"))
                .collect()
        })
        .collect();
    let common: Vec<f64> =
        sets[0].iter().copied().filter(|r| sets.iter().all(|s| s.iter().any(|x| (x - r).abs() < 1e-6 * r))).collect();
    let lowest_saturation = results
        .iter()
        .map(|v| runs(v).iter().map(|r| f(r, "achieved_block_ops_per_s")).fold(0.0, f64::max))
        .fold(f64::INFINITY, f64::min);
    let highest =
        |it: &mut dyn Iterator<Item = f64>| it.fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
    highest(&mut common.iter().copied().filter(|r| *r <= 0.5 * lowest_saturation))
        .or_else(|| highest(&mut common.iter().copied()))
}

fn parent(args: &CommonArgs, backends: &[String], repeat: usize, from: Option<&str>) -> Result<(), String> {
    let per_rep: Vec<Vec<Value>> = match from {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
            let saved: Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
            serde_json::from_value(saved["results"].clone()).map_err(|e| format!("{path}: no results: {e}"))?
        }
        None => {
            let mut per_rep = Vec::new();
            for rep in 0..repeat {
                let mut results = Vec::new();
                for name in backends {
                    eprintln!("== repetition {}/{repeat}: {name}", rep + 1);
                    results.push(spawn(args, name, rep, &[])?);
                }
                per_rep.push(results);
            }
            per_rep
        }
    };
    // One more child per backend counts heap bytes; its timing is not used,
    // so it replays as fast as the backend can.
    let heap: Vec<Value> = match from {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
            let saved: Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
            saved["heap"].as_array().cloned().unwrap_or_default()
        }
        None => {
            let mut heap = Vec::new();
            for name in backends {
                eprintln!("== heap count: {name}");
                let extra = ["--rates", "1G", "--verify-samples", "100", "--heap", "1"];
                heap.push(spawn(args, name, usize::MAX, &extra)?);
            }
            heap
        }
    };
    let heap_bytes = |i: usize| heap.get(i).and_then(|v| v["runs"][0]["heap_bytes"].as_f64());
    let names: Vec<String> = match per_rep.first() {
        Some(first) => first.iter().map(|v| v["backend"].as_str().unwrap_or("?").to_string()).collect(),
        None => return Err("no repetition to report".into()),
    };
    if per_rep.iter().any(|r| r.len() != names.len()) {
        return Err(format!("expected {} backends in every repetition", names.len()));
    }
    let repeat = per_rep.len();
    let live_pairs = f(&per_rep[0][0]["workload"], "live_pairs_end");
    let mut rows: Vec<Vec<Figures>> = (0..names.len()).map(|_| Vec::new()).collect();
    let mut common_rates = Vec::new();
    for results in &per_rep {
        let common = comparison_rate(results);
        common_rates.push(common);
        for (i, v) in results.iter().enumerate() {
            rows[i].push(figures(v, common, live_pairs));
        }
    }
    let med = |i: usize, g: &dyn Fn(&Figures) -> f64| median(rows[i].iter().map(g).collect());
    // Latencies exist only in repetitions that had a comparison rate.
    let med_lat = |i: usize, g: &dyn Fn(&Figures) -> f64| median(rows[i].iter().map(g).filter(|v| *v > 0.0).collect());
    let ours_sat = med(0, &|x| x.saturation);
    let ours_p50 = med_lat(0, &|x| x.p50_us);
    let ours_p99 = med_lat(0, &|x| x.p99_us);
    let ours_rss = med(0, &|x| x.rss_bytes_per_pair);

    let w = &per_rep[0][0]["workload"];
    println!(
        "\nworkload: {} requests, {} query blocks, {} stored, {} removed, {} block ops, {} live pairs at end",
        w["requests"], w["query_blocks"], w["stored_blocks"], w["removed_blocks"], w["block_ops"], w["live_pairs_end"]
    );
    let options = match from {
        Some(path) => format!("as saved in {path}"),
        None => format!("{} writers, {} readers, {}", args.writers, args.driver.readers, args.raw.join(" ")),
    };
    println!(
        "options: {options}; {repeat} repetition(s); latencies at (per repetition): {}",
        common_rates.iter().map(|r| r.map_or("none".into(), rate)).collect::<Vec<_>>().join(", ")
    );
    println!(
        "\n{:<19} {:>11} {:>7} {:>8} {:>8} {:>8} {:>7} {:>7} {:>10} {:>11} {:>11} {:>9} {:>6}",
        "backend",
        "sat ops/s",
        "ours/x",
        "p50_us",
        "p99_us",
        "p999_us",
        "x/ours",
        "x/ours",
        "idx B/pair",
        "heap B/pair",
        "RSS B/pair",
        "peak MiB",
        "mism"
    );
    println!("{:<19} {:>11} {:>7} {:>8} {:>8} {:>8} {:>7} {:>7}", "", "", "", "", "", "", "p50", "p99");
    let mut summary = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let sat = med(i, &|x| x.saturation);
        let p50 = med_lat(i, &|x| x.p50_us);
        let p99 = med_lat(i, &|x| x.p99_us);
        let p999 = med_lat(i, &|x| x.p999_us);
        let rss = med(i, &|x| x.rss_bytes_per_pair);
        let idx = rows[i][0].index_bytes_per_pair;
        let heap_bpp = heap_bytes(i).map(|b| b / live_pairs.max(1.0));
        let peak = med(i, &|x| x.rss_peak_mib);
        let mism: u64 = rows[i].iter().map(|x| x.mismatches).sum();
        println!(
            "{:<19} {:>11} {:>7.2} {:>8.1} {:>8.1} {:>8.1} {:>7.2} {:>7.2} {:>10} {:>11} {:>11.1} {:>9.1} {:>6}",
            name,
            rate(sat),
            ours_sat / sat,
            p50,
            p99,
            p999,
            p50 / ours_p50,
            p99 / ours_p99,
            idx.map_or("-".into(), |b| format!("{b:.1}")),
            heap_bpp.map_or("-".into(), |b| format!("{b:.1}")),
            rss,
            peak,
            mism
        );
        summary.push(json!({
            "backend": name, "saturation_block_ops_per_s": sat, "saturation_ratio_ours_over": ours_sat / sat,
            "query_p50_us": p50, "query_p99_us": p99, "query_p999_us": p999,
            "index_bytes_per_pair": idx, "heap_bytes_per_pair": heap_bpp, "rss_bytes_per_pair": rss,
            "rss_ratio_over_ours": rss / ours_rss, "rss_peak_mib": peak, "mismatches": mism,
        }));
    }
    println!(
        "(ours/x: our saturation over theirs; x/ours: their latency over ours; medians over repetitions;\n \
         idx: the index's own accounting; heap: heap bytes held after draining, counted by the allocator;\n \
         RSS: resident growth over the run, skewed by pages the allocator reuses)"
    );

    if let Some(path) = &args.json {
        let out = json!({
            "trace": args.trace, "writers": args.writers, "readers": args.driver.readers,
            "options": args.raw, "repeat": repeat,
            "comparison_rates": common_rates,
            "summary": summary, "results": per_rep, "heap": heap,
        });
        std::fs::write(path, serde_json::to_string_pretty(&out).expect("json")).map_err(|e| format!("{path}: {e}"))?;
        println!("wrote {path}");
    }
    if let Some(path) = &args.svg {
        let series: Vec<(String, Vec<(f64, f64)>)> = per_rep[0]
            .iter()
            .map(|v| {
                let pts = v["runs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|r| (f(r, "offered_block_ops_per_s"), f(r, "achieved_block_ops_per_s")))
                    .collect();
                (v["backend"].as_str().unwrap_or("?").to_string(), pts)
            })
            .collect();
        let title =
            format!("trace replay: kv-indexer vs Dynamo ({} writers, {} readers)", args.writers, args.driver.readers);
        std::fs::write(path, svg(&title, &series)).map_err(|e| format!("{path}: {e}"))?;
        println!("wrote {path}");
    }
    Ok(())
}

//! Soak: the real daemon (release build) for minutes under engines that
//! publish a steady cache workload and HTTP clients that query over
//! keep-alive connections. Every interval it prints errors (non-2xx on a
//! valid request, transport failures, undecodable answers, failed
//! listeners, daemon ERROR lines), queries/s with p50/p99 of that window,
//! the daemon's RSS and the index's pairs. At the end: p99 and RSS drift,
//! a check that answers match what each engine caches, and a verdict.
//!
//! Run: `cargo bench --bench soak -- --seconds 300 [--engines 16 --clients 8]`
//! (more: `--interval 10 --engine-rate 20 --client-rate 250 --capacity 2048
//! --daemon-args "--max-pairs 100000"`). Not part of CI.

#[path = "soak/client.rs"]
mod client;
#[path = "soak/daemon.rs"]
mod daemon;
#[path = "soak/engine.rs"]
mod engine;
#[path = "soak/workload.rs"]
mod workload;

use daemon::{metric, sample, Daemon};
use engine::{Engine, EngineConfig};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use workload::{Rng, Workload};

const MODEL: &str = "soak";
/// Longest wait for the daemon to apply every published batch at the end.
const DRAIN_WAIT_MS: u64 = 60_000;
/// Chains per engine the final check compares.
const CHECKS_PER_ENGINE: usize = 200;

struct Args {
    seconds: u64,
    engines: u64,
    clients: u64,
    interval_s: u64,
    engine_rate: f64,
    client_rate: f64,
    capacity: usize,
    daemon_args: Vec<String>,
}

fn parse_args() -> Result<Args, String> {
    use lexopt::prelude::*;
    let mut a = Args {
        seconds: 300,
        engines: 16,
        clients: 8,
        interval_s: 10,
        engine_rate: 20.0,
        client_rate: 250.0,
        capacity: 2048,
        daemon_args: Vec::new(),
    };
    let mut p = lexopt::Parser::from_env();
    while let Some(arg) = p.next().map_err(|e| e.to_string())? {
        let name = match arg {
            Long(l) => l.to_string(),
            other => return Err(format!("unexpected argument {other:?}")),
        };
        if name == "bench" {
            continue; // cargo bench passes it
        }
        let v = p.value().map_err(|e| e.to_string())?.into_string().map_err(|_| format!("--{name}: not UTF-8"))?;
        let num =
            || v.parse::<f64>().ok().filter(|n| *n >= 0.0).ok_or(format!("--{name}: expected a number, got {v:?}"));
        match name.as_str() {
            "seconds" => a.seconds = num()?.max(1.0) as u64,
            "engines" => a.engines = num()?.clamp(1.0, 1024.0) as u64,
            "clients" => a.clients = num()?.clamp(1.0, 1024.0) as u64,
            "interval" => a.interval_s = num()?.max(1.0) as u64,
            "engine-rate" => a.engine_rate = num()?.max(0.1),
            "client-rate" => a.client_rate = num()?,
            "capacity" => a.capacity = num()?.max(128.0) as usize,
            "daemon-args" => a.daemon_args = v.split_whitespace().map(str::to_string).collect(),
            _ => return Err(format!("unknown option --{name}")),
        }
    }
    Ok(a)
}

fn percentile(sorted: &[u32], q: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn get(base: &str, path: &str) -> Result<String, String> {
    ureq::get(&format!("{base}{path}"))
        .timeout(Duration::from_secs(10))
        .call()
        .map_err(|e| e.to_string())?
        .into_string()
        .map_err(|e| e.to_string())
}

/// One interval's figures.
struct Window {
    qps: f64,
    p50_us: u32,
    p99_us: u32,
    rss: u64,
}

fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("soak: {e}");
        std::process::exit(2);
    });
    let w = Workload { block_size: 16, docs: 4_000, families: 64, shared_blocks: 8, doc_blocks_max: 64 };
    let d = Daemon::start(env!("CARGO_BIN_EXE_kv-indexer"), &args.daemon_args);
    println!(
        "soak: {} s, {} engines x {}/s (cache {} blocks), {} clients x {}, daemon {} {}",
        args.seconds,
        args.engines,
        args.engine_rate,
        args.capacity,
        args.clients,
        if args.client_rate > 0.0 { format!("{}/s", args.client_rate) } else { "back to back".into() },
        d.base,
        args.daemon_args.join(" ")
    );

    // Engines bind, register and wait for the daemon's subscription.
    let stop_engines = Arc::new(AtomicBool::new(false));
    let mut engine_threads = Vec::new();
    let mut published = Vec::new();
    for i in 1..=args.engines {
        let cfg = EngineConfig {
            instance: i,
            capacity_blocks: args.capacity,
            requests_per_s: args.engine_rate,
            clear_every: 5_000,
        };
        let mut e = Engine::bind(cfg, w);
        let body = serde_json::json!({"instance_id": i, "endpoint": e.endpoint, "model_name": MODEL, "block_size": w.block_size});
        let res = ureq::post(&format!("{}/register", d.base)).send_string(&body.to_string());
        assert!(res.is_ok(), "registering engine {i}: {res:?}");
        assert!(e.wait_subscribed(), "engine {i} got no subscription");
        published.push(e.published.clone());
        let stop = stop_engines.clone();
        engine_threads.push(std::thread::spawn(move || {
            e.run(&stop);
            e
        }));
    }

    let stop_clients = Arc::new(AtomicBool::new(false));
    let stats: Vec<Arc<client::ClientStats>> = (0..args.clients).map(|_| Arc::default()).collect();
    let client_threads: Vec<_> = stats
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let (s, stop, base, rate) = (s.clone(), stop_clients.clone(), d.base.clone(), args.client_rate);
            std::thread::spawn(move || client::run(&base, MODEL, w, 1_000 + i as u64, rate, &s, &stop))
        })
        .collect();

    let started = Instant::now();
    let mut windows: Vec<Window> = Vec::new();
    let mut errors_total = 0u64;
    let mut queries_total = 0u64;
    let mut last_queries = 0u64;
    let mut peak_rss = 0u64;
    let mut scrape_errors = 0u64;
    let mut window_start = Instant::now();
    while started.elapsed() < Duration::from_secs(args.seconds) {
        let left = Duration::from_secs(args.seconds).saturating_sub(started.elapsed());
        std::thread::sleep(left.min(Duration::from_secs(args.interval_s)));
        let elapsed_window = window_start.elapsed().as_secs_f64();
        window_start = Instant::now();
        let mut samples: Vec<u32> = Vec::new();
        for s in &stats {
            samples.append(&mut s.samples_us.lock());
        }
        samples.sort_unstable();
        let queries: u64 = stats.iter().map(|s| s.queries.load(Ordering::Relaxed)).sum();
        let client_errors: u64 = stats.iter().map(|s| s.errors.load(Ordering::Relaxed)).sum();
        let text = get(&d.base, "/metrics").unwrap_or_else(|_| {
            scrape_errors += 1;
            String::new()
        });
        let failed_listeners = sample(&text, "dynamo_kvindexer_listeners{status=\"failed\"}").unwrap_or(0.0) as u64;
        let daemon_errors = d.log.errors.load(Ordering::Relaxed);
        errors_total = client_errors + scrape_errors + failed_listeners + daemon_errors;
        let rss = d.rss_bytes();
        peak_rss = peak_rss.max(rss);
        let pub_total: u64 = published.iter().map(|p| p.load(Ordering::Relaxed)).sum();
        let win = Window {
            qps: (queries - last_queries) as f64 / elapsed_window,
            p50_us: percentile(&samples, 0.50),
            p99_us: percentile(&samples, 0.99),
            rss,
        };
        println!(
            "[{:>4} s] errors {} | {:>7.0} q/s  p50 {:>5} us  p99 {:>6} us | rss {:>7.1} MiB | pairs {:>8} entries {:>8} index {:.1} MiB shed {} | batches {} applied {}",
            started.elapsed().as_secs(),
            errors_total,
            win.qps,
            win.p50_us,
            win.p99_us,
            mib(rss),
            metric(&text, "kv_indexer_pairs").unwrap_or(-1.0),
            metric(&text, "kv_indexer_entries").unwrap_or(-1.0),
            mib(metric(&text, "kv_indexer_index_bytes").unwrap_or(0.0) as u64),
            sample(&text, "kv_indexer_blocks_total{outcome=\"shed\"}").unwrap_or(0.0),
            pub_total,
            metric(&text, "kv_indexer_batches_applied_total").unwrap_or(-1.0),
        );
        last_queries = queries;
        queries_total = queries;
        windows.push(win);
    }

    stop_clients.store(true, Ordering::Relaxed);
    for t in client_threads {
        let _ = t.join();
    }
    stop_engines.store(true, Ordering::Relaxed);
    let engines: Vec<Engine> = engine_threads.into_iter().map(|t| t.join().expect("engine thread")).collect();

    // Drain, then compare answers with what each engine caches.
    let pub_total: u64 = published.iter().map(|p| p.load(Ordering::Relaxed)).sum();
    let deadline = Instant::now() + Duration::from_millis(DRAIN_WAIT_MS);
    let mut applied = 0.0;
    while Instant::now() < deadline {
        applied =
            get(&d.base, "/metrics").ok().and_then(|t| metric(&t, "kv_indexer_batches_applied_total")).unwrap_or(0.0);
        if applied as u64 >= pub_total {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let drained = applied as u64 >= pub_total;
    let text = get(&d.base, "/metrics").unwrap_or_default();
    let shed = sample(&text, "kv_indexer_blocks_total{outcome=\"shed\"}").unwrap_or(0.0) as u64;
    let (mut compared, mut wrong, mut overclaimed) = (0u64, 0u64, 0u64);
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(10)).build();
    let mut rng = Rng::new(99);
    let mut tokens = Vec::new();
    for e in &engines {
        for _ in 0..CHECKS_PER_ENGINE {
            let doc = w.pick_doc(&mut rng);
            let blocks = w.doc_len(doc);
            w.prompt(doc, blocks, 0, &mut tokens);
            let body = serde_json::json!({"model_name": MODEL, "token_ids": tokens});
            let v: serde_json::Value = match agent.post(&format!("{}/query", d.base)).send_json(body) {
                Ok(r) => r.into_json().unwrap_or_default(),
                Err(_) => serde_json::Value::Null,
            };
            let got = v["scores"][e.cfg.instance.to_string()]["0"].as_u64().unwrap_or(0) / w.block_size as u64;
            let want = e.cached_prefix(doc, blocks) as u64;
            compared += 1;
            // Shedding may under-report; nothing may over-report.
            if got > want {
                overclaimed += 1;
            } else if got != want && shed == 0 {
                wrong += 1;
            }
        }
    }
    let daemon_log = d.log.clone();
    let exit = d.terminate();

    let first = windows.first().expect("at least one window");
    let last = windows.last().expect("at least one window");
    // RSS after warm-up: the window a third of the way in, when caches are full.
    let settled = &windows[windows.len() / 3];
    let drift = |a: f64, b: f64| if a > 0.0 { (b - a) / a * 100.0 } else { 0.0 };
    let p99_drift = drift(first.p99_us as f64, last.p99_us as f64);
    // One window's p99 swings with whatever else the machine runs: judge drift
    // on the median window p99 of the last third against the first third.
    let third = (windows.len() / 3).max(1);
    let median_p99 = |ws: &[_]| {
        let mut v: Vec<u32> = ws.iter().map(|w: &Window| w.p99_us).collect();
        v.sort_unstable();
        v[v.len() / 2]
    };
    let (early_p99, late_p99) = (median_p99(&windows[..third]), median_p99(&windows[windows.len() - third..]));
    let rss_drift = drift(first.rss as f64, last.rss as f64);
    let rss_settled_drift = drift(settled.rss as f64, last.rss as f64);
    let errors = errors_total + (!drained) as u64 + wrong + overclaimed + (exit != Some(0)) as u64;
    println!(
        "summary: {} s, {} queries ({:.0}/s), {} batches published, drained {drained}, exit {exit:?}",
        args.seconds,
        queries_total,
        queries_total as f64 / args.seconds as f64,
        pub_total
    );
    println!("p99 first window {} us, last {} us: drift {p99_drift:+.1}%", first.p99_us, last.p99_us);
    println!("p99 median of window p99s, first third {early_p99} us, last third {late_p99} us");
    println!(
        "rss first window {:.1} MiB, after warm-up {:.1} MiB, last {:.1} MiB, peak {:.1} MiB: drift {rss_drift:+.1}% ({rss_settled_drift:+.1}% after warm-up)",
        mib(first.rss),
        mib(settled.rss),
        mib(last.rss),
        mib(peak_rss)
    );
    println!(
        "final check: {compared} chains compared with the engines' caches, {wrong} differ, {overclaimed} over-claimed"
    );
    for s in &stats {
        for m in s.messages.lock().iter() {
            println!("client error: {m}");
        }
    }
    for l in daemon_log.notable.lock().iter() {
        println!("daemon: {l}");
    }
    let p99_ok = late_p99 as f64 <= 2.0 * early_p99.max(100) as f64;
    let rss_ok = rss_settled_drift <= 10.0;
    let verdict = if errors == 0 && p99_ok && rss_ok { "PASS" } else { "FAIL" };
    println!(
        "verdict: {verdict} (errors {errors}; median p99 late <= 2x early: {p99_ok}; RSS growth after warm-up <= 10%: {rss_ok})"
    );
    if verdict != "PASS" {
        std::process::exit(1);
    }
}

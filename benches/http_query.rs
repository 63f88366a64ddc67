//! `/query` over loopback HTTP: queries/s, p50/p99 latency and the server's
//! CPU time per query, for our daemon and (optionally) Dynamo's standalone
//! indexer on the same state.
//!
//! For each server in turn: start it pinned to one core (`taskset -c 1`;
//! the bench itself runs on core 0), register 2 x 64 engines (one ZMQ
//! publisher per worker, in this process), publish the two workloads'
//! state through ZMQ (see `http_query/workloads.rs`), wait until the server
//! shows a sentinel block on every worker, then measure each cell:
//! workload (trace prompts, 128-block prompts) x load (idle, or while a
//! publisher thread streams Stored/Removed events at `--ingest-rate`
//! blocks/s) x 1, 8 and 64 keep-alive clients. The event streams and
//! queries are deterministic, so both servers hold the same state; the
//! bench checks that by comparing their answers to the same sample queries.
//!
//! After each workload's cells, the churn runs alone for a window (no
//! queries) to read the server's CPU per ingested block. Before each
//! repeat, the server sits idle for a window (engines registered and
//! connected, nothing published, no queries) to read its idle CPU.
//!
//! Server CPU per query is utime+stime of the server process over the
//! measured window divided by the replies completed in it (10 ms ticks;
//! windows are seconds long). Under ingest it includes applying events.
//! The client is one thread polling all connections; its own CPU per query
//! is shown separately.
//!
//! With `--ingest-only --together` both servers run at once, fed by the
//! same engines, and each window reads both servers' CPU: load from other
//! jobs on the machine then falls on both alike, so their ratio is steadier
//! than across windows taken one server after the other.
//!
//! Run: `cargo bench --bench http_query -- [--dynamo PATH/dynamo-indexer]
//! [--secs 3] [--repeats 3] [--clients 1,8,64] [--ingest-rate 32000]
//! [--only trace|synthetic] [--ingest-only [--together]] [--json PATH] [--trace PATH]`, or against a running server:
//! `--url http://127.0.0.1:8090 [--pid PID]` (its engines are registered
//! over `/register` like ours). Build Dynamo's with
//! `cargo build --release --manifest-path benches/dynamo-service/Cargo.toml`.
//! The trace workload reads `--trace` (default: the 800-request sample in
//! `benches/data/`, so a fresh clone runs it; docs/benchmarks.md's figures use the
//! full Mooncake conversation trace).

#[path = "http_query/client.rs"]
#[allow(dead_code)] // shared with benches/freshness, which uses more of it
mod client;
#[path = "http_query/engines.rs"]
#[allow(dead_code)] // shared with benches/dynamo-service's interop tool, which uses more of it
mod engines;
#[path = "http_query/server.rs"]
mod server;
#[path = "http_query/workloads.rs"]
mod workloads;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use engines::Engine;
use server::Server;
use workloads::{Churn, Workload, BLOCK_SIZE, WORKERS};

/// How long a server may take to apply what was published.
const SYNC_WAIT_MS: u64 = 900_000;
/// Sample queries per workload compared between servers.
const SAMPLE_QUERIES: usize = 128;
/// Blocks one churn step publishes (a store and, later, a remove).
const CHURN_STEP_BLOCKS: f64 = 2.0 * workloads::CHURN_BLOCKS as f64;

struct Options {
    ours: String,
    dynamo: Option<String>,
    url: Option<SocketAddr>,
    pid: Option<u32>,
    secs: f64,
    warmup_secs: f64,
    repeats: usize,
    clients: Vec<usize>,
    ingest_rate: f64,
    only: Option<String>,
    /// Skip the query cells: only the idle and ingest-only rows.
    ingest_only: bool,
    /// With `--ingest-only`: run both servers at once on the same engines,
    /// each window read on both, so other load on the machine hits both.
    together: bool,
    json: String,
    trace: String,
    server_core: usize,
    client_core: usize,
}

fn parse_options() -> Result<Options, String> {
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let mut o = Options {
        ours: env!("CARGO_BIN_EXE_kv-indexer").to_string(),
        dynamo: None,
        url: None,
        pid: None,
        secs: 3.0,
        warmup_secs: 1.0,
        repeats: 3,
        clients: vec![1, 8, 64],
        ingest_rate: 32_000.0,
        only: None,
        ingest_only: false,
        together: false,
        json: format!("{target}/http_query.json"),
        trace: concat!(env!("CARGO_MANIFEST_DIR"), "/benches/data/sample_trace.jsonl").to_string(),
        server_core: 1,
        client_core: 0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        // cargo bench passes --bench to every bench binary.
        if flag == "--bench" {
            continue;
        }
        if flag == "--ingest-only" || flag == "--together" {
            o.ingest_only |= flag == "--ingest-only";
            o.together |= flag == "--together";
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<f64>().map_err(|_| format!("{flag}: not a number: {v}"));
        match flag.as_str() {
            "--ours" => o.ours = value,
            "--dynamo" => o.dynamo = Some(value),
            "--url" => {
                let hostport = value.trim_start_matches("http://").trim_end_matches('/');
                o.url = Some(hostport.parse().map_err(|_| format!("--url: want http://IP:PORT, got {value}"))?);
            }
            "--pid" => o.pid = Some(num(&value)? as u32),
            "--secs" => o.secs = num(&value)?,
            "--warmup-secs" => o.warmup_secs = num(&value)?,
            "--repeats" => o.repeats = num(&value)? as usize,
            "--clients" => {
                o.clients = value
                    .split(',')
                    .map(|c| c.trim().parse::<usize>().map_err(|_| format!("--clients: {c}")))
                    .collect::<Result<_, _>>()?
            }
            "--ingest-rate" => o.ingest_rate = num(&value)?,
            "--only" => o.only = Some(value),
            "--json" => o.json = value,
            "--trace" => o.trace = value,
            "--server-core" => o.server_core = num(&value)? as usize,
            "--client-core" => o.client_core = num(&value)? as usize,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if o.only.as_deref().is_some_and(|w| w != "trace" && w != "synthetic") {
        return Err("--only takes trace or synthetic".into());
    }
    if o.together && (!o.ingest_only || o.dynamo.is_none() || o.url.is_some()) {
        return Err("--together takes --ingest-only and --dynamo, not --url".into());
    }
    if o.secs <= 0.0 || o.repeats == 0 || o.clients.is_empty() || o.clients.iter().any(|&c| c == 0 || c > 1024) {
        return Err("--secs, --repeats and --clients (1..=1024 each) must be positive".into());
    }
    Ok(o)
}

/// One measured cell.
#[derive(Clone, Debug)]
struct Cell {
    server: String,
    workload: &'static str,
    ingest: bool,
    clients: usize,
    repeat: usize,
    queries_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    server_cpu_us_per_query: f64,
    server_core_use: f64,
    client_cpu_us_per_query: f64,
    errors: u64,
    ingest_blocks_per_s: f64,
}

impl Cell {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "server": self.server, "workload": self.workload, "ingest": self.ingest,
            "clients": self.clients, "repeat": self.repeat, "queries_per_s": self.queries_per_s,
            "p50_us": self.p50_us, "p99_us": self.p99_us,
            "server_cpu_us_per_query": self.server_cpu_us_per_query,
            "server_core_use": self.server_core_use,
            "client_cpu_us_per_query": self.client_cpu_us_per_query,
            "errors": self.errors, "ingest_blocks_per_s": self.ingest_blocks_per_s,
        })
    }
}

/// Server CPU spent ingesting, with no queries: the churn alone for a window.
struct IngestOnly {
    server: String,
    workload: &'static str,
    repeat: usize,
    blocks_per_s: f64,
    cpu_us_per_block: f64,
    core_use: f64,
}

/// Server CPU with nothing to do: engines connected, no events, no queries.
struct Idle {
    server: String,
    core_use: f64,
}

/// A server under test, with its engines.
struct Target {
    server: Server,
    setups: Vec<(Workload, Vec<Engine>, u64)>,
}

/// Waits until the server shows sentinel `generation` on every worker of `wl`.
fn wait_synced(server: &Server, wl: &Workload, generation: u64) -> Result<Duration, String> {
    let started = Instant::now();
    let body = workloads::query_body(&wl.model, &workloads::sentinel_tokens(generation));
    let wanted = wl.first_instance..wl.first_instance + WORKERS as u64;
    let mut last = String::new();
    while started.elapsed() < Duration::from_millis(SYNC_WAIT_MS) {
        match client::call_json(server.addr, "POST", "/query", &body, 200) {
            Ok(v) => {
                let held = v["scores"].as_object().map_or(0, |scores| {
                    scores
                        .iter()
                        .filter(|(k, ranks)| {
                            k.parse::<u64>().is_ok_and(|id| wanted.contains(&id))
                                && ranks.as_object().is_some_and(|r| r.values().any(|s| s.as_u64() >= Some(16)))
                        })
                        .count()
                });
                if held == WORKERS {
                    return Ok(started.elapsed());
                }
                last = format!("{held} of {WORKERS} workers show it");
            }
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!("{}: sentinel {generation} of {} not applied in time ({last})", server.name, wl.name))
}

/// The device-tier answer to a query, normalised for comparison.
fn answer(server: &Server, body: &str) -> Result<String, String> {
    let v = client::call_json(server.addr, "POST", "/query", body, 200)?;
    let mut out = BTreeMap::new();
    for (instance, ranks) in v["scores"].as_object().into_iter().flatten() {
        for (rank, score) in ranks.as_object().into_iter().flatten() {
            let score = score.as_u64().unwrap_or(0);
            if score > 0 {
                out.insert(format!("{instance}/{rank}"), score);
            }
        }
    }
    Ok(format!("{out:?}"))
}

/// Starts (or attaches to) a server, registers engines and populates state.
fn prepare(
    name: &str,
    program: Option<&str>,
    args: &[String],
    o: &Options,
    wls: Vec<Workload>,
) -> Result<Target, String> {
    let server = match (program, o.url) {
        (Some(p), _) => Server::spawn(name, p, args, Some(o.server_core))?,
        (None, Some(addr)) => Server::external(name, addr, o.pid.unwrap_or(0)),
        (None, None) => unreachable!("a target is a program or a URL"),
    };
    let ctx = zmq::Context::new();
    let mut setups = Vec::new();
    for wl in wls {
        let mut engines = wl.engines(&ctx)?;
        for e in &engines {
            client::call_json(server.addr, "POST", "/register", &wl.register_body(e), 201)?;
        }
        for e in &mut engines {
            e.wait_subscribed(1)?;
        }
        setups.push((wl, engines, 0));
    }
    // Publish everything first, then wait: the server ingests while the rest is encoded.
    let started = Instant::now();
    let mut blocks = Vec::new();
    for (wl, engines, _) in &mut setups {
        blocks.push(wl.populate(engines)?);
        workloads::publish_sentinel(engines, 0)?;
    }
    for ((wl, _, _), blocks) in setups.iter().zip(&blocks) {
        wait_synced(&server, wl, 0)?;
        println!(
            "{name}: {} holds {blocks} (block, worker) pairs over {WORKERS} workers; populated in {:.1} s",
            wl.name,
            started.elapsed().as_secs_f64()
        );
    }
    if let Some(rss) = server.rss_bytes() {
        println!("{name}: resident memory {:.0} MiB after populating", rss as f64 / (1 << 20) as f64);
    }
    Ok(Target { server, setups })
}

/// Measures every cell of one repeat on `target`.
/// Streams the churn alone at `--ingest-rate` and reads each server's CPU
/// over the window, per block published in it.
fn measure_ingest_only(
    servers: &[&Server],
    wl: &Workload,
    engines: &mut [Engine],
    generation: &mut u64,
    o: &Options,
    repeat: usize,
) -> Result<Vec<IngestOnly>, String> {
    let mut churn = Churn::new(7 + repeat as u64 * 1_000);
    let step_every = Duration::from_secs_f64(CHURN_STEP_BLOCKS / o.ingest_rate);
    let started = Instant::now();
    let window_start = started + Duration::from_secs_f64(o.warmup_secs);
    let window_end = window_start + Duration::from_secs_f64(o.secs);
    let cpu_times = || servers.iter().map(|s| s.cpu_time()).collect::<Vec<_>>();
    let mut due = started;
    let mut at_start = None;
    let at_end = loop {
        let now = Instant::now();
        if at_start.is_none() && now >= window_start {
            at_start = Some((now, cpu_times(), churn.blocks_published));
        }
        if now >= window_end {
            break (now, cpu_times(), churn.blocks_published);
        }
        churn.step(engines)?;
        due += step_every;
        if due > Instant::now() {
            std::thread::sleep(due - Instant::now());
        }
    };
    churn.finish(engines)?;
    *generation += 1;
    workloads::publish_sentinel(engines, *generation)?;
    for server in servers {
        wait_synced(server, wl, *generation)?;
    }
    let (t0, c0, b0) = at_start.ok_or("the ingest window never opened")?;
    let (t1, c1, b1) = at_end;
    let (wall, blocks) = ((t1 - t0).as_secs_f64(), (b1 - b0).max(1) as f64);
    let mut rows = Vec::new();
    for (server, (c0, c1)) in servers.iter().zip(c0.into_iter().zip(c1)) {
        let cpu = match (c0, c1) {
            (Some(c0), Some(c1)) => c1.saturating_sub(c0).as_secs_f64(),
            _ => f64::NAN,
        };
        let row = IngestOnly {
            server: server.name.clone(),
            workload: wl.name,
            repeat,
            blocks_per_s: blocks / wall,
            cpu_us_per_block: cpu * 1e6 / blocks,
            core_use: cpu / wall,
        };
        println!(
            "  {:<6} {:<9} ingest only {:>7.0} blocks/s  cpu {:>6.2} us/block  core {:.2}",
            row.server, row.workload, row.blocks_per_s, row.cpu_us_per_block, row.core_use
        );
        rows.push(row);
    }
    Ok(rows)
}

/// Reads each server's CPU over a window in which nothing happens.
fn measure_idle(servers: &[&Server], o: &Options) -> Result<Vec<Idle>, String> {
    // Let the previous cell's work drain first.
    std::thread::sleep(Duration::from_secs_f64(o.warmup_secs));
    let (t0, c0) = (Instant::now(), servers.iter().map(|s| s.cpu_time()).collect::<Vec<_>>());
    std::thread::sleep(Duration::from_secs_f64(o.secs));
    let (t1, c1) = (Instant::now(), servers.iter().map(|s| s.cpu_time()).collect::<Vec<_>>());
    let mut rows = Vec::new();
    for (server, (c0, c1)) in servers.iter().zip(c0.into_iter().zip(c1)) {
        let (Some(c0), Some(c1)) = (c0, c1) else { return Err("no CPU time for the server".into()) };
        let core_use = c1.saturating_sub(c0).as_secs_f64() / (t1 - t0).as_secs_f64();
        println!("  {:<6} idle       core {:.4}", server.name, core_use);
        rows.push(Idle { server: server.name.clone(), core_use });
    }
    Ok(rows)
}

/// `--together`: both servers at once, fed by the same engines, every
/// window read on both.
fn run_together(o: &Options, targets: &[(&str, Option<String>, Vec<String>)]) -> Result<(), String> {
    let mut servers = Vec::new();
    for (name, program, args) in targets {
        servers.push(Server::spawn(name, program.as_deref().unwrap_or_default(), args, Some(o.server_core))?);
    }
    let ctx = zmq::Context::new();
    let mut wls = Vec::new();
    if o.only.as_deref().is_none_or(|w| w == "trace") {
        wls.push(workloads::trace(&o.trace, 1)?);
    }
    if o.only.as_deref().is_none_or(|w| w == "synthetic") {
        wls.push(workloads::synthetic(1_001));
    }
    let mut setups = Vec::new();
    for wl in wls {
        let mut engines = wl.engines(&ctx)?;
        for server in &servers {
            for e in &engines {
                client::call_json(server.addr, "POST", "/register", &wl.register_body(e), 201)?;
            }
        }
        for e in &mut engines {
            e.wait_subscribed(servers.len())?;
        }
        wl.populate(&mut engines)?;
        workloads::publish_sentinel(&mut engines, 0)?;
        for server in &servers {
            wait_synced(server, &wl, 0)?;
        }
        setups.push((wl, engines, 0));
    }
    let (mut ingest_rows, mut idle_rows) = (Vec::new(), Vec::new());
    let refs: Vec<&Server> = servers.iter().collect();
    for repeat in 0..o.repeats {
        println!("together: repeat {}/{}", repeat + 1, o.repeats);
        idle_rows.extend(measure_idle(&refs, o)?);
        for (wl, engines, generation) in &mut setups {
            ingest_rows.extend(measure_ingest_only(&refs, wl, engines, generation, o, repeat)?);
        }
    }
    for server in &mut servers {
        server.stop();
    }
    ingest_table(&ingest_rows);
    idle_table(&idle_rows);
    Ok(())
}

fn measure(
    target: &mut Target,
    o: &Options,
    repeat: usize,
    cells: &mut Vec<Cell>,
    ingest_only: &mut Vec<IngestOnly>,
) -> Result<(), String> {
    let Target { server, setups } = target;
    for (wl, engines, generation) in setups.iter_mut() {
        let requests: Vec<Vec<u8>> = (0..wl.queries.len())
            .map(|i| client::request_bytes("POST", "/query", wl.query_body(i).as_bytes()))
            .collect();
        for ingest in [false, true] {
            for &clients in if o.ingest_only { &[][..] } else { &o.clients[..] } {
                let stop = AtomicBool::new(false);
                let mut cpu = Vec::new();
                let mut churn = Churn::new(1 + repeat as u64 * 1_000 + clients as u64);
                let mut churn_secs = 0.0;
                let stats = std::thread::scope(|s| {
                    let churner = ingest.then(|| {
                        let (engines, churn, stop) = (&mut *engines, &mut churn, &stop);
                        s.spawn(move || -> Result<f64, String> {
                            let started = Instant::now();
                            let step_every = Duration::from_secs_f64(CHURN_STEP_BLOCKS / o.ingest_rate);
                            let mut due = started;
                            while !stop.load(Ordering::Relaxed) {
                                churn.step(engines)?;
                                due += step_every;
                                let now = Instant::now();
                                if due > now {
                                    std::thread::sleep(due - now);
                                }
                            }
                            Ok(started.elapsed().as_secs_f64())
                        })
                    });
                    let stats = client::drive(
                        server.addr,
                        &requests,
                        clients,
                        Duration::from_secs_f64(o.warmup_secs),
                        Duration::from_secs_f64(o.secs),
                        || cpu.push((Instant::now(), server.cpu_time())),
                    );
                    stop.store(true, Ordering::Relaxed);
                    if let Some(h) = churner {
                        churn_secs = h.join().map_err(|_| "churn thread panicked".to_string())??;
                    }
                    stats
                })?;
                if ingest {
                    churn.finish(engines)?;
                    *generation += 1;
                    workloads::publish_sentinel(engines, *generation)?;
                    wait_synced(server, wl, *generation)?;
                }
                let (wall, server_cpu) = match cpu.as_slice() {
                    [(t0, Some(c0)), (t1, Some(c1))] => ((*t1 - *t0).as_secs_f64(), c1.saturating_sub(*c0)),
                    _ => (o.secs, Duration::ZERO),
                };
                let q = stats.completed.max(1) as f64;
                let cell = Cell {
                    server: server.name.clone(),
                    workload: wl.name,
                    ingest,
                    clients,
                    repeat,
                    queries_per_s: stats.queries_per_s(),
                    p50_us: stats.percentile_us(50.0),
                    p99_us: stats.percentile_us(99.0),
                    server_cpu_us_per_query: server_cpu.as_secs_f64() * 1e6 / q,
                    server_core_use: server_cpu.as_secs_f64() / wall,
                    client_cpu_us_per_query: stats.client_cpu.as_secs_f64() * 1e6 / q,
                    errors: stats.errors,
                    ingest_blocks_per_s: if ingest { churn.blocks_published as f64 / churn_secs } else { 0.0 },
                };
                println!(
                    "  {:<6} {:<9} {:<6} c={:<3} {:>9.0} q/s  p50 {:>8.1} us  p99 {:>8.1} us  cpu {:>7.1} us/q  core {:.2}{}",
                    cell.server,
                    cell.workload,
                    if ingest { "ingest" } else { "idle" },
                    clients,
                    cell.queries_per_s,
                    cell.p50_us,
                    cell.p99_us,
                    cell.server_cpu_us_per_query,
                    cell.server_core_use,
                    if cell.errors > 0 { format!("  ERRORS {}", cell.errors) } else { String::new() }
                );
                cells.push(cell);
            }
        }
        ingest_only.extend(measure_ingest_only(&[&*server], wl, engines, generation, o, repeat)?);
    }
    Ok(())
}

/// Medians over repeats of the idle rows.
fn idle_table(rows: &[Idle]) -> Vec<serde_json::Value> {
    let mut servers: Vec<&str> = Vec::new();
    for r in rows {
        if !servers.contains(&r.server.as_str()) {
            servers.push(&r.server);
        }
    }
    println!("\nidle (engines connected, nothing published, no queries): server cores used; medians");
    println!("| server | core use |");
    println!("|---|---:|");
    let mut out = Vec::new();
    for server in servers {
        let of: Vec<f64> = rows.iter().filter(|r| r.server == server).map(|r| r.core_use).collect();
        let core = median(of.clone());
        println!("| {server} | {core:.4} |");
        out.push(serde_json::json!({"server": server, "core_use": core, "repeats": of}));
    }
    out
}

/// Medians over repeats of the ingest-only rows, with ratios to ours.
fn ingest_table(rows: &[IngestOnly]) -> Vec<serde_json::Value> {
    let mut keys: Vec<(String, &'static str)> = Vec::new();
    for r in rows {
        if !keys.contains(&(r.server.clone(), r.workload)) {
            keys.push((r.server.clone(), r.workload));
        }
    }
    println!("\ningest only (no queries): server CPU per block published (stores + removes); medians");
    println!("| server | workload | blocks/s | server cpu us/block | core use | cpu/block vs ours |");
    println!("|---|---|---:|---:|---:|---:|");
    let cpu_of = |server: &str, workload: &str| {
        median(
            rows.iter().filter(|r| r.server == server && r.workload == workload).map(|r| r.cpu_us_per_block).collect(),
        )
    };
    let mut out = Vec::new();
    for (server, workload) in keys {
        let of: Vec<&IngestOnly> = rows.iter().filter(|r| r.server == server && r.workload == workload).collect();
        let rate = median(of.iter().map(|r| r.blocks_per_s).collect());
        let cpu = cpu_of(&server, workload);
        let core = median(of.iter().map(|r| r.core_use).collect());
        let vs_ours = cpu / cpu_of("ours", workload);
        println!("| {server} | {workload} | {rate:.0} | {cpu:.2} | {core:.2} | {vs_ours:.1}x |");
        out.push(serde_json::json!({
            "server": server, "workload": workload, "blocks_per_s": rate,
            "server_cpu_us_per_block": cpu, "core_use": core,
            "repeats": of.iter().map(|r| r.cpu_us_per_block).collect::<Vec<_>>(),
            "repeat_ids": of.iter().map(|r| r.repeat).collect::<Vec<_>>(),
        }));
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Medians over repeats of one (server, workload, load, clients) cell.
struct Summary {
    key: (String, &'static str, bool, usize),
    qps: f64,
    qps_spread: f64,
    p50: f64,
    p99: f64,
    cpu: f64,
    core: f64,
    client_cpu: f64,
    ingest_rate: f64,
    errors: u64,
}

fn summarise(cells: &[Cell]) -> Vec<Summary> {
    let mut keys: Vec<(String, &'static str, bool, usize)> = Vec::new();
    for c in cells {
        let k = (c.server.clone(), c.workload, c.ingest, c.clients);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .map(|key| {
            let of: Vec<&Cell> = cells
                .iter()
                .filter(|c| {
                    (c.server.as_str(), c.workload, c.ingest, c.clients) == (key.0.as_str(), key.1, key.2, key.3)
                })
                .collect();
            let m = |f: fn(&Cell) -> f64| median(of.iter().map(|c| f(c)).collect());
            let qps = m(|c| c.queries_per_s);
            let (lo, hi) =
                of.iter().fold((f64::MAX, 0f64), |(lo, hi), c| (lo.min(c.queries_per_s), hi.max(c.queries_per_s)));
            Summary {
                qps,
                qps_spread: (hi - lo) / qps,
                p50: m(|c| c.p50_us),
                p99: m(|c| c.p99_us),
                cpu: m(|c| c.server_cpu_us_per_query),
                core: m(|c| c.server_core_use),
                client_cpu: m(|c| c.client_cpu_us_per_query),
                ingest_rate: m(|c| c.ingest_blocks_per_s),
                errors: of.iter().map(|c| c.errors).sum(),
                key,
            }
        })
        .collect()
}

fn print_table(summaries: &[Summary], repeats: usize) {
    println!("\nmedians of {repeats} repeats; spread = (max - min) / median of q/s; q/cpu-s = 1e6 / cpu us per query");
    println!(
        "| server | workload | load | clients | q/s | spread | p50 us | p99 us | server cpu us/q | core use | q/cpu-s | client cpu us/q |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in summaries {
        let load = if s.key.2 { format!("ingest {:.0}k blk/s", s.ingest_rate / 1e3) } else { "idle".into() };
        println!(
            "| {} | {} | {} | {} | {:.0} | {:.0}% | {:.1} | {:.1} | {:.1} | {:.2} | {:.0} | {:.1} |{}",
            s.key.0,
            s.key.1,
            load,
            s.key.3,
            s.qps,
            s.qps_spread * 100.0,
            s.p50,
            s.p99,
            s.cpu,
            s.core,
            1e6 / s.cpu,
            s.client_cpu,
            if s.errors > 0 { format!(" errors {}", s.errors) } else { String::new() }
        );
    }
}

/// Ours vs Dynamo for every cell both ran.
fn ratios(summaries: &[Summary]) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let mut printed = false;
    for ours in summaries.iter().filter(|s| s.key.0 == "ours") {
        let Some(dyn_) = summaries
            .iter()
            .find(|s| s.key.0 == "dynamo" && (s.key.1, s.key.2, s.key.3) == (ours.key.1, ours.key.2, ours.key.3))
        else {
            continue;
        };
        if !printed {
            println!("\nours / dynamo (same state, same load; both pinned to one core)");
            println!(
                "| workload | load | clients | q/s ratio | q/cpu-s ratio (= dynamo cpu/q / ours) | p50 dynamo/ours |"
            );
            println!("|---|---|---:|---:|---:|---:|");
            printed = true;
        }
        let load = if ours.key.2 { "ingest" } else { "idle" };
        let qps = ours.qps / dyn_.qps;
        let per_core = dyn_.cpu / ours.cpu;
        let p50 = dyn_.p50 / ours.p50;
        println!("| {} | {load} | {} | {qps:.1}x | {per_core:.1}x | {p50:.1}x |", ours.key.1, ours.key.3);
        out.push(serde_json::json!({
            "workload": ours.key.1, "ingest": ours.key.2, "clients": ours.key.3,
            "qps_ratio": qps, "queries_per_cpu_second_ratio": per_core, "p50_ratio": p50,
        }));
    }
    out
}

fn pin_self(core: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!("could not pin the bench to core {core}; running unpinned");
        }
    }
}

fn run(o: Options) -> Result<(), String> {
    // Before any thread (ZMQ's included) starts, so they all inherit it.
    pin_self(o.client_core);
    let wanted = |name: &str| o.only.as_deref().is_none_or(|only| only == name);
    let build = |base: u64| -> Result<Vec<Workload>, String> {
        let mut wls = Vec::new();
        if wanted("trace") {
            wls.push(workloads::trace(&o.trace, base)?);
        }
        if wanted("synthetic") {
            wls.push(workloads::synthetic(base + 1_000));
        }
        Ok(wls)
    };
    let common = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = ["--port", "0"].iter().map(|s| s.to_string()).collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let mut targets: Vec<(&str, Option<String>, Vec<String>)> = Vec::new();
    if o.url.is_some() {
        targets.push(("server", None, Vec::new()));
    } else {
        targets.push(("ours", Some(o.ours.clone()), common(&["--host", "127.0.0.1"])));
        if let Some(d) = &o.dynamo {
            targets.push(("dynamo", Some(d.clone()), common(&[])));
        }
    }
    if o.together {
        return run_together(&o, &targets);
    }
    let mut cells = Vec::new();
    let mut ingest_rows = Vec::new();
    let mut idle_rows = Vec::new();
    let mut answers: Vec<(String, Vec<String>)> = Vec::new();
    for (name, program, args) in targets {
        let mut target = prepare(name, program.as_deref(), &args, &o, build(1)?)?;
        let mut sample = Vec::new();
        for (wl, _, _) in &target.setups {
            for i in 0..SAMPLE_QUERIES.min(wl.queries.len()) {
                sample.push(answer(&target.server, &wl.query_body(i))?);
            }
        }
        answers.push((name.to_string(), sample));
        for repeat in 0..o.repeats {
            println!("{name}: repeat {}/{}", repeat + 1, o.repeats);
            idle_rows.extend(measure_idle(&[&target.server], &o)?);
            measure(&mut target, &o, repeat, &mut cells, &mut ingest_rows)?;
        }
        target.server.stop();
    }
    let summaries = summarise(&cells);
    print_table(&summaries, o.repeats);
    let mut state_check = serde_json::Value::Null;
    if let [(a, sa), (b, sb)] = answers.as_slice() {
        let same = sa.iter().zip(sb).filter(|(x, y)| x == y).count();
        let nonempty = sa.iter().filter(|x| x.as_str() != "{}").count();
        println!(
            "\nstate check: {same}/{} sample answers identical between {a} and {b} ({nonempty} non-empty)",
            sa.len()
        );
        if let Some((x, y)) = sa.iter().zip(sb).find(|(x, y)| x != y) {
            println!("  first difference: {a} {x}\n                    {b} {y}");
        }
        state_check = serde_json::json!({"identical": same, "compared": sa.len(), "non_empty": nonempty});
    }
    let ratio_rows = ratios(&summaries);
    let ingest_summary = ingest_table(&ingest_rows);
    let idle_summary = idle_table(&idle_rows);
    let report = serde_json::json!({
        "config": {
            "secs": o.secs, "warmup_secs": o.warmup_secs, "repeats": o.repeats, "clients": o.clients,
            "ingest_rate_blocks_per_s": o.ingest_rate, "block_size": BLOCK_SIZE, "workers": WORKERS,
            "server_core": o.server_core, "client_core": o.client_core,
        },
        "cells": cells.iter().map(Cell::json).collect::<Vec<_>>(),
        "ratios": ratio_rows,
        "ingest_only": ingest_summary,
        "idle": idle_summary,
        "state_check": state_check,
    });
    std::fs::write(&o.json, serde_json::to_string_pretty(&report).unwrap())
        .map_err(|e| format!("cannot write {}: {e}", o.json))?;
    println!("\nwrote {}", o.json);
    Ok(())
}

fn main() {
    let options = match parse_options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("http_query: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(options) {
        eprintln!("http_query: {e}");
        std::process::exit(1);
    }
}

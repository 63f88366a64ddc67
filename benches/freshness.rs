//! Freshness: how long after an engine publishes a block the first `/query`
//! shows it, idle and under background event streams, for our daemon beside
//! Dynamo's standalone indexer in one run, with each server's ingest CPU
//! per block.
//!
//! Setup: every server is started pinned to core 1 (`taskset`; the bench
//! and its engines run on core 0) and gets its own 64 background engines
//! (one ZMQ publisher per worker, `http_query/engines.rs`), each holding a
//! few 64-block prompts, and its own probe publisher. The probe publisher
//! is vLLM's: with `--vllm DIR` (made by `benches/freshness/vllm_env.sh`)
//! a Python process runs vLLM's released `kv_events.py` publisher, one per
//! server (`freshness/vllm_probe.py`); without it the bench's own engine
//! publishes the probes in the same wire format, and the report says so.
//!
//! Each load (`--loads`, block ops/s: stored plus removed blocks) runs as
//! `--slices` slices; in each slice every server takes a turn, the order
//! alternating between slices, so machine noise falls on both. A turn
//! starts that server's background stream at the load (16-block stores
//! under held prompts, each removed 256 steps later: `workloads::Churn`),
//! lets it run `--warmup-secs`, reads the server's CPU over `--cpu-secs`
//! of stream alone, then sends probes (`--probes` per load, split over the
//! slices) while the stream goes on, then stops the stream and waits until
//! the server shows a sentinel on every worker (it has applied everything),
//! so no backlog runs into the next server's turn. Only one server ever
//! receives events at a time; the idle one sits on its own core share.
//!
//! A probe is one fresh root block on the probe worker. Its latency is from
//! the moment just before `publish` (CLOCK_MONOTONIC, taken by the
//! publishing process) to the completion of the first `/query` for its
//! tokens that credits the probe worker, polled back to back over one
//! keep-alive connection. After each probe the bench waits a random
//! 2-8 ms, so probes do not fall into step with the stream. A probe not
//! seen within `PROBE_TIMEOUT_MS` counts as a timeout.
//!
//! CPU per block is the CPU time of the server's threads over the CPU
//! windows (`/proc/PID/task/*/schedstat`, in nanoseconds; a window in which
//! a thread exited falls back to the process's utime+stime, in 10 ms ticks,
//! and the JSON counts such windows) divided by the blocks published in
//! them; at load 0 the row gives the cores used while idle instead.
//!
//! Run: `cargo bench --bench freshness -- [--dynamo PATH/dynamo-indexer]
//! [--vllm DIR] [--loads 0,20000,100000,300000] [--probes 300] [--slices 6]
//! [--cpu-secs 2] [--also NAME=PATH] [--json PATH]`. `--also` adds another
//! build of ours (for an A/B). Build Dynamo's with
//! `cargo build --release --manifest-path benches/dynamo-service/Cargo.toml`.

#[path = "http_query/client.rs"]
#[allow(dead_code)] // shared with benches/http_query, which uses more of it
mod client;
#[path = "http_query/engines.rs"]
#[allow(dead_code)]
mod engines;
#[path = "http_query/server.rs"]
#[allow(dead_code)]
mod server;
#[path = "http_query/workloads.rs"]
#[allow(dead_code)]
mod workloads;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use engines::{stored_events, Engine};
use server::Server;
use workloads::{mix, tokens_of, Churn, Rng, BLOCK_SIZE, WORKERS};

/// The model every server's workers are registered under.
const MODEL: &str = "fresh";
/// Instance id of the probe worker (the background workers are 1..=64).
const PROBE_INSTANCE: u64 = 9_000;
/// Token namespace of probe blocks (beside `workloads::space`).
const PROBE_SPACE: u64 = 5;
/// A probe not visible after this long counts as a timeout.
const PROBE_TIMEOUT_MS: u64 = 2_000;
/// Prompts each background worker holds before the streams start.
const PROMPTS_PER_WORKER: usize = 8;
/// Blocks per held prompt.
const PROMPT_BLOCKS: usize = 64;
/// How long a server may take to show a sentinel.
const SYNC_WAIT_MS: u64 = 120_000;
/// Blocks one churn step publishes (a store and, later, a remove).
const STEP_BLOCKS: f64 = 2.0 * workloads::CHURN_BLOCKS as f64;

struct Options {
    servers: Vec<(String, String)>,
    vllm: Option<String>,
    loads: Vec<f64>,
    probes: usize,
    slices: usize,
    warmup_secs: f64,
    cpu_secs: f64,
    json: String,
    server_core: usize,
    bench_core: usize,
}

fn parse_options() -> Result<Options, String> {
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let mut o = Options {
        servers: vec![("ours".into(), env!("CARGO_BIN_EXE_kv-indexer").into())],
        vllm: None,
        loads: vec![0.0, 20_000.0, 100_000.0, 300_000.0],
        probes: 300,
        slices: 6,
        warmup_secs: 0.5,
        cpu_secs: 2.0,
        json: format!("{target}/freshness.json"),
        server_core: 1,
        bench_core: 0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        // cargo bench passes --bench to every bench binary.
        if flag == "--bench" {
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| v.trim().parse::<f64>().map_err(|_| format!("{flag}: not a number: {v}"));
        match flag.as_str() {
            "--ours" => o.servers[0].1 = value,
            "--dynamo" => o.servers.push(("dynamo".into(), value)),
            "--also" => {
                let (name, path) = value.split_once('=').ok_or("--also takes NAME=PATH")?;
                o.servers.push((name.into(), path.into()));
            }
            "--vllm" => o.vllm = Some(value),
            "--loads" => o.loads = value.split(',').map(num).collect::<Result<_, _>>()?,
            "--probes" => o.probes = num(&value)? as usize,
            "--slices" => o.slices = num(&value)? as usize,
            "--warmup-secs" => o.warmup_secs = num(&value)?,
            "--cpu-secs" => o.cpu_secs = num(&value)?,
            "--json" => o.json = value,
            "--server-core" => o.server_core = num(&value)? as usize,
            "--bench-core" => o.bench_core = num(&value)? as usize,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if o.probes == 0 || o.slices == 0 || o.probes < o.slices || o.cpu_secs <= 0.0 || o.loads.is_empty() {
        return Err("--probes (at least --slices), --slices, --cpu-secs and --loads must be positive".into());
    }
    if o.loads.iter().any(|&l| !(0.0..=10_000_000.0).contains(&l)) {
        return Err("--loads are block ops/s in 0..=10000000".into());
    }
    Ok(o)
}

/// Where probes come from: vLLM's publisher in a Python process, or ours.
enum Probes {
    Vllm { child: Child, stdin: ChildStdin, stdout: BufReader<ChildStdout>, endpoints: Vec<String> },
    Bench { engines: Vec<Engine> },
}

impl Probes {
    fn start(o: &Options, ctx: &zmq::Context) -> Result<Probes, String> {
        let Some(dir) = &o.vllm else {
            let engines = (0..o.servers.len())
                .map(|_| Engine::new(ctx, PROBE_INSTANCE, BLOCK_SIZE))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(Probes::Bench { engines });
        };
        let repo = env!("CARGO_MANIFEST_DIR");
        let mut child = Command::new(format!("{dir}/venv/bin/python"))
            .arg(format!("{repo}/benches/freshness/vllm_probe.py"))
            .args(["--module-root", &format!("{dir}/src"), "--scripts", &format!("{repo}/scripts")])
            .args(["--publishers", &o.servers.len().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {dir}/venv/bin/python (made by benches/freshness/vllm_env.sh?): {e}"))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).map_err(|e| format!("vllm_probe.py: {e}"))?;
        let endpoints: Vec<String> = match line.trim().strip_prefix("ready ") {
            Some(rest) => rest.split(' ').map(String::from).collect(),
            None => return Err(format!("vllm_probe.py did not start: {line:?}")),
        };
        if endpoints.len() != o.servers.len() {
            return Err(format!("vllm_probe.py started {} publishers", endpoints.len()));
        }
        Ok(Probes::Vllm { child, stdin, stdout, endpoints })
    }

    fn name(&self) -> &'static str {
        match self {
            Probes::Vllm { .. } => "vLLM's ZmqEventPublisher (kv_events.py)",
            Probes::Bench { .. } => "the bench's own engine (same wire format)",
        }
    }

    fn endpoint(&self, server: usize) -> String {
        match self {
            Probes::Vllm { endpoints, .. } => endpoints[server].clone(),
            Probes::Bench { engines } => engines[server].endpoint.clone(),
        }
    }

    /// Publishes one probe block on `server`'s probe publisher; returns
    /// CLOCK_MONOTONIC just before the publish, in ns.
    fn publish(&mut self, server: usize, hash: u64, tokens: &[u32]) -> Result<u64, String> {
        match self {
            Probes::Vllm { stdin, stdout, .. } => {
                let mut line = format!("probe {server} {hash}");
                tokens.iter().for_each(|t| line.push_str(&format!(" {t}")));
                line.push('\n');
                stdin.write_all(line.as_bytes()).and_then(|()| stdin.flush()).map_err(|e| e.to_string())?;
                let mut reply = String::new();
                stdout.read_line(&mut reply).map_err(|e| e.to_string())?;
                reply.trim().parse().map_err(|_| format!("vllm_probe.py answered {reply:?}"))
            }
            Probes::Bench { engines } => {
                let events = stored_events(None, &[hash], tokens, BLOCK_SIZE);
                let t0 = monotonic_ns();
                engines[server].publish(&events)?;
                Ok(t0)
            }
        }
    }

    fn stop(&mut self) {
        if let Probes::Vllm { child, stdin, .. } = self {
            let _ = stdin.write_all(b"quit\n").and_then(|()| stdin.flush());
            let _ = child.wait();
        }
    }
}

fn monotonic_ns() -> u64 {
    // SAFETY: clock_gettime writes the timespec we pass.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A server's background engines and their stream.
struct Stream {
    engines: Vec<Engine>,
    churn: Churn,
    sentinel: u64,
}

impl Stream {
    /// Publishes churn steps at `load` block ops/s until `stop`, counting
    /// blocks in `published`; returns how long it ran, in seconds.
    fn run(&mut self, load: f64, stop: &AtomicBool, published: &AtomicU64) -> Result<f64, String> {
        let started = Instant::now();
        let step_every = Duration::from_secs_f64(STEP_BLOCKS / load);
        let mut due = started;
        let before = self.churn.blocks_published;
        while !stop.load(Ordering::Relaxed) {
            self.churn.step(&mut self.engines)?;
            published.store(self.churn.blocks_published - before, Ordering::Relaxed);
            due += step_every;
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        Ok(started.elapsed().as_secs_f64())
    }

    /// Publishes the next sentinel on every worker and waits until the
    /// server shows it on all of them: everything published before is applied.
    fn sync(&mut self, poller: &mut client::KeepAlive, name: &str) -> Result<(), String> {
        self.sentinel += 1;
        workloads::publish_sentinel(&mut self.engines, self.sentinel)?;
        let request = query_request(&workloads::sentinel_tokens(self.sentinel));
        let deadline = Instant::now() + Duration::from_millis(SYNC_WAIT_MS);
        loop {
            let reply = poller.call(&request)?;
            if reply.status == 200 && credited(&reply.body, |id| (1..=WORKERS as u64).contains(&id))? == WORKERS {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{name}: sentinel {} not applied in time", self.sentinel));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A server under test with its stream and its query connection.
struct Target {
    server: Server,
    stream: Stream,
    poller: client::KeepAlive,
    probes_sent: u64,
}

/// What one server showed at one load, over all its turns.
#[derive(Default)]
struct Cell {
    latencies_ns: Vec<u64>,
    timeouts: usize,
    cpu: Duration,
    /// CPU windows read in 10 ms ticks (a thread exited during them).
    cpu_coarse: usize,
    cpu_wall: Duration,
    cpu_blocks: u64,
    stream_blocks: u64,
    stream_secs: f64,
}

fn query_request(tokens: &[u32]) -> Vec<u8> {
    client::request_bytes("POST", "/query", workloads::query_body(MODEL, tokens).as_bytes())
}

/// How many instances `wanted` takes a `/query` reply credits with a block.
fn credited(body: &[u8], wanted: impl Fn(u64) -> bool) -> Result<usize, String> {
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| format!("/query reply: {e}"))?;
    Ok(v["scores"].as_object().map_or(0, |scores| {
        scores
            .iter()
            .filter(|(k, ranks)| {
                k.parse::<u64>().is_ok_and(&wanted)
                    && ranks.as_object().is_some_and(|r| r.values().any(|s| s.as_u64() >= Some(BLOCK_SIZE as u64)))
            })
            .count()
    }))
}

impl Target {
    fn start(
        name: &str,
        program: &str,
        o: &Options,
        ctx: &zmq::Context,
        probe_endpoint: &str,
    ) -> Result<Target, String> {
        let mut args: Vec<String> = vec!["--port".into(), "0".into()];
        if name != "dynamo" {
            args.extend(["--host".into(), "127.0.0.1".into()]);
        }
        let server = Server::spawn(name, program, &args, Some(o.server_core))?;
        let mut engines =
            (0..WORKERS).map(|w| Engine::new(ctx, 1 + w as u64, BLOCK_SIZE)).collect::<Result<Vec<_>, String>>()?;
        let register = |instance: u64, endpoint: &str| {
            let body = serde_json::json!({
                "instance_id": instance, "endpoint": endpoint, "model_name": MODEL, "block_size": BLOCK_SIZE,
            });
            client::call_json(server.addr, "POST", "/register", &body.to_string(), 201).map(|_| ())
        };
        for e in &engines {
            register(e.instance_id, &e.endpoint)?;
        }
        register(PROBE_INSTANCE, probe_endpoint)?;
        for e in &mut engines {
            e.wait_subscribed(1)?;
        }
        let mut tokens = Vec::new();
        for (w, e) in engines.iter_mut().enumerate() {
            for p in 0..PROMPTS_PER_WORKER {
                tokens.clear();
                let prompt = ((w * PROMPTS_PER_WORKER + p) as u64) << 32;
                for b in 0..PROMPT_BLOCKS {
                    tokens_of(workloads::space::SYNTH, prompt | b as u64, BLOCK_SIZE, &mut tokens);
                }
                e.store_prompt(&tokens)?;
            }
        }
        let mut poller = client::KeepAlive::connect(server.addr)?;
        let mut stream = Stream { engines, churn: Churn::new(11), sentinel: 0 };
        stream.sync(&mut poller, name)?;
        Ok(Target { server, stream, poller, probes_sent: 0 })
    }
}

/// One probe: publish a fresh block, poll until a query credits it.
/// Returns its latency in ns, or None after `PROBE_TIMEOUT_MS`.
fn probe(
    poller: &mut client::KeepAlive,
    sent: &mut u64,
    index: usize,
    probes: &mut Probes,
) -> Result<Option<u64>, String> {
    *sent += 1;
    let id = (index as u64) << 40 | *sent;
    let mut tokens = Vec::with_capacity(BLOCK_SIZE);
    tokens_of(PROBE_SPACE, id, BLOCK_SIZE, &mut tokens);
    let request = query_request(&tokens);
    let t0 = probes.publish(index, mix(id), &tokens)?;
    let deadline = t0 + PROBE_TIMEOUT_MS * 1_000_000;
    loop {
        let reply = poller.call(&request)?;
        let seen = monotonic_ns();
        // A server may answer 404 before its index exists; that is "not yet".
        if reply.status == 200 && credited(&reply.body, |id| id == PROBE_INSTANCE)? == 1 {
            return Ok(Some(seen.saturating_sub(t0)));
        }
        if seen > deadline {
            return Ok(None);
        }
    }
}

/// Probes until one shows (the server subscribed to the probe publisher).
fn warm_up(t: &mut Target, index: usize, probes: &mut Probes) -> Result<(), String> {
    for _ in 0..30 {
        if probe(&mut t.poller, &mut t.probes_sent, index, probes)?.is_some() {
            return Ok(());
        }
    }
    Err(format!("{}: no probe became visible", t.server.name))
}

/// One server's turn in one slice: stream, CPU window, probes, drain.
fn turn(
    t: &mut Target,
    index: usize,
    probes: &mut Probes,
    load: f64,
    count: usize,
    o: &Options,
    cell: &mut Cell,
) -> Result<(), String> {
    let (stop, published) = (AtomicBool::new(false), AtomicU64::new(0));
    let Target { server, stream, poller, probes_sent } = t;
    let pid = server.pid;
    let mut rng = Rng(monotonic_ns());
    let (measured, secs) = std::thread::scope(|s| {
        let streamer = (load > 0.0).then(|| s.spawn(|| stream.run(load, &stop, &published)));
        let measured = (|| -> Result<(), String> {
            std::thread::sleep(Duration::from_secs_f64(o.warmup_secs));
            let cpu = || (thread_cpu_of(pid), server::cpu_time_of(pid));
            let (t0, c0, b0) = (Instant::now(), cpu(), published.load(Ordering::Relaxed));
            std::thread::sleep(Duration::from_secs_f64(o.cpu_secs));
            let (t1, c1, b1) = (Instant::now(), cpu(), published.load(Ordering::Relaxed));
            let precise = c0.0.zip(c1.0).and_then(|(a, b)| cpu_between(&a, &b));
            cell.cpu += match (precise, c0.1, c1.1) {
                (Some(cpu), _, _) => cpu,
                // A thread exited: the process's own count has it, in 10 ms ticks.
                (None, Some(a), Some(b)) => {
                    cell.cpu_coarse += 1;
                    b.saturating_sub(a)
                }
                _ => return Err("no CPU time for the server".into()),
            };
            cell.cpu_wall += t1 - t0;
            cell.cpu_blocks += b1 - b0;
            for _ in 0..count {
                match probe(poller, probes_sent, index, probes)? {
                    Some(ns) => cell.latencies_ns.push(ns),
                    None => cell.timeouts += 1,
                }
                std::thread::sleep(Duration::from_micros(2_000 + rng.below(6_000)));
            }
            Ok(())
        })();
        stop.store(true, Ordering::Relaxed);
        let secs = match streamer {
            Some(h) => h.join().map_err(|_| "stream thread panicked".to_string()).and_then(|r| r),
            None => Ok(0.0),
        };
        (measured, secs)
    });
    measured?;
    cell.stream_secs += secs?;
    cell.stream_blocks += published.load(Ordering::Relaxed);
    stream.sync(poller, &server.name)
}

/// The `p`-th percentile (nearest rank) of sorted `v`, in ms.
fn percentile_ms(v: &[u64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() as f64 * p / 100.0).ceil() as usize).clamp(1, v.len());
    v[i - 1] as f64 / 1e6
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

/// CPU time of each thread of `pid`, in nanoseconds (`/proc/<pid>/task/*/schedstat`).
fn thread_cpu_of(pid: u32) -> Option<Vec<(u32, u64)>> {
    let mut threads = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let entry = entry.ok()?;
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        // A thread that exits meanwhile has no file: it is left out (see `cpu_between`).
        let Ok(stat) = std::fs::read_to_string(entry.path().join("schedstat")) else { continue };
        threads.push((tid, stat.split_whitespace().next()?.parse().ok()?));
    }
    Some(threads)
}

/// CPU `pid` used between two `thread_cpu_of` readings, to the nanosecond;
/// None if a thread exited in between (its share is unknown).
fn cpu_between(before: &[(u32, u64)], after: &[(u32, u64)]) -> Option<Duration> {
    let mut ns = 0;
    for &(tid, start) in before {
        let &(_, end) = after.iter().find(|t| t.0 == tid)?;
        ns += end.saturating_sub(start);
    }
    // Threads started in between count whole.
    ns += after.iter().filter(|t| !before.iter().any(|b| b.0 == t.0)).map(|t| t.1).sum::<u64>();
    Some(Duration::from_nanos(ns))
}

fn run(o: Options) -> Result<(), String> {
    // Before any thread (ZMQ's, Python's) starts, so they all inherit it.
    pin_self(o.bench_core);
    let ctx = zmq::Context::new();
    let mut probes = Probes::start(&o, &ctx)?;
    println!("probe publisher: {}", probes.name());
    let mut targets = Vec::new();
    for (i, (name, program)) in o.servers.iter().enumerate() {
        let mut t = Target::start(name, program, &o, &ctx, &probes.endpoint(i))?;
        warm_up(&mut t, i, &mut probes)?;
        println!("{name}: started, {} workers holding {PROMPTS_PER_WORKER} prompts of {PROMPT_BLOCKS} blocks", WORKERS);
        targets.push(t);
    }
    let mut rows = Vec::new();
    for &load in &o.loads {
        let mut cells: Vec<Cell> = targets.iter().map(|_| Cell::default()).collect();
        for slice in 0..o.slices {
            // Probes of this slice; the remainder goes to the first slices.
            let count = o.probes / o.slices + usize::from(slice < o.probes % o.slices);
            let mut order: Vec<usize> = (0..targets.len()).collect();
            if slice % 2 == 1 {
                order.reverse();
            }
            for i in order {
                turn(&mut targets[i], i, &mut probes, load, count, &o, &mut cells[i])?;
            }
        }
        println!("\nload {:.0} block ops/s ({} slices, probes from {})", load, o.slices, probes.name());
        println!(
            "| server | probes | p50 ms | p99 ms | max ms | timeouts | achieved blk/s | cpu us/block | core use |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for (t, cell) in targets.iter().zip(&mut cells) {
            cell.latencies_ns.sort_unstable();
            let lat = &cell.latencies_ns;
            let (p50, p99, max) = (percentile_ms(lat, 50.0), percentile_ms(lat, 99.0), percentile_ms(lat, 100.0));
            let cpu_s = cell.cpu.as_secs_f64();
            let core = cpu_s / cell.cpu_wall.as_secs_f64();
            let per_block = (cell.cpu_blocks > 0).then(|| cpu_s * 1e6 / cell.cpu_blocks as f64);
            let achieved = if cell.stream_secs > 0.0 { cell.stream_blocks as f64 / cell.stream_secs } else { 0.0 };
            println!(
                "| {} | {} | {p50:.2} | {p99:.2} | {max:.2} | {} | {achieved:.0} | {} | {core:.3} |",
                t.server.name,
                lat.len(),
                cell.timeouts,
                per_block.map_or("-".to_string(), |c| format!("{c:.2}")),
            );
            rows.push(serde_json::json!({
                "server": t.server.name, "load_block_ops_per_s": load, "achieved_block_ops_per_s": achieved,
                "probes": lat.len(), "timeouts": cell.timeouts,
                "p50_ms": p50, "p99_ms": p99, "max_ms": max,
                "cpu_us_per_block": per_block, "core_use": core, "cpu_window_s": cell.cpu_wall.as_secs_f64(), "cpu_windows_coarse": cell.cpu_coarse,
                "latencies_us": lat.iter().map(|&ns| ns / 1_000).collect::<Vec<_>>(),
            }));
        }
        if cells.len() >= 2 {
            let (a, b) = (&cells[0], &cells[1]);
            let pa = |p| percentile_ms(&a.latencies_ns, p);
            let pb = |p| percentile_ms(&b.latencies_ns, p);
            let cpu = |c: &Cell| c.cpu.as_secs_f64() / c.cpu_blocks.max(1) as f64;
            print!(
                "{} / {}: p50 {:.2}x, p99 {:.2}x",
                targets[0].server.name,
                targets[1].server.name,
                pa(50.0) / pb(50.0),
                pa(99.0) / pb(99.0)
            );
            if a.cpu_blocks > 0 && b.cpu_blocks > 0 {
                print!(", cpu per block {:.2}x", cpu(a) / cpu(b));
            }
            println!();
        }
    }
    probes.stop();
    for t in &mut targets {
        t.server.stop();
    }
    let report = serde_json::json!({
        "config": {
            "loads": o.loads, "probes": o.probes, "slices": o.slices, "warmup_secs": o.warmup_secs,
            "cpu_secs": o.cpu_secs, "probe_publisher": probes.name(), "workers": WORKERS,
            "prompts_per_worker": PROMPTS_PER_WORKER, "prompt_blocks": PROMPT_BLOCKS,
            "servers": o.servers.iter().map(|(n, p)| serde_json::json!({"name": n, "path": p})).collect::<Vec<_>>(),
        },
        "rows": rows,
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
            eprintln!("freshness: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(options) {
        eprintln!("freshness: {e}");
        std::process::exit(1);
    }
}

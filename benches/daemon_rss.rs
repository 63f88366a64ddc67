//! Daemon memory per (block, worker) pair: the release binary loaded over
//! real ZMQ, its resident set set against what the index says it holds.
//!
//! Starts the daemon on a free loopback port, registers `--engines` engines
//! (one XPUB publisher each, in this process, as `benches/http_query` does),
//! and has each store `--blocks` distinct blocks in prompts of
//! `--prompt-blocks` (the engines take turns, so every listener and shard
//! works at once). Once `kv_indexer_pairs` shows every pair it reads the
//! daemon's VmRSS from /proc and `kv_indexer_index_bytes` from /metrics,
//! waits `--settle-s` (longer than the trim thread's longest pause) and reads
//! them again; then every engine publishes AllBlocksCleared, and once the
//! pairs are 0 (and `--settle-s` later) it reads them again. `--cycles`
//! repeats load and clear with new blocks, so a later cycle shows the
//! steady state (memory the first left behind is reused, or not). RSS is
//! reported whole and less the idle daemon's (read after registering,
//! before any block), per live pair and over the index's own bytes, and
//! split into anonymous memory and mapped files (RssAnon, RssFile), and
//! idle and once loaded by mapping (each file, the heap, other anonymous
//! memory). Each load stops halfway for a settled reading, so the second
//! half gives the marginal figure: RSS added over index bytes added.
//!
//! Run: `cargo bench --bench daemon_rss -- [--engines 64] [--blocks 16384]
//! [--prompt-blocks 256] [--settle-s 20] [--cycles 2] [--bin PATH] [--env NAME=VALUE]...
//! [--daemon-args "..."]`. `--env` sets a variable for the daemon (e.g.
//! `MALLOC_ARENA_MAX=2`); `--bin` runs another build of the daemon.

#[path = "soak/daemon.rs"]
#[allow(dead_code)] // shared with benches/soak, which uses more of it
mod daemon;
#[path = "http_query/engines.rs"]
#[allow(dead_code)] // shared with benches/http_query, which uses more of it
mod engines;

use std::time::{Duration, Instant};

use daemon::{metric, Daemon};
use engines::Engine;

const MODEL: &str = "rss";
const BLOCK_SIZE: usize = 16;
/// Longest wait for the daemon to apply a phase's events.
const APPLY_WAIT_MS: u64 = 600_000;
/// Most load-and-clear cycles of one run.
const CYCLES_MAX: usize = 100;
/// Most engines one run registers.
const ENGINES_MAX: u64 = 4096;

struct Args {
    bin: String,
    engines: u64,
    blocks: usize,
    prompt_blocks: usize,
    settle_s: f64,
    cycles: usize,
    env: Vec<(String, String)>,
    daemon_args: Vec<String>,
}

fn parse_args() -> Result<Args, String> {
    use lexopt::prelude::*;
    let mut a = Args {
        bin: env!("CARGO_BIN_EXE_kv-indexer").to_string(),
        engines: 64,
        blocks: 16_384,
        prompt_blocks: 256,
        settle_s: 20.0,
        cycles: 2,
        env: Vec::new(),
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
        let num = |max: f64| {
            v.parse::<f64>()
                .ok()
                .filter(|n| *n >= 0.0 && *n <= max)
                .ok_or(format!("--{name}: expected a number in 0..={max}, got {v:?}"))
        };
        match name.as_str() {
            "bin" => a.bin = v,
            "engines" => a.engines = num(ENGINES_MAX as f64)?.max(1.0) as u64,
            "blocks" => a.blocks = num((1u64 << 24) as f64)?.max(1.0) as usize,
            "prompt-blocks" => a.prompt_blocks = num(4096.0)?.max(1.0) as usize,
            "settle-s" => a.settle_s = num(600.0)?,
            "cycles" => a.cycles = num(CYCLES_MAX as f64)?.max(1.0) as usize,
            "env" => {
                let (k, val) = v.split_once('=').ok_or(format!("--env wants NAME=VALUE, got {v:?}"))?;
                a.env.push((k.to_string(), val.to_string()));
            }
            "daemon-args" => a.daemon_args = v.split_whitespace().map(str::to_string).collect(),
            _ => return Err(format!("unknown option --{name}")),
        }
    }
    Ok(a)
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Tokens of prompt `prompt` of engine `engine` in cycle `cycle`: shared by no other prompt.
fn prompt_tokens(cycle: usize, engine: u64, prompt: usize, blocks: usize) -> Vec<u32> {
    let base = splitmix64((cycle as u64) << 48 ^ engine << 24 ^ prompt as u64);
    (0..(blocks * BLOCK_SIZE) as u64).map(|i| splitmix64(base ^ i) as u32).collect()
}

/// What the daemon holds at one moment.
#[derive(Clone, Copy, Debug, Default)]
struct Reading {
    rss_bytes: u64,
    /// Of `rss_bytes`, anonymous memory (heap, stacks, libzmq's buffers) and
    /// mapped files (the binary and its shared libraries).
    anon_bytes: u64,
    file_bytes: u64,
    index_bytes: f64,
    pairs: f64,
}

/// Field `name` (in kB) of /proc/PID/status, in bytes; 0 if absent.
fn status_bytes(pid: u32, name: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The resident set of process `pid` by mapping (/proc/PID/smaps): each
/// mapped file by name, `[heap]`, and the other anonymous mappings (thread
/// stacks, allocator arenas, large allocations) together; largest first.
fn rss_by_mapping(pid: u32) -> Vec<(String, u64)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut by: std::collections::BTreeMap<String, u64> = Default::default();
    let mut name = String::new();
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let Some(kb) = line.strip_prefix("Rss:") {
            let kb: u64 = kb.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            *by.entry(name.clone()).or_default() += kb * 1024;
        } else if fields
            .first()
            .is_some_and(|f| f.contains('-') && f.chars().all(|c| c.is_ascii_hexdigit() || c == '-'))
        {
            // A mapping's header: address range, perms, offset, device, inode, path.
            name = match fields.get(5) {
                None => "anonymous".to_string(),
                Some(path) => path.rsplit('/').next().unwrap_or(path).to_string(),
            };
        }
    }
    let mut v: Vec<(String, u64)> = by.into_iter().filter(|&(_, b)| b > 0).collect();
    v.sort_by_key(|m| std::cmp::Reverse(m.1));
    v
}

fn print_maps(pid: u32) {
    let maps: Vec<String> =
        rss_by_mapping(pid).iter().take(8).map(|(n, b)| format!("{n} {:.2}", mib(*b as f64))).collect();
    println!("  resident by mapping, MiB: {}", maps.join(", "));
}

fn metrics(d: &Daemon) -> Result<String, String> {
    ureq::get(&format!("{}/metrics", d.base))
        .timeout(Duration::from_secs(10))
        .call()
        .map_err(|e| format!("/metrics: {e}"))?
        .into_string()
        .map_err(|e| e.to_string())
}

fn read(d: &Daemon) -> Result<Reading, String> {
    let text = metrics(d)?;
    Ok(Reading {
        rss_bytes: d.rss_bytes(),
        anon_bytes: status_bytes(d.pid(), "RssAnon"),
        file_bytes: status_bytes(d.pid(), "RssFile"),
        index_bytes: metric(&text, "kv_indexer_index_bytes").unwrap_or(0.0),
        pairs: metric(&text, "kv_indexer_pairs").unwrap_or(0.0),
    })
}

/// Polls until the daemon holds `pairs` pairs; the time it took.
fn wait_pairs(d: &Daemon, pairs: f64, since: Instant) -> Result<Duration, String> {
    let deadline = Instant::now() + Duration::from_millis(APPLY_WAIT_MS);
    loop {
        let r = read(d)?;
        if r.pairs == pairs {
            return Ok(since.elapsed());
        }
        if Instant::now() > deadline {
            return Err(format!("the daemon holds {} pairs, not {pairs}, after {APPLY_WAIT_MS} ms", r.pairs));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// User plus system CPU seconds of process `pid` so far.
fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of the line; `fields` starts at field 3.
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) as f64 / hz
}

fn mib(bytes: f64) -> f64 {
    bytes / (1 << 20) as f64
}

/// One line of the report: RSS whole and over the idle daemon, per pair and over index bytes.
fn report(label: &str, r: &Reading, idle: &Reading, pairs: f64, loaded_index_bytes: f64) {
    let rss = r.rss_bytes as f64;
    let over_idle = rss - idle.rss_bytes as f64;
    println!(
        "{label:<22} RSS {:>7.1} MiB ({:>6.1} over idle; anon {:>6.1}, files {:>4.1}), index {:>7.1} MiB, {:>7} pairs | per loaded pair: RSS {:>6.1} B ({:>6.1} over idle), index {:>5.1} B | RSS/index {:>5.2} ({:>5.2} over idle)",
        mib(rss),
        mib(over_idle),
        mib(r.anon_bytes as f64),
        mib(r.file_bytes as f64),
        mib(r.index_bytes),
        r.pairs,
        rss / pairs,
        over_idle / pairs,
        r.index_bytes / pairs,
        rss / loaded_index_bytes,
        over_idle / loaded_index_bytes,
    );
}

fn run(a: &Args) -> Result<(), String> {
    for (k, v) in &a.env {
        // Set before the daemon starts, which inherits it; no other thread runs yet.
        std::env::set_var(k, v);
    }
    let d = Daemon::start(&a.bin, &a.daemon_args);
    let ctx = zmq::Context::new();
    let mut engines = Vec::new();
    for i in 1..=a.engines {
        let e = Engine::new(&ctx, i, BLOCK_SIZE)?;
        let body = serde_json::json!({"instance_id": i, "endpoint": e.endpoint, "model_name": MODEL, "block_size": BLOCK_SIZE});
        ureq::post(&format!("{}/register", d.base))
            .send_string(&body.to_string())
            .map_err(|e| format!("registering engine {i}: {e}"))?;
        engines.push(e);
    }
    for e in &mut engines {
        e.wait_subscribed(1)?;
    }
    let idle = read(&d)?;
    let pairs = (a.engines as usize * a.blocks) as f64;
    println!(
        "daemon {} {}{}: {} engines x {} blocks = {pairs} pairs, prompts of {} blocks; idle RSS {:.1} MiB (anon {:.1}, files {:.1})",
        a.bin,
        a.daemon_args.join(" "),
        a.env.iter().map(|(k, v)| format!(" {k}={v}")).collect::<String>(),
        a.engines,
        a.blocks,
        a.prompt_blocks,
        mib(idle.rss_bytes as f64),
        mib(idle.anon_bytes as f64),
        mib(idle.file_bytes as f64)
    );
    print_maps(d.pid());

    for cycle in 1..=a.cycles {
        println!("cycle {cycle}:");
        let started = Instant::now();
        let cpu_before = cpu_s(d.pid());
        let prompts = a.blocks.div_ceil(a.prompt_blocks);
        // Half the prompts, a settled reading, then the rest: the second
        // half's cost is the marginal one (connections and threads are
        // already warm).
        let mut half = None;
        for p in 0..prompts {
            if p == prompts / 2 && p > 0 {
                let half_pairs = (a.engines as usize * p * a.prompt_blocks) as f64;
                wait_pairs(&d, half_pairs, started)?;
                std::thread::sleep(Duration::from_secs_f64(a.settle_s));
                half = Some(read(&d)?);
            }
            let len = a.prompt_blocks.min(a.blocks - p * a.prompt_blocks);
            for e in &mut engines {
                e.store_prompt(&prompt_tokens(cycle, e.instance_id, p, len))?;
            }
        }
        let took = wait_pairs(&d, pairs, started)?;
        let loaded = read(&d)?;
        let load_cpu_s = cpu_s(d.pid()) - cpu_before;
        println!(
            "loaded in {:.2} s, daemon CPU {load_cpu_s:.2} s ({:.0} ns a block)",
            took.as_secs_f64(),
            load_cpu_s / pairs * 1e9
        );
        report("after load", &loaded, &idle, pairs, loaded.index_bytes);
        std::thread::sleep(Duration::from_secs_f64(a.settle_s));
        let settled = read(&d)?;
        report(&format!("after load +{}s", a.settle_s), &settled, &idle, pairs, loaded.index_bytes);
        print_maps(d.pid());
        // The second half's RSS over its index bytes.
        let marginal = half.map_or(f64::NAN, |h| {
            (settled.rss_bytes as f64 - h.rss_bytes as f64) / (settled.index_bytes - h.index_bytes)
        });
        println!("second half of the load: RSS added over index bytes added {marginal:.3}");

        let started = Instant::now();
        for e in &mut engines {
            e.clear()?;
        }
        let took = wait_pairs(&d, 0.0, started)?;
        let cleared = read(&d)?;
        println!("cleared in {:.2} s", took.as_secs_f64());
        report("after clear", &cleared, &idle, pairs, loaded.index_bytes);
        std::thread::sleep(Duration::from_secs_f64(a.settle_s));
        let cleared_settled = read(&d)?;
        report(&format!("after clear +{}s", a.settle_s), &cleared_settled, &idle, pairs, loaded.index_bytes);
        println!(
            "result: cycle {cycle} rss_per_pair {:.1} index_per_pair {:.1} rss_over_index {:.3} rss_over_idle_over_index {:.3} marginal_rss_over_index {marginal:.3} rss_loaded_mib {:.1} anon_loaded_mib {:.1} files_loaded_mib {:.1} rss_cleared_mib {:.1} idle_mib {:.1} idle_anon_mib {:.1} load_cpu_s {load_cpu_s:.2}",
            settled.rss_bytes as f64 / pairs,
            loaded.index_bytes / pairs,
            settled.rss_bytes as f64 / loaded.index_bytes,
            (settled.rss_bytes as f64 - idle.rss_bytes as f64) / loaded.index_bytes,
            mib(settled.rss_bytes as f64),
            mib(settled.anon_bytes as f64),
            mib(settled.file_bytes as f64),
            mib(cleared_settled.rss_bytes as f64),
            mib(idle.rss_bytes as f64),
            mib(idle.anon_bytes as f64)
        );
    }
    if d.log.errors.load(std::sync::atomic::Ordering::Relaxed) > 0 {
        return Err(format!("the daemon logged errors: {:?}", d.log.notable.lock()));
    }
    Ok(())
}

fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("daemon_rss: {e}");
        std::process::exit(2);
    });
    if let Err(e) = run(&args) {
        eprintln!("daemon_rss: {e}");
        std::process::exit(1);
    }
}

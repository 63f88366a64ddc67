//! Fleet-scale bench: a thousand and more engines publishing over ZMQ in
//! vLLM's wire format, each with a replay ring, one daemon following them
//! all, and what that costs it.
//!
//! Engine processes (this binary again, `--per-child` engines each, see
//! `fleet/child.rs`) run the Mooncake trace as `--copies` hash-disjoint
//! copies over `--engines` mock engines with LRU caches of `--gpu-blocks`,
//! so the pairs at the end are about engines x gpu-blocks. Our daemon
//! follows them from a workers file; with `--dynamo PATH` Dynamo's service
//! follows the same engines in the same run (registered by `/register`).
//! Phases (`--scenarios`, `fleet/scenarios.rs`): settle, dump, replica,
//! snapshot, flood, flood-empty. Every figure comes from /proc (VmRSS, VmHWM reset by
//! `clear_refs` before a phase, /proc/PID/fd, /proc/PID/task, utime+stime)
//! or the servers' HTTP answers; the bench talks to the servers over HTTP
//! only, so it runs unchanged on any build of either.
//!
//! Run: `cargo bench --bench fleet -- --trace PATH [--engines 1024 --copies
//! 16 --gpu-blocks 16384] [--dynamo PATH] [--json out.json]`; `--help` lists
//! every option. With `FLEET_LOG_DIR=DIR` each server's whole log also
//! goes to `DIR/NAME.log`.

#[path = "fleet/args.rs"]
mod args;
#[path = "fleet/cache.rs"]
mod cache;
#[path = "fleet/child.rs"]
mod child;
#[path = "http_query/engines.rs"]
#[allow(dead_code)] // shared with benches/http_query, which uses more of it
mod engines;
#[path = "trace/mooncake.rs"]
#[allow(dead_code)] // shared with benches/trace_replay
mod mooncake;
#[path = "fleet/probe.rs"]
mod probe;
#[path = "fleet/publishers.rs"]
mod publishers;
#[path = "fleet/report.rs"]
mod report;
#[path = "fleet/scenarios.rs"]
mod scenarios;
#[path = "fleet/watch.rs"]
mod watch;

use std::io::Write;
use std::time::Duration;

use serde_json::json;

use probe::{post, Server};
use publishers::Publishers;
use scenarios::Ctx;

const MODEL: &str = "fleet";

fn main() {
    let a = match args::parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("fleet: {e}");
            std::process::exit(2);
        }
    };
    let result = match a.child {
        Some((first, end)) => child::run(&a, first, end),
        None => run(&a),
    };
    if let Err(e) = result {
        eprintln!("fleet: {e}");
        std::process::exit(1);
    }
}

fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map_or_else(|| "unknown".into(), |s| s.trim().to_string())
}

fn run(a: &args::Args) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("kv-fleet-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("snap")).map_err(|e| format!("{}: {e}", dir.display()))?;
    let pubs = Publishers::start(a)?;
    let workers_file = dir.join("workers.jsonl");
    let mut lines = String::new();
    for e in &pubs.engines {
        let line = json!({"instance_id": e.instance, "endpoint": e.endpoint, "replay_endpoint": e.replay,
            "model_name": MODEL, "block_size": child::BLOCK_SIZE});
        lines.push_str(&format!("{line}\n"));
    }
    std::fs::write(&workers_file, lines).map_err(|e| e.to_string())?;
    let mut c = Ctx {
        a,
        pubs,
        report: Default::default(),
        workers_file,
        snapshot_dir: dir.join("snap"),
        published: Default::default(),
    };
    let r = &mut c.report;
    r.put("run", "machine", "commit", json!(git_commit()));
    r.put("run", "machine", "unix_time", json!(std::time::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_secs())));
    r.put("run", "engines", "engines", json!(a.engines));
    r.put("run", "engines", "processes", json!(c.pubs.pids.len()));
    r.put("run", "engines", "copies", json!(a.copies));
    r.put("run", "engines", "gpu_blocks", json!(a.gpu_blocks));
    r.put("run", "engines", "trace", json!(a.trace));
    r.put("run", "engines", "ring_steps", json!(a.ring_steps));
    r.put("run", "engines", "ring_mib", json!(a.ring_mib));
    r.put("run", "engines", "chunk_blocks", json!(a.chunk_blocks));
    r.load("run");

    let ours = Server::spawn("ours", &a.bin, &c.our_args(None, true))?;
    let mut ours_ready = ours;
    ours_ready.wait_healthy(Duration::from_secs(600))?;
    let mut dynamo = match &a.dynamo {
        Some(path) => start_dynamo(&mut c, path),
        None => None,
    };
    let subs = 1 + usize::from(dynamo.is_some());
    c.pubs.wait_subscribed(subs)?;
    // Every later phase needs the engines' state, so settle always runs.
    let mut ours = ours_ready;
    scenarios::settle(&mut c, &ours, dynamo.as_ref())?;
    if a.wants("dump") {
        let mut servers = vec![("ours", &ours)];
        if let Some(d) = &dynamo {
            servers.push(("dynamo", d));
        }
        scenarios::dump(&mut c, &servers)?;
    }
    if let Some(status) = dynamo.as_mut().and_then(Server::exit_status) {
        c.report.put("run", "dynamo", "exit_status", json!(status));
    }
    drop(dynamo);
    if a.wants("replica") {
        scenarios::replica(&mut c, &ours)?;
    }
    if a.wants("snapshot") {
        ours = scenarios::snapshot(&mut c, ours)?;
    }
    if a.wants("flood") {
        ours = scenarios::flood(&mut c, ours)?;
    }
    if a.wants("flood-empty") {
        ours = scenarios::flood_empty(&mut c, ours)?;
    }
    ours.kill();
    c.report.load("end");
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&c.report.json).map_err(|e| e.to_string())?;
        let mut f = std::fs::File::create(path).map_err(|e| format!("{path}: {e}"))?;
        f.write_all(text.as_bytes()).map_err(|e| format!("{path}: {e}"))?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Starts Dynamo's service and registers every engine with it; None (and
/// a note saying why) if it cannot follow them all.
fn start_dynamo(c: &mut Ctx, path: &str) -> Option<Server> {
    let args: Vec<String> = ["--port", "0"].iter().map(|s| s.to_string()).collect();
    let mut d = match Server::spawn("dynamo", path, &args) {
        Ok(d) => d,
        Err(e) => {
            c.report.note("run", "dynamo", &e);
            return None;
        }
    };
    if let Err(e) = d.wait_healthy(Duration::from_secs(120)) {
        c.report.note("run", "dynamo", &e);
        return None;
    }
    for (n, e) in c.pubs.engines.iter().enumerate() {
        let body = json!({"instance_id": e.instance, "endpoint": e.endpoint, "replay_endpoint": e.replay,
            "model_name": MODEL, "block_size": child::BLOCK_SIZE});
        let answer = post(&d.base, "/register", &body.to_string());
        if !matches!(answer, Ok((200..=299, _))) || !d.alive() {
            let why = format!(
                "registering engine {} of {} failed: {answer:?}; {}",
                n + 1,
                c.pubs.engines.len(),
                d.log_tail()
            );
            c.report.note("run", "dynamo", &why);
            return None;
        }
    }
    c.report.put("run", "dynamo", "registered", json!(c.pubs.engines.len()));
    Some(d)
}

//! `/dump` and peer recovery at fleet size: how long a dump takes and what
//! it adds to the daemon's memory, and how long a replica takes to recover
//! from it and how much memory that takes, JSON and compact.
//!
//! A daemon (A) is filled to `--pairs` live (block, worker) pairs over
//! `--workers` workers without any engine: this bench serves it a compact
//! dump as its startup peer, generated on the fly from the Mooncake
//! conversation trace routed over the workers (each worker walks the
//! trace from its own offset, storing each request's chain, skipping the
//! prefix it holds already, until it holds its share; a lap over the trace
//! makes new blocks of the same shapes). Then:
//!
//! - A's settled RSS (after `--settle-s`);
//! - `GET /dump` as JSON and as compact, read to the end on loopback:
//!   bytes, seconds, MB/s, and the peak RSS the dump added to A (VmHWM
//!   reset through /proc/PID/clear_refs before, read after, less VmRSS
//!   before);
//! - a replica (B) started with `--peers A`: seconds from spawn to a
//!   healthy `/health`, its peak RSS (VmHWM) and its RSS `--settle-s`
//!   later, and its pairs against A's; once with the compact format and
//!   once through a proxy that drops the `Accept` header (JSON).
//!
//! `cargo bench --bench dump_scale -- [--pairs 16777216] [--workers 1024]
//! [--trace PATH] [--settle-s 5] [--bin target/release/kv-indexer]`
//! (without `--trace`, the 800-request sample in `benches/data`).

#[path = "soak/daemon.rs"]
#[allow(dead_code)] // shared with benches/soak, which uses more of it
mod daemon;

use daemon::{metric, Daemon};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use xxhash_rust::xxh3::Xxh3;

struct Args {
    pairs: u64,
    workers: u64,
    trace: String,
    settle_s: u64,
    bin: String,
}

fn parse_args() -> Result<Args, String> {
    use lexopt::prelude::*;
    let mut a = Args {
        pairs: 1 << 24,
        workers: 1024,
        trace: concat!(env!("CARGO_MANIFEST_DIR"), "/benches/data/sample_trace.jsonl").into(),
        settle_s: 5,
        bin: env!("CARGO_BIN_EXE_kv-indexer").into(),
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
        let value = p.value().map_err(|e| e.to_string())?.into_string().map_err(|_| "not UTF-8".to_string())?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("--{name}: {e}"));
        match name.as_str() {
            "pairs" => a.pairs = num(&value)?,
            "workers" => a.workers = num(&value)?,
            "trace" => a.trace = value,
            "settle-s" => a.settle_s = num(&value)?,
            "bin" => a.bin = value,
            _ => return Err(format!("unknown option --{name}")),
        }
    }
    if a.workers == 0 || a.workers > 65_536 || a.pairs < a.workers {
        return Err("--workers must be in 1..=65536 and --pairs at least --workers".into());
    }
    Ok(a)
}

/// Each request's chain of Mooncake hash ids.
fn read_trace(path: &str) -> Vec<Vec<u64>> {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut out = Vec::new();
    for line in BufReader::new(f).lines().map_while(Result::ok) {
        let v: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
        let ids: Vec<u64> = v["hash_ids"].as_array().expect("hash_ids").iter().filter_map(|x| x.as_u64()).collect();
        if !ids.is_empty() {
            out.push(ids);
        }
    }
    out
}

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The compact dump of the routed trace (the format of `dump::binary`),
/// written to `out` a worker at a time, checksummed as it goes.
/// Sends `buf` as one chunk, hashed, and empties it.
fn flush(buf: &mut Vec<u8>, out: &mut dyn Write, hash: &mut Xxh3) -> std::io::Result<()> {
    hash.update(buf);
    write!(out, "{:x}\r\n", buf.len())?;
    out.write_all(buf)?;
    out.write_all(b"\r\n")?;
    buf.clear();
    Ok(())
}

fn serve_generated(out: &mut dyn Write, trace: &[Vec<u64>], pairs: u64, workers: u64) -> std::io::Result<u64> {
    let mut hash = Xxh3::new();
    let mut buf: Vec<u8> = Vec::with_capacity(4 << 20);
    buf.extend_from_slice(b"KVIXDUMP");
    buf.extend_from_slice(&1u32.to_le_bytes());
    buf.push(1);
    for name in ["m", "default"] {
        buf.extend_from_slice(&(name.len() as u32).to_le_bytes());
        buf.extend_from_slice(name.as_bytes());
    }
    buf.extend_from_slice(&16u32.to_le_bytes());
    let (mut events, mut total) = (0u64, 0u64);
    let mut held: rustc_hash::FxHashSet<u64> = Default::default();
    let n = trace.len() as u64;
    for w in 0..workers {
        let share = pairs / workers + u64::from(w < pairs % workers);
        held.clear();
        buf.push(2);
        buf.extend_from_slice(&w.to_le_bytes());
        buf.extend_from_slice(&0u32.to_le_bytes());
        let mut j = (w * 7919) % n;
        let mut have = 0u64;
        while have < share {
            let (chain, lap) = (&trace[(j % n) as usize], j / n);
            j += 1;
            let key = |id: u64| mix(id ^ (lap << 44));
            let skip = chain.iter().take_while(|&&id| held.contains(&key(id))).count();
            let take = ((chain.len() - skip) as u64).min(share - have) as usize;
            if take == 0 {
                continue;
            }
            let parent = (skip > 0).then(|| key(chain[skip - 1]));
            buf.push(3);
            buf.push(if parent.is_some() { 1 << 4 } else { 0 });
            if let Some(p) = parent {
                buf.extend_from_slice(&p.to_le_bytes());
            }
            buf.extend_from_slice(&(take as u32).to_le_bytes());
            for &id in &chain[skip..skip + take] {
                let k = key(id);
                held.insert(k);
                buf.extend_from_slice(&k.to_le_bytes());
                buf.extend_from_slice(&mix(k ^ 0x5151).to_le_bytes());
            }
            have += take as u64;
            events += 1;
        }
        total += have;
        if buf.len() >= 1 << 20 {
            flush(&mut buf, out, &mut hash)?;
        }
    }
    buf.push(0);
    hash.update(&buf);
    let digest = hash.digest();
    buf.extend_from_slice(&events.to_le_bytes());
    buf.extend_from_slice(&digest.to_le_bytes());
    write!(out, "{:x}\r\n", buf.len())?;
    out.write_all(&buf)?;
    out.write_all(b"\r\n0\r\n\r\n")?;
    Ok(total)
}

/// Reads a request head off `s`.
fn read_head(s: &mut TcpStream) -> Vec<u8> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
        head.push(byte[0]);
    }
    head
}

/// Serves the generated dump to one request; the peer URL.
fn generator_peer(trace: Vec<Vec<u64>>, pairs: u64, workers: u64) -> (String, std::thread::JoinHandle<u64>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        read_head(&mut s);
        let head =
            "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.kv-indexer.dump\r\nTransfer-Encoding: chunked\r\n\r\n";
        s.write_all(head.as_bytes()).unwrap();
        let mut w = std::io::BufWriter::with_capacity(4 << 20, s);
        let total = serve_generated(&mut w, &trace, pairs, workers).expect("serving the generated dump");
        w.flush().unwrap();
        total
    });
    (url, t)
}

/// A proxy to `target` that drops the `Accept` header of each request,
/// so a replica behind it is answered JSON.
fn json_proxy(target: String) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let target = target.clone();
            std::thread::spawn(move || {
                let head = String::from_utf8_lossy(&read_head(&mut c)).into_owned();
                let kept: String = head
                    .split("\r\n")
                    .filter(|l| !l.to_ascii_lowercase().starts_with("accept:"))
                    .collect::<Vec<_>>()
                    .join("\r\n");
                let mut up = TcpStream::connect(target.trim_start_matches("http://")).unwrap();
                up.write_all(kept.as_bytes()).unwrap();
                let _ = std::io::copy(&mut up, &mut c);
            });
        }
    });
    url
}

/// GET `path` with `Connection: close`; status, and the body bytes read (headers and framing included).
fn get(base: &str, path: &str, accept: &str) -> (u16, Vec<u8>) {
    let Ok(mut s) = TcpStream::connect(base.trim_start_matches("http://")) else { return (0, Vec::new()) };
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return (0, Vec::new());
    }
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    let status = all.get(9..12).and_then(|b| std::str::from_utf8(b).ok()?.parse().ok()).unwrap_or(0);
    (status, all)
}

/// Reads a dump to its end, counting bytes only; (status, bytes).
fn dump_bytes(base: &str, accept: &str) -> (u16, u64) {
    let mut s = TcpStream::connect(base.trim_start_matches("http://")).unwrap();
    let req = format!("GET /dump HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = vec![0u8; 4 << 20];
    let (mut total, mut first) = (0u64, Vec::new());
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        if first.len() < 12 {
            first.extend_from_slice(&buf[..n.min(12)]);
        }
        total += n as u64;
    }
    let status = first.get(9..12).and_then(|b| std::str::from_utf8(b).ok()?.parse().ok()).unwrap_or(0);
    (status, total)
}

fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Resets the process's peak RSS (VmHWM) to its current RSS.
fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("resetting VmHWM (needs /proc/PID/clear_refs)");
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

fn pairs_of(base: &str) -> u64 {
    let (_, body) = get(base, "/metrics", "*/*");
    metric(&String::from_utf8_lossy(&body), "kv_indexer_pairs").unwrap_or(0.0) as u64
}

fn wait_healthy(base: &str, limit: Duration) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if get(base, "/health", "*/*").0 == 200 {
            return Some(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() {
    let a = parse_args().unwrap_or_else(|e| {
        eprintln!("dump_scale: {e}");
        std::process::exit(2)
    });
    let trace = read_trace(&a.trace);
    println!(
        "trace {} ({} requests), {} pairs over {} workers; load {}",
        a.trace,
        trace.len(),
        a.pairs,
        a.workers,
        loadavg()
    );
    let (gen_url, generator) = generator_peer(trace, a.pairs, a.workers);
    let common = |peer: &str| -> Vec<String> {
        ["--peers", peer, "--slow-joiner-ms", "0", "--peer-timeout-ms", "60000", "--max-pairs", "0"]
            .map(String::from)
            .to_vec()
    };
    let t = Instant::now();
    let src = Daemon::start(&a.bin, &common(&gen_url));
    wait_healthy(&src.base, Duration::from_secs(3600)).expect("the source daemon never became healthy");
    let sent = generator.join().unwrap();
    let pairs = pairs_of(&src.base);
    println!("source: {pairs} pairs ({sent} sent) in {:.1} s from the generator", t.elapsed().as_secs_f64());
    std::thread::sleep(Duration::from_secs(a.settle_s));
    let pid = src.pid();
    let settled = status_kb(pid, "VmRSS:");
    println!("source settled RSS {:.0} MB ({:.1} bytes a pair)", mb(settled), settled as f64 / pairs as f64);
    for (name, accept) in [("JSON", "application/json"), ("compact", "application/vnd.kv-indexer.dump")] {
        reset_peak(pid);
        let before = status_kb(pid, "VmRSS:");
        let t = Instant::now();
        let (status, bytes) = dump_bytes(&src.base, accept);
        let secs = t.elapsed().as_secs_f64();
        let peak = status_kb(pid, "VmHWM:");
        assert_eq!(status, 200, "{name} dump");
        println!(
            "dump {name}: {:.0} MB in {secs:.2} s ({:.0} MB/s, {:.1} bytes a pair); peak RSS added {:.1} MB; load {}",
            mb(bytes),
            mb(bytes) / secs,
            bytes as f64 / pairs as f64,
            mb(peak.saturating_sub(before)),
            loadavg()
        );
    }
    for (name, peer) in [("compact", src.base.clone()), ("JSON", json_proxy(src.base.clone()))] {
        let mut args = common(&peer);
        args[5] = "10000".into(); // the default --peer-timeout-ms
        let t = Instant::now();
        let (replica, recovered_line) = Daemon::start_noting(&a.bin, &args, "recovered from peer");
        let healthy = wait_healthy(&replica.base, Duration::from_secs(3600)).expect("the replica never became healthy");
        let since_spawn = t.elapsed();
        let peak = status_kb(replica.pid(), "VmHWM:");
        let got = pairs_of(&replica.base);
        std::thread::sleep(Duration::from_secs(a.settle_s));
        let settled = status_kb(replica.pid(), "VmRSS:");
        println!(
            "replica {name}: healthy {:.2} s after spawn ({:.2} s of polling); {got} pairs{}; peak RSS {:.0} MB, \
             settled {:.0} MB ({:.2}x); load {}",
            since_spawn.as_secs_f64(),
            healthy.as_secs_f64(),
            if got == pairs { "" } else { " (NOT the source's)" },
            mb(peak),
            mb(settled),
            peak as f64 / settled as f64,
            loadavg()
        );
        if let Ok(line) = recovered_line.recv_timeout(Duration::from_secs(1)) {
            println!("  replica log: {}", line.split(" INFO ").nth(1).unwrap_or(&line));
        }
        drop(replica);
    }
}

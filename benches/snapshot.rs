//! Snapshot benchmark: what a stop's snapshot costs, how large the file
//! is and how long a warm start takes, for about a million (block, worker)
//! pairs (64 workers x 16,384 blocks by default), through the real daemon.
//!
//! A peer serving a `/dump` of that state fills the first daemon; each
//! round then stops the daemon (SIGTERM: capture with shard sync, the
//! indexes read out into the file, crash-safe write with fsync) and starts
//! the next from the file (open, events read into fresh indexes). The
//! figures are the daemon's own, from its debug log: `snapshot written
//! (stop): ... (capture C ms, write W ms)` and `snapshot restored: ... in
//! R ms`; the load total is from the process's spawn to that line.
//!
//! Memory, from /proc: the resident set once loaded (VmRSS 1.2 s after
//! the `restored` line: the allocator's trim thread runs each second);
//! the peak while loading (VmHWM at that line) and while saving (VmHWM
//! reset through `clear_refs` just before SIGTERM, read every 2 ms until
//! the process is gone), each also over that resident set. Memory freed
//! that the allocator keeps counts in the resident set, so the absolute
//! peaks compare best between builds.
//!
//! `cargo bench --bench snapshot [-- --workers N --blocks N --dir PATH --rounds N]`
//! (`--dir` picks the file system; default: the system temp dir).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Blocks of the system prompt every worker holds once, at the root.
const PROMPT: u64 = 16;
/// Blocks per conversation, chained to the system prompt.
const CONVERSATION: u64 = 48;
/// How long the daemon may take for any one step.
const STEP_TIMEOUT: Duration = Duration::from_secs(600);

/// A `/dump` of index `m:default` with `workers` x `blocks` pairs: per
/// worker a shared system prompt, then conversations hanging off it (no
/// aliases). Returns the body and its pairs.
fn dump(workers: u64, blocks: u64) -> (Vec<u8>, u64) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut events = Vec::new();
    let mut pairs = 0;
    for w in 0..workers {
        let mut engine = w << 40;
        let mut chain = |n: u64, shared: bool, parent: Option<u64>, rng: &mut Rng| {
            let blocks: Vec<String> = (0..n)
                .map(|k| {
                    engine += 1;
                    let local = if shared { 9_000 + k } else { rng.next() };
                    format!(r#"{{"block_hash":{engine},"tokens_hash":{local}}}"#)
                })
                .collect();
            let parent = parent.map_or("null".to_string(), |p| p.to_string());
            let id = events.len();
            events.push(format!(
                r#"{{"worker_id":{w},"event":{{"event_id":{id},"data":{{"stored":{{"parent_hash":{parent},"blocks":[{}]}}}},"dp_rank":0}}}}"#,
                blocks.join(",")
            ));
            (n, engine)
        };
        let (n, root) = chain(PROMPT.min(blocks), true, None, &mut rng);
        let mut held = n;
        while held < blocks {
            held += chain(CONVERSATION.min(blocks - held), false, Some(root), &mut rng).0;
        }
        pairs += held;
    }
    let body = format!(
        r#"{{"m:default":{{"model_name":"m","tenant_id":"default","block_size":16,"events":[{}]}}}}"#,
        events.join(",")
    );
    (body.into_bytes(), pairs)
}

/// Serves `body` as every request's reply on a free loopback port; its URL.
fn serve(body: Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().unwrap());
    let body = Arc::new(body);
    std::thread::spawn(move || {
        for mut s in listener.incoming().map_while(Result::ok) {
            let body = body.clone();
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).is_ok_and(|n| n == 1) {
                    head.push(byte[0]);
                }
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(reply.as_bytes()).and_then(|()| s.write_all(&body));
            });
        }
    });
    url
}

/// The daemon, its stderr lines as they come.
struct Daemon {
    child: Child,
    pid: u32,
    lines: Receiver<String>,
    started: Instant,
}

impl Daemon {
    fn start(args: &[&str]) -> Daemon {
        let started = Instant::now();
        let mut child = Command::new(env!("CARGO_BIN_EXE_kv-indexer"))
            .args(["--port", "0", "--host", "127.0.0.1", "--no-pin", "--log-level", "debug"])
            .args(args)
            .env_remove("NOTIFY_SOCKET")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting kv-indexer");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Daemon { pid: child.id(), child, lines, started }
    }

    /// VmRSS and VmHWM, in bytes (0 once the process is gone).
    fn memory(&self) -> (u64, u64) {
        memory(self.pid)
    }

    /// The first line from now on that contains `text`, and when it came.
    fn wait_for(&self, text: &str) -> (String, Instant) {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|_| panic!("the daemon never logged {text:?}"));
            assert!(!line.contains(" WARN ") && !line.contains(" ERROR "), "{line}");
            if line.contains(text) {
                return (line, Instant::now());
            }
        }
    }

    /// SIGTERM, then its stop snapshot's log line and the peak resident
    /// set the stop reached, in bytes.
    fn stop(mut self) -> (String, u64) {
        let _ = std::fs::write(format!("/proc/{}/clear_refs", self.pid), "5");
        let pid = self.pid;
        let peak = std::thread::spawn(move || {
            let mut peak = 0;
            loop {
                let (rss, hwm) = memory(pid);
                if rss == 0 {
                    return peak;
                }
                peak = peak.max(hwm);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let (line, _) = self.wait_for("snapshot written (stop)");
        assert_eq!(self.child.wait().ok().and_then(|s| s.code()), Some(0), "a clean stop");
        (line, peak.join().unwrap())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// VmRSS and VmHWM of `pid`, in bytes (0 when it has none: gone).
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        let v = status.lines().find_map(|l| l.strip_prefix(key));
        v.and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok()).map_or(0, |k| k * 1024)
    };
    (kb("VmRSS:"), kb("VmHWM:"))
}

/// The number before `unit` in `line` (`"... 12.5 ms"`), after `after`.
fn number(line: &str, after: &str, unit: &str) -> f64 {
    let rest = &line[line.find(after).unwrap_or_else(|| panic!("{after:?} in {line}")) + after.len()..];
    let field = rest.split(unit).next().unwrap().split_whitespace().last().unwrap();
    field.trim_start_matches('(').parse().unwrap_or_else(|_| panic!("{field:?} in {line}"))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut workers = 64u64;
    let mut blocks = 16_384u64;
    let mut rounds = 5usize;
    let mut dir = std::env::temp_dir().join(format!("kvi-snapshot-bench-{}", std::process::id()));
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--workers" => workers = args.next().and_then(|v| v.parse().ok()).expect("--workers N"),
            "--blocks" => blocks = args.next().and_then(|v| v.parse().ok()).expect("--blocks N"),
            "--rounds" => rounds = args.next().and_then(|v| v.parse().ok()).expect("--rounds N"),
            "--dir" => dir = PathBuf::from(args.next().expect("--dir PATH")).join("kvi-snapshot-bench"),
            _ => {} // cargo bench passes --bench
        }
    }
    let (body, pairs) = dump(workers, blocks);
    let peer = serve(body);
    let _ = std::fs::remove_dir_all(&dir);
    let dir_arg = dir.display().to_string();
    let snapshot = ["--snapshot-dir", dir_arg.as_str(), "--snapshot-interval-s", "0"];

    let first: Vec<&str> = snapshot.iter().copied().chain(["--peers", &peer, "--slow-joiner-ms", "0"]).collect();
    let d = Daemon::start(&[&first[..], &["--peer-timeout-ms", "600000"]].concat());
    let (line, _) = d.wait_for("recovered from peer");
    assert!(line.contains(&format!(" {pairs} blocks ")), "the peer's state is held: {line}");
    let (mut saved, _) = d.stop();

    let (mut capture, mut write, mut save) = (vec![], vec![], vec![]);
    let (mut restore, mut load) = (vec![], vec![]);
    let (mut save_peak, mut save_add, mut load_peak, mut load_add, mut settled) =
        (vec![], vec![], vec![], vec![], vec![]);
    let mut bytes = 0;
    for _ in 0..rounds.max(1) {
        assert!(saved.contains(&format!(" {pairs} pairs, ")), "{saved}");
        capture.push(number(&saved, "(capture", "ms"));
        write.push(number(&saved, ", write ", "ms)"));
        save.push(number(&saved, " in ", "ms"));
        bytes = std::fs::metadata(Path::new(&dir).join("snapshot.bin")).expect("the snapshot file").len();

        let d = Daemon::start(&snapshot);
        let (line, at) = d.wait_for("snapshot restored");
        assert!(line.contains(&format!(" {pairs} pairs, ")), "{line}");
        let (_, hwm) = d.memory();
        restore.push(number(&line, " watermark(s) in ", "ms"));
        load.push((at - d.started).as_secs_f64() * 1e3);
        std::thread::sleep(Duration::from_millis(1_200));
        let (rss, _) = d.memory();
        settled.push(rss as f64 / 1e6);
        load_peak.push(hwm as f64 / 1e6);
        load_add.push(hwm.saturating_sub(rss) as f64 / 1e6);
        let peak;
        (saved, peak) = d.stop();
        save_peak.push(peak as f64 / 1e6);
        save_add.push(peak.saturating_sub(rss) as f64 / 1e6);
    }
    let _ = std::fs::remove_dir_all(&dir);

    println!(
        "snapshot of {workers} workers x {blocks} blocks = {pairs} (block, worker) pairs, {rounds} rounds, medians"
    );
    println!("file {}: {:.1} MB, {:.1} bytes/pair", dir.display(), bytes as f64 / 1e6, bytes as f64 / pairs as f64);
    println!("| step | ms |");
    println!("|---|---:|");
    for (name, v) in [
        ("capture (watermarks, shard sync, registrations)", &mut capture),
        ("write (indexes read out into the temp file, fsync, rename, fsync dir)", &mut write),
        ("**save total** (what a stop costs)", &mut save),
        ("restore (events read and applied to fresh indexes)", &mut restore),
        ("**load total** (spawn to restored: start, open, restore)", &mut load),
    ] {
        println!("| {name} | {:.1} |", median(v));
    }
    println!("| memory | MB |");
    println!("|---|---:|");
    for (name, v) in [
        ("resident set once loaded (VmRSS, 1.2 s after restored)", &mut settled),
        ("peak while loading (VmHWM at restored)", &mut load_peak),
        ("**peak a load adds** (that over the resident set)", &mut load_add),
        ("peak while saving (VmHWM during the stop)", &mut save_peak),
        ("**peak a save adds** (that over the resident set)", &mut save_add),
    ] {
        println!("| {name} | {:.1} |", median(v));
    }
}

//! The daemon under soak: the real binary on a free loopback port, its
//! stderr drained (warnings and errors counted), its RSS read from /proc
//! and its figures scraped from /metrics.

use parking_lot::Mutex;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Log lines kept for the report.
const LINES_KEPT_MAX: usize = 16;

/// What the daemon wrote to stderr.
#[derive(Default)]
pub struct LogStats {
    pub warnings: AtomicU64,
    pub errors: AtomicU64,
    pub notable: Mutex<Vec<String>>,
}

pub struct Daemon {
    child: Child,
    pub base: String,
    pub log: Arc<LogStats>,
}

impl Daemon {
    /// Starts `bin` with `args` on a free port and waits until it listens.
    pub fn start(bin: &str, args: &[String]) -> Daemon {
        Daemon::start_noting(bin, args, "\0").0
    }

    /// `start`, and the log lines that contain `needle`, as they come.
    pub fn start_noting(bin: &str, args: &[String], needle: &str) -> (Daemon, std::sync::mpsc::Receiver<String>) {
        let (noted_tx, noted) = std::sync::mpsc::channel();
        let needle = needle.to_string();
        let mut child = Command::new(bin)
            .args(["--port", "0", "--host", "127.0.0.1", "--no-pin"])
            .args(args)
            .env_remove("NOTIFY_SOCKET")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting kv-indexer");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(LogStats::default());
        let (port_tx, port_rx) = std::sync::mpsc::channel();
        let l = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains(&needle) {
                    let _ = noted_tx.send(line.clone());
                }
                if let Some(rest) = line.split(" listening on ").nth(1) {
                    let port = rest.split_whitespace().next().and_then(|a| a.rsplit(':').next()?.parse::<u16>().ok());
                    let _ = port_tx.send(port);
                }
                // Lines start with a timestamp, then the level.
                let level = line.split_whitespace().nth(1).unwrap_or("");
                let counter = if level == "ERROR" {
                    &l.errors
                } else if level == "WARN" {
                    &l.warnings
                } else {
                    continue;
                };
                counter.fetch_add(1, Ordering::Relaxed);
                let mut kept = l.notable.lock();
                if kept.len() < LINES_KEPT_MAX {
                    kept.push(line);
                }
            }
        });
        let port = port_rx.recv_timeout(Duration::from_secs(20)).ok().flatten().expect("the daemon did not start");
        (Daemon { child, base: format!("http://127.0.0.1:{port}"), log }, noted)
    }

    /// The daemon's process id.
    #[allow(dead_code)] // benches/daemon_rss reads its CPU time; the soak does not
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory, from /proc.
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }

    /// Sends SIGTERM and waits; the exit code.
    pub fn terminate(mut self) -> Option<i32> {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().ok().and_then(|s| s.code())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sum of every sample of `name` (any labels) in a /metrics text; None if absent.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = l.strip_prefix(name) else { continue };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        if let Some(v) = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// One labelled sample, e.g. `name{status="failed"}`.
pub fn sample(text: &str, key: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(key)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

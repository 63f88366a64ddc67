//! The fleet bench's phases, in the order they run: settle (every engine
//! publishes its share of the trace at full speed, less the requests kept
//! for the flood), `/dump`, a replica recovering from the daemon, a stop
//! with a snapshot and a warm start, the flood (the daemon stopped, every
//! engine publishing its last `--flood-requests` into its ring meanwhile,
//! the daemon started warm: every ring replays what it missed at once),
//! and the empty flood (started with no snapshot: every ring fill from
//! seq 0 at once; blocks whose parents are older than the ring stay out).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

use super::args::Args;
use super::probe::{get_counted, Server};
use super::publishers::{Published, Publishers};
use super::report::Report;
use super::watch;

/// Longest wait for a started daemon's `/health`.
const HEALTH_WAIT: Duration = Duration::from_secs(900);
/// Pause after settling before the settled reading (freed memory trimmed).
const SETTLED_PAUSE: Duration = Duration::from_secs(5);

pub struct Ctx<'a> {
    pub a: &'a Args,
    pub pubs: Publishers,
    pub report: Report,
    pub workers_file: PathBuf,
    pub snapshot_dir: PathBuf,
    pub published: Published,
}

impl Ctx<'_> {
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.a.settle_timeout_s)
    }

    /// Our daemon's command line; `peers` makes it a replica.
    pub fn our_args(&self, peers: Option<&str>, snapshot: bool) -> Vec<String> {
        let mut v: Vec<String> = ["--port", "0", "--host", "127.0.0.1", "--no-pin", "--log-level", "info"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(["--workers-file".into(), self.workers_file.display().to_string()]);
        if snapshot {
            v.extend(["--snapshot-dir".into(), self.snapshot_dir.display().to_string()]);
            v.extend(["--snapshot-interval-s".into(), "0".into()]);
        }
        if let Some(p) = peers {
            v.extend(["--peers".into(), p.to_string()]);
            v.extend(self.a.replica_args.iter().cloned());
        }
        v.extend(self.a.daemon_args.iter().cloned());
        v
    }

    /// Status figures of `s` under `section`.
    fn status(&mut self, section: &str, who: &str, s: &Server, prefix: &str) {
        let st = s.status();
        self.report.mib(section, who, &format!("{prefix}rss"), st.rss);
        self.report.put(section, who, &format!("{prefix}fds"), json!(st.fds));
        self.report.put(section, who, &format!("{prefix}threads"), json!(st.threads));
    }
}

/// Every engine publishes its share; each server's time to settle, peak and
/// settled memory, files, threads, and CPU while idle afterwards.
pub fn settle(c: &mut Ctx, ours: &Server, dynamo: Option<&Server>) -> Result<(), String> {
    let sec = "settle";
    c.report.load(sec);
    let servers: Vec<(&str, &Server)> = std::iter::once(("ours", ours)).chain(dynamo.map(|d| ("dynamo", d))).collect();
    for (who, s) in &servers {
        c.status(sec, who, s, "idle_");
        s.reset_peak();
    }
    let t0 = Instant::now();
    let hold = if c.a.wants("flood") { c.a.flood_requests } else { 0 };
    c.published = publish(c, hold, t0)?;
    let p = c.published.clone();
    c.report.secs(sec, "engines", "publish", t0.elapsed().as_secs_f64());
    c.report.put(sec, "engines", "stored_blocks", json!(p.stored));
    c.report.put(sec, "engines", "removed_blocks", json!(p.removed));
    c.report.put(sec, "engines", "batches", json!(p.batches));
    c.report.mib(sec, "engines", "wire", p.bytes);
    c.report.put(sec, "engines", "cached_blocks", json!(p.cached_blocks));
    c.report.put(sec, "engines", "ring_block_ops", json!(p.ring_ops));
    c.report.put(sec, "engines", "ring_batches", json!(p.ring_batches));
    c.report.mib(sec, "engines", "ring", p.ring_bytes);
    c.report.mib(sec, "engines", "processes_rss", c.pubs.rss());
    let s = watch::wait_ours(ours, &p, t0, c.timeout())?;
    c.report.secs(sec, "ours", "settle", s.secs);
    c.report.put(sec, "ours", "pairs", json!(s.pairs));
    c.report.put(sec, "ours", "engines_behind", json!(s.behind));
    if let Some(d) = dynamo {
        match watch::wait_dynamo(d, t0, c.timeout()) {
            Ok(s) => c.report.secs(sec, "dynamo", "settle", s.secs),
            Err(e) => c.report.note(sec, "dynamo", &e),
        }
        // What it refused: a store whose parent it does not hold is dropped.
        for (kind, status) in [("stored", "ok"), ("stored", "parent_block_not_found"), ("removed", "ok")] {
            let n = watch::dynamo_events(&d.base, kind, status).unwrap_or(0.0);
            c.report.put(sec, "dynamo", &format!("{kind}_events_{status}"), json!(n));
        }
    }
    c.report.put(sec, "engines", "ring_requests_answered", json!(c.pubs.replays()?));
    std::thread::sleep(SETTLED_PAUSE);
    let cpu0: Vec<f64> = servers.iter().map(|(_, s)| s.status().cpu_s).collect();
    std::thread::sleep(Duration::from_secs(c.a.idle_s));
    for ((who, s), cpu0) in servers.iter().zip(cpu0) {
        if !s.running() {
            continue;
        }
        let st = s.status();
        c.report.mib(sec, who, "peak_rss", st.hwm);
        c.report.mib(sec, who, "settled_rss", st.rss);
        c.report.put(sec, who, "fds", json!(st.fds));
        c.report.put(sec, who, "threads", json!(st.threads));
        c.report.put(sec, who, "idle_cpu_pct", json!((st.cpu_s - cpu0) * 100.0 / c.a.idle_s as f64));
    }
    Ok(())
}

/// Has the engines publish all but their last `hold` requests; what they did.
fn publish(c: &mut Ctx, hold: u32, t0: Instant) -> Result<Published, String> {
    c.pubs.publish(hold)?;
    let mut acc = (0, Published::default());
    while !c.pubs.poll_published(&mut acc, Duration::from_secs(1))? {
        if t0.elapsed() > c.timeout() {
            return Err("the engines did not finish publishing".into());
        }
    }
    Ok(acc.1)
}

/// `/dump` of each server: bytes, seconds, and the peak it adds.
pub fn dump(c: &mut Ctx, servers: &[(&str, &Server)]) -> Result<(), String> {
    let sec = "dump";
    c.report.load(sec);
    for (who, s) in servers {
        if !s.running() {
            c.report.note(sec, who, "not running");
            continue;
        }
        let before = s.status().rss;
        s.reset_peak();
        let t = Instant::now();
        match get_counted(&s.base, "/dump") {
            Ok(bytes) => {
                c.report.secs(sec, who, "dump", t.elapsed().as_secs_f64());
                c.report.mib(sec, who, "bytes", bytes);
                let st = s.status();
                c.report.mib(sec, who, "rss_before", before);
                c.report.mib(sec, who, "peak_rss", st.hwm);
                c.report.mib(sec, who, "peak_added", st.hwm.saturating_sub(before));
            }
            Err(e) => c.report.note(sec, who, &e),
        }
    }
    Ok(())
}

/// A second daemon started with `--peers` (and the engines in its workers
/// file, as an operator would): time to `/health` 200, to settled, its peak.
pub fn replica(c: &mut Ctx, ours: &Server) -> Result<(), String> {
    let sec = "replica";
    c.report.load(sec);
    let args = c.our_args(Some(&ours.base), false);
    let t0 = Instant::now();
    let mut r = Server::spawn("replica", &c.a.bin, &args)?;
    r.wait_healthy(HEALTH_WAIT)?;
    c.report.secs(sec, "ours", "healthy", t0.elapsed().as_secs_f64());
    let at_health = watch::ours(&r.base).map(|(_, p)| p).unwrap_or(0);
    c.report.put(sec, "ours", "pairs_at_healthy", json!(at_health));
    let s = watch::wait_ours(&r, &c.published, t0, c.timeout())?;
    c.report.secs(sec, "ours", "settle", s.secs);
    c.report.put(sec, "ours", "pairs", json!(s.pairs));
    c.report.put(sec, "ours", "engines_behind", json!(s.behind));
    std::thread::sleep(SETTLED_PAUSE);
    let st = r.status();
    c.report.mib(sec, "ours", "peak_rss", st.hwm);
    c.report.mib(sec, "ours", "settled_rss", st.rss);
    r.kill();
    Ok(())
}

/// Stops the daemon (its snapshot written on the way out) and starts it
/// warm from the file; returns the new daemon.
pub fn snapshot(c: &mut Ctx, mut ours: Server) -> Result<Server, String> {
    let sec = "snapshot";
    c.report.load(sec);
    let before = ours.status();
    ours.reset_peak();
    let (save_s, save_peak) = ours.stop()?;
    c.report.secs(sec, "ours", "stop_with_save", save_s);
    c.report.mib(sec, "ours", "rss_before", before.rss);
    c.report.mib(sec, "ours", "stop_peak_rss", save_peak);
    let written = ours.snapshot_lines.lock().unwrap().iter().find(|l| l.contains("written")).cloned();
    c.report.note(sec, "ours", written.as_deref().unwrap_or("no snapshot line logged"));
    let file = c.snapshot_dir.join("snapshot.bin");
    c.report.mib(sec, "ours", "file", std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0));
    let args = c.our_args(None, true);
    let t0 = Instant::now();
    let mut warm = Server::spawn("ours", &c.a.bin, &args)?;
    warm.wait_healthy(HEALTH_WAIT)?;
    c.report.secs(sec, "ours", "start_to_healthy", t0.elapsed().as_secs_f64());
    let s = watch::wait_ours(&warm, &c.published, t0, c.timeout())?;
    c.report.secs(sec, "ours", "start_to_settled", s.secs);
    c.report.put(sec, "ours", "pairs", json!(s.pairs));
    c.report.put(sec, "ours", "engines_behind", json!(s.behind));
    if let Some(l) = warm.snapshot_lines.lock().unwrap().iter().find(|l| l.contains("restored")) {
        c.report.put(sec, "ours", "restored_line", json!(l));
    }
    std::thread::sleep(SETTLED_PAUSE);
    let st = warm.status();
    c.report.mib(sec, "ours", "peak_rss", st.hwm);
    c.report.mib(sec, "ours", "settled_rss", st.rss);
    Ok(warm)
}

/// Stops the daemon (its snapshot written), has every engine publish its
/// last requests into its ring meanwhile, and starts the daemon warm:
/// every ring replays what the daemon missed, all at once.
pub fn flood(c: &mut Ctx, mut ours: Server) -> Result<Server, String> {
    let sec = "flood";
    c.report.load(sec);
    let before = ours.status();
    ours.stop()?;
    let t = Instant::now();
    let p = publish(c, 0, t)?;
    c.report.secs(sec, "engines", "publish", t.elapsed().as_secs_f64());
    c.report.put(sec, "engines", "block_ops_missed", json!(p.stored + p.removed));
    c.report.put(sec, "engines", "batches_missed", json!(p.batches));
    c.report.put(sec, "engines", "ring_block_ops", json!(p.ring_ops));
    c.report.put(sec, "engines", "ring_batches", json!(p.ring_batches));
    c.report.mib(sec, "engines", "ring", p.ring_bytes);
    c.report.put(sec, "engines", "cached_blocks", json!(p.cached_blocks));
    c.published = p;
    let replays0 = c.pubs.replays()?;
    let args = c.our_args(None, true);
    let t0 = Instant::now();
    let mut warm = Server::spawn("ours", &c.a.bin, &args)?;
    warm.wait_healthy(HEALTH_WAIT)?;
    let healthy = t0.elapsed().as_secs_f64();
    c.report.secs(sec, "ours", "start_to_healthy", healthy);
    let s = watch::wait_ours(&warm, &c.published, t0, c.timeout())?;
    c.report.secs(sec, "ours", "start_to_settled", s.secs);
    c.report.secs(sec, "ours", "healthy_to_settled", s.secs - healthy);
    c.report.put(sec, "ours", "pairs", json!(s.pairs));
    c.report.put(sec, "ours", "engines_behind", json!(s.behind));
    c.report.put(sec, "engines", "ring_requests_answered", json!(c.pubs.replays()? - replays0));
    std::thread::sleep(SETTLED_PAUSE);
    let st = warm.status();
    c.report.mib(sec, "ours", "rss_before_stop", before.rss);
    c.report.mib(sec, "ours", "peak_rss", st.hwm);
    c.report.mib(sec, "ours", "settled_rss", st.rss);
    c.report.put(sec, "ours", "peak_over_settled", json!(st.hwm as f64 / st.rss.max(1) as f64));
    c.report.put(sec, "ours", "fds", json!(st.fds));
    c.report.put(sec, "ours", "threads", json!(st.threads));
    Ok(warm)
}

/// Kills the daemon (no snapshot), drops its file and starts it empty
/// while every engine's ring is full: every ring fill lands at once.
pub fn flood_empty(c: &mut Ctx, mut ours: Server) -> Result<Server, String> {
    let sec = "flood-empty";
    c.report.load(sec);
    ours.kill();
    let _ = std::fs::remove_file(c.snapshot_dir.join("snapshot.bin"));
    c.report.put(sec, "engines", "ring_block_ops", json!(c.published.ring_ops));
    c.report.mib(sec, "engines", "ring", c.published.ring_bytes);
    let replays0 = c.pubs.replays()?;
    let args = c.our_args(None, true);
    let t0 = Instant::now();
    let fresh = Server::spawn("ours", &c.a.bin, &args)?;
    let s = watch::wait_ours(&fresh, &c.published, t0, c.timeout())?;
    c.report.secs(sec, "ours", "start_to_settled", s.secs);
    let first = s.first_pair_s.unwrap_or(0.0);
    c.report.secs(sec, "ours", "start_to_first_pair", first);
    c.report.secs(sec, "ours", "first_pair_to_settled", s.secs - first);
    c.report.put(sec, "ours", "pairs", json!(s.pairs));
    c.report.put(sec, "ours", "engines_behind", json!(s.behind));
    c.report.put(sec, "engines", "ring_requests_answered", json!(c.pubs.replays()? - replays0));
    std::thread::sleep(SETTLED_PAUSE);
    let st = fresh.status();
    c.report.mib(sec, "ours", "peak_rss", st.hwm);
    c.report.mib(sec, "ours", "settled_rss", st.rss);
    c.report.put(sec, "ours", "peak_over_settled", json!(st.hwm as f64 / st.rss.max(1) as f64));
    c.report.put(sec, "ours", "fds", json!(st.fds));
    c.report.put(sec, "ours", "threads", json!(st.threads));
    Ok(fresh)
}

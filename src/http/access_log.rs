//! The access log (Dynamo's `--access-log PATH`): one JSON line per HTTP
//! request, appended to a file, reopened on `POST /reopen_logs` or SIGHUP so
//! logrotate can move the file away.
//!
//! A line is Dynamo's: `{"ts","trace_id","method","path","model","status",
//! "duration_ms"}`. `ts` is when the request head was read, RFC 3339 with
//! milliseconds (UTC with `Z`, or local time with its offset under
//! `--access-log-local-time`); `trace_id` the value of the
//! `--trace-id-header` (default `x-trace-id`) or `-`; `path` the endpoint
//! (`unknown` for a path that is none); `model` the request's `model_name`
//! where the endpoint takes one and the body said it, else `-`.
//!
//! Request threads never wait on the disk: they put a record on a queue of
//! at most `QUEUE_LINES_MAX` records and go on; one writer thread formats,
//! writes and flushes whenever the queue runs dry. A full queue drops the
//! record and counts it (`kv_indexer_access_log_dropped_total`). The queue
//! is a linked one whose memory follows what is queued (a ring of that many
//! slots would hold about 9 MiB resident from the start). A reopen travels
//! the same queue, so lines before it land in the old file and lines after
//! it in the new one; if the new file cannot be opened the old one is kept
//! and the reopen reports the error.

use crate::log::{push_timestamp, truncate_utf8};
use crossbeam::channel::{bounded, unbounded, Receiver, Sender};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// Records queued for the writer before new ones are dropped.
pub const QUEUE_LINES_MAX: usize = 65_536;
/// Longest trace id copied into a line, in bytes; longer ones are cut.
pub const TRACE_ID_BYTES_MAX: usize = 256;
/// How long a reopen waits for the writer to take it and answer.
const REOPEN_TIMEOUT_MS: u64 = 5_000;
/// Least time between two warnings about failed writes.
const ERROR_LOG_INTERVAL_MS: u64 = 10_000;

/// Where the access log goes and what it records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessLogConfig {
    /// None: no access log.
    pub path: Option<PathBuf>,
    /// The request header copied into `trace_id`, lowercase.
    pub trace_id_header: String,
    /// Local time with offset instead of UTC.
    pub local_time: bool,
}

impl Default for AccessLogConfig {
    fn default() -> Self {
        AccessLogConfig { path: None, trace_id_header: "x-trace-id".into(), local_time: false }
    }
}

/// Checks an HTTP header name (RFC 9110 token) and lowercases it.
pub fn header_name(name: &str) -> Result<String, String> {
    let tchar = |c: u8| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c);
    if name.is_empty() || name.len() > 256 || !name.bytes().all(tchar) {
        return Err(format!("{name:?} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~, 1-256 bytes)"));
    }
    Ok(name.to_ascii_lowercase())
}

/// One answered request.
pub struct Record {
    /// When its head was read.
    pub at: SystemTime,
    pub trace_id: Option<String>,
    pub method: String,
    pub path: &'static str,
    pub model: Option<String>,
    pub status: u16,
    pub duration: Duration,
}

enum Msg {
    Line(Record),
    Reopen(Sender<Result<(), String>>),
    Stop,
}

/// The running access log: a queue and its writer thread.
pub struct AccessLog {
    tx: Sender<Msg>,
    /// Records sent and not yet taken by the writer.
    queued: Arc<AtomicUsize>,
    /// The header whose value becomes `trace_id`, lowercase.
    pub trace_id_header: String,
    dropped: AtomicU64,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl AccessLog {
    /// Opens (creating, appending) `cfg.path` and starts the writer; None
    /// without a path.
    pub fn open(cfg: &AccessLogConfig) -> Result<Option<AccessLog>, String> {
        let Some(path) = cfg.path.clone() else { return Ok(None) };
        let file = open_append(&path)?;
        let (tx, rx) = unbounded();
        let queued = Arc::new(AtomicUsize::new(0));
        let local_time = cfg.local_time;
        let taken = Arc::clone(&queued);
        let writer = std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || {
                Writer { path, file, local_time, pending: Vec::new(), errors: 0, last_warning: None }.run(rx, &taken)
            })
            .map_err(|e| format!("cannot start the access log writer: {e}"))?;
        Ok(Some(AccessLog {
            tx,
            queued,
            trace_id_header: cfg.trace_id_header.clone(),
            dropped: AtomicU64::new(0),
            writer: Mutex::new(Some(writer)),
        }))
    }

    /// Queues a line; never blocks. A full queue drops it, counted.
    pub fn record(&self, r: Record) {
        if self.queued.fetch_add(1, Ordering::Relaxed) >= QUEUE_LINES_MAX || self.tx.send(Msg::Line(r)).is_err() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Lines dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Closes the file and opens the path again (after logrotate moved it).
    /// Lines queued before the call go to the old file.
    pub fn reopen(&self) -> Result<(), String> {
        let timeout = Duration::from_millis(REOPEN_TIMEOUT_MS);
        let (done_tx, done_rx) = bounded(1);
        self.tx.send(Msg::Reopen(done_tx)).map_err(|_| "the access log writer has stopped".to_string())?;
        done_rx.recv_timeout(timeout).map_err(|_| "the access log writer did not answer".to_string())?
    }

    /// Writes what is queued, flushes and stops the writer.
    pub fn stop(&self) {
        let Some(writer) = self.writer.lock().ok().and_then(|mut w| w.take()) else { return };
        if self.tx.send(Msg::Stop).is_ok() {
            let _ = writer.join();
        }
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        self.stop();
    }
}

fn open_append(path: &Path) -> Result<File, String> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("cannot open the access log {}: {e}", path.display()))
}

struct Writer {
    path: PathBuf,
    file: File,
    local_time: bool,
    /// Formatted lines not yet written.
    pending: Vec<u8>,
    errors: u64,
    last_warning: Option<Instant>,
}

impl Writer {
    fn run(mut self, rx: Receiver<Msg>, queued: &AtomicUsize) {
        // Block until something arrives, then take what is queued and write
        // it in one go.
        while let Ok(first) = rx.recv() {
            for msg in std::iter::once(first).chain(std::iter::from_fn(|| rx.try_recv().ok())) {
                match msg {
                    Msg::Line(r) => {
                        queued.fetch_sub(1, Ordering::Relaxed);
                        self.format(&r);
                    }
                    Msg::Reopen(done) => {
                        self.flush();
                        let _ = done.send(open_append(&self.path).map(|f| self.file = f));
                    }
                    Msg::Stop => return self.flush(),
                }
                if self.pending.len() >= 1 << 16 {
                    self.flush();
                }
            }
            self.flush();
        }
        self.flush();
    }

    fn flush(&mut self) {
        if let Err(e) = self.file.write_all(&self.pending) {
            self.errors += 1;
            let interval = Duration::from_millis(ERROR_LOG_INTERVAL_MS);
            if self.last_warning.is_none_or(|t| t.elapsed() >= interval) {
                self.last_warning = Some(Instant::now());
                let (path, errors) = (self.path.display(), self.errors);
                crate::warn!("writing the access log {path} failed ({errors} failed writes so far): {e}");
            }
        }
        self.pending.clear();
    }

    fn format(&mut self, r: &Record) {
        let line = &mut self.pending;
        line.extend_from_slice(b"{\"ts\":\"");
        push_timestamp(line, r.at, self.local_time);
        let trace = truncate_utf8(r.trace_id.as_deref().unwrap_or("-"), TRACE_ID_BYTES_MAX);
        let model = r.model.as_deref().unwrap_or("-");
        for (key, value) in
            [("\",\"trace_id\":", trace), (",\"method\":", &r.method), (",\"path\":", r.path), (",\"model\":", model)]
        {
            line.extend_from_slice(key.as_bytes());
            crate::json::out::push_str(line, value);
        }
        let ms = r.duration.as_secs_f64() * 1e3;
        let _ = writeln!(line, ",\"status\":{},\"duration_ms\":{ms}}}", r.status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn header_names_are_tokens() {
        assert_eq!(header_name("X-Trace-Id").unwrap(), "x-trace-id");
        for bad in ["", "a b", "a:b", "é", &"a".repeat(257)] {
            assert!(header_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_a_taken_record_makes_room() {
        let (tx, rx) = unbounded();
        let log = AccessLog {
            tx,
            queued: Arc::new(AtomicUsize::new(0)),
            trace_id_header: "x-trace-id".into(),
            dropped: AtomicU64::new(0),
            writer: Mutex::new(None),
        };
        let rec = || Record {
            at: UNIX_EPOCH,
            trace_id: None,
            method: "GET".into(),
            path: "/health",
            model: None,
            status: 200,
            duration: Duration::ZERO,
        };
        for _ in 0..QUEUE_LINES_MAX + 3 {
            log.record(rec());
        }
        assert_eq!((rx.len(), log.dropped()), (QUEUE_LINES_MAX, 3));
        // The writer takes one: one more fits, the next is dropped again.
        assert!(matches!(rx.try_recv(), Ok(Msg::Line(_))));
        log.queued.fetch_sub(1, Ordering::Relaxed);
        log.record(rec());
        log.record(rec());
        assert_eq!((rx.len(), log.dropped()), (QUEUE_LINES_MAX, 4));
        // No writer at all: every record is dropped, none counted as queued.
        drop(rx);
        log.queued.store(0, Ordering::Relaxed);
        log.record(rec());
        assert_eq!((log.queued.load(Ordering::Relaxed), log.dropped()), (0, 5));
    }

    #[test]
    fn lines_are_written_and_reopened() {
        let dir = std::env::temp_dir().join(format!("kv-access-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("access.log");
        let _ = std::fs::remove_file(&path);
        let cfg = AccessLogConfig { path: Some(path.clone()), ..AccessLogConfig::default() };
        let log = AccessLog::open(&cfg).unwrap().unwrap();
        let rec = |status| Record {
            at: UNIX_EPOCH,
            trace_id: Some("t\"1".into()),
            method: "POST".into(),
            path: "/query",
            model: None,
            status,
            duration: Duration::from_micros(1500),
        };
        log.record(rec(200));
        std::fs::rename(&path, dir.join("access.log.1")).unwrap();
        log.reopen().unwrap();
        log.record(rec(404));
        log.stop();
        let old = std::fs::read_to_string(dir.join("access.log.1")).unwrap();
        let new = std::fs::read_to_string(&path).unwrap();
        let v: serde_json::Value = serde_json::from_str(old.trim()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"ts": "1970-01-01T00:00:00.000Z", "trace_id": "t\"1", "method": "POST",
                "path": "/query", "model": "-", "status": 200, "duration_ms": 1.5})
        );
        assert_eq!(new.lines().count(), 1);
        assert!(new.contains("\"status\":404"), "{new}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! Wiring: starts the ingest pipeline, registers `--workers` and
//! `--workers-file`, serves the API, recovers from a snapshot and peers,
//! opens the ready gate, tells systemd, reopens the access log and rereads
//! the workers file on SIGHUP, and stops cleanly on SIGTERM or SIGINT.
//!
//! Startup order: the snapshot (`--snapshot-dir`) is opened, its header
//! and registrations read; with a snapshot or peers the ready gate starts
//! closed. The workers file is read (a bad one stops the start). The
//! snapshot's events stream into its indexes (a file found bad on the way
//! leaves nothing applied: the start goes on as without one), its
//! watermarks are seeded, then listeners connect
//! (`--workers` and the workers file's entries, merged with the snapshot as
//! the command line is, then the snapshot's other registrations; they hold
//! what engines send), the HTTP API answers (`/health` says why it is not ready yet),
//! with peers the slow-joiner window passes and a peer's dump is applied
//! (replacing the snapshot's blocks of the workers it names), the gate
//! opens and held events drain.
//! Until then systemd's start timeout is extended step by step
//! (`notify::StartupExtender`). READY=1 goes to systemd once recovery is
//! done and the API serves; the worker gate (`--min-initial-workers`) is
//! the router's business, reported by `/health` and systemd's `STATUS=`,
//! so a slow engine never makes systemd kill a healthy daemon. On stop:
//! the API closes, a last snapshot is written while ingest still runs, then
//! ingest stops. A SIGHUP's reread runs on the main thread, between its
//! readiness checks, one at a time; SIGHUPs that arrive meanwhile make one
//! more.

pub mod notify;
pub mod recovery;
pub mod signals;
pub mod unix_socket;

use crate::config::Config;
use crate::http::access_log::AccessLog;
use crate::http::routes::Api;
use crate::http::server::HttpServer;
use crate::ingest::{Ingest, IngestConfig};
use crate::peers::Peers;
use crate::registry::readiness::Readiness;
use crate::registry::Registry;
use crate::snapshot::{self, Periodic, SnapshotDir};
use crate::workers_file::{Entry, WorkersFile};
use crossbeam::channel::{bounded, never, select, Receiver};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Runs the daemon until a stop signal; Err is a startup failure to report.
pub fn run(cfg: Config) -> Result<(), String> {
    crate::log::init(cfg.log_level, cfg.log_format);
    raise_open_files_limit();
    signals::block();
    let running = start(&cfg)?;
    let signal = running.serve();
    running.stop(&cfg, signal);
    Ok(())
}

/// What a started daemon holds until it stops.
struct Running {
    hangup: signals::Hangup,
    stop: Receiver<i32>,
    reread: Receiver<()>,
    access_log: Option<Arc<AccessLog>>,
    workers_file: Option<WorkersFile>,
    snapshot_dir: Option<Arc<SnapshotDir>>,
    periodic: Option<Periodic>,
    ingest: Arc<Ingest>,
    registry: Arc<Registry>,
    readiness: Arc<Readiness>,
    http: HttpServer,
}

/// Starts everything in the order of the module doc, up to a recovered
/// state the API serves.
fn start(cfg: &Config) -> Result<Running, String> {
    let hangup = signals::Hangup::default();
    let stop = signals::wait_for_stop(hangup.clone());
    let extender = notify::StartupExtender::start();
    let access_log = AccessLog::open(&cfg.access_log)?.map(Arc::new);
    let workers_file = cfg.workers_file.clone().map(WorkersFile::new);
    let reread = on_hangup(&hangup, access_log.clone(), workers_file.is_some());

    // Opened before anything starts; its events are applied whole or not
    // at all (`snapshot::restore`).
    let snapshot_dir = cfg.snapshot_dir.as_deref().map(SnapshotDir::open).transpose()?.map(Arc::new);
    let saved = snapshot_dir.as_ref().and_then(|d| d.load());
    let recovering = !cfg.peers.is_empty() || saved.is_some();
    let ingest = start_ingest(cfg, recovering)?;
    let budget = Arc::new(crate::index::Budget::new(cfg.max_pairs));
    let predict = crate::predict::PredictLimits::new(cfg.predict_max_blocks, cfg.predict_ttl_ms);
    let registry = Arc::new(Registry::new(ingest.clone(), cfg.jump, budget).with_predict(predict));
    let restored = register_workers(cfg, &registry, workers_file.as_ref(), saved)?;

    let readiness =
        Arc::new(Readiness { recovered: AtomicBool::new(!recovering), min_workers: cfg.min_initial_workers });
    let peers = Arc::new(Peers::new(cfg.peers.clone()));
    let http = serve_api(cfg, &registry, &peers, &readiness, &access_log)?;
    if recovering {
        if !cfg.peers.is_empty() {
            std::thread::sleep(Duration::from_millis(cfg.slow_joiner_ms));
            recovery::recover(&registry, &peers.list(), Duration::from_millis(cfg.peer_timeout_ms), restored);
        }
        ingest.open_ready_gate();
        readiness.recovered.store(true, Ordering::Release);
    }
    let periodic = match &snapshot_dir {
        Some(dir) if cfg.snapshot_interval_s > 0 => {
            Some(Periodic::start(dir.clone(), registry.clone(), cfg.snapshot_interval_s).map_err(|e| e.to_string())?)
        }
        _ => None,
    };
    // Serving a recovered state: systemd may consider the start done.
    drop(extender);
    Ok(Running {
        hangup,
        stop,
        reread,
        access_log,
        workers_file,
        snapshot_dir,
        periodic,
        ingest,
        registry,
        readiness,
        http,
    })
}

/// The ingest pipeline, its ready gate closed while the daemon recovers.
fn start_ingest(cfg: &Config, recovering: bool) -> Result<Arc<Ingest>, String> {
    let ingest_cfg = IngestConfig {
        listener_threads: cfg.listener_threads,
        shard_threads: cfg.writer_threads,
        pin_threads: cfg.pin_threads,
        replay_timeout_ms: cfg.replay_timeout_ms,
        heartbeat_ivl_ms: cfg.heartbeat_ms,
        engine_gone_ms: cfg.engine_gone_s * 1_000,
        budget_bytes: cfg.ingest_budget_mib << 20,
        ready_gate_open: !recovering,
        ..IngestConfig::default()
    };
    if let Some(us) = cfg.ingest_coalesce_us {
        crate::warn!("--ingest-coalesce-us {us} is ignored: listeners apply each event as soon as they read it");
    }
    Ok(Arc::new(Ingest::start(ingest_cfg).map_err(|e| e.to_string())?))
}

/// Registers `--workers` and the workers file's entries, merged with a
/// saved snapshot's registrations when there is one; whether the snapshot
/// was applied.
fn register_workers(
    cfg: &Config,
    registry: &Registry,
    workers_file: Option<&WorkersFile>,
    saved: Option<snapshot::Saved>,
) -> Result<bool, String> {
    let file_entries = match workers_file {
        Some(f) => read_workers_file(f, &cfg.workers)?,
        None => Vec::new(),
    };
    // The file's entries merge with the snapshot as the command line's do.
    let restored = match saved {
        Some(s) => {
            let file = file_entries.iter().map(|e| e.args.clone()).collect();
            snapshot::restore(registry, &s.path, s.opened, cfg.workers.clone(), file)?.is_ok()
        }
        None => false,
    };
    if restored {
        for e in &file_entries {
            registry.adopt_from_file(&e.args);
        }
    } else {
        for args in cfg.workers.clone() {
            registry.register(args).map_err(|e| format!("--workers: {e}"))?;
        }
    }
    if let Some(f) = workers_file {
        f.apply(registry, &file_entries, "at start")?;
    }
    Ok(restored)
}

/// Starts the HTTP API on TCP and, with `--unix-socket`, on its socket.
fn serve_api(
    cfg: &Config,
    registry: &Arc<Registry>,
    peers: &Arc<Peers>,
    readiness: &Arc<Readiness>,
    access_log: &Option<Arc<AccessLog>>,
) -> Result<HttpServer, String> {
    let api = Arc::new(Api {
        registry: registry.clone(),
        peers: peers.clone(),
        readiness: readiness.clone(),
        metrics: Default::default(),
        admin_token: cfg.admin_token.clone(),
        auth_refused: Default::default(),
        access_log: access_log.clone(),
        dumps: Default::default(),
    });
    let http = HttpServer::start(&cfg.host, cfg.port, cfg.unix_socket.as_deref(), cfg.http, api)?;
    if let Some(path) = &cfg.unix_socket {
        unix_socket::grant(path)?;
    }
    crate::info!(
        "kv-indexer {} listening on {}:{}{}",
        crate::version(),
        cfg.host,
        http.tcp_addr.port(),
        cfg.unix_socket.as_ref().map(|p| format!(" and {}", p.display())).unwrap_or_default()
    );
    Ok(http)
}

impl Running {
    /// Reports readiness as it changes (READY=1 the first time) and rereads
    /// the workers file on SIGHUP, until a stop signal, which it returns.
    fn serve(&self) -> i32 {
        let mut reported: Option<Result<(), String>> = None;
        loop {
            let now = self.readiness.check(&self.registry);
            if reported.as_ref() != Some(&now) {
                match &now {
                    Ok(()) => crate::info!("ready"),
                    Err(why) => crate::info!("serving; not ready for routing yet: {why}"),
                }
                let status = now.as_ref().map_or_else(|why| why.as_str(), |()| "ready");
                let ready = if reported.is_none() { "READY=1\n" } else { "" };
                notify::notify(&format!("{ready}STATUS={status}"));
                reported = Some(now);
            }
            select! {
                recv(self.stop) -> sig => return sig.unwrap_or(0),
                recv(self.reread) -> _ => {
                    if let Some(f) = &self.workers_file {
                        // Counted and logged; a failed read changed nothing or is retried by the next.
                        let _ = f.reload(&self.registry, "on SIGHUP");
                    }
                }
                default(Duration::from_millis(100)) => {}
            }
        }
    }

    /// Closes the API, writes the last snapshot while ingest still runs,
    /// then stops ingest and the access log.
    fn stop(self, cfg: &Config, signal: i32) {
        crate::info!("stopping on signal {signal}");
        notify::notify("STOPPING=1");
        self.http.stop();
        // At most one snapshot write on stop (see `snapshot::Periodic::stop`),
        // while ingest still runs: the watermarks-first capture stays consistent.
        let just_written = self.periodic.is_some_and(Periodic::stop);
        if let Some(dir) = self.snapshot_dir.as_ref().filter(|_| !just_written) {
            if let Some(s) = dir.save_logged(&self.registry, "stop") {
                crate::info!("snapshot written on stop: {} bytes, {} pairs", s.bytes, s.pairs);
            }
        }
        self.ingest.shutdown();
        if let Ok(mut h) = self.hangup.lock() {
            *h = None;
        }
        if let Some(log) = &self.access_log {
            log.stop();
        }
        if let Some(p) = &cfg.unix_socket {
            let _ = std::fs::remove_file(p);
        }
        crate::info!("stopped");
    }
}

/// Sets what SIGHUP does: reopen the access log, if any, and (with a
/// workers file) ask the main loop to reread it through the returned
/// channel. One pending reread is enough, however many SIGHUPs come.
fn on_hangup(hangup: &signals::Hangup, access_log: Option<Arc<AccessLog>>, workers_file: bool) -> Receiver<()> {
    // Without a workers file nothing is ever sent (and the loop must not
    // see a closed channel, which would be ready at once, every round).
    let (tx, rx) = if workers_file {
        let (tx, rx) = bounded(1);
        (Some(tx), rx)
    } else {
        (None, never())
    };
    if access_log.is_none() && tx.is_none() {
        return rx;
    }
    let on_signal = move || {
        if let Some(log) = &access_log {
            match log.reopen() {
                Ok(()) => crate::info!("access log reopened on SIGHUP"),
                Err(e) => crate::warn!("reopening the access log on SIGHUP: {e}"),
            }
        }
        if let Some(tx) = &tx {
            let _ = tx.try_send(());
        }
    };
    if let Ok(mut h) = hangup.lock() {
        *h = Some(Box::new(on_signal));
    }
    rx
}

/// Reads the workers file at start: an error stops the start. A key also
/// in `--workers` is refused: one of the two would own it.
fn read_workers_file(f: &WorkersFile, workers: &[crate::registry::RegisterArgs]) -> Result<Vec<Entry>, String> {
    let entries = f.read()?;
    if let Some(e) = entries.iter().find(|e| workers.iter().any(|w| w.worker() == e.args.worker())) {
        return Err(format!(
            "workers file {} line {}: instance {} dp_rank {} is in --workers too; list it in one of them",
            f.path().display(),
            e.line,
            e.args.instance_id,
            e.args.dp_rank
        ));
    }
    Ok(entries)
}

/// Raises the soft limit on open files to the hard one. A worker holds
/// about six descriptors (its TCP connection and its ZMQ sockets'
/// mailboxes), so the usual soft limit of 1,024 would refuse workers past
/// about 160 while the hard limit (systemd's default 524,288) allows more.
fn raise_open_files_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read and write only `lim`, ours.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 || lim.rlim_cur >= lim.rlim_max {
        return;
    }
    let from = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } == 0 {
        crate::info!("open files limit raised from {from} to {}", lim.rlim_max);
    } else {
        let e = std::io::Error::last_os_error();
        crate::warn!("open files limit stays at {from} (raising it to {} failed: {e})", lim.rlim_max);
    }
}

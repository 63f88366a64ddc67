//! Wiring: starts the ingest pipeline, registers `--workers`, serves the
//! API, recovers from a snapshot and peers, opens the ready gate, tells
//! systemd, and stops cleanly on SIGTERM or SIGINT.
//!
//! Startup order: the snapshot (`--snapshot-dir`) is read and decoded whole;
//! with a snapshot or peers the ready gate starts closed. The snapshot's
//! indexes are rebuilt and its watermarks seeded, then listeners connect
//! (`--workers`, then the snapshot's registrations; they hold what engines
//! send), the HTTP API answers (`/health` says why it is not ready yet),
//! with peers the slow-joiner window passes and a peer's dump is applied
//! (replacing the snapshot's blocks of the workers it names), the gate
//! opens and held events drain.
//! Until then systemd's start timeout is extended step by step
//! (`notify::StartupExtender`). READY=1 goes to systemd once recovery is
//! done and the API serves; the worker gate (`--min-initial-workers`) is
//! the router's business, reported by `/health` and systemd's `STATUS=`,
//! so a slow engine never makes systemd kill a healthy daemon. On stop:
//! the API closes, a last snapshot is written while ingest still runs, then
//! ingest stops.

use crate::config::Config;
use crate::http::routes::{Api, Readiness};
use crate::http::server::HttpServer;
use crate::ingest::{Ingest, IngestConfig};
use crate::metrics::{HttpMetrics, Prom};
use crate::recovery::{self, Peers};
use crate::registry::{RegisterArgs, Registry};
use crate::snapshot::{self, Periodic, SnapshotDir};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Runs the daemon until a stop signal; Err is a startup failure to report.
pub fn run(cfg: Config) -> Result<(), String> {
    crate::log::init(cfg.log_level, cfg.log_format);
    crate::signals::block();
    let hangup = crate::signals::Hangup::default();
    let stop = crate::signals::wait_for_stop(hangup.clone());
    let extender = crate::notify::StartupExtender::start();
    let access_log = crate::http::access_log::AccessLog::open(&cfg.access_log)?.map(Arc::new);
    if let Some(log) = &access_log {
        let log = log.clone();
        let reopen = move || match log.reopen() {
            Ok(()) => crate::info!("access log reopened on SIGHUP"),
            Err(e) => crate::warn!("reopening the access log on SIGHUP: {e}"),
        };
        if let Ok(mut h) = hangup.lock() {
            *h = Some(Box::new(reopen));
        }
    }

    // Decoded whole before anything starts: a bad file is ignored, never half-applied.
    let snapshot_dir = cfg.snapshot_dir.as_deref().map(SnapshotDir::open).transpose()?.map(Arc::new);
    let saved = snapshot_dir.as_ref().and_then(|d| d.load());
    let recovering = !cfg.peers.is_empty() || saved.is_some();
    let ingest_cfg = IngestConfig {
        listener_threads: cfg.listener_threads,
        shard_threads: cfg.writer_threads,
        pin_threads: cfg.pin_threads,
        replay_timeout_ms: cfg.replay_timeout_ms,
        ready_gate_open: !recovering,
        ..IngestConfig::default()
    };
    let ingest = Arc::new(Ingest::start(ingest_cfg).map_err(|e| e.to_string())?);
    let budget = Arc::new(crate::index::Budget::new(cfg.max_pairs));
    let registry = Arc::new(Registry::new(ingest.clone(), cfg.jump, budget));
    let workers: Vec<RegisterArgs> = cfg
        .workers
        .iter()
        .map(|w| RegisterArgs {
            instance_id: w.worker.instance_id,
            dp_rank: w.worker.dp_rank,
            endpoint: w.endpoint.clone(),
            replay_endpoint: None,
            model_name: cfg.model_name.clone(),
            tenant_id: cfg.tenant_id.clone(),
            block_size: cfg.block_size.unwrap_or(16),
        })
        .collect();
    let restored = saved.is_some();
    match saved {
        Some(s) => {
            snapshot::restore(&registry, snapshot::plan(s, workers))?;
        }
        None => {
            for args in workers {
                registry.register(args).map_err(|e| format!("--workers: {e}"))?;
            }
        }
    }

    let readiness =
        Arc::new(Readiness { recovered: AtomicBool::new(!recovering), min_workers: cfg.min_initial_workers });
    let peers = Arc::new(Peers::new(cfg.peers.clone()));
    let metrics = Arc::new(HttpMetrics::default());
    let api = Arc::new(Api {
        registry: registry.clone(),
        peers: peers.clone(),
        readiness: readiness.clone(),
        metrics: metrics.clone(),
        admin_token: cfg.admin_token.clone(),
        auth_refused: Default::default(),
        access_log: access_log.clone(),
    });
    let http =
        HttpServer::start(&cfg.host, cfg.port, cfg.unix_socket.as_deref(), cfg.http, api, metrics, access_log.clone())?;
    if let Some(path) = &cfg.unix_socket {
        crate::unix_socket::grant(path)?;
    }
    crate::info!(
        "kv-indexer {} listening on {}:{}{}",
        crate::version(),
        cfg.host,
        http.local_port.unwrap_or(cfg.port),
        cfg.unix_socket.as_ref().map(|p| format!(" and {}", p.display())).unwrap_or_default()
    );

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

    // Serving a recovered state: systemd may consider the start done. The
    // worker gate is reported as it changes; stop waiting if asked to stop.
    drop(extender);
    let mut reported: Option<Result<(), String>> = None;
    let signal = loop {
        let now = readiness.check(&registry);
        if reported.as_ref() != Some(&now) {
            match &now {
                Ok(()) => crate::info!("ready"),
                Err(why) => crate::info!("serving; not ready for routing yet: {why}"),
            }
            let status = now.as_ref().map_or_else(|why| why.as_str(), |()| "ready");
            let ready = if reported.is_none() { "READY=1\n" } else { "" };
            crate::notify::notify(&format!("{ready}STATUS={status}"));
            reported = Some(now);
        }
        match stop.recv_timeout(Duration::from_millis(100)) {
            Ok(sig) => break sig,
            Err(crossbeam::channel::RecvTimeoutError::Timeout) => continue,
            Err(_) => break 0,
        }
    };
    crate::info!("stopping on signal {signal}");
    crate::notify::notify("STOPPING=1");
    http.stop();
    // At most one snapshot write on stop (see `snapshot::Periodic::stop`),
    // while ingest still runs: the watermarks-first capture stays consistent.
    let just_written = periodic.is_some_and(Periodic::stop);
    if let Some(dir) = snapshot_dir.as_ref().filter(|_| !just_written) {
        if let Some(s) = dir.save_logged(&registry, "stop") {
            crate::info!("snapshot written on stop: {} bytes, {} pairs", s.bytes, s.pairs);
        }
    }
    ingest.shutdown();
    if let Ok(mut h) = hangup.lock() {
        *h = None;
    }
    if let Some(log) = &access_log {
        log.stop();
    }
    if let Some(p) = &cfg.unix_socket {
        let _ = std::fs::remove_file(p);
    }
    crate::info!("stopped");
    Ok(())
}

/// Registry, ingest and index figures for `/metrics`.
pub fn render_state_metrics(p: &mut Prom, registry: &Registry, readiness: &Readiness) {
    let indexes = registry.indexes();
    p.single("dynamo_kvindexer_models", "gauge", "Indexes by (model, tenant).", indexes.len() as f64);
    p.single("dynamo_kvindexer_workers", "gauge", "Registered worker instances.", registry.instance_count() as f64);
    let infos = registry.listener_infos();
    p.family("dynamo_kvindexer_listeners", "gauge", "ZMQ listeners by status.");
    for status in ["pending", "active", "paused", "failed"] {
        let n = infos.values().filter(|i| i.status.as_str() == status).count();
        p.sample("dynamo_kvindexer_listeners", &[("status", status)], n as f64);
    }
    p.single(
        "kv_indexer_ready",
        "gauge",
        "1 once recovered and enough workers are registered.",
        readiness.check(registry).is_ok() as u8 as f64,
    );

    p.family("kv_indexer_index_blocks", "gauge", "Indexed entries (block, tier, worker group) per index.");
    for h in &indexes {
        let s = h.index.stats();
        p.sample("kv_indexer_index_blocks", &[("model", &h.model_name), ("tenant", &h.tenant_id)], s.entries as f64);
    }
    p.family("kv_indexer_index_pairs", "gauge", "Live (block, worker) pairs per index.");
    for h in &indexes {
        let s = h.index.stats();
        p.sample("kv_indexer_index_pairs", &[("model", &h.model_name), ("tenant", &h.tenant_id)], s.pairs as f64);
    }
    p.family("kv_indexer_index_bytes", "gauge", "Bytes held by each index's structures.");
    for h in &indexes {
        let s = h.index.stats();
        p.sample("kv_indexer_index_bytes", &[("model", &h.model_name), ("tenant", &h.tenant_id)], s.bytes as f64);
    }

    let b = &registry.budget;
    let cap = b.pairs_max().unwrap_or(0) as f64;
    p.single("kv_indexer_pairs_max", "gauge", "Cap on live (block, worker) pairs (--max-pairs); 0: none.", cap);
    p.single("kv_indexer_pairs", "gauge", "Live (block, worker) pairs over all indexes.", b.pairs() as f64);
    p.single(
        "kv_indexer_entries",
        "gauge",
        "Live index entries over all indexes (capped like pairs).",
        b.entries() as f64,
    );

    let c = &registry.counters;
    let r = Ordering::Relaxed;
    p.family("kv_indexer_events_applied_total", "counter", "Events applied to indexes, by type.");
    for (t, v) in [("stored", &c.stored_events), ("removed", &c.removed_events), ("cleared", &c.cleared_events)] {
        p.sample("kv_indexer_events_applied_total", &[("type", t)], v.load(r) as f64);
    }
    p.family("kv_indexer_blocks_total", "counter", "Blocks of applied events, by outcome.");
    for (o, v) in [
        ("stored", &c.blocks_stored),
        ("removed", &c.blocks_removed),
        ("duplicate", &c.blocks_duplicate),
        ("unknown_parent", &c.blocks_unknown_parent),
        ("unknown_removed", &c.removes_unknown),
        ("depth_exceeded", &c.blocks_depth_exceeded),
        ("rejected", &c.blocks_rejected),
        ("shed", &c.blocks_shed),
        ("cleared", &c.pairs_cleared),
    ] {
        p.sample("kv_indexer_blocks_total", &[("outcome", o)], v.load(r) as f64);
    }

    c.dynamo.render(p);

    let ic = registry.ingest().counters();
    let counters: [(&str, &str, u64); 19] = [
        ("batches_received", "Well-formed batches received.", ic.batches_received),
        ("batches_applied", "Batches applied (live and replayed).", ic.batches_applied),
        // Not `events_applied`: that family counts what the indexes applied, by type.
        ("events_ingested", "Events handed by the writer shards to indexes.", ic.events_applied),
        ("malformed_messages", "Messages of the wrong shape, dropped.", ic.malformed_messages),
        ("undecodable_batches", "Batches whose payload could not be decoded.", ic.undecodable_batches),
        ("duplicates_dropped", "Batches already seen, dropped.", ic.duplicates_dropped),
        ("gaps_detected", "Gaps in a publisher's sequence.", ic.gaps_detected),
        ("replays_started", "Replay requests sent.", ic.replays_started),
        ("replays_ok", "Replays that filled their gap.", ic.replays_ok),
        ("replays_partial", "Replays that filled part of their gap.", ic.replays_partial),
        ("replays_failed", "Replays that delivered nothing.", ic.replays_failed),
        ("batches_replayed", "Batches recovered by replay.", ic.batches_replayed),
        ("batches_lost", "Batches lost and not recovered.", ic.batches_lost),
        ("batches_missed_at_join", "Batches missed before a listener's first.", ic.batches_missed_at_join),
        ("restarts", "Engine restarts detected (worker cleared).", ic.restarts),
        ("resyncs", "Workers cleared after an unreplayable gap.", ic.resyncs),
        ("held_dropped", "Batches dropped from a full hold buffer.", ic.held_dropped),
        ("dp_rank_limit_dropped", "Batches over the per-listener dp rank limit.", ic.dp_rank_limit_dropped),
        ("workers_removed", "Workers removed through their shard.", ic.workers_removed),
    ];
    for (name, help, v) in counters {
        p.single(&format!("kv_indexer_{name}_total"), "counter", help, v as f64);
    }
    p.family("kv_indexer_events_skipped_total", "counter", "Engine events skipped, by reason.");
    for (reason, n) in &ic.skips {
        p.sample("kv_indexer_events_skipped_total", &[("reason", reason)], *n as f64);
    }
    p.family("kv_indexer_shard_queue_depth", "gauge", "Messages queued per writer shard.");
    for (i, d) in ic.shard_queue_depths.iter().enumerate() {
        p.sample("kv_indexer_shard_queue_depth", &[("shard", &i.to_string())], *d as f64);
    }
    p.single(
        "kv_indexer_held_batches",
        "gauge",
        "Batches held by listeners (replay or ready gate).",
        ic.held_batches as f64,
    );
}

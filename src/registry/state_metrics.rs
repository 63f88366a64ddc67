//! The registry's, the indexes' and the ingest pipeline's figures, written
//! into `/metrics` at scrape time. Reads state; keeps none.

use crate::ingest::EVENT_LAG_BUCKETS_S;
use crate::metrics::Prom;
use crate::registry::readiness::Readiness;
use crate::registry::{IndexHandle, Origin, Registry};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Registry, ingest and index figures for `/metrics`.
pub fn render(p: &mut Prom, registry: &Registry, readiness: &Readiness) {
    let indexes = registry.indexes();
    render_registry(p, registry, readiness, indexes.len());
    render_indexes(p, registry, &indexes);
    render_predictions(p, registry);
    registry.counters.render(p);
    render_ingest(p, registry);
    render_event_lag(p, registry);
    render_listeners(p, registry);
    render_workers_file(p, registry);
}

/// How many indexes, workers and listeners, and whether the daemon is ready.
fn render_registry(p: &mut Prom, registry: &Registry, readiness: &Readiness, indexes: usize) {
    p.single("dynamo_kvindexer_models", "gauge", "Indexes by (model, tenant).", indexes as f64);
    p.single("dynamo_kvindexer_workers", "gauge", "Registered worker instances.", registry.instance_count() as f64);
    let infos = registry.listener_infos();
    let by_status = ["pending", "active", "paused", "failed"]
        .map(|status| (status, infos.values().filter(|i| i.status.as_str() == status).count() as f64));
    p.labelled("dynamo_kvindexer_listeners", "gauge", "ZMQ listeners by status.", "status", by_status);
    p.single(
        "kv_indexer_ready",
        "gauge",
        "1 once recovered and enough workers are registered.",
        readiness.check(registry).is_ok() as u8 as f64,
    );
}

/// Each index's size, and the shared budget's cap and use.
fn render_indexes(p: &mut Prom, registry: &Registry, indexes: &[Arc<IndexHandle>]) {
    let stats: Vec<_> = indexes.iter().map(|h| h.index().stats()).collect();
    for (i, name, help) in [
        (0, "kv_indexer_index_blocks", "Indexed entries (block, tier, worker group) per index."),
        (1, "kv_indexer_index_pairs", "Live (block, worker) pairs per index."),
        (2, "kv_indexer_index_bytes", "Bytes held by each index's structures."),
    ] {
        p.family(name, "gauge", help);
        for (h, s) in indexes.iter().zip(&stats) {
            p.sample(
                name,
                &[("model", &h.model_name), ("tenant", &h.tenant_id)],
                [s.entries, s.pairs, s.bytes][i] as f64,
            );
        }
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
}

/// The ingest pipeline's counters, skips, queue depths and held batches.
fn render_ingest(p: &mut Prom, registry: &Registry) {
    let ic = registry.ingest().counters();
    let counters: [(&str, &str, u64); 26] = [
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
        ("ring_fills", "Ring fills asked for when a listener connected.", ic.ring_fills),
        (
            "late_join_reads",
            "Ring reads after a fill no live batch followed (batches sent before the subscription took).",
            ic.late_join_reads,
        ),
        ("batches_filled", "Batches recovered by ring fills.", ic.batches_filled),
        ("engine_gone_clears", "Workers cleared after their engine stayed unreachable.", ic.engine_gone_clears),
        ("restarts", "Engine restarts detected (worker cleared).", ic.restarts),
        (
            "unverified_continuations",
            "New connections taken for the same engine process, unverified.",
            ic.unverified_continuations,
        ),
        ("resyncs", "Workers cleared after an unreplayable gap.", ic.resyncs),
        ("held_dropped", "Batches dropped from a full hold buffer.", ic.held_dropped),
        ("budget_dropped", "Batches dropped undecoded with the ingest budget spent.", ic.budget_dropped),
        ("unproven_dropped", "Batches not known to be the followed process's, dropped.", ic.unproven_dropped),
        ("dp_rank_limit_dropped", "Batches over the per-listener dp rank limit.", ic.dp_rank_limit_dropped),
        ("workers_removed", "Workers removed through their shard.", ic.workers_removed),
    ];
    for (name, help, v) in counters {
        p.single(&format!("kv_indexer_{name}_total"), "counter", help, v as f64);
    }
    let skips = ic.skips.iter().map(|&(reason, n)| (reason, n as f64));
    p.labelled("kv_indexer_events_skipped_total", "counter", "Engine events skipped, by reason.", "reason", skips);
    let depths = ic.shard_queue_depths.iter().enumerate().map(|(i, &d)| (i.to_string(), d as f64));
    p.labelled("kv_indexer_shard_queue_depth", "gauge", "Messages queued per writer shard.", "shard", depths);
    p.single(
        "kv_indexer_held_batches",
        "gauge",
        "Batches held by listeners (replay or ready gate).",
        ic.held_batches as f64,
    );
    p.single(
        "kv_indexer_ingest_budget_used_bytes",
        "gauge",
        "Bytes of engine batches received and not yet applied.",
        ic.budget_bytes as f64,
    );
    p.single("kv_indexer_ingest_budget_bytes", "gauge", "--ingest-budget-mib, in bytes.", ic.budget_bytes_max as f64);
}

/// `kv_indexer_event_lag_seconds`: applied batches by how long after their
/// engine stamped them they were applied.
fn render_event_lag(p: &mut Prom, registry: &Registry) {
    let name = "kv_indexer_event_lag_seconds";
    let lag = registry.ingest().event_lag();
    p.family(name, "histogram", "Time from an engine's timestamp of a batch to its apply (skew counts as 0).");
    let mut cumulative = 0;
    for (bound, n) in EVENT_LAG_BUCKETS_S.iter().zip(&lag.buckets) {
        cumulative += n;
        p.sample(&format!("{name}_bucket"), &[("le", &bound.to_string())], cumulative as f64);
    }
    p.sample(&format!("{name}_bucket"), &[("le", "+Inf")], lag.count() as f64);
    p.sample(&format!("{name}_sum"), &[], lag.sum_s);
    p.sample(&format!("{name}_count"), &[], lag.count() as f64);
}

/// Per listener: connected or not, its watermark, and the seconds since
/// its last batch. One series per registration (at most `LISTENERS_MAX`),
/// labelled as `/workers` lists it.
fn render_listeners(p: &mut Prom, registry: &Registry) {
    let infos = registry.listener_infos();
    let listeners: Vec<_> =
        registry.registrations().into_iter().filter_map(|r| infos.get(&r.listener).map(|i| (r, i.clone()))).collect();
    let families = [
        ("kv_indexer_listener_connected", "1 while the listener's socket is connected to its engine."),
        ("kv_indexer_listener_last_seq", "Highest engine seq the listener dealt with (absent before the first)."),
        (
            "kv_indexer_listener_last_batch_age_seconds",
            "Seconds since the listener's last batch arrived (since it was added, before the first).",
        ),
    ];
    for (i, (name, help)) in families.into_iter().enumerate() {
        p.family(name, "gauge", help);
        for (r, info) in &listeners {
            let value = match i {
                0 => Some(info.connected as u8 as f64),
                1 => info.last_seq.map(|s| s as f64),
                _ => Some(info.since_last_batch.as_secs_f64()),
            };
            let (instance, rank) = (r.worker.instance_id.to_string(), r.worker.dp_rank.to_string());
            let labels = [
                ("model", r.model_name.as_str()),
                ("tenant", &r.tenant_id),
                ("instance_id", &instance),
                ("dp_rank", &rank),
            ];
            if let Some(v) = value {
                p.sample(name, &labels, v);
            }
        }
    }
}

/// Reads of `--workers-file` and what it registered.
fn render_workers_file(p: &mut Prom, registry: &Registry) {
    let f = &registry.file_reloads;
    let outcomes = [("applied", &f.applied), ("partial", &f.partial), ("refused", &f.refused)]
        .map(|(o, n)| (o, n.load(Ordering::Relaxed) as f64));
    let help = "Reads of --workers-file (at start and on SIGHUP), by outcome; refused: nothing changed.";
    p.labelled("kv_indexer_workers_file_reloads_total", "counter", help, "outcome", outcomes);
    p.single(
        "kv_indexer_workers_file_last_reload_successful",
        "gauge",
        "0 when the last read of --workers-file was refused or partial, else 1.",
        !f.last_failed.load(Ordering::Relaxed) as u8 as f64,
    );
    let owned = registry.registrations().iter().filter(|r| matches!(r.origin, Origin::File(_))).count();
    p.single("kv_indexer_workers_file_entries", "gauge", "Registrations made by --workers-file.", owned as f64);
}

/// Predicted placements (`/routed`): what is due is swept first, so the
/// live figure counts no expired booking.
fn render_predictions(p: &mut Prom, registry: &Registry) {
    let now = crate::predict::now_ms();
    for h in registry.indexes() {
        h.predictions.sweep(now);
    }
    let l = &registry.predict;
    p.single(
        "kv_indexer_predicted_blocks_max",
        "gauge",
        "Cap on live predicted blocks over all indexes (--predict-max-blocks).",
        l.max_blocks as f64,
    );
    p.single(
        "kv_indexer_predicted_blocks_live",
        "gauge",
        "Live predicted blocks booked through /routed, over all indexes.",
        l.live() as f64,
    );
    let c = &l.counters;
    let outcomes = [
        ("made", &c.made),
        ("renewed", &c.renewed),
        ("confirmed", &c.confirmed),
        ("expired", &c.expired),
        ("dropped", &c.dropped),
        ("refused", &c.refused),
    ]
    .map(|(o, v)| (o, v.load(Ordering::Relaxed) as f64));
    let help = "Predicted blocks by what became of them.";
    p.labelled("kv_indexer_predicted_blocks_total", "counter", help, "outcome", outcomes);
}

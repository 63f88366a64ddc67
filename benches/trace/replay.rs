//! Replays a workload against a backend at an offered rate and measures it.
//!
//! The trace timeline is compressed so the whole stream's block ops arrive
//! in `block_ops / rate` seconds. One issuer thread walks the ops by
//! deadline: events go to the backend's sticky writers, queries to reader
//! threads over a bounded channel. Throughput counts until every event is
//! applied and every query answered (draining included).
//!
//! Bounded lag: before the issuer hands out a query it waits until, for
//! every worker, at most `max_lag_events` of the events that precede the
//! query in the trace are still unapplied. A query therefore never runs
//! against an index emptier than the trace says by more than that, so an
//! overloaded run cannot look fast by querying a small, early index; when
//! writers fall behind, the issuer stalls and the achieved rate shows it.
//! While it stalls it sleeps between polls (`lag_backoff`), so the driver
//! does not take the cores from the backend it waits for.

use std::time::{Duration, Instant};

use crossbeam::channel::bounded;

use super::backend::Backend;
use super::workload::{OpKind, Workload};

/// Queries at least this long are also timed apart (`long_service_ns`).
pub const LONG_QUERY_BLOCKS: u32 = 2048;
/// Queries waiting for a reader before the issuer blocks.
pub const QUERY_QUEUE: usize = 1024;
/// Latency samples kept per reader (one per query; beyond this, not recorded).
pub const LATENCY_SAMPLES_MAX: usize = 50_000_000;

/// How the driver runs.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    pub readers: usize,
    pub max_lag_events: u64,
}

/// Latency percentiles in nanoseconds.
#[derive(Copy, Clone, Debug, Default)]
pub struct Percentiles {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

impl Percentiles {
    /// Percentiles of `v` (sorted in place).
    pub fn of(v: &mut [u64]) -> Self {
        if v.is_empty() {
            return Self::default();
        }
        v.sort_unstable();
        let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
        Self { p50: at(0.50), p90: at(0.90), p99: at(0.99), p999: at(0.999), max: v[v.len() - 1] }
    }
}

/// What one run at one offered rate measured.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    pub offered_ops_per_s: f64,
    pub window_s: f64,
    pub elapsed_s: f64,
    pub achieved_ops_per_s: f64,
    /// Finished within 1.1x the window (Dynamo's keep-up rule).
    pub kept_up: bool,
    /// Longest time the issuer ran behind an op's deadline.
    pub issue_behind_max_ms: f64,
    /// Time the issuer waited for writers to bring queries within the lag bound.
    pub lag_stall_ms: f64,
    /// Queries that had to wait for writers.
    pub lag_stalled_queries: u64,
    /// Lookup time alone.
    pub service_ns: Percentiles,
    /// Lookup time of the queries of `LONG_QUERY_BLOCKS` blocks or more,
    /// which make the tail.
    pub long_service_ns: Percentiles,
    /// From the query's deadline to its answer (includes queueing).
    pub end_to_end_ns: Percentiles,
    pub queries: u64,
}

/// Events and query hashes in the backend's form, built before timing.
pub struct Prepared<B: Backend> {
    events: Vec<Option<B::Event>>,
    hashes: Vec<B::Hash>,
}

/// Builds every event and the query slab for one run.
pub fn prepare<B: Backend>(backend: &B, wl: &Workload) -> Prepared<B> {
    let mut event_id = 0;
    let events = wl
        .ops
        .iter()
        .map(|op| {
            op.is_event().then(|| {
                event_id += 1;
                backend.build_event(op, wl, event_id - 1)
            })
        })
        .collect();
    let hashes = wl.query_locals.iter().map(|&h| B::hash(h)).collect();
    Prepared { events, hashes }
}

fn wait_until(start: Instant, deadline_ns: u64) -> u64 {
    let target = start + Duration::from_nanos(deadline_ns);
    loop {
        let now = Instant::now();
        if now >= target {
            return (now - target).as_nanos() as u64;
        }
        let left = target - now;
        if left > Duration::from_micros(200) {
            std::thread::sleep(left - Duration::from_micros(100));
        } else {
            std::thread::yield_now();
        }
    }
}

/// Polls of the lag gate that yield before it sleeps instead.
pub const LAG_YIELDS: u32 = 4;
/// How long the lag gate sleeps between polls once past `LAG_YIELDS`.
pub const LAG_SLEEP: Duration = Duration::from_micros(50);

/// Waits a little before the lag gate polls again: a few yields, then
/// short sleeps, so an issuer waiting for writers leaves them the cores
/// instead of spinning through the scheduler beside them (a gate waits for
/// about a millisecond of writers' work at saturation).
fn lag_backoff(polls: &mut u32) {
    *polls += 1;
    if *polls <= LAG_YIELDS {
        std::thread::yield_now();
    } else {
        std::thread::sleep(LAG_SLEEP);
    }
}

/// Replays `wl` at `rate` block ops/s through `backend`.
pub fn replay<B: Backend>(
    backend: &B,
    wl: &Workload,
    prepared: Prepared<B>,
    rate: f64,
    cfg: &DriverConfig,
) -> RunStats {
    let Prepared { mut events, hashes } = prepared;
    let block_ops = wl.stats.block_ops() as f64;
    let window_ns = block_ops / rate * 1e9;
    let span_us = wl.stats.span_us.max(1) as f64;
    let ns_per_trace_us = window_ns / span_us;
    let t0 = wl.ops.first().map_or(0, |o| o.t_us);
    let workers = wl.config.workers as usize;
    let readers = cfg.readers.max(1);
    let queries_total = wl.ops.iter().filter(|o| !o.is_event()).count();
    let per_reader = queries_total.div_ceil(readers).min(LATENCY_SAMPLES_MAX);

    let (tx, rx) = bounded::<(usize, u32, u64)>(QUERY_QUEUE);
    let mut sent = vec![0u64; workers];
    let mut known_applied = vec![0u64; workers];
    let mut stats = RunStats {
        offered_ops_per_s: rate,
        window_s: window_ns / 1e9,
        queries: queries_total as u64,
        ..RunStats::default()
    };
    let mut behind_max_ns = 0u64;
    let mut stall = Duration::ZERO;
    let start = Instant::now();

    let (mut service, mut long, mut e2e) = std::thread::scope(|s| {
        let hashes = &hashes;
        let handles: Vec<_> = (0..readers)
            .map(|r| {
                let rx = rx.clone();
                let reader = std::thread::Builder::new().name(format!("reader-{r}"));
                reader
                    .spawn_scoped(s, move || {
                        let mut service = Vec::with_capacity(per_reader);
                        let mut long = Vec::new();
                        let mut e2e = Vec::with_capacity(per_reader);
                        let mut out = Vec::new();
                        for (q_start, len, deadline_ns) in rx {
                            let q = &hashes[q_start..q_start + len as usize];
                            let a = Instant::now();
                            out.clear();
                            backend.find_matches(q, &mut out);
                            let b = Instant::now();
                            if service.len() < per_reader {
                                if len >= LONG_QUERY_BLOCKS {
                                    long.push((b - a).as_nanos() as u64);
                                }
                                service.push((b - a).as_nanos() as u64);
                                let since_start = (b - start).as_nanos() as u64;
                                e2e.push(since_start.saturating_sub(deadline_ns));
                            }
                        }
                        (service, long, e2e)
                    })
                    .expect("spawn reader thread")
            })
            .collect();
        drop(rx);

        for (i, op) in wl.ops.iter().enumerate() {
            let deadline_ns = ((op.t_us - t0) as f64 * ns_per_trace_us) as u64;
            behind_max_ns = behind_max_ns.max(wait_until(start, deadline_ns));
            match op.kind {
                OpKind::Query => {
                    let gate = Instant::now();
                    let mut waited = false;
                    let mut polls = 0u32;
                    for w in 0..workers {
                        while sent[w] > known_applied[w] + cfg.max_lag_events {
                            known_applied[w] = backend.applied_events(w as u32);
                            if sent[w] > known_applied[w] + cfg.max_lag_events {
                                waited = true;
                                lag_backoff(&mut polls);
                            }
                        }
                    }
                    if waited {
                        stall += gate.elapsed();
                        stats.lag_stalled_queries += 1;
                    }
                    tx.send((op.start, op.len, deadline_ns)).expect("readers are gone");
                }
                OpKind::Stored { .. } | OpKind::Removed => {
                    let event = events[i].take().expect("event built once");
                    backend.submit(op.worker, event);
                    sent[op.worker as usize] += 1;
                }
            }
        }
        drop(tx);
        backend.drain();
        let (mut service, mut long, mut e2e) = (Vec::new(), Vec::new(), Vec::new());
        for h in handles {
            let (s, l, e) = h.join().expect("reader panicked");
            service.extend(s);
            long.extend(l);
            e2e.extend(e);
        }
        (service, long, e2e)
    });
    let elapsed = start.elapsed();

    stats.elapsed_s = elapsed.as_secs_f64();
    stats.achieved_ops_per_s = block_ops / stats.elapsed_s;
    stats.kept_up = stats.elapsed_s <= 1.1 * stats.window_s;
    stats.issue_behind_max_ms = behind_max_ns as f64 / 1e6;
    stats.lag_stall_ms = stall.as_secs_f64() * 1e3;
    stats.service_ns = Percentiles::of(&mut service);
    stats.long_service_ns = Percentiles::of(&mut long);
    stats.end_to_end_ns = Percentiles::of(&mut e2e);
    stats
}

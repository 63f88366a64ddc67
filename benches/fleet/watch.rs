//! When a server has dealt with everything the engines published.
//!
//! Ours has settled when `/workers` shows every engine's last seq and
//! `kv_indexer_pairs` read the same on two polls in a row. Dynamo's service
//! shows no seq, so it has settled when its count of applied events
//! (`dynamo_kvrouter_kv_cache_events_applied`, every status) stops moving
//! for [`DYNAMO_STABLE_POLLS`] polls after the engines are done.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::probe::{get, metric, Server};
use super::publishers::Published;

/// How often a server is polled while settling.
pub const POLL: Duration = Duration::from_millis(250);
/// Polls in a row without a new applied event for Dynamo to count as settled.
pub const DYNAMO_STABLE_POLLS: u32 = 8;

/// Our daemon's progress: each instance's last seq, and live pairs.
pub fn ours(base: &str) -> Result<(HashMap<u64, i64>, u64), String> {
    let (status, body) = get(base, "/workers")?;
    if status != 200 {
        return Err(format!("/workers answered {status}"));
    }
    let workers: Value = serde_json::from_str(&body).map_err(|e| format!("/workers: {e}"))?;
    let mut seqs = HashMap::new();
    for w in workers.as_array().into_iter().flatten() {
        let id = w["instance_id"].as_u64().unwrap_or(0);
        let last = w["listeners"]["0"]["last_seq"].as_i64().unwrap_or(-1);
        seqs.insert(id, last);
    }
    let (_, metrics) = get(base, "/metrics")?;
    let pairs = metric(&metrics, "kv_indexer_pairs").unwrap_or(0.0) as u64;
    Ok((seqs, pairs))
}

/// Whether every engine's last seq is in `seqs`.
pub fn caught_up(seqs: &HashMap<u64, i64>, published: &Published) -> bool {
    published.last_seq.iter().all(|(id, last)| seqs.get(id).copied().unwrap_or(-1) >= *last)
}

/// What one wait saw.
#[derive(Clone, Copy, Debug, Default)]
pub struct Settled {
    /// From the wait's start to the poll that found it settled, or (when
    /// it stalled) to the last poll that saw anything move.
    pub secs: f64,
    /// From the wait's start to the first poll that saw a pair.
    pub first_pair_s: Option<f64>,
    pub pairs: u64,
    /// Engines whose last seq the daemon never reached: it stalled.
    pub behind: usize,
}

/// Polls our daemon at `base` until it has settled on `published`, or
/// nothing moved for [`STALL`] (idle engines send nothing more that could
/// show a daemon what it lacks).
pub fn wait_ours(server: &Server, published: &Published, t0: Instant, timeout: Duration) -> Result<Settled, String> {
    let base = &server.base;
    let mut prev = None;
    let mut first_pair_s = None;
    let mut moved_s = 0.0;
    loop {
        if let Ok((seqs, pairs)) = ours(base) {
            if pairs > 0 && first_pair_s.is_none() {
                first_pair_s = Some(t0.elapsed().as_secs_f64());
            }
            let seq_sum: i64 = seqs.values().sum();
            let now = t0.elapsed().as_secs_f64();
            if caught_up(&seqs, published) && prev.is_some_and(|(_, p)| p == pairs) {
                return Ok(Settled { secs: now, first_pair_s, pairs, behind: 0 });
            }
            if prev != Some((seq_sum, pairs)) {
                moved_s = now;
            } else if now - moved_s > STALL.as_secs_f64() {
                let behind =
                    published.last_seq.iter().filter(|(id, l)| seqs.get(id).copied().unwrap_or(-1) < *l).count();
                return Ok(Settled { secs: moved_s, first_pair_s, pairs, behind });
            }
            prev = Some((seq_sum, pairs));
        }
        if !server.running() {
            return Err(format!("our daemon exited before it settled: {}", server.log_tail()));
        }
        if t0.elapsed() > timeout {
            return Err(format!("our daemon did not settle within {timeout:?}: {}", server.log_tail()));
        }
        std::thread::sleep(POLL);
    }
}

/// Events Dynamo's service has applied, over every status.
pub fn dynamo_applied(base: &str) -> Option<f64> {
    let (_, metrics) = get(base, "/metrics").ok()?;
    metric(&metrics, "dynamo_kvrouter_kv_cache_events_applied")
}

/// How long nothing may move before a wait gives up on the rest.
pub const STALL: Duration = Duration::from_secs(45);

/// Polls Dynamo's service until its applied events stop moving; the time
/// is that of the first poll of the still run.
pub fn wait_dynamo(server: &Server, t0: Instant, timeout: Duration) -> Result<Settled, String> {
    let base = &server.base;
    let (mut prev, mut still, mut since) = (None, 0, 0.0);
    loop {
        if !server.running() {
            return Err(format!("Dynamo's service exited: {}", server.log_tail()));
        }
        let now = dynamo_applied(base);
        if now.is_some() && now == prev {
            still += 1;
            if still >= DYNAMO_STABLE_POLLS {
                return Ok(Settled { secs: since, first_pair_s: None, pairs: 0, behind: 0 });
            }
        } else {
            still = 0;
            since = t0.elapsed().as_secs_f64();
        }
        prev = now;
        if t0.elapsed() > timeout {
            return Err(format!("Dynamo's service did not settle within {timeout:?}"));
        }
        std::thread::sleep(POLL);
    }
}

/// Dynamo's applied events of `event_type` with `status`.
pub fn dynamo_events(base: &str, event_type: &str, status: &str) -> Option<f64> {
    let (_, metrics) = get(base, "/metrics").ok()?;
    let key = format!("dynamo_kvrouter_kv_cache_events_applied{{event_type=\"{event_type}\",status=\"{status}\"}}");
    metrics.lines().find(|l| l.starts_with(&key)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

//! How far the index runs behind the engines: for each applied batch, the
//! wall-clock time it was applied minus the engine's own timestamp of the
//! batch (its first msgpack element, `ts`, in seconds), counted into fixed
//! buckets (`kv_indexer_event_lag_seconds`).
//!
//! The lag covers everything between the engine and the index: the
//! engine's publisher queue, the network, the listener's read and decode,
//! a replay or a closed ready gate, the shard queue, the apply itself. A
//! lag below zero is clock skew between the hosts and counts as zero; a
//! timestamp that is not a finite number is not counted at all.
//!
//! Recorded by the writer shard after each batch is applied: one clock
//! read, a bucket found by comparison, two relaxed atomic adds and one
//! compare-and-swap for the sum; no lock, no allocation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Upper bounds of the buckets, in seconds: sub-millisecond to a minute.
pub const EVENT_LAG_BUCKETS_S: [f64; 18] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// Live lag counts, shared by every shard.
#[derive(Debug, Default)]
pub(crate) struct EventLag {
    /// Per bucket (not cumulative), then one for lags past the last bound.
    buckets: [AtomicU64; EVENT_LAG_BUCKETS_S.len() + 1],
    /// Sum of the counted lags in seconds, as `f64` bits.
    sum_bits: AtomicU64,
}

/// A snapshot of the lag histogram.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EventLagCounts {
    /// Batches per bucket of `EVENT_LAG_BUCKETS_S` (not cumulative), then
    /// those past the last bound.
    pub buckets: Vec<u64>,
    /// Sum of the counted lags, in seconds.
    pub sum_s: f64,
}

impl EventLagCounts {
    /// Batches counted.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

impl EventLag {
    /// Counts a batch stamped `engine_ts_s` (Unix seconds) applied now.
    pub(crate) fn observe(&self, engine_ts_s: f64) {
        let now_s = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        self.observe_lag(now_s - engine_ts_s);
    }

    fn observe_lag(&self, lag_s: f64) {
        if !lag_s.is_finite() {
            return;
        }
        let lag_s = lag_s.max(0.0);
        let i = EVENT_LAG_BUCKETS_S.iter().position(|&b| lag_s <= b).unwrap_or(EVENT_LAG_BUCKETS_S.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let add = |bits: u64| Some((f64::from_bits(bits) + lag_s).to_bits());
        // The closure never refuses, so the update always succeeds.
        let _ = self.sum_bits.fetch_update(Ordering::Relaxed, Ordering::Relaxed, add);
    }

    pub(crate) fn snapshot(&self) -> EventLagCounts {
        EventLagCounts {
            buckets: self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect(),
            sum_s: f64::from_bits(self.sum_bits.load(Ordering::Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lags_land_in_their_buckets_and_skew_counts_as_zero() {
        let lag = EventLag::default();
        for s in [0.00005, 0.0001, 0.003, 59.0, 61.0, -5.0, f64::NAN, f64::INFINITY] {
            lag.observe_lag(s);
        }
        let c = lag.snapshot();
        let at = |bound: f64| c.buckets[EVENT_LAG_BUCKETS_S.iter().position(|&b| b == bound).unwrap()];
        assert_eq!(at(0.0001), 3, "two at or under the first bound, and the negative one");
        assert_eq!(at(0.005), 1);
        assert_eq!(at(60.0), 1);
        assert_eq!(c.buckets[EVENT_LAG_BUCKETS_S.len()], 1, "61 s is past every bound");
        assert_eq!(c.count(), 6, "NaN and infinity are not counted");
        assert!((c.sum_s - (0.00005 + 0.0001 + 0.003 + 59.0 + 61.0)).abs() < 1e-9, "{}", c.sum_s);
    }

    #[test]
    fn a_batch_stamped_now_lags_less_than_one_stamped_a_minute_ago() {
        let lag = EventLag::default();
        let now_s = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
        lag.observe(now_s - 120.0);
        lag.observe(now_s + 3_600.0);
        let c = lag.snapshot();
        assert_eq!(c.buckets[EVENT_LAG_BUCKETS_S.len()], 1, "two minutes old is past the last bound");
        assert_eq!(c.buckets[0], 1, "an hour in the future is skew: zero");
    }
}

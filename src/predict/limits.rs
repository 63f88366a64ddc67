//! What every index's predictions share: the cap on live predicted blocks,
//! the TTLs, the counters `/metrics` shows, and the clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// Default lifetime of a booking (`--predict-ttl-ms`): long enough for a
/// queued request's prefill and its events, short enough that a booking
/// the worker never honours stops steering routers soon.
pub const TTL_MS_DEFAULT: u64 = 2_000;
/// Longest lifetime a booking may ask for (`ttl_ms`, `--predict-ttl-ms`).
pub const TTL_MS_MAX: u64 = 60_000;
/// Default cap on live predicted blocks over all indexes (`--predict-max-blocks`);
/// about 50 bytes a block (see docs/limits.md).
pub const MAX_BLOCKS_DEFAULT: u64 = 1 << 20;

/// Totals since start, in blocks (`kv_indexer_predicted_blocks_total`).
/// `made = confirmed + expired + dropped + live` at every quiet moment.
#[derive(Default)]
pub struct PredictCounters {
    /// Blocks added by bookings.
    pub made: AtomicU64,
    /// Blocks of bookings that an existing booking covered: its time renewed.
    pub renewed: AtomicU64,
    /// Blocks a Stored of the worker made real.
    pub confirmed: AtomicU64,
    /// Blocks whose booking ran out of time.
    pub expired: AtomicU64,
    /// Blocks dropped with their worker: Cleared, engine restart, resync,
    /// removal, or their index gone.
    pub dropped: AtomicU64,
    /// Blocks of bookings refused at the cap.
    pub refused: AtomicU64,
}

/// The limits and counters every index's predictions share.
pub struct PredictLimits {
    /// Most live predicted blocks over all indexes.
    pub max_blocks: u64,
    /// TTL of a booking that names none.
    pub ttl_ms_default: u64,
    live: AtomicU64,
    pub counters: PredictCounters,
}

impl PredictLimits {
    pub fn new(max_blocks: u64, ttl_ms_default: u64) -> Self {
        PredictLimits { max_blocks, ttl_ms_default, live: AtomicU64::new(0), counters: Default::default() }
    }

    /// Live predicted blocks over all indexes (expired ones count until swept).
    pub fn live(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }

    /// Takes room for `n` blocks, never passing the cap; false when full.
    pub(super) fn take(&self, n: u64) -> bool {
        self.live
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |live| {
                live.checked_add(n).filter(|&after| after <= self.max_blocks)
            })
            .is_ok()
    }

    /// Gives back room for `n` blocks.
    pub(super) fn release(&self, n: u64) {
        let before = self.live.fetch_sub(n, Ordering::Relaxed);
        debug_assert!(before >= n, "released more predicted blocks than were taken");
    }

    pub(super) fn count(&self, counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

impl Default for PredictLimits {
    fn default() -> Self {
        PredictLimits::new(MAX_BLOCKS_DEFAULT, TTL_MS_DEFAULT)
    }
}

/// Milliseconds on the daemon's monotonic clock (since its first call).
/// Every expiry is on this clock; the store itself takes `now` as an
/// argument, so tests and benchmarks can drive it in trace time.
pub fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_holds_and_room_comes_back() {
        let l = PredictLimits::new(10, 5);
        assert!(l.take(6));
        assert!(!l.take(5), "6 + 5 passes 10");
        assert!(l.take(4));
        assert!(!l.take(1));
        l.release(3);
        assert!(l.take(3));
        assert_eq!(l.live(), 10);
        assert!(!l.take(u64::MAX), "no overflow");
    }
}

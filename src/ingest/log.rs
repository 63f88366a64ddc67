//! Warnings to stderr, at most one a second per source, so a publisher that
//! misbehaves on every batch cannot flood the log. Counters carry the totals.

use std::time::{Duration, Instant};

/// Least time between two lines from one source.
const LOG_INTERVAL_MS: u64 = 1_000;

/// Rate limiter for one source of warnings (one listener).
#[derive(Debug, Default)]
pub(crate) struct LogLimiter {
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimiter {
    /// Prints the warning unless one was printed less than a second ago.
    pub(crate) fn warn(&mut self, message: impl FnOnce() -> String) {
        let now = Instant::now();
        if self.last.is_some_and(|t| now.duration_since(t) < Duration::from_millis(LOG_INTERVAL_MS)) {
            self.suppressed = self.suppressed.saturating_add(1);
            return;
        }
        let suppressed = std::mem::take(&mut self.suppressed);
        if suppressed > 0 {
            eprintln!("kv-indexer ingest: {} ({suppressed} similar lines suppressed)", message());
        } else {
            eprintln!("kv-indexer ingest: {}", message());
        }
        self.last = Some(now);
    }
}

//! Ingest log lines, at most one a second per source (or per the source's
//! own interval), so a publisher that misbehaves on every batch cannot
//! flood the log. Counters carry the totals.

use std::time::{Duration, Instant};

/// Least time between two lines from one source.
const LOG_INTERVAL_MS: u64 = 1_000;

/// Rate limiter for one source of warnings (one listener).
#[derive(Debug)]
pub(crate) struct LogLimiter {
    last: Option<Instant>,
    suppressed: u64,
    interval: Duration,
}

impl Default for LogLimiter {
    fn default() -> Self {
        Self::every(Duration::from_millis(LOG_INTERVAL_MS))
    }
}

impl LogLimiter {
    /// At most one line per `interval`.
    pub(crate) fn every(interval: Duration) -> Self {
        Self { last: None, suppressed: 0, interval }
    }

    /// Logs a warning unless a line was logged less than a second ago.
    pub(crate) fn warn(&mut self, message: impl FnOnce() -> String) {
        self.line(crate::log::Level::Warn, message);
    }

    /// Logs a debug line, rate-limited like warnings.
    pub(crate) fn debug(&mut self, message: impl FnOnce() -> String) {
        self.line(crate::log::Level::Debug, message);
    }

    /// Logs an informational line, rate-limited like warnings.
    pub(crate) fn info(&mut self, message: impl FnOnce() -> String) {
        self.line(crate::log::Level::Info, message);
    }

    fn line(&mut self, level: crate::log::Level, message: impl FnOnce() -> String) {
        if !crate::log::enabled(level) {
            return;
        }
        let now = Instant::now();
        if self.last.is_some_and(|t| now.duration_since(t) < self.interval) {
            self.suppressed = self.suppressed.saturating_add(1);
            return;
        }
        let suppressed = std::mem::take(&mut self.suppressed);
        if suppressed > 0 {
            crate::log::write(level, format_args!("{} ({suppressed} similar lines suppressed)", message()));
        } else {
            crate::log::write(level, format_args!("{}", message()));
        }
        self.last = Some(now);
    }

    /// Forgets the last line: the next one is written at once.
    pub(crate) fn reset(&mut self) {
        self.last = None;
    }
}

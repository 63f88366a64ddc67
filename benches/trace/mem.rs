//! Process memory from /proc/self/status (Linux), in bytes.
//!
//! `VmRSS` is the resident set now, `VmHWM` its peak; writing `5` to
//! /proc/self/clear_refs resets the peak so each run measures its own.
//! Elsewhere every figure reads 0.
//!
//! A binary with a counting global allocator can also install a probe of
//! its live heap bytes (`set_heap_probe`); a run then reports the heap its
//! index holds, which RSS cannot isolate (freed pages the allocator keeps
//! get reused by the index without showing up as growth).

use std::sync::OnceLock;

static HEAP_PROBE: OnceLock<fn() -> i64> = OnceLock::new();

/// Installs the live-heap probe (first call wins).
pub fn set_heap_probe(probe: fn() -> i64) {
    let _ = HEAP_PROBE.set(probe);
}

/// Live heap bytes, when a probe is installed.
pub fn heap_live() -> Option<i64> {
    HEAP_PROBE.get().map(|p| p())
}

/// Resident set size now and its peak since the last reset, in bytes.
#[derive(Copy, Clone, Debug, Default)]
pub struct Rss {
    pub now_bytes: u64,
    pub peak_bytes: u64,
}

/// Reads the current and peak resident set size.
pub fn rss() -> Rss {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return Rss::default();
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    Rss { now_bytes: field("VmRSS:"), peak_bytes: field("VmHWM:") }
}

/// Resets the peak to the current resident set (ignored where unsupported).
pub fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

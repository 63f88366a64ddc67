//! Checks an index against the mock engines' true caches.
//!
//! Each sampled query carries the exact depth every worker holds at the end
//! of the trace; after a drained replay the index must give the same set of
//! (worker, depth) pairs. Any difference is a mismatch.

use std::time::Instant;

use super::backend::Backend;
use super::replay::Percentiles;
use super::workload::Workload;

/// Most mismatches described in detail.
pub const MISMATCH_REPORTS_MAX: usize = 5;

/// Result of a check.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    pub samples: u64,
    /// Sampled queries where at least one worker had a cached prefix.
    pub samples_with_hits: u64,
    pub mismatches: u64,
    pub details: Vec<String>,
    /// Lookup time of the sampled queries on the drained, quiet index.
    pub quiet_service_ns: Percentiles,
}

/// Queries every sample and compares with the engines' depths.
pub fn verify<B: Backend>(backend: &B, wl: &Workload) -> Verdict {
    let mut v = Verdict::default();
    let mut got = Vec::new();
    let mut hashes = Vec::new();
    let mut times = Vec::with_capacity(wl.samples.len());
    for s in &wl.samples {
        hashes.clear();
        hashes.extend(wl.query_locals[s.start..s.start + s.len as usize].iter().map(|&h| B::hash(h)));
        got.clear();
        let t = Instant::now();
        backend.find_matches(&hashes, &mut got);
        times.push(t.elapsed().as_nanos() as u64);
        got.sort_unstable();
        v.samples += 1;
        v.samples_with_hits += u64::from(!s.expected.is_empty());
        if got != s.expected {
            v.mismatches += 1;
            if v.details.len() < MISMATCH_REPORTS_MAX {
                v.details.push(format!(
                    "query of {} blocks: expected (worker, depth) {:?}, index gave {:?}",
                    s.len,
                    &s.expected[..s.expected.len().min(8)],
                    &got[..got.len().min(8)]
                ));
            }
        }
    }
    v.quiet_service_ns = Percentiles::of(&mut times);
    v
}

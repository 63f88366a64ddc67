//! Runs a backend over a series of offered rates, one fresh index per run.
//!
//! Each run builds the backend's events outside timing, resets the peak RSS,
//! replays, records memory (after returning freed heap pages to the OS), and
//! checks the drained index against the mock engines. An automatic sweep
//! starts at an 8 s window, halves the rate until a run keeps up, then
//! doubles it from the start until two runs in a row fail to keep up.

use super::backend::Backend;
use super::mem::{heap_live, reset_peak, rss};
use super::replay::{prepare, replay, DriverConfig};
use super::report::{sustainable, RunRecord};
use super::verify::verify;
use super::workload::Workload;

/// Window of the first run of an automatic sweep.
pub const AUTO_FIRST_WINDOW_S: f64 = 8.0;
/// Longest window an automatic sweep runs when it steps down.
pub const AUTO_WINDOW_MAX_S: f64 = 64.0;
/// Shortest window an automatic sweep runs.
pub const AUTO_WINDOW_MIN_S: f64 = 0.01;
/// Most runs in one sweep.
pub const SWEEP_RUNS_MAX: usize = 24;

/// Which offered rates to run.
#[derive(Clone, Debug)]
pub enum Rates {
    /// These block-op rates, in order.
    Fixed(Vec<f64>),
    /// Doubling from an 8 s window until saturation.
    Auto,
}

/// Parses "250K,1M,2.5M" into block ops/s.
pub fn parse_rates(s: &str) -> Result<Vec<f64>, String> {
    s.split(',')
        .map(|part| {
            let p = part.trim();
            let (num, mult) = match p.chars().last() {
                Some('K' | 'k') => (&p[..p.len() - 1], 1e3),
                Some('M' | 'm') => (&p[..p.len() - 1], 1e6),
                Some('G' | 'g') => (&p[..p.len() - 1], 1e9),
                _ => (p, 1.0),
            };
            num.parse::<f64>()
                .ok()
                .map(|v| v * mult)
                .filter(|v| v.is_finite() && *v > 0.0)
                .ok_or_else(|| format!("bad rate {p:?}: want e.g. 500K or 2M"))
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(|v| {
            if v.is_empty() || v.len() > SWEEP_RUNS_MAX {
                Err(format!("give 1..={SWEEP_RUNS_MAX} rates"))
            } else {
                Ok(v)
            }
        })
}

/// Returns freed heap pages to the OS so RSS reflects live memory.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: glibc's malloc_trim only releases free pages; it takes no pointers.
        unsafe {
            malloc_trim(0);
        }
    }
}

/// One run at `rate` with a backend from `make`.
pub fn run_one<B: Backend>(make: &dyn Fn() -> B, wl: &Workload, rate: f64, cfg: &DriverConfig) -> RunRecord {
    trim_heap();
    let rss_before = rss().now_bytes;
    let heap_before = heap_live();
    let backend = make();
    let prepared = prepare(&backend, wl);
    reset_peak();
    let stats = replay(&backend, wl, prepared, rate, cfg);
    trim_heap();
    let after = rss();
    let heap_bytes = heap_live().zip(heap_before).map(|(a, b)| a - b);
    let memory = backend.memory();
    let verdict = verify(&backend, wl);
    for d in &verdict.details {
        eprintln!("MISMATCH [{}]: {d}", backend.label());
    }
    RunRecord {
        stats,
        rss_before_bytes: rss_before,
        rss_peak_bytes: after.peak_bytes,
        rss_after_bytes: after.now_bytes,
        memory,
        verify_samples: verdict.samples,
        verify_samples_with_hits: verdict.samples_with_hits,
        mismatches: verdict.mismatches,
        event_problems: backend.event_problems(),
        quiet_service_ns: verdict.quiet_service_ns,
        heap_bytes,
    }
}

/// Runs the sweep, calling `each` after every run.
pub fn sweep<B: Backend>(
    make: &dyn Fn() -> B,
    wl: &Workload,
    rates: &Rates,
    cfg: &DriverConfig,
    each: &mut dyn FnMut(&RunRecord),
) -> Vec<RunRecord> {
    let mut runs = Vec::new();
    match rates {
        Rates::Fixed(list) => {
            for &r in list {
                let rec = run_one(make, wl, r, cfg);
                each(&rec);
                runs.push(rec);
            }
        }
        Rates::Auto => {
            let ops = wl.stats.block_ops() as f64;
            let first = ops / AUTO_FIRST_WINDOW_S;
            let mut run = |r: f64, runs: &mut Vec<RunRecord>| {
                let rec = run_one(make, wl, r, cfg);
                each(&rec);
                let ok = sustainable(&rec);
                runs.push(rec);
                ok
            };
            // Down from the first window until a run keeps up, then up until two fail.
            let mut r = first;
            let mut ok = run(r, &mut runs);
            while !ok && runs.len() < SWEEP_RUNS_MAX && ops / (r / 2.0) <= AUTO_WINDOW_MAX_S {
                r /= 2.0;
                ok = run(r, &mut runs);
            }
            let mut r = first * 2.0;
            let mut misses = usize::from(!sustainable(&runs[0]));
            while runs.len() < SWEEP_RUNS_MAX && ops / r >= AUTO_WINDOW_MIN_S && misses < 2 {
                misses = if run(r, &mut runs) { 0 } else { misses + 1 };
                r *= 2.0;
            }
            runs.sort_by(|a, b| a.stats.offered_ops_per_s.total_cmp(&b.stats.offered_ops_per_s));
        }
    }
    runs
}

//! Tables, JSON and an achieved-vs-offered SVG for replay results.
//!
//! The SVG is written by hand (log-log axes, one polyline per series and the
//! y = x line) so the benchmark needs no plotting dependency.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::backend::IndexMemory;
use super::replay::{Percentiles, RunStats};
use super::workload::{Workload, WorkloadStats};

/// Everything measured in one run at one rate.
#[derive(Clone, Debug, Default)]
pub struct RunRecord {
    pub stats: RunStats,
    /// Resident set before the index was built, at its peak during the run, and after draining.
    pub rss_before_bytes: u64,
    pub rss_peak_bytes: u64,
    pub rss_after_bytes: u64,
    pub memory: Option<IndexMemory>,
    pub verify_samples: u64,
    pub verify_samples_with_hits: u64,
    pub mismatches: u64,
    pub event_problems: u64,
    /// Lookup time of the verification queries on the drained, quiet index.
    pub quiet_service_ns: Percentiles,
    /// Heap bytes the backend holds after draining (with a heap probe only).
    pub heap_bytes: Option<i64>,
}

/// The headline figures of a sweep.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Highest achieved block ops/s over the sweep.
    pub saturation_ops_per_s: f64,
    /// Index of the highest-rate run that kept up without lag stalls, if any.
    pub sustainable: Option<usize>,
}

/// Whether a run kept up: finished within 1.1x its window and its queries
/// waited for writers less than 1% of the window.
pub fn sustainable(r: &RunRecord) -> bool {
    r.stats.kept_up && r.stats.lag_stall_ms <= 10.0 * r.stats.window_s
}

/// Saturation and the sustainable run of `runs`.
pub fn summarize(runs: &[RunRecord]) -> Summary {
    let saturation = runs.iter().map(|r| r.stats.achieved_ops_per_s).fold(0.0, f64::max);
    let sustainable = runs
        .iter()
        .enumerate()
        .filter(|(_, r)| sustainable(r))
        .max_by(|a, b| a.1.stats.offered_ops_per_s.total_cmp(&b.1.stats.offered_ops_per_s))
        .map(|(i, _)| i);
    Summary { saturation_ops_per_s: saturation, sustainable }
}

/// Bytes as MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// Block ops/s as "12.3M".
pub fn rate(ops: f64) -> String {
    if ops >= 1e6 {
        format!("{:.2}M", ops / 1e6)
    } else {
        format!("{:.0}K", ops / 1e3)
    }
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e3)
}

/// Prints the workload's statistics.
pub fn print_workload(trace: &str, wl: &Workload, gen_s: f64) {
    let c = &wl.config;
    let s = &wl.stats;
    println!("trace {trace}");
    println!(
        "  block size {}, workers {} ({}), gpu blocks {}/worker, decode {} us/token, output blocks stored {}",
        c.block_size,
        c.workers,
        c.assign.as_str(),
        c.gpu_blocks,
        c.decode_us_per_token,
        if c.decode_events { "one per event while decoding" } else { "at completion" }
    );
    println!(
        "  requests {}, query blocks {}, stored blocks {} ({} events, {} from output), removed blocks {} ({} events)",
        s.requests,
        s.query_blocks,
        s.stored_blocks,
        s.stored_events,
        s.output_blocks,
        s.removed_blocks,
        s.removed_events
    );
    println!(
        "  block ops {}, engine prefix hits {}, live pairs at end {} (max {}), shortfall blocks {}, trace span {:.1} s",
        s.block_ops(),
        s.engine_hit_blocks,
        s.live_pairs_end,
        s.live_pairs_max,
        s.shortfall_blocks,
        s.span_us as f64 / 1e6
    );
    println!("  op stream generated in {gen_s:.2} s (not timed in runs)");
}

/// Prints one table row per run.
pub fn print_runs(label: &str, runs: &[RunRecord]) {
    println!("\n{label}");
    println!(
        "{:>9} {:>9} {:>6} {:>5} {:>8} {:>9} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8} {:>6}",
        "offered",
        "achieved",
        "ratio",
        "kept",
        "window_s",
        "stall_ms",
        "p50_us",
        "p99_us",
        "p999_us",
        "e2e99_us",
        "peak_MiB",
        "B/pair",
        "mism"
    );
    for r in runs {
        let s = &r.stats;
        let bpp = r
            .memory
            .filter(|m| m.pairs > 0 && m.bytes > 0)
            .map_or("-".to_string(), |m| format!("{:.1}", m.bytes as f64 / m.pairs as f64));
        println!(
            "{:>9} {:>9} {:>6.2} {:>5} {:>8.3} {:>9.1} {:>7} {:>7} {:>7} {:>8} {:>8.1} {:>8} {:>6}",
            rate(s.offered_ops_per_s),
            rate(s.achieved_ops_per_s),
            s.achieved_ops_per_s / s.offered_ops_per_s,
            if sustainable(r) { "yes" } else { "no" },
            s.window_s,
            s.lag_stall_ms,
            us(s.service_ns.p50),
            us(s.service_ns.p99),
            us(s.service_ns.p999),
            us(s.end_to_end_ns.p99),
            mib(r.rss_peak_bytes),
            bpp,
            r.mismatches
        );
    }
}

fn percentiles_json(p: &Percentiles) -> Value {
    json!({"p50": p.p50, "p90": p.p90, "p99": p.p99, "p999": p.p999, "max": p.max})
}

/// One run as JSON.
pub fn run_json(r: &RunRecord) -> Value {
    let s = &r.stats;
    json!({
        "offered_block_ops_per_s": s.offered_ops_per_s,
        "achieved_block_ops_per_s": s.achieved_ops_per_s,
        "window_s": s.window_s,
        "elapsed_s": s.elapsed_s,
        "kept_up": s.kept_up,
        "sustainable": sustainable(r),
        "issue_behind_max_ms": s.issue_behind_max_ms,
        "lag_stall_ms": s.lag_stall_ms,
        "lag_stalled_queries": s.lag_stalled_queries,
        "queries": s.queries,
        "query_service_ns": percentiles_json(&s.service_ns),
        "long_query_service_ns": percentiles_json(&s.long_service_ns),
        "query_end_to_end_ns": percentiles_json(&s.end_to_end_ns),
        "rss_before_bytes": r.rss_before_bytes,
        "rss_peak_bytes": r.rss_peak_bytes,
        "rss_after_bytes": r.rss_after_bytes,
        "index_pairs": r.memory.map(|m| m.pairs),
        "index_bytes": r.memory.map(|m| m.bytes),
        "verify_samples": r.verify_samples,
        "verify_samples_with_hits": r.verify_samples_with_hits,
        "mismatches": r.mismatches,
        "event_problems": r.event_problems,
        "quiet_query_service_ns": percentiles_json(&r.quiet_service_ns),
        "heap_bytes": r.heap_bytes,
    })
}

/// Workload statistics as JSON.
pub fn workload_json(s: &WorkloadStats) -> Value {
    json!({
        "requests": s.requests,
        "query_blocks": s.query_blocks,
        "stored_blocks": s.stored_blocks,
        "removed_blocks": s.removed_blocks,
        "stored_events": s.stored_events,
        "removed_events": s.removed_events,
        "block_ops": s.block_ops(),
        "engine_hit_blocks": s.engine_hit_blocks,
        "output_blocks": s.output_blocks,
        "shortfall_blocks": s.shortfall_blocks,
        "live_pairs_end": s.live_pairs_end,
        "live_pairs_max": s.live_pairs_max,
        "span_us": s.span_us,
    })
}

/// An achieved-vs-offered plot of several series (label, [(offered, achieved)]).
pub fn svg(title: &str, series: &[(String, Vec<(f64, f64)>)]) -> String {
    const W: f64 = 720.0;
    const H: f64 = 480.0;
    const M: f64 = 64.0;
    const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    let all: Vec<f64> =
        series.iter().flat_map(|(_, pts)| pts.iter().flat_map(|&(o, a)| [o, a])).filter(|v| *v > 0.0).collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min).max(1.0);
    let hi = all.iter().copied().fold(1.0, f64::max);
    let (l0, l1) = (lo.log10().floor(), hi.log10().ceil().max(lo.log10().floor() + 1.0));
    let floor = 10f64.powf(l0);
    let x = |v: f64| M + (v.max(floor).log10() - l0) / (l1 - l0) * (W - 2.0 * M);
    let y = |v: f64| H - M - (v.max(floor).log10() - l0) / (l1 - l0) * (H - 2.0 * M);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#, W / 2.0, escape(title));
    // Decade grid and labels on both axes.
    let mut d = l0;
    while d <= l1 + 1e-9 {
        let v = 10f64.powf(d);
        let (px, py) = (x(v), y(v));
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{}" x2="{px:.1}" y2="{}" stroke="#ddd"/><line x1="{M}" y1="{py:.1}" x2="{}" y2="{py:.1}" stroke="#ddd"/>"##,
            M,
            H - M,
            W - M
        );
        let _ = writeln!(
            s,
            r#"<text x="{px:.1}" y="{}" text-anchor="middle">{}</text><text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
            H - M + 16.0,
            rate(v),
            M - 6.0,
            py + 4.0,
            rate(v)
        );
        d += 1.0;
    }
    let _ = writeln!(
        s,
        r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#999" stroke-dasharray="4 4"/>"##,
        x(lo),
        y(lo),
        x(hi),
        y(hi)
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">offered block ops/s</text><text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">achieved block ops/s</text>"#,
        W / 2.0,
        H - 20.0,
        H / 2.0,
        H / 2.0
    );
    for (i, (label, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = pts.iter().map(|&(o, a)| format!("{:.1},{:.1}", x(o), y(a))).collect();
        let _ = writeln!(s, r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#, path.join(" "));
        for &(o, a) in pts {
            let _ = writeln!(s, r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{color}"/>"#, x(o), y(a));
        }
        let ly = M + 8.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{}" y="{}" width="12" height="12" fill="{color}"/><text x="{}" y="{}">{}</text>"#,
            M + 10.0,
            ly - 10.0,
            M + 28.0,
            ly,
            escape(label)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

//! Request counts, error classes and durations per endpoint (Dynamo's
//! `dynamo_kvindexer_requests_total` and friends), labelled by the endpoint
//! table's labels.

use super::endpoints::{label, Route, TABLE};
use crate::metrics::Prom;
use std::sync::atomic::{AtomicU64, Ordering};

/// Histogram bucket bounds, in seconds.
const BUCKETS_S: [f64; 12] = [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 1.0, 10.0];
const METHODS: [&str; 3] = ["GET", "POST", "OTHER"];
const CLASSES: [&str; 2] = ["4xx", "5xx"];

#[derive(Default)]
struct EndpointStats {
    /// By `METHODS`.
    requests: [AtomicU64; 3],
    /// By `CLASSES`.
    errors: [AtomicU64; 2],
    buckets: [AtomicU64; BUCKETS_S.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

/// Statuses a request is refused with before its endpoint is known.
const HEAD_REFUSALS: [u16; 4] = [400, 408, 413, 431];

/// Request counts, errors and durations per endpoint.
#[derive(Default)]
pub struct HttpMetrics {
    /// Per route in table order, then one for every unknown path.
    stats: [EndpointStats; TABLE.len() + 1],
    /// Connections refused at `--http-connections-max`.
    connections_refused: AtomicU64,
    /// Requests refused before their endpoint was known, by `HEAD_REFUSALS`.
    heads_refused: [AtomicU64; HEAD_REFUSALS.len()],
}

impl HttpMetrics {
    /// Records one answered request.
    pub fn record(&self, route: Option<Route>, method: &str, status: u16, elapsed: std::time::Duration) {
        let s = &self.stats[route.map_or(TABLE.len(), |r| r as usize)];
        let m = METHODS[..2].iter().position(|&m| m == method).unwrap_or(2);
        s.requests[m].fetch_add(1, Ordering::Relaxed);
        if let Some(errors) = s.errors.get(usize::from(status / 100).wrapping_sub(4)) {
            errors.fetch_add(1, Ordering::Relaxed);
        }
        let secs = elapsed.as_secs_f64();
        if let Some(i) = BUCKETS_S.iter().position(|&b| secs <= b) {
            s.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        s.count.fetch_add(1, Ordering::Relaxed);
        s.sum_ns.fetch_add(elapsed.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// Counts a connection refused at the cap; returns how many have been.
    pub fn record_connection_refused(&self) -> u64 {
        self.connections_refused.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Counts a request refused (with `status`) before its endpoint was known.
    pub fn record_head_refused(&self, status: u16) {
        if let Some(i) = HEAD_REFUSALS.iter().position(|&s| s == status) {
            self.heads_refused[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Each route's stats with its label, unknown paths last.
    fn labelled(&self) -> impl Iterator<Item = (&EndpointStats, &'static str)> {
        let routes = TABLE.iter().map(|s| Some(s.route)).chain([None]);
        self.stats.iter().zip(routes.map(label))
    }

    /// Writes the HTTP families.
    pub fn render(&self, out: &mut Prom) {
        let name = "kv_indexer_http_connections_refused_total";
        out.family(name, "counter", "Connections refused (503) because --http-connections-max were open.");
        out.sample(name, &[], self.connections_refused.load(Ordering::Relaxed) as f64);
        let name = "kv_indexer_http_heads_refused_total";
        out.family(
            name,
            "counter",
            "Requests refused at their head: 400 malformed, 408 late, 413 a body over the limit, 431 headers too large.",
        );
        for (status, n) in HEAD_REFUSALS.iter().zip(&self.heads_refused) {
            out.sample(name, &[("status", &status.to_string())], n.load(Ordering::Relaxed) as f64);
        }
        out.family("dynamo_kvindexer_requests_total", "counter", "HTTP requests by endpoint and method.");
        for (s, e) in self.labelled() {
            for (i, m) in METHODS.iter().enumerate() {
                let n = s.requests[i].load(Ordering::Relaxed);
                if n > 0 {
                    out.sample("dynamo_kvindexer_requests_total", &[("endpoint", e), ("method", m)], n as f64);
                }
            }
        }
        out.family("dynamo_kvindexer_errors_total", "counter", "HTTP error responses by endpoint and status class.");
        for (s, e) in self.labelled() {
            for (class, n) in CLASSES.iter().zip(&s.errors) {
                let n = n.load(Ordering::Relaxed);
                if n > 0 {
                    out.sample("dynamo_kvindexer_errors_total", &[("endpoint", e), ("status_class", class)], n as f64);
                }
            }
        }
        let name = "dynamo_kvindexer_request_duration_seconds";
        out.family(name, "histogram", "HTTP request duration.");
        for (s, e) in self.labelled() {
            let count = s.count.load(Ordering::Relaxed);
            if count == 0 {
                continue;
            }
            let mut cumulative = 0;
            for (i, b) in BUCKETS_S.iter().enumerate() {
                cumulative += s.buckets[i].load(Ordering::Relaxed);
                let le = format!("{b}");
                out.sample(&format!("{name}_bucket"), &[("endpoint", e), ("le", &le)], cumulative as f64);
            }
            out.sample(&format!("{name}_bucket"), &[("endpoint", e), ("le", "+Inf")], count as f64);
            out.sample(&format!("{name}_sum"), &[("endpoint", e)], s.sum_ns.load(Ordering::Relaxed) as f64 / 1e9);
            out.sample(&format!("{name}_count"), &[("endpoint", e)], count as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_errors_and_histograms() {
        let m = HttpMetrics::default();
        m.record(Some(Route::Query), "POST", 200, std::time::Duration::from_micros(30));
        m.record(Some(Route::Query), "POST", 404, std::time::Duration::from_millis(3));
        let mut p = Prom::default();
        m.render(&mut p);
        let t = p.text;
        assert!(t.contains("dynamo_kvindexer_requests_total{endpoint=\"/query\",method=\"POST\"} 2"), "{t}");
        assert!(t.contains("dynamo_kvindexer_errors_total{endpoint=\"/query\",status_class=\"4xx\"} 1"));
        assert!(t.contains("dynamo_kvindexer_request_duration_seconds_bucket{endpoint=\"/query\",le=\"0.00005\"} 1"));
        assert!(t.contains("dynamo_kvindexer_request_duration_seconds_bucket{endpoint=\"/query\",le=\"+Inf\"} 2"));
    }
}

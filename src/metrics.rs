//! Prometheus text exposition: the HTTP request metrics this module keeps,
//! and a small writer the daemon uses to add the registry's, the ingest
//! pipeline's and the indexes' figures at scrape time. Names keep Dynamo's
//! `dynamo_kvindexer_*` families; the rest are `kv_indexer_*`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// The API's endpoints, as metric labels.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Health,
    Metrics,
    Register,
    Unregister,
    Workers,
    Query,
    QueryByHash,
    Dump,
    RegisterPeer,
    DeregisterPeer,
    Peers,
    ReopenLogs,
    Unknown,
}

impl Endpoint {
    pub const ALL: [Endpoint; 13] = [
        Endpoint::Health,
        Endpoint::Metrics,
        Endpoint::Register,
        Endpoint::Unregister,
        Endpoint::Workers,
        Endpoint::Query,
        Endpoint::QueryByHash,
        Endpoint::Dump,
        Endpoint::RegisterPeer,
        Endpoint::DeregisterPeer,
        Endpoint::Peers,
        Endpoint::ReopenLogs,
        Endpoint::Unknown,
    ];

    /// The endpoint of a request path (query string excluded).
    pub fn of_path(path: &str) -> Endpoint {
        match path {
            "/health" => Endpoint::Health,
            "/metrics" => Endpoint::Metrics,
            "/register" => Endpoint::Register,
            "/unregister" => Endpoint::Unregister,
            "/workers" => Endpoint::Workers,
            "/query" => Endpoint::Query,
            "/query_by_hash" => Endpoint::QueryByHash,
            "/dump" => Endpoint::Dump,
            "/register_peer" => Endpoint::RegisterPeer,
            "/deregister_peer" => Endpoint::DeregisterPeer,
            "/peers" => Endpoint::Peers,
            "/reopen_logs" => Endpoint::ReopenLogs,
            _ => Endpoint::Unknown,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Health => "/health",
            Endpoint::Metrics => "/metrics",
            Endpoint::Register => "/register",
            Endpoint::Unregister => "/unregister",
            Endpoint::Workers => "/workers",
            Endpoint::Query => "/query",
            Endpoint::QueryByHash => "/query_by_hash",
            Endpoint::Dump => "/dump",
            Endpoint::RegisterPeer => "/register_peer",
            Endpoint::DeregisterPeer => "/deregister_peer",
            Endpoint::Peers => "/peers",
            Endpoint::ReopenLogs => "/reopen_logs",
            Endpoint::Unknown => "other",
        }
    }
}

/// Histogram bucket bounds, in seconds.
const BUCKETS_S: [f64; 12] = [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 1.0, 10.0];
const METHODS: [&str; 3] = ["GET", "POST", "OTHER"];

#[derive(Default)]
struct EndpointStats {
    requests: [AtomicU64; 3],
    errors_4xx: AtomicU64,
    errors_5xx: AtomicU64,
    buckets: [AtomicU64; BUCKETS_S.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

/// Request counts, errors and durations per endpoint.
#[derive(Default)]
pub struct HttpMetrics {
    stats: [EndpointStats; Endpoint::ALL.len()],
}

impl HttpMetrics {
    /// Records one answered request.
    pub fn record(&self, endpoint: Endpoint, method: &str, status: u16, elapsed: std::time::Duration) {
        let s = &self.stats[endpoint as usize];
        let m = match method {
            "GET" => 0,
            "POST" => 1,
            _ => 2,
        };
        s.requests[m].fetch_add(1, Ordering::Relaxed);
        match status {
            400..=499 => s.errors_4xx.fetch_add(1, Ordering::Relaxed),
            500..=599 => s.errors_5xx.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        let secs = elapsed.as_secs_f64();
        if let Some(i) = BUCKETS_S.iter().position(|&b| secs <= b) {
            s.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        s.count.fetch_add(1, Ordering::Relaxed);
        s.sum_ns.fetch_add(elapsed.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// Writes the HTTP families.
    pub fn render(&self, out: &mut Prom) {
        out.family("dynamo_kvindexer_requests_total", "counter", "HTTP requests by endpoint and method.");
        for e in Endpoint::ALL {
            let s = &self.stats[e as usize];
            for (i, m) in METHODS.iter().enumerate() {
                let n = s.requests[i].load(Ordering::Relaxed);
                if n > 0 {
                    out.sample("dynamo_kvindexer_requests_total", &[("endpoint", e.label()), ("method", m)], n as f64);
                }
            }
        }
        out.family("dynamo_kvindexer_errors_total", "counter", "HTTP error responses by endpoint and status class.");
        for e in Endpoint::ALL {
            let s = &self.stats[e as usize];
            for (class, n) in [("4xx", &s.errors_4xx), ("5xx", &s.errors_5xx)] {
                let n = n.load(Ordering::Relaxed);
                if n > 0 {
                    out.sample(
                        "dynamo_kvindexer_errors_total",
                        &[("endpoint", e.label()), ("status_class", class)],
                        n as f64,
                    );
                }
            }
        }
        let name = "dynamo_kvindexer_request_duration_seconds";
        out.family(name, "histogram", "HTTP request duration.");
        for e in Endpoint::ALL {
            let s = &self.stats[e as usize];
            let count = s.count.load(Ordering::Relaxed);
            if count == 0 {
                continue;
            }
            let mut cumulative = 0;
            for (i, b) in BUCKETS_S.iter().enumerate() {
                cumulative += s.buckets[i].load(Ordering::Relaxed);
                let le = format!("{b}");
                out.sample(&format!("{name}_bucket"), &[("endpoint", e.label()), ("le", &le)], cumulative as f64);
            }
            out.sample(&format!("{name}_bucket"), &[("endpoint", e.label()), ("le", "+Inf")], count as f64);
            out.sample(
                &format!("{name}_sum"),
                &[("endpoint", e.label())],
                s.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
            );
            out.sample(&format!("{name}_count"), &[("endpoint", e.label())], count as f64);
        }
    }
}

/// A Prometheus text writer.
#[derive(Default)]
pub struct Prom {
    pub text: String,
}

impl Prom {
    /// Starts a metric family.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One sample. Label values are escaped.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"");
                for c in v.chars() {
                    match c {
                        '\\' => self.text.push_str("\\\\"),
                        '"' => self.text.push_str("\\\""),
                        '\n' => self.text.push_str("\\n"),
                        c => self.text.push(c),
                    }
                }
                self.text.push('"');
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }

    /// A family with a single unlabelled sample.
    pub fn single(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_errors_and_histograms() {
        let m = HttpMetrics::default();
        m.record(Endpoint::Query, "POST", 200, std::time::Duration::from_micros(30));
        m.record(Endpoint::Query, "POST", 404, std::time::Duration::from_millis(3));
        let mut p = Prom::default();
        m.render(&mut p);
        let t = p.text;
        assert!(t.contains("dynamo_kvindexer_requests_total{endpoint=\"/query\",method=\"POST\"} 2"), "{t}");
        assert!(t.contains("dynamo_kvindexer_errors_total{endpoint=\"/query\",status_class=\"4xx\"} 1"));
        assert!(t.contains("dynamo_kvindexer_request_duration_seconds_bucket{endpoint=\"/query\",le=\"0.00005\"} 1"));
        assert!(t.contains("dynamo_kvindexer_request_duration_seconds_bucket{endpoint=\"/query\",le=\"+Inf\"} 2"));
    }

    #[test]
    fn label_values_are_escaped() {
        let mut p = Prom::default();
        p.sample("x", &[("model", "a\"b\\c")], 1.0);
        assert_eq!(p.text, "x{model=\"a\\\"b\\\\c\"} 1\n");
    }
}

//! `/metrics` passes `promtool check metrics`: checked by an in-suite lint
//! that applies promtool's rules (always), and by promtool itself when
//! `scripts/install-test-tools.sh` could unpack it. The scrape covers every
//! family with samples: requests, errors of both classes, a registered
//! index with a label value that needs escaping (in the per-listener
//! families too), ingest and process figures.

mod support;

use serde_json::json;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use support::daemon::Daemon;
use support::prom_lint::lint;
use support::wait_until;

fn scrape() -> String {
    let d = Daemon::start(&[]);
    let reg = json!({"instance_id": 1, "endpoint": "tcp://127.0.0.1:1", "model_name": "m\"odel\\x", "block_size": 4});
    assert_eq!(d.post_json("/register", reg).0, 201);
    assert_eq!(d.post("/query", r#"{"token_ids":[1,2,3,4],"model_name":"none"}"#).0, 404);
    assert_eq!(d.get("/query").0, 405);
    assert_eq!(d.get("/health").0, 200);
    // A request is counted just after its reply is written: wait until the
    // four above are, so the request families have their samples.
    let counted =
        ["/register\",method=\"POST", "/query\",method=\"POST", "/query\",method=\"GET", "/health\",method=\"GET"]
            .map(|e| format!("dynamo_kvindexer_requests_total{{endpoint=\"{e}\"}} 1"));
    let mut text = String::new();
    let all = wait_until(|| {
        let (status, t) = d.get("/metrics");
        text = t;
        status == 200 && counted.iter().all(|c| text.contains(c.as_str()))
    });
    assert!(all, "the requests were never all counted:\n{text}");
    text
}

#[test]
fn metrics_pass_the_lint_and_carry_build_and_process_figures() {
    let text = scrape();
    let problems = lint(&text);
    assert!(problems.is_empty(), "{}\n\n{text}", problems.join("\n"));
    for family in [
        "kv_indexer_build_info{version=",
        "process_resident_memory_bytes ",
        "process_cpu_seconds_total ",
        "process_open_fds ",
        "process_start_time_seconds ",
        "kv_indexer_events_applied_total{type=\"stored\"}",
        "kv_indexer_events_ingested_total ",
        "dynamo_kvindexer_request_duration_seconds_bucket{",
        "kv_indexer_index_pairs{model=\"m\\\"odel\\\\x\",tenant=\"default\"} 0",
        "kv_indexer_listener_connected{model=\"m\\\"odel\\\\x\",tenant=\"default\",instance_id=\"1\",dp_rank=\"0\"} 0",
        "kv_indexer_listener_last_batch_age_seconds{model=",
        "kv_indexer_event_lag_seconds_bucket{le=\"+Inf\"} 0",
        "kv_indexer_workers_file_reloads_total{outcome=\"refused\"} 0",
    ] {
        assert!(text.contains(family), "{family} missing:\n{text}");
    }
}

#[test]
fn promtool_accepts_the_metrics() {
    let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-tools/promtool");
    let promtool = if local.exists() { local.into_os_string() } else { "promtool".into() };
    let child = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        println!("skipped: promtool not found (scripts/install-test-tools.sh unpacks it); the in-suite lint ran");
        return;
    };
    child.stdin.take().unwrap().write_all(scrape().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "promtool: {said}");
}

#[test]
fn the_lint_catches_what_promtool_refuses() {
    let ok = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 1\n";
    assert_eq!(lint(ok), Vec::<String>::new());
    let hist = "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n";
    assert_eq!(lint(hist), Vec::<String>::new());
    for (bad, why) in [
        (format!("{ok}# HELP a_total Again.\n"), "second HELP"),
        (format!("{ok}# TYPE a_total counter\n"), "second TYPE"),
        (format!("{ok}a_total{{x=\"1\"}} 2\n"), "duplicate series"),
        ("# HELP a A.\n# TYPE a counter\na 1\n".into(), "should end in _total"),
        ("# HELP g_total G.\n# TYPE g_total gauge\ng_total 1\n".into(), "should not end in _total"),
        ("# HELP 1a A.\n# TYPE 1a gauge\n1a 1\n".into(), "invalid metric name"),
        ("# HELP a A.\n# TYPE a gauge\na{1x=\"1\"} 1\n".into(), "invalid label name"),
        ("# HELP a A.\n# TYPE a gauge\na{x=1} 1\n".into(), "not quoted"),
        ("# HELP a A.\n# TYPE a gauge\na{x=\"\\q\"} 1\n".into(), "bad escape"),
        ("# HELP a A.\n# TYPE a gauge\na{x=\"1\",x=\"2\"} 1\n".into(), "label repeats"),
        ("# HELP a A.\n# TYPE a gauge\na one\n".into(), "bad value"),
        ("a 1\n".into(), "no TYPE"),
        (
            "# HELP a A.\n# TYPE a gauge\na{x=\"1\"} 1\n# HELP b B.\n# TYPE b gauge\nb 1\na{x=\"2\"} 1\n".into(),
            "not together",
        ),
        ("# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n".into(), "no +Inf"),
        (
            "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"
                .into(),
            "cumulative",
        ),
        ("# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n".into(), "no _sum"),
    ] {
        let problems = lint(&bad);
        assert!(problems.iter().any(|p| p.contains(why)), "{why:?} not found for {bad:?}: {problems:?}");
    }
}

#[test]
fn the_dashboard_only_names_metrics_the_daemon_exports() {
    let text = scrape();
    let families: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).collect();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/grafana/kv-indexer.json");
    let dash: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(exprs.len() > 20, "{exprs:?}");
    let mut named = 0;
    for expr in &exprs {
        let words = expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'));
        for w in words.filter(|w| ["kv_indexer_", "dynamo_kvindexer_", "process_"].iter().any(|p| w.starts_with(p))) {
            let base = w.strip_suffix("_bucket").unwrap_or(w);
            assert!(families.contains(&base), "the dashboard names {w}, which /metrics lacks: {expr}");
            named += 1;
        }
    }
    assert!(named >= exprs.len(), "every expression names a metric");
}

//! The real binary started as a unit file written for Dynamo 1.6.1's
//! standalone indexer starts it: its flags, its access log and the log's
//! reopen, its `/dump` field, its metric names, its index lifecycle and its
//! answer shape.

mod support;

use kv_indexer::StorageTier;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use support::daemon::Daemon;
use support::publisher::{PublisherConfig, TestEvent, TestPublisher};
use support::wait_until;

/// A fresh directory for one test's files.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kv-indexer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The access log's lines, parsed.
fn lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}"))).collect()
}

/// A POST with a trace header.
fn post_traced(d: &Daemon, path: &str, body: Value, header: &str, trace: &str) -> u16 {
    let agent = ureq::AgentBuilder::new().build();
    match agent.post(&format!("{}{path}", d.base)).set(header, trace).send_string(&body.to_string()) {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(code, _)) => code,
        Err(e) => panic!("{path}: {e}"),
    }
}

fn metric(text: &str, sample: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(sample).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.parse().ok()))
}

fn publisher(seed: u64) -> TestPublisher {
    TestPublisher::new(PublisherConfig { block_size: 4, seed, ..PublisherConfig::default() })
}

/// Publishes a device chain of `blocks` and returns its leaf hash.
fn publish_chain(p: &mut TestPublisher, blocks: usize) -> u64 {
    let TestEvent::Stored { hashes, .. } = p.new_store(StorageTier::Device, None, blocks) else { unreachable!() };
    let leaf = *hashes.last().unwrap();
    p.publish(vec![TestEvent::Stored { tier: StorageTier::Device, parent: None, hashes }]);
    leaf
}

#[test]
fn access_log_lines_follow_dynamo_and_survive_rotation() {
    let dir = temp_dir("access-log");
    let log = dir.join("access.log");
    let mut p = publisher(3);
    let workers = format!("1={}", p.endpoint);
    let mut d = Daemon::start(&[
        "--block-size",
        "4",
        "--model-name",
        "llama",
        "--routing-group",
        "acme",
        "--workers",
        &workers,
        "--access-log",
        log.to_str().unwrap(),
        "--trace-id-header",
        "X-Request-Id",
    ]);
    assert!(p.wait_subscribed(1));
    let leaf = publish_chain(&mut p, 2);
    let tokens = p.chain_tokens(leaf);
    let query = json!({"token_ids": tokens, "model_name": "llama", "routing_group": "acme"});
    // --routing-group named the --workers index's tenant.
    assert!(wait_until(|| d.post_json("/query", query.clone()).1["scores"]["1"]["0"] == 8));
    assert_eq!(post_traced(&d, "/query", query.clone(), "x-request-id", "trace-7"), 200);
    assert_eq!(post_traced(&d, "/query", json!({"token_ids": [1], "model_name": "nope"}), "x-request-id", "t8"), 404);
    assert_eq!(d.post("/query", "{not json").0, 400);
    assert_eq!(d.get("/nowhere").0, 404);
    // Lines of the polling queries above aside (200s without a trace id).
    let polled = |l: &Value| l["trace_id"] == "-" && l["path"] == "/query" && l["status"] == 200;
    let ours = || lines(&log).into_iter().filter(|l| !polled(l)).collect::<Vec<_>>();
    assert!(wait_until(|| ours().len() == 4), "{:?}", lines(&log));
    for l in lines(&log) {
        let ts = l["ts"].as_str().unwrap();
        assert!(ts.len() == 24 && ts.ends_with('Z') && &ts[10..11] == "T", "UTC RFC 3339 with millis: {ts}");
        assert!(l["duration_ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{l}");
        assert_eq!(l.as_object().unwrap().len(), 7, "Dynamo's seven fields: {l}");
    }
    // Each request came on its own connection, and a line is queued once
    // its reply is written: lines of different connections may swap.
    let short = |l: &Value| json!([l["trace_id"], l["method"], l["path"], l["model"], l["status"]]).to_string();
    let mut got: Vec<String> = ours().iter().map(short).collect();
    got.sort();
    let mut want: Vec<String> = [
        json!(["trace-7", "POST", "/query", "llama", 200]),
        json!(["t8", "POST", "/query", "nope", 404]),
        json!(["-", "POST", "/query", "-", 400]),
        json!(["-", "GET", "unknown", "-", 404]),
    ]
    .iter()
    .map(Value::to_string)
    .collect();
    want.sort();
    assert_eq!(got, want);
    let paths = |path: &Path| {
        let mut p: Vec<String> = lines(path).iter().map(|l| l["path"].as_str().unwrap().to_string()).collect();
        p.sort();
        p
    };

    // logrotate: move the file, reopen by POST, then by SIGHUP.
    let rotated = dir.join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    let (status, v) = d.post_json("/reopen_logs", json!({}));
    assert_eq!((status, v), (200, json!({"status": "ok"})));
    assert_eq!(d.get("/health").0, 200);
    assert!(wait_until(|| paths(&log) == ["/health", "/reopen_logs"]), "{:?}", paths(&log));
    let in_rotated = lines(&rotated).len();
    assert!(paths(&rotated).contains(&"unknown".to_string()), "earlier lines stay in the old file");
    assert!(!paths(&rotated).contains(&"/health".to_string()));
    let rotated2 = dir.join("access.log.2");
    std::fs::rename(&log, &rotated2).unwrap();
    // SAFETY: kill(2) on the daemon this test started.
    unsafe { libc::kill(d.pid() as i32, libc::SIGHUP) };
    assert!(d.wait_logged("access log reopened on SIGHUP"));
    assert_eq!(d.get("/peers").0, 200);
    assert!(wait_until(|| paths(&log) == ["/peers"]), "{:?}", paths(&log));
    assert_eq!(lines(&rotated).len(), in_rotated, "nothing more in the first rotated file");
    assert_eq!(paths(&rotated2), ["/health", "/reopen_logs"]);

    let metrics = d.get("/metrics").1;
    assert_eq!(metric(&metrics, "kv_indexer_access_log_dropped_total"), Some(0.0));
    assert_eq!(d.terminate(), Some(0));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn local_time_and_reopen_without_an_access_log() {
    let d = Daemon::start(&[]);
    let (status, v) = d.post_json("/reopen_logs", json!({}));
    assert_eq!((status, v), (200, json!({"status": "ok"})), "ok with no access log, as Dynamo");
    assert_eq!(d.get("/reopen_logs").0, 405);

    let dir = temp_dir("access-log-local");
    let log = dir.join("a.log");
    let d = Daemon::start(&["--access-log", log.to_str().unwrap(), "--access-log-local-time"]);
    assert_eq!(d.get("/health").0, 200);
    assert!(wait_until(|| lines(&log).len() == 1));
    let ts = lines(&log)[0]["ts"].as_str().unwrap().to_string();
    assert_eq!(ts.len(), "2025-01-02T03:04:05.678+01:00".len(), "{ts}");
    assert!(matches!(&ts[23..24], "+" | "-"), "an offset, not Z: {ts}");
    drop(d);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_dynamo_flags_are_one_line_and_exit_2() {
    for args in [
        &["--trace-id-header", "not a header"][..],
        &["--access-log", "/nonexistent-dir/x/access.log"],
        &["--routing-group", ""],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kv-indexer"))
            .args(["--port", "0", "--host", "127.0.0.1"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{args:?}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(args[0]) || err.contains("access log"), "{args:?}: {err}");
    }
}

#[test]
fn answers_list_only_what_matched_unless_asked() {
    let d = Daemon::start(&[]);
    let mut p1 = publisher(11);
    let (p2, p3) = (publisher(12), publisher(13));
    for (id, rank, p) in [(1u64, 0u32, &p1), (2, 0, &p2), (2, 1, &p3)] {
        let body =
            json!({"instance_id": id, "dp_rank": rank, "endpoint": p.endpoint, "model_name": "m", "block_size": 4});
        assert_eq!(d.post_json("/register", body).0, 201);
    }
    assert!(p1.wait_subscribed(1));
    let leaf = publish_chain(&mut p1, 3);
    let locals = p1.chain_locals(leaf);
    let q = json!({"block_hashes": locals, "model_name": "m"});
    assert!(wait_until(|| d.post_json("/query_by_hash", q.clone()).1["scores"]["1"]["0"] == 12));
    let (_, v) = d.post_json("/query_by_hash", q.clone());
    assert_eq!(
        v,
        json!({"scores": {"1": {"0": 12}}, "frequencies": [],
               "instances": {"1": {"longest_matched": 12, "gpu": 12, "dp": {"0": 12}, "cpu": 12, "disk": 12}}}),
        "Dynamo's shape: only instance 1 matched"
    );
    let (_, v) = d.post_json("/query", json!({"token_ids": p1.chain_tokens(leaf), "model_name": "m"}));
    assert_eq!(v["instances"].as_object().unwrap().len(), 1, "{v}");
    let mut all = q.clone();
    all["include_unmatched"] = json!(true);
    let (_, v) = d.post_json("/query_by_hash", all);
    assert_eq!(
        v["instances"],
        json!({"1": {"longest_matched": 12, "gpu": 12, "dp": {"0": 12}, "cpu": 12, "disk": 12},
               "2": {"longest_matched": 0, "gpu": 0, "dp": {"0": 0, "1": 0}, "cpu": 0, "disk": 0}}),
        "every registered worker, on request"
    );
    assert_eq!(v["scores"], json!({"1": {"0": 12}}));
    let mut bad = q.clone();
    bad["include_unmatched"] = json!("yes");
    let (status, v) = d.post_json("/query_by_hash", bad);
    assert_eq!(status, 422, "{v}");
    assert!(v["error"].as_str().unwrap().contains("include_unmatched"), "{v}");
}

#[test]
fn the_last_unregister_drops_the_index() {
    let d = Daemon::start(&[]);
    let (p, p8) = (publisher(5), publisher(6));
    for (id, p) in [(9u64, &p), (8, &p8)] {
        let body = json!({"instance_id": id, "endpoint": p.endpoint, "model_name": "m", "tenant_id": "t",
                          "block_size": 4});
        assert_eq!(d.post_json("/register", body).0, 201);
    }
    let q = json!({"block_hashes": [1, 2], "model_name": "m", "tenant_id": "t"});
    assert_eq!(d.post_json("/query_by_hash", q.clone()).0, 200);
    assert_eq!(d.post_json("/unregister", json!({"instance_id": 9, "model_name": "m"})).0, 200);
    assert_eq!(d.post_json("/query_by_hash", q.clone()).0, 200, "instance 8 still holds the index");
    assert_eq!(metric(&d.get("/metrics").1, "dynamo_kvindexer_models"), Some(1.0));
    assert_eq!(d.post_json("/unregister", json!({"instance_id": 8, "model_name": "m", "tenant_id": "t"})).0, 200);
    let (status, v) = d.post_json("/query_by_hash", q.clone());
    assert_eq!((status, v), (404, json!({"error": "no indexer for model=m tenant=t"})));
    assert_eq!(metric(&d.get("/metrics").1, "dynamo_kvindexer_models"), Some(0.0));
    // A new registration creates it afresh, with any block size.
    let body = json!({"instance_id": 9, "endpoint": p.endpoint, "model_name": "m", "tenant_id": "t", "block_size": 8});
    assert_eq!(d.post_json("/register", body).0, 201);
    assert_eq!(d.post_json("/query_by_hash", q).0, 200);
    assert_eq!(d.get_json("/workers").1[0]["block_size"], 8);
}

#[test]
fn dumps_carry_the_residency_domain_and_metrics_use_dynamo_names() {
    let mut p = publisher(8);
    let workers = format!("1={}", p.endpoint);
    let d = Daemon::start(&["--block-size", "4", "--workers", &workers]);
    assert!(p.wait_subscribed(1));
    let leaf = publish_chain(&mut p, 3);
    // A child of an unknown parent, a remove of an unknown block, a duplicate store.
    let orphan = p.new_store(StorageTier::Device, Some(0xdead), 1);
    p.publish(vec![orphan]);
    p.publish(vec![TestEvent::Removed { tier: StorageTier::Device, hashes: vec![0xbeef] }]);
    let hashes = p.chain_hashes(leaf);
    p.publish(vec![TestEvent::Stored { tier: StorageTier::Device, parent: None, hashes: hashes[..1].to_vec() }]);
    let applied = |status: &str, t: &str| {
        metric(
            &d.get("/metrics").1,
            &format!("dynamo_kvrouter_kv_cache_events_applied{{event_type=\"{t}\",status=\"{status}\"}}"),
        )
    };
    assert!(wait_until(|| applied("ok", "stored") == Some(2.0)), "{}", d.get("/metrics").1);
    let m = d.get("/metrics").1;
    assert_eq!(applied("parent_block_not_found", "stored"), Some(1.0), "{m}");
    assert_eq!(applied("block_not_found", "removed"), Some(1.0), "{m}");
    assert_eq!(applied("ok", "cleared"), Some(0.0), "every label pair is exported");
    assert_eq!(metric(&m, "dynamo_kvrouter_kv_cache_event_warnings{warning_kind=\"duplicate_store\"}"), Some(1.0));
    assert_eq!(metric(&m, "dynamo_kvrouter_ckf_mutation_total{outcome=\"unknown_remove\"}"), Some(1.0));
    assert_eq!(metric(&m, "dynamo_kvrouter_ckf_mutation_total{outcome=\"capacity_exhausted\"}"), Some(0.0));
    assert_eq!(metric(&m, "kv_indexer_blocks_total{outcome=\"stored\"}"), Some(3.0), "ours stay beside them");

    let dump = d.get_json("/dump").1;
    let events = dump["default:default"]["events"].as_array().unwrap();
    assert!(!events.is_empty());
    assert!(events.iter().all(|e| e["residency_domain"] == "worker"), "{dump}");
}

/// Serves `body` as the answer to one `GET /dump`, then stops.
fn serve_dump_once(body: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let Ok((mut conn, _)) = listener.accept() else { return };
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let mut line = String::new();
        while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
            line.clear();
        }
        let _ = write!(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        let _ = conn.read(&mut [0u8; 1]);
    });
    url
}

#[test]
fn recovery_applies_the_worker_domain_and_skips_others_as_dynamo() {
    let stored = |worker: u64, domain: &str| {
        format!(
            r#"{{"worker_id": {worker}, {domain} "storage_tier": "device", "event": {{"event_id": 0, "data": {{"stored": {{"parent_hash": null, "blocks": [{{"block_hash": 70, "tokens_hash": 71}}]}}}}, "dp_rank": 0}}}}"#
        )
    };
    let events = [
        stored(1, r#""residency_domain": "worker","#),
        stored(2, ""),
        stored(3, r#""residency_domain": "cache_owner","#),
        stored(4, r#""residency_domain": null,"#),
        stored(5, r#""residency_domain": "future","#),
    ];
    let body = format!(r#"{{"m:t": {{"block_size": 4, "events": [{}]}}}}"#, events.join(","));
    let peer = serve_dump_once(body);
    let mut d = Daemon::start(&["--peers", &peer, "--slow-joiner-ms", "0"]);
    assert!(wait_until(|| d.get("/health").0 == 200));
    let (status, v) = d.post_json("/query_by_hash", json!({"block_hashes": [71], "model_name": "m", "tenant_id": "t"}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["scores"], json!({"1": {"0": 4}, "2": {"0": 4}}), "worker and missing domains only");
    let m = d.get("/metrics").1;
    let key = "dynamo_kvrouter_kv_cache_events_applied{event_type=\"stored\",status=\"unsupported_residency_domain\"}";
    assert_eq!(metric(&m, key), Some(3.0), "{m}");
    assert!(d.wait_logged("3 event(s) of a residency domain other than"));
}

//! The daemon as an operator drives it: the real binary, real ZMQ
//! publishers, HTTP requests. Every error path answers JSON and changes
//! nothing; registered engines' blocks are found by /query and
//! /query_by_hash; unregister removes them; the Unix socket serves the same API.

mod support;

use kv_indexer::StorageTier;
use serde_json::{json, Value};
use support::daemon::Daemon;
use support::publisher::{PublisherConfig, TestEvent, TestPublisher};
use support::wait_until;

fn publisher(seed: u64, batch_dp_rank: Option<u32>) -> TestPublisher {
    TestPublisher::new(PublisherConfig { block_size: 4, seed, batch_dp_rank, ..PublisherConfig::default() })
}

fn register(d: &Daemon, instance: u64, p: &TestPublisher, model: &str, tenant: &str) -> (u16, Value) {
    d.post_json(
        "/register",
        json!({"instance_id": instance, "endpoint": p.endpoint, "replay_endpoint": p.replay_endpoint,
               "model_name": model, "tenant_id": tenant, "block_size": 4}),
    )
}

/// The device depth (tokens) `/query_by_hash` reports for an instance and rank.
fn score(d: &Daemon, model: &str, tenant: &str, locals: &[u64], instance: u64, rank: u32) -> u64 {
    let (status, v) =
        d.post_json("/query_by_hash", json!({"block_hashes": locals, "model_name": model, "tenant_id": tenant}));
    assert_eq!(status, 200, "{v}");
    v["scores"][instance.to_string()][rank.to_string()].as_u64().unwrap_or(0)
}

/// Publishes a 3-block device chain and returns its leaf hash.
fn publish_chain(p: &mut TestPublisher, blocks: usize) -> u64 {
    let TestEvent::Stored { hashes, .. } = p.new_store(StorageTier::Device, None, blocks) else { unreachable!() };
    let leaf = *hashes.last().unwrap();
    p.publish(vec![TestEvent::Stored { tier: StorageTier::Device, parent: None, hashes }]);
    leaf
}

#[test]
fn register_query_unregister_with_a_real_engine() {
    let d = Daemon::start(&[]);
    let mut p = publisher(7, None);
    assert_eq!(register(&d, 1, &p, "llama", "default"), (201, json!({"status": "ok"})));
    assert!(p.wait_subscribed(1));
    assert!(wait_until(|| d.get_json("/workers").1[0]["status"] == "active"), "listener becomes active once connected");

    let leaf = publish_chain(&mut p, 3);
    let locals = p.chain_locals(leaf);
    assert!(wait_until(|| score(&d, "llama", "default", &locals, 1, 0) == 12));

    // /query with the tokens finds the same prefix; a partial tail block is ignored.
    let mut tokens = p.chain_tokens(leaf);
    tokens.extend([1, 2]);
    let (status, v) = d.post_json("/query", json!({"token_ids": tokens, "model_name": "llama"}));
    assert_eq!(status, 200);
    assert_eq!(v["scores"]["1"]["0"], 12);
    assert_eq!(v["instances"]["1"], json!({"longest_matched": 12, "gpu": 12, "dp": {"0": 12}, "cpu": 12, "disk": 12}));
    // Another LoRA hashes differently: no match.
    let (_, v) = d.post_json("/query", json!({"token_ids": tokens, "model_name": "llama", "lora_name": "a"}));
    assert!(v["scores"].get("1").is_none());

    let (status, _) = d.post_json("/unregister", json!({"instance_id": 1, "model_name": "llama"}));
    assert_eq!(status, 200);
    // The last worker gone, the index goes too, as in Dynamo.
    let (status, v) =
        d.post_json("/query_by_hash", json!({"block_hashes": locals, "model_name": "llama", "tenant_id": "default"}));
    assert_eq!((status, v), (404, json!({"error": "no indexer for model=llama tenant=default"})));
    assert_eq!(d.get_json("/workers").1, json!([]));
    assert_eq!(d.get_json("/dump").1, json!({}));
}

#[test]
fn every_error_is_json_and_changes_nothing() {
    let d = Daemon::start(&["--body-limit-bytes", "4096"]);
    let mut p = publisher(1, None);
    assert_eq!(register(&d, 1, &p, "m", "default").0, 201);
    assert!(p.wait_subscribed(1));
    assert!(wait_until(|| d.get_json("/workers").1[0]["status"] == "active"));
    // A listener's last batch age moves with the clock; nothing else may.
    let workers = |d: &Daemon| {
        let mut v = d.get_json("/workers").1;
        for w in v.as_array_mut().unwrap() {
            for l in w["listeners"].as_object_mut().unwrap().values_mut() {
                l.as_object_mut().unwrap().remove("last_batch_age_s");
            }
        }
        v
    };
    let before = (workers(&d), d.get("/dump").1);
    let ep = p.endpoint.clone();
    let cases: Vec<(&str, &str, String, u16)> = vec![
        ("POST", "/register", "{not json".into(), 400),
        (
            "POST",
            "/register",
            json!({"instance_id": 2, "endpoint": "udp://h:1", "model_name": "m", "block_size": 4}).to_string(),
            400,
        ),
        (
            "POST",
            "/register",
            json!({"instance_id": 2, "endpoint": "tcp://*:5557", "model_name": "m", "block_size": 4}).to_string(),
            400,
        ),
        (
            "POST",
            "/register",
            json!({"instance_id": 2, "endpoint": ep, "model_name": "m", "block_size": 0}).to_string(),
            400,
        ),
        ("POST", "/register", json!({"instance_id": 2, "model_name": "m", "block_size": 4}).to_string(), 422),
        (
            "POST",
            "/register",
            json!({"instance_id": "two", "endpoint": ep, "model_name": "m", "block_size": 4}).to_string(),
            422,
        ),
        (
            "POST",
            "/register",
            json!({"instance_id": -1, "endpoint": ep, "model_name": "m", "block_size": 4}).to_string(),
            422,
        ),
        (
            "POST",
            "/register",
            json!({"instance_id": 1, "endpoint": ep, "model_name": "m", "block_size": 4}).to_string(),
            409,
        ),
        (
            "POST",
            "/register",
            json!({"instance_id": 2, "endpoint": ep, "model_name": "m", "block_size": 8}).to_string(),
            409,
        ),
        (
            "POST",
            "/register",
            json!({"instance_id": 1, "dp_rank": 1, "endpoint": ep, "model_name": "other", "block_size": 4}).to_string(),
            409,
        ),
        ("POST", "/query", json!({"token_ids": [1, 2, 3, 4], "model_name": "nope"}).to_string(), 404),
        ("POST", "/query", json!({"token_ids": [1, -2], "model_name": "m"}).to_string(), 422),
        ("POST", "/query", json!({"model_name": "m"}).to_string(), 422),
        ("POST", "/query", "[]".into(), 422),
        ("POST", "/query", format!("{{\"token_ids\": [{}], \"model_name\": \"m\"}}", vec!["1"; 3000].join(",")), 413),
        ("POST", "/query_by_hash", json!({"block_hashes": [1, "x"], "model_name": "m"}).to_string(), 422),
        ("POST", "/unregister", json!({"instance_id": 9, "model_name": "m"}).to_string(), 404),
        ("POST", "/unregister", json!({"instance_id": 1, "model_name": "nope"}).to_string(), 404),
        ("POST", "/deregister_peer", json!({"url": "http://127.0.0.1:1"}).to_string(), 404),
        ("POST", "/register_peer", json!({"url": "ftp://x"}).to_string(), 400),
        ("GET", "/register", String::new(), 405),
        ("POST", "/dump", String::new(), 405),
        ("GET", "/nothing", String::new(), 404),
    ];
    for (method, path, body, want) in cases {
        let (status, text) =
            support::daemon::request(method, &format!("{}{path}", d.base), (method == "POST").then_some(body.as_str()));
        assert_eq!(status, want, "{method} {path} {body:.200}: {text}");
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("{path}: error body is not JSON: {text:?}"));
        assert!(v["error"].as_str().is_some_and(|m| !m.is_empty()), "{path}: {v}");
    }
    assert_eq!((workers(&d), d.get("/dump").1), before, "failed requests change nothing");
    assert_eq!(d.get("/health").0, 200, "the daemon is still up");
}

#[test]
fn tenants_never_see_each_others_scores() {
    let d = Daemon::start(&[]);
    let mut a = publisher(11, None);
    let mut b = publisher(11, None); // same seed: same tokens, same local hashes
    assert_eq!(register(&d, 1, &a, "m", "tenant-a").0, 201);
    // `routing_group` is accepted as the tenant's name.
    let (status, _) = d.post_json(
        "/register",
        json!({"instance_id": 2, "endpoint": b.endpoint, "model_name": "m", "routing_group": "tenant-b", "block_size": 4}),
    );
    assert_eq!(status, 201);
    assert!(a.wait_subscribed(1) && b.wait_subscribed(1));
    let leaf_a = publish_chain(&mut a, 2);
    let leaf_b = publish_chain(&mut b, 2);
    let locals = a.chain_locals(leaf_a);
    assert_eq!(locals, b.chain_locals(leaf_b));
    assert!(wait_until(
        || score(&d, "m", "tenant-a", &locals, 1, 0) == 8 && score(&d, "m", "tenant-b", &locals, 2, 0) == 8
    ));
    let (_, va) =
        d.post_json("/query_by_hash", json!({"block_hashes": locals, "model_name": "m", "tenant_id": "tenant-a"}));
    let (_, vb) =
        d.post_json("/query_by_hash", json!({"block_hashes": locals, "model_name": "m", "tenant_id": "tenant-b"}));
    assert!(va["instances"].get("2").is_none() && vb["instances"].get("1").is_none(), "{va} {vb}");
    let (_, w) = d.get_json("/workers?model_name=m&tenant_id=tenant-b");
    assert_eq!(w.as_array().unwrap().len(), 1);
    assert_eq!(w[0]["instance_id"], 2);
    // Unregistering from one tenant leaves the other alone.
    assert_eq!(
        d.post_json("/unregister", json!({"instance_id": 1, "model_name": "m", "tenant_id": "tenant-a"})).0,
        200
    );
    assert_eq!(score(&d, "m", "tenant-b", &locals, 2, 0), 8);
}

#[test]
fn unregister_by_rank_removes_blocks_stored_under_an_unregistered_rank() {
    let d = Daemon::start(&[]);
    // The engine's batches say rank 3, though it was registered as rank 0.
    let mut p = publisher(5, Some(3));
    assert_eq!(register(&d, 7, &p, "m", "default").0, 201);
    assert!(p.wait_subscribed(1));
    let leaf = publish_chain(&mut p, 2);
    let locals = p.chain_locals(leaf);
    assert!(wait_until(|| score(&d, "m", "default", &locals, 7, 3) == 8));
    assert_eq!(d.post_json("/unregister", json!({"instance_id": 7, "model_name": "m", "dp_rank": 3})).0, 200);
    assert_eq!(score(&d, "m", "default", &locals, 7, 3), 0);
    // Rank 0's registration is still there.
    assert_eq!(d.get_json("/workers").1[0]["instance_id"], 7);
}

/// Blocks `/dump` lists for `instance`, over every index and rank.
fn dumped_blocks(d: &Daemon, instance: u64) -> usize {
    let (status, dump) = d.get_json("/dump");
    assert_eq!(status, 200, "{dump}");
    let events = dump.as_object().unwrap().values().flat_map(|ix| ix["events"].as_array().unwrap().iter());
    events
        .filter(|ev| ev["worker_id"] == instance)
        .map(|ev| ev["event"]["data"]["stored"]["blocks"].as_array().map_or(0, Vec::len))
        .sum()
}

#[test]
fn unregister_removes_every_rank_its_listener_fed() {
    let d = Daemon::start(&[]);
    // Registered as rank 0; every batch says rank 2 (which overrides it).
    let mut p = publisher(9, Some(2));
    let (status, v) = d.post_json(
        "/register",
        json!({"instance_id": 4, "endpoint": p.endpoint, "replay_endpoint": p.replay_endpoint,
               "model_name": "m", "routing_group": "g", "dp_rank": 0, "block_size": 4}),
    );
    assert_eq!(status, 201, "{v}");
    assert!(p.wait_subscribed(1));
    let leaf = publish_chain(&mut p, 3);
    let locals = p.chain_locals(leaf);
    assert!(wait_until(|| score(&d, "m", "g", &locals, 4, 2) == 12));
    assert_eq!(dumped_blocks(&d, 4), 3);

    let unregister = json!({"instance_id": 4, "model_name": "m", "routing_group": "g", "dp_rank": 0});
    assert_eq!(d.post_json("/unregister", unregister.clone()).0, 200);
    assert_eq!(dumped_blocks(&d, 4), 0, "{}", d.get("/dump").1);
    assert_eq!(d.get_json("/workers").1, json!([]));
    // Nothing is left to unregister, under any rank.
    assert_eq!(d.post_json("/unregister", unregister).0, 404);
    assert_eq!(d.post_json("/unregister", json!({"instance_id": 4, "model_name": "m"})).0, 404);
}

/// Removes the file when dropped, even if the test fails first.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn the_unix_socket_serves_the_same_api_and_is_gone_after_a_stop() {
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::temp_dir().join(format!("kv-indexer-test-{}.sock", std::process::id()));
    let _cleanup = RemoveOnDrop(path.clone());
    let mut d = Daemon::start(&["--unix-socket", path.to_str().unwrap()]);
    // Owner and group may connect, whatever the umask.
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o660);
    let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
    let body = r#"{"token_ids":[1,2,3,4],"model_name":"none"}"#;
    write!(s, "POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
        .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 404"), "{resp}");
    assert!(resp.contains(r#"{"error":"no indexer for model=none tenant=default"}"#), "{resp}");
    assert_eq!(d.terminate(), Some(0));
    assert!(!path.exists(), "a stopped daemon removes its socket");
}

#[test]
fn a_wrong_method_is_405_with_the_allowed_ones() {
    use std::io::{Read, Write};
    let d = Daemon::start(&[]);
    for (method, path, allow) in [
        ("GET", "/query", "POST"),
        ("DELETE", "/register", "POST"),
        ("POST", "/health", "GET, HEAD"),
        ("HEAD", "/query", "POST"),
    ] {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", d.port)).unwrap();
        write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        assert!(resp.starts_with("HTTP/1.1 405 "), "{resp}");
        assert!(resp.contains(&format!("\r\nAllow: {allow}\r\n")), "{method} {path}: {resp}");
    }
}

#[test]
fn last_error_clears_once_the_listener_is_active_again() {
    let d = Daemon::start(&[]);
    // Nothing listens there yet: the listener fails to connect and says so.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("tcp://127.0.0.1:{port}");
    let body = json!({"instance_id": 1, "endpoint": endpoint, "model_name": "m", "block_size": 4});
    assert_eq!(d.post_json("/register", body).0, 201);
    let listener = |d: &Daemon| d.get_json("/workers").1[0]["listeners"]["0"].clone();
    assert!(wait_until(|| listener(&d)["last_error"].as_str().is_some_and(|e| e.contains("cannot connect"))));
    // The engine comes up on that port.
    let mut p =
        TestPublisher::new(PublisherConfig { block_size: 4, endpoint: Some(endpoint), ..PublisherConfig::default() });
    assert!(p.wait_subscribed(1));
    assert!(wait_until(|| listener(&d)["status"] == "active"), "{}", listener(&d));
    assert!(listener(&d).get("last_error").is_none(), "stale error on an active listener: {}", listener(&d));
}

#[test]
fn health_waits_for_the_minimum_number_of_workers() {
    let d = Daemon::start_env(&[], &[("DYN_ROUTER_MIN_INITIAL_WORKERS", "1")]);
    let (status, v) = d.get_json("/health");
    assert_eq!(status, 503);
    assert!(v["reason"].as_str().unwrap().contains("0 of 1"), "{v}");
    let p = publisher(3, None);
    assert_eq!(register(&d, 1, &p, "m", "default").0, 201);
    assert_eq!(d.get("/health").0, 200);
}

#[test]
fn sigterm_stops_cleanly() {
    let mut d = Daemon::start(&[]);
    assert_eq!(d.terminate(), Some(0));
    // The last lines may still be on their way from the pipe.
    assert!(wait_until(|| d.log().iter().any(|l| l.contains("stopped"))), "{:?}", d.log());
}

#[test]
fn bad_command_lines_exit_2_with_one_line() {
    let bin = env!("CARGO_BIN_EXE_kv-indexer");
    for args in [&["--port", "x"][..], &["--bogus"], &["--workers", "1=tcp://h:1"], &["--block-size", "0"]] {
        let out = std::process::Command::new(bin).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
    let out = std::process::Command::new(bin).arg("--version").output().unwrap();
    assert!(out.status.success() && String::from_utf8(out.stdout).unwrap().starts_with("kv-indexer "));
    let out = std::process::Command::new(bin).arg("--help").output().unwrap();
    assert!(out.status.success() && String::from_utf8(out.stdout).unwrap().contains("--peers"));
}

#[test]
fn unregister_leaves_the_ranks_another_registration_owns() {
    let d = Daemon::start(&[]);
    // Engine A is registered as rank 0 but names rank 1 in its batches;
    // engine B is registered as rank 1 itself.
    let (mut a, mut b) = (publisher(11, Some(1)), publisher(12, None));
    for (p, rank) in [(&a, 0), (&b, 1)] {
        let body = json!({"instance_id": 6, "endpoint": p.endpoint, "replay_endpoint": p.replay_endpoint,
                          "model_name": "m", "dp_rank": rank, "block_size": 4});
        assert_eq!(d.post_json("/register", body).0, 201);
    }
    assert!(a.wait_subscribed(1) && b.wait_subscribed(1));
    let (leaf_a, leaf_b) = (publish_chain(&mut a, 2), publish_chain(&mut b, 3));
    let (from_a, from_b) = (a.chain_locals(leaf_a), b.chain_locals(leaf_b));
    assert!(wait_until(|| score(&d, "m", "default", &from_a, 6, 1) == 8));
    assert!(wait_until(|| score(&d, "m", "default", &from_b, 6, 1) == 12));
    // Unregistering A's key leaves B's registration and its worker whole.
    assert_eq!(d.post_json("/unregister", json!({"instance_id": 6, "model_name": "m", "dp_rank": 0})).0, 200);
    assert_eq!(score(&d, "m", "default", &from_b, 6, 1), 12, "B's blocks went with A's registration");
    assert_eq!(d.get_json("/workers").1[0]["endpoints"]["1"], json!(b.endpoint));
}

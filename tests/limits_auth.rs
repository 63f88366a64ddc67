//! The admin token through the real binary: with one configured, the
//! mutating endpoints answer 401 with a JSON error and a `WWW-Authenticate`
//! challenge unless the request carries the token; reads stay open, peer
//! recovery needs no token, and the token shows up in no log, help text
//! or metric.

mod support;

use serde_json::{json, Value};
use std::time::Duration;
use support::daemon::Daemon;
use support::publisher::{PublisherConfig, TestPublisher};
use support::wait_until;

const TOKEN: &str = "adm1n-T0ken.never-shown";

/// Status, `WWW-Authenticate` header and body of one request.
fn send(method: &str, url: &str, authorization: Option<&str>, body: Option<&Value>) -> (u16, Option<String>, String) {
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(20)).build();
    let mut req = agent.request(method, url);
    if let Some(a) = authorization {
        req = req.set("Authorization", a);
    }
    let res = match body {
        Some(b) => req.send_string(&b.to_string()),
        None => req.call(),
    };
    let r = match res {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {url}: {e}"),
    };
    let challenge = r.header("WWW-Authenticate").map(str::to_string);
    (r.status(), challenge, r.into_string().unwrap_or_default())
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[test]
fn mutating_endpoints_need_the_token_and_reads_stay_open() {
    let mut d = Daemon::start_env(&[], &[("KV_INDEXER_ADMIN_TOKEN", TOKEN)]);
    let p = TestPublisher::new(PublisherConfig { block_size: 4, ..PublisherConfig::default() });
    let register = json!({"instance_id": 1, "endpoint": p.endpoint, "model_name": "m", "block_size": 4});
    let unregister = json!({"instance_id": 1, "model_name": "m"});
    let peer = json!({"url": "http://127.0.0.1:9"});
    let mutating = [
        ("/register", &register, 201),
        ("/register_peer", &peer, 201),
        ("/deregister_peer", &peer, 200),
        ("/unregister", &unregister, 200),
    ];
    let right = bearer(TOKEN);
    let wrong_tokens = [bearer("adm1n-T0ken.never-show"), bearer(&format!("{TOKEN}x")), "Basic Zm9vOmJhcg==".into()];
    for (path, body, ok) in mutating {
        let url = format!("{}{path}", d.base);
        let mut refusals = vec![None];
        refusals.extend(wrong_tokens.iter().map(|t| Some(t.as_str())));
        for auth in refusals {
            let (status, challenge, text) = send("POST", &url, auth, Some(body));
            assert_eq!(status, 401, "{path} with {auth:?}: {text}");
            assert!(challenge.is_some_and(|c| c.starts_with("Bearer")), "{path}: a Bearer challenge");
            let v: Value = serde_json::from_str(&text).unwrap();
            assert!(v["error"].as_str().is_some_and(|e| !e.contains(TOKEN)), "{v}");
        }
        // Nothing changed by the refusals: the registration or peer list is as before.
        let (status, _, text) = send("POST", &url, Some(&right), Some(body));
        assert_eq!(status, ok, "{path} with the token: {text}");
        // The scheme is case-insensitive.
        if path == "/register_peer" {
            assert_eq!(send("POST", &url, Some(&format!("bearer {TOKEN}")), Some(body)).0, 201);
        }
    }
    assert_eq!(d.get_json("/workers").1, json!([]), "unregistered with the token");

    // Reads need no token.
    for path in ["/health", "/metrics", "/workers", "/dump", "/peers"] {
        assert_eq!(d.get(path).0, 200, "{path}");
    }
    // (The index went with its last worker: answered, not refused.)
    let (status, v) = d.post_json("/query", json!({"token_ids": [1, 2, 3, 4], "model_name": "m"}));
    assert_eq!(status, 404, "{v}");
    assert!(v["error"].as_str().is_some_and(|e| e.starts_with("no indexer")), "{v}");
    assert_eq!(d.post_json("/query_by_hash", json!({"block_hashes": [1], "model_name": "m"})).0, 404);

    let metrics = d.get("/metrics").1;
    assert!(!metrics.contains(TOKEN));
    let refused = metrics.lines().find(|l| l.starts_with("kv_indexer_auth_refused_total ")).unwrap();
    assert_eq!(refused, "kv_indexer_auth_refused_total 16");
    assert_eq!(d.terminate(), Some(0));
    assert!(d.log().iter().any(|l| l.contains("stopped")), "the whole log is read");
    assert!(!d.log().iter().any(|l| l.contains(TOKEN)), "{:?}", d.log());
}

#[test]
fn without_a_token_everything_is_open() {
    let d = Daemon::start(&[]);
    let (status, _, _) = send("POST", &format!("{}/register_peer", d.base), None, Some(&json!({"url": "http://h:1"})));
    assert_eq!(status, 201);
}

#[test]
fn the_flag_sets_the_token_and_help_never_shows_it() {
    let d = Daemon::start(&["--admin-token", TOKEN]);
    let url = format!("{}/register_peer", d.base);
    let body = json!({"url": "http://h:1"});
    assert_eq!(send("POST", &url, None, Some(&body)).0, 401);
    assert_eq!(send("POST", &url, Some(&bearer(TOKEN)), Some(&body)).0, 201);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kv-indexer"))
        .args(["--admin-token", TOKEN, "--help"])
        .env("KV_INDEXER_ADMIN_TOKEN", TOKEN)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("--admin-token") && !text.contains(TOKEN), "{text}");
    // A bad token is refused at startup without being echoed.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kv-indexer"))
        .args(["--admin-token", "secret with spaces"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("secret with spaces"));
}

#[test]
fn peer_recovery_needs_no_token() {
    let mut p = TestPublisher::new(PublisherConfig { block_size: 4, seed: 5, ..PublisherConfig::default() });
    let workers = format!("1={}", p.endpoint);
    let args = ["--block-size", "4", "--model-name", "m", "--workers", &workers, "--admin-token", TOKEN];
    let a = Daemon::start(&args);
    assert!(p.wait_subscribed(1));
    let chain = p.new_store(kv_indexer::StorageTier::Device, None, 6);
    p.publish(vec![chain]);
    // Stored blocks in the dump, however its events are grouped.
    let blocks = |d: &Daemon| -> usize {
        let dump = d.get_json("/dump").1;
        let events = dump["m:default"]["events"].as_array().cloned().unwrap_or_default();
        events.iter().filter_map(|e| e["event"]["data"]["stored"]["blocks"].as_array()).map(Vec::len).sum()
    };
    assert!(wait_until(|| blocks(&a) == 6));
    let peers = a.base.clone();
    let mut with_peer = args.to_vec();
    with_peer.extend(["--peers", peers.as_str(), "--slow-joiner-ms", "10"]);
    let mut b = Daemon::start(&with_peer);
    assert!(wait_until(|| b.get("/health").0 == 200), "ready after recovery");
    assert!(b.wait_logged("recovered"), "{:?}", b.log());
    assert_eq!(blocks(&b), blocks(&a), "recovered from the peer's open /dump");
}

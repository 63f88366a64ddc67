//! Predicted placements through the real binary: a router books what it
//! routed with `POST /routed`; queries report the booking as `predicted`
//! for the booked prefix only, never as `gpu`; the worker's Stored confirms
//! it; it expires; a Cleared, an engine restart and `/unregister` drop it;
//! bad input changes nothing; the cap holds; the admin token guards it.

mod support;

use kv_indexer::StorageTier;
use serde_json::{json, Value};
use support::daemon::Daemon;
use support::publisher::{PublisherConfig, TestEvent, TestPublisher};
use support::wait_until;

fn publisher(seed: u64) -> TestPublisher {
    TestPublisher::new(PublisherConfig { block_size: 4, seed, ..PublisherConfig::default() })
}

/// Registers `p` as `instance` of model `m` and waits until it is active.
fn register(d: &Daemon, instance: u64, p: &mut TestPublisher) {
    let (status, v) = d.post_json(
        "/register",
        json!({"instance_id": instance, "endpoint": p.endpoint, "model_name": "m", "block_size": 4}),
    );
    assert_eq!(status, 201, "{v}");
    assert!(p.wait_subscribed(1));
}

/// Publishes a device chain of `n` blocks under `parent`; returns its leaf.
fn publish_chain(p: &mut TestPublisher, parent: Option<u64>, n: usize) -> u64 {
    let TestEvent::Stored { hashes, .. } = p.new_store(StorageTier::Device, parent, n) else { unreachable!() };
    let leaf = *hashes.last().unwrap();
    p.publish(vec![TestEvent::Stored { tier: StorageTier::Device, parent, hashes }]);
    leaf
}

/// A device store of `n` blocks under `parent`, encoded now (so its tokens
/// are known) and sent later with `send_payload`: the engine's events for
/// a request still in its queue.
fn pending_store(p: &mut TestPublisher, parent: u64, n: usize) -> (u64, Vec<u8>) {
    let ev = p.new_store(StorageTier::Device, Some(parent), n);
    let TestEvent::Stored { hashes, .. } = &ev else { unreachable!() };
    let leaf = *hashes.last().unwrap();
    (leaf, p.encode_batch(&[ev]))
}

fn query(d: &Daemon, locals: &[u64]) -> Value {
    let (status, v) = d.post_json("/query_by_hash", json!({"block_hashes": locals, "model_name": "m"}));
    assert_eq!(status, 200, "{v}");
    v
}

/// `instances.<id>.predicted` of a query, if present.
fn predicted(d: &Daemon, locals: &[u64], instance: u64) -> Option<u64> {
    query(d, locals)["instances"][instance.to_string()]["predicted"].as_u64()
}

fn gpu(d: &Daemon, locals: &[u64], instance: u64) -> u64 {
    query(d, locals)["instances"][instance.to_string()]["gpu"].as_u64().unwrap_or(0)
}

fn routed(d: &Daemon, body: Value) -> (u16, Value) {
    d.post_json("/routed", body)
}

/// A sample of `/metrics`, by its exact name and labels.
fn metric(d: &Daemon, series: &str) -> u64 {
    let (status, text) = d.get("/metrics");
    assert_eq!(status, 200);
    let line = text
        .lines()
        .find(|l| l.strip_prefix(series).is_some_and(|rest| rest.starts_with(' ')))
        .unwrap_or_else(|| panic!("no {series} in /metrics"));
    line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64
}

fn blocks_total(d: &Daemon, outcome: &str) -> u64 {
    metric(d, &format!("kv_indexer_predicted_blocks_total{{outcome=\"{outcome}\"}}"))
}

#[test]
fn a_booking_is_predicted_for_its_prefix_only_never_as_gpu_and_a_stored_confirms_it() {
    let d = Daemon::start(&["--predict-ttl-ms", "60000"]);
    let mut p1 = publisher(1);
    let mut p2 = publisher(2);
    register(&d, 1, &mut p1);
    register(&d, 2, &mut p2);
    let held = publish_chain(&mut p1, None, 2);
    let (leaf, payload) = pending_store(&mut p1, held, 3);
    let locals = p1.chain_locals(leaf);
    assert!(wait_until(|| gpu(&d, &locals, 1) == 8));
    let before_dump = d.get("/dump").1;

    // The router sent the whole request (and a partial tail block) to instance 1.
    let mut tokens = p1.chain_tokens(leaf);
    tokens.extend([7, 7]);
    let (status, v) = routed(&d, json!({"model_name": "m", "token_ids": tokens, "instance_id": 1}));
    assert_eq!((status, v), (200, json!({"status": "ok", "predicted_blocks": 3, "ttl_ms": 60000})));
    let v = query(&d, &locals);
    assert_eq!(v["scores"], json!({"1": {"0": 8}}), "scores say only what the engine reported");
    assert_eq!(
        v["instances"]["1"],
        json!({"longest_matched": 8, "gpu": 8, "dp": {"0": 8}, "cpu": 8, "disk": 8, "predicted": 20})
    );
    // /query with the tokens says the same.
    let (_, vt) = d.post_json("/query", json!({"token_ids": p1.chain_tokens(leaf), "model_name": "m"}));
    assert_eq!(vt["instances"], v["instances"]);
    // Only the booked prefix: a query that leaves it at block 3 is predicted 3 blocks.
    let mut other = locals.clone();
    other[3] ^= 1;
    assert_eq!(predicted(&d, &other, 1), Some(12));
    assert_eq!(predicted(&d, &locals[..4], 1), Some(16));
    other[2] ^= 1;
    assert_eq!(predicted(&d, &other, 1), None, "diverging at the first booked block: nothing predicted");

    // Instance 2 holds nothing; once booked it is listed, with zeros but for `predicted`.
    let (status, v) = routed(&d, json!({"model_name": "m", "block_hashes": locals, "instance_id": 2, "dp_rank": 0}));
    assert_eq!((status, v["predicted_blocks"].clone()), (200, json!(5)));
    let v = query(&d, &locals);
    assert_eq!(v["scores"], json!({"1": {"0": 8}}));
    assert_eq!(
        v["instances"]["2"],
        json!({"longest_matched": 0, "gpu": 0, "dp": {"0": 0}, "cpu": 0, "disk": 0, "predicted": 20})
    );
    assert_eq!((blocks_total(&d, "made"), metric(&d, "kv_indexer_predicted_blocks_live")), (8, 8));
    assert_eq!(d.get("/dump").1, before_dump, "predictions are not in the dump");

    // The engine's Stored arrives: real now, and the booking is confirmed.
    p1.send_payload(payload);
    assert!(wait_until(|| gpu(&d, &locals, 1) == 20));
    assert!(wait_until(|| blocks_total(&d, "confirmed") == 3));
    let v = query(&d, &locals);
    assert_eq!(v["instances"]["1"], json!({"longest_matched": 20, "gpu": 20, "dp": {"0": 20}, "cpu": 20, "disk": 20}));
    assert_eq!(v["instances"]["2"]["predicted"], 20, "another worker's booking is its own");
    assert_eq!(metric(&d, "kv_indexer_predicted_blocks_live"), 5);
}

#[test]
fn a_booking_expires() {
    let d = Daemon::start(&[]);
    let mut p1 = publisher(3);
    register(&d, 1, &mut p1);
    let held = publish_chain(&mut p1, None, 1);
    let (leaf, _never_sent) = pending_store(&mut p1, held, 2);
    let locals = p1.chain_locals(leaf);
    assert!(wait_until(|| gpu(&d, &locals, 1) == 4));
    let (status, v) = routed(&d, json!({"model_name": "m", "block_hashes": locals, "instance_id": 1, "ttl_ms": 200}));
    assert_eq!((status, v), (200, json!({"status": "ok", "predicted_blocks": 2, "ttl_ms": 200})));
    assert!(wait_until(|| predicted(&d, &locals, 1).is_none()), "gone once its time is up");
    assert_eq!((blocks_total(&d, "made"), blocks_total(&d, "expired")), (2, 2));
    assert_eq!(metric(&d, "kv_indexer_predicted_blocks_live"), 0);
    assert_eq!(gpu(&d, &locals, 1), 4, "the engine's blocks stay");
    // The default TTL is --predict-ttl-ms's 2000 ms.
    let (_, v) = routed(&d, json!({"model_name": "m", "block_hashes": locals, "instance_id": 1}));
    assert_eq!(v["ttl_ms"], 2000);
}

#[test]
fn a_cleared_an_engine_restart_and_unregister_drop_bookings() {
    let d = Daemon::start(&["--predict-ttl-ms", "60000"]);
    let mut p1 = publisher(4);
    let mut p2 = publisher(5);
    register(&d, 1, &mut p1);
    register(&d, 2, &mut p2);
    let held = publish_chain(&mut p1, None, 1);
    let (leaf, _) = pending_store(&mut p1, held, 2);
    let locals = p1.chain_locals(leaf);
    assert!(wait_until(|| gpu(&d, &locals, 1) == 4));
    let book = |instance: u64| {
        let (status, v) = routed(&d, json!({"model_name": "m", "block_hashes": locals, "instance_id": instance}));
        assert_eq!(status, 200, "{v}");
        v["predicted_blocks"].as_u64().unwrap()
    };

    assert_eq!(book(1), 2);
    assert_eq!(book(2), 3);
    p1.publish(vec![TestEvent::Cleared]);
    assert!(wait_until(|| predicted(&d, &locals, 1).is_none()));
    assert_eq!(predicted(&d, &locals, 2), Some(12), "another worker's bookings stay");
    assert_eq!(blocks_total(&d, "dropped"), 2);

    // The engine restarts (seq back to 0): the daemon clears it, and its bookings go.
    assert_eq!(book(1), 3, "cleared: nothing held now");
    p1.restart(false);
    publish_chain(&mut p1, None, 1);
    assert!(wait_until(|| predicted(&d, &locals, 1).is_none()));
    assert_eq!(blocks_total(&d, "dropped"), 5);

    // Unregistering instance 2 drops its bookings; it can book no more.
    let (status, _) = d.post_json("/unregister", json!({"instance_id": 2, "model_name": "m"}));
    assert_eq!(status, 200);
    assert!(query(&d, &locals)["instances"].get("2").is_none());
    assert_eq!(blocks_total(&d, "dropped"), 8);
    let (status, v) = routed(&d, json!({"model_name": "m", "block_hashes": locals, "instance_id": 2}));
    assert_eq!(status, 404, "{v}");
    assert_eq!((metric(&d, "kv_indexer_predicted_blocks_live"), blocks_total(&d, "made")), (0, 8));
}

#[test]
fn bad_input_changes_nothing_and_the_cap_holds() {
    let d = Daemon::start(&["--predict-max-blocks", "4", "--predict-ttl-ms", "60000"]);
    let mut p1 = publisher(6);
    register(&d, 1, &mut p1);
    let leaf = publish_chain(&mut p1, None, 1);
    assert!(wait_until(|| gpu(&d, &p1.chain_locals(leaf), 1) == 4));
    let a: Vec<u64> = vec![11, 12, 13];
    let b: Vec<u64> = vec![21, 22];
    let ok = json!({"model_name": "m", "block_hashes": a, "instance_id": 1});
    let with = |k: &str, v: Value| {
        let mut body = ok.clone();
        body[k] = v;
        body.to_string()
    };
    let without = |k: &str| {
        let mut body = ok.clone();
        body.as_object_mut().unwrap().remove(k);
        body.to_string()
    };
    let cases: Vec<(String, u16)> = vec![
        (with("model_name", json!("nope")), 404),
        (with("tenant_id", json!("nope")), 404),
        (with("instance_id", json!(9)), 404),
        (with("dp_rank", json!(3)), 404),
        (without("instance_id"), 422),
        (without("block_hashes"), 422),
        (without("model_name"), 422),
        (with("instance_id", json!("1")), 422),
        (with("block_hashes", json!([1, "x"])), 422),
        (with("token_ids", json!([1, 2, 3, 4])), 422),
        (with("ttl_ms", json!(-1)), 422),
        (with("ttl_ms", json!(0)), 400),
        (with("ttl_ms", json!(60_001)), 400),
        ("{\"model_name\": \"m\",".to_string(), 400),
    ];
    for (body, want) in cases {
        let (status, text) = d.post("/routed", &body);
        assert_eq!(status, want, "{body}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert!(v["error"].as_str().is_some_and(|m| !m.is_empty()), "{body}: {v}");
    }
    assert_eq!(d.get("/routed").0, 405);
    assert_eq!((blocks_total(&d, "made"), metric(&d, "kv_indexer_predicted_blocks_live")), (0, 0));
    assert_eq!(predicted(&d, &a, 1), None, "nothing was booked");

    // The cap: 3 of 4 blocks, then a booking of 2 is refused whole.
    assert_eq!(routed(&d, ok.clone()).0, 200);
    let (status, v) = routed(&d, json!({"model_name": "m", "block_hashes": b, "instance_id": 1}));
    assert_eq!(status, 503, "{v}");
    assert!(v["error"].as_str().unwrap().contains("--predict-max-blocks"), "{v}");
    assert_eq!(predicted(&d, &b, 1), None);
    assert_eq!(predicted(&d, &a, 1), Some(12));
    assert_eq!(metric(&d, "kv_indexer_predicted_blocks_live"), 3);
    assert_eq!((metric(&d, "kv_indexer_predicted_blocks_max"), blocks_total(&d, "refused")), (4, 2));
    // The same request again renews its booking and needs no room; one block still fits.
    assert_eq!(routed(&d, ok.clone()).0, 200);
    assert_eq!(blocks_total(&d, "renewed"), 3);
    assert_eq!(routed(&d, json!({"model_name": "m", "block_hashes": [31], "instance_id": 1})).0, 200);
    assert_eq!(metric(&d, "kv_indexer_predicted_blocks_live"), 4);
}

#[test]
fn the_admin_token_guards_routed() {
    let d = Daemon::start_env(&[], &[("KV_INDEXER_ADMIN_TOKEN", "s3cret")]);
    let mut p1 = publisher(7);
    let agent = ureq::AgentBuilder::new().build();
    let (status, _) =
        match agent.post(&format!("{}/register", d.base)).set("Authorization", "Bearer s3cret").send_string(
            &json!({"instance_id": 1, "endpoint": p1.endpoint, "model_name": "m", "block_size": 4}).to_string(),
        ) {
            Ok(r) => (r.status(), r.into_string().unwrap()),
            Err(e) => panic!("{e}"),
        };
    assert_eq!(status, 201);
    assert!(p1.wait_subscribed(1));
    let body = json!({"model_name": "m", "block_hashes": [1, 2], "instance_id": 1}).to_string();
    let (status, text) = d.post("/routed", &body);
    assert_eq!(status, 401, "{text}");
    match agent.post(&format!("{}/routed", d.base)).set("Authorization", "Bearer wrong").send_string(&body) {
        Err(ureq::Error::Status(401, r)) => assert!(r.header("WWW-Authenticate").is_some()),
        other => panic!("a wrong token: {other:?}"),
    }
    assert_eq!(predicted(&d, &[1, 2], 1), None, "refused: nothing booked");
    let r = agent.post(&format!("{}/routed", d.base)).set("Authorization", "Bearer s3cret").send_string(&body);
    assert_eq!(r.map(|r| r.status()).ok(), Some(200));
    assert_eq!(predicted(&d, &[1, 2], 1), Some(8), "queries stay open");
}

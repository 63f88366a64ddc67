//! Peer recovery: a second daemon started with `--peers` takes the first's
//! state from its /dump, then both follow the same engines and agree.

mod support;

use kv_indexer::StorageTier;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use support::daemon::Daemon;
use support::publisher::{PublisherConfig, TestEvent, TestPublisher};
use support::wait_until;

/// A dump as a set of (index, worker, tier, block, local, parent) facts
/// (and where each orphan hangs), whatever the order and grouping of its
/// events.
fn facts(dump: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (key, entry) in dump.as_object().unwrap() {
        for ev in entry["events"].as_array().unwrap() {
            let worker = format!("{}:{}", ev["worker_id"], ev["event"]["dp_rank"]);
            let tier = ev["storage_tier"].as_str().unwrap_or("device").to_string();
            let stored = &ev["event"]["data"]["stored"];
            assert!(stored.is_object(), "a dump lists stored blocks only: {ev}");
            let mut parent = stored["parent_hash"].to_string();
            if !stored["kv_indexer_orphan"].is_null() {
                let (at, orphan) = (&stored["start_position"], &stored["kv_indexer_orphan"]);
                out.insert(format!("{key} {worker} {tier} {} at {at} hangs under {orphan}", stored["blocks"][0]));
            }
            for b in stored["blocks"].as_array().unwrap() {
                out.insert(format!("{key} {worker} {tier} {} {} {parent}", b["block_hash"], b["tokens_hash"]));
                parent = b["block_hash"].to_string();
            }
        }
    }
    out
}

#[test]
fn a_second_daemon_recovers_an_identical_dump_from_its_peer() {
    let mut p = TestPublisher::new(PublisherConfig { block_size: 4, seed: 21, ..PublisherConfig::default() });
    let workers = format!("1={}", p.endpoint);
    let a = Daemon::start(&["--block-size", "4", "--model-name", "m:with:colons", "--workers", &workers]);
    assert!(p.wait_subscribed(1));
    // Some history: stores in two tiers, a removal.
    let TestEvent::Stored { hashes, .. } = p.new_store(StorageTier::Device, None, 6) else { unreachable!() };
    p.publish(vec![TestEvent::Stored { tier: StorageTier::Device, parent: None, hashes: hashes.clone() }]);
    let host = p.new_store(StorageTier::HostPinned, Some(hashes[4]), 2);
    p.publish(vec![host]);
    p.publish(vec![TestEvent::Removed { tier: StorageTier::Device, hashes: vec![hashes[5]] }]);
    let expected_blocks = 5 + 2;
    assert!(wait_until(|| facts(&a.dump()).len() == expected_blocks), "{}", a.get("/dump").1);

    let peers = a.base.clone();
    let b = Daemon::start(&[
        "--block-size",
        "4",
        "--model-name",
        "m:with:colons",
        "--workers",
        &workers,
        "--peers",
        &peers,
    ]);
    assert!(wait_until(|| b.get("/health").0 == 200), "ready after recovery");
    assert!(p.wait_subscribed(2));
    let (fa, fb) = (facts(&a.dump()), facts(&b.dump()));
    assert_eq!(fa, fb, "recovered dump equals the peer's");
    // The model name with colons round-trips through the dump's explicit fields.
    assert!(b.dump().get("m:with:colons:default").is_some());

    // Both follow live events from here.
    let more = p.new_store(StorageTier::Device, Some(hashes[4]), 3);
    p.publish(vec![more]);
    assert!(wait_until(|| facts(&a.dump()).len() == expected_blocks + 3));
    assert!(wait_until(|| facts(&b.dump()) == facts(&a.dump())));
    let (status, _) = b.post_json("/register_peer", json!({"url": "http://127.0.0.1:9/"}));
    assert_eq!(status, 201);
    let (_, peers) = b.get_json("/peers");
    assert_eq!(peers, json!([a.base, "http://127.0.0.1:9"]));
}

#[test]
fn no_reachable_peer_starts_empty_and_says_so() {
    let mut d = Daemon::start(&["--peers", "http://127.0.0.1:9", "--slow-joiner-ms", "10", "--peer-timeout-ms", "500"]);
    assert!(wait_until(|| d.get("/health").0 == 200));
    assert!(d.wait_logged("no peer gave a usable dump"), "{:?}", d.log());
    assert_eq!(d.get_json("/dump").1, json!({}));
}

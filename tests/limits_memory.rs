//! The pair cap through the real binary: engines fed past `--max-pairs`
//! leave the daemon at or under the cap, the overflow is shed and counted
//! and logged, answers never claim a block an engine lacks, removes and
//! clears still apply, and freed room takes new stores again.

mod support;

use kv_indexer::StorageTier;
use serde_json::json;
use std::collections::{BTreeSet, HashMap};
use support::daemon::Daemon;
use support::publisher::{PublisherConfig, TestEvent, TestPublisher};
use support::rng::Rng;
use support::wait_until;

const DEV: StorageTier = StorageTier::Device;

/// A value from /metrics: the sample whose name and labels start with `key`.
fn metric(d: &Daemon, key: &str) -> u64 {
    let (status, text) = d.get("/metrics");
    assert_eq!(status, 200);
    text.lines()
        .find(|l| l.starts_with(key) && l[key.len()..].starts_with([' ', '{', ',', '}']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no metric {key} in {text}")) as u64
}

/// An engine registered with the daemon, and the chains it stored: for each
/// leaf, the engine hashes from the root down.
struct Engine {
    p: TestPublisher,
    instance: u64,
    paths: HashMap<u64, Vec<u64>>,
    published: u64,
}

impl Engine {
    fn start(d: &Daemon, instance: u64) -> Engine {
        let mut p = TestPublisher::new(PublisherConfig { block_size: 4, seed: instance, ..PublisherConfig::default() });
        let (status, v) = d.post_json(
            "/register",
            json!({"instance_id": instance, "endpoint": p.endpoint, "replay_endpoint": p.replay_endpoint,
                   "model_name": "m", "block_size": 4}),
        );
        assert_eq!(status, 201, "{v}");
        assert!(p.wait_subscribed(1));
        assert!(wait_until(|| d.get_json("/workers").1.as_array().unwrap().iter().all(|w| w["status"] == "active")));
        Engine { p, instance, paths: HashMap::new(), published: 0 }
    }

    fn publish(&mut self, events: Vec<TestEvent>) {
        self.p.publish(events);
        self.published += 1;
    }

    /// Stores `n` device blocks under `parent` (a leaf of this engine) or as a new root; returns the leaf.
    fn store(&mut self, parent: Option<u64>, n: usize) -> u64 {
        let TestEvent::Stored { hashes, .. } = self.p.new_store(DEV, parent, n) else { unreachable!() };
        let mut path = parent.map(|p| self.paths[&p].clone()).unwrap_or_default();
        path.extend(&hashes);
        let leaf = *hashes.last().unwrap();
        self.paths.insert(leaf, path);
        self.publish(vec![TestEvent::Stored { tier: DEV, parent, hashes }]);
        leaf
    }

    fn remove(&mut self, hashes: Vec<u64>) {
        self.publish(vec![TestEvent::Removed { tier: DEV, hashes }]);
    }

    /// The device depth (blocks) the engine really holds along the chain to `leaf`.
    fn truth(&self, leaf: u64) -> u64 {
        let held: &BTreeSet<u64> = &self.p.truth()[DEV.index()];
        self.paths[&leaf].iter().take_while(|h| held.contains(h)).count() as u64
    }

    /// The device depth (blocks) the daemon reports along the chain to `leaf`.
    fn reported(&self, d: &Daemon, leaf: u64) -> u64 {
        let locals = self.p.chain_locals(leaf);
        let (status, v) = d.post_json("/query_by_hash", json!({"block_hashes": locals, "model_name": "m"}));
        assert_eq!(status, 200, "{v}");
        v["scores"][self.instance.to_string()]["0"].as_u64().unwrap_or(0) / 4
    }
}

/// Waits until the daemon applied every batch the engines published.
fn settle(d: &Daemon, engines: &[&Engine]) {
    let published: u64 = engines.iter().map(|e| e.published).sum();
    assert!(
        wait_until(|| metric(d, "kv_indexer_batches_applied_total") >= published),
        "the daemon applies all {published} batches"
    );
}

#[test]
fn past_the_cap_stores_are_shed_and_answers_never_overclaim() {
    let mut d = Daemon::start(&["--max-pairs", "24"]);
    assert_eq!(metric(&d, "kv_indexer_pairs_max"), 24);
    let mut a = Engine::start(&d, 1);
    let mut b = Engine::start(&d, 2);

    let a_leaves: Vec<u64> = (0..4).map(|_| a.store(None, 5)).collect();
    settle(&d, &[&a, &b]);
    let b_leaves: Vec<u64> = (0..4).map(|_| b.store(None, 5)).collect();
    settle(&d, &[&a, &b]);
    assert_eq!(metric(&d, "kv_indexer_pairs"), 24, "filled to the cap, not past it");
    assert_eq!(metric(&d, "kv_indexer_index_pairs{model=\"m\""), 24);
    assert_eq!(metric(&d, "kv_indexer_blocks_total{outcome=\"shed\""), 16);
    for leaf in &a_leaves {
        assert_eq!((a.reported(&d, *leaf), a.truth(*leaf)), (5, 5));
    }
    let b_depths: Vec<u64> = b_leaves.iter().map(|l| b.reported(&d, *l)).collect();
    assert_eq!(b_depths, [4, 0, 0, 0], "the refused blocks are not claimed");

    // A child of a shed block is refused as an unknown parent.
    let unknown_before = metric(&d, "kv_indexer_blocks_total{outcome=\"unknown_parent\"");
    let child = b.store(Some(b_leaves[0]), 2);
    settle(&d, &[&a, &b]);
    assert_eq!(metric(&d, "kv_indexer_blocks_total{outcome=\"unknown_parent\""), unknown_before + 2);
    assert_eq!(b.reported(&d, child), 4);

    // Removes apply at the cap; the room they free takes new stores.
    let freed: Vec<u64> = [a_leaves[0], a_leaves[1]].iter().flat_map(|l| a.paths[l].clone()).collect();
    a.remove(freed);
    settle(&d, &[&a, &b]);
    assert_eq!(metric(&d, "kv_indexer_pairs"), 14);
    assert_eq!(a.reported(&d, a_leaves[0]), 0);
    let fresh = b.store(None, 5);
    settle(&d, &[&a, &b]);
    assert_eq!(b.reported(&d, fresh), 5, "stores are accepted again once engines free blocks");
    assert_eq!(metric(&d, "kv_indexer_pairs"), 19);

    // A clear applies too, and so does unregistering.
    a.publish(vec![TestEvent::Cleared]);
    settle(&d, &[&a, &b]);
    assert_eq!(metric(&d, "kv_indexer_pairs"), 9);
    assert_eq!(d.post_json("/unregister", json!({"instance_id": 2, "model_name": "m"})).0, 200);
    assert_eq!(metric(&d, "kv_indexer_pairs"), 0);
    assert_eq!(metric(&d, "kv_indexer_entries"), 0);

    assert!(d.wait_logged("memory cap reached"), "{:?}", d.log());
    let log = d.log().join("\n");
    let lines = log.lines().filter(|l| l.contains("memory cap reached")).count();
    assert!((1..16).contains(&lines), "one rate-limited line, not one per block:\n{log}");
    assert!(log.contains("raise --max-pairs"), "the line says what to raise:\n{log}");
}

#[test]
fn random_workloads_stay_under_the_cap_and_within_the_truth() {
    let cap = 50u64;
    let d = Daemon::start(&["--max-pairs", &cap.to_string()]);
    let mut engines: Vec<Engine> = (1..=3).map(|i| Engine::start(&d, i)).collect();
    let mut rng = Rng::new(7);
    let mut peak = 0;
    for round in 0..60 {
        for e in engines.iter_mut() {
            let held: Vec<u64> = e.p.truth()[DEV.index()].iter().copied().collect();
            let leaves: Vec<u64> = e.paths.keys().copied().filter(|l| e.p.truth()[DEV.index()].contains(l)).collect();
            match rng.below(100) {
                0..=64 => {
                    let parent =
                        (!leaves.is_empty() && rng.chance(50)).then(|| leaves[rng.below(leaves.len() as u64) as usize]);
                    e.store(parent, 1 + rng.below(6) as usize);
                }
                65..=97 if !held.is_empty() => {
                    let n = 1 + rng.below(4);
                    e.remove((0..n).map(|_| held[rng.below(held.len() as u64) as usize]).collect());
                }
                _ => e.publish(vec![TestEvent::Cleared]),
            }
        }
        if round % 5 == 4 {
            let pairs = metric(&d, "kv_indexer_pairs");
            assert!(pairs <= cap, "round {round}: {pairs} pairs over the cap {cap}");
            peak = peak.max(pairs);
        }
    }
    settle(&d, &engines.iter().collect::<Vec<_>>());
    assert!(metric(&d, "kv_indexer_pairs") <= cap);
    assert!(metric(&d, "kv_indexer_blocks_total{outcome=\"shed\"") > 0, "the workload went past the cap");
    let mut found = 0;
    for e in &engines {
        for &leaf in e.paths.keys() {
            let (got, truth) = (e.reported(&d, leaf), e.truth(leaf));
            assert!(got <= truth, "instance {} claims {got} blocks of a chain it holds {truth} of", e.instance);
            found += got;
        }
    }
    assert!(found > 0 && peak > 0, "the index answered something");

    // Clears free everything; then a new chain is indexed in full.
    for e in engines.iter_mut() {
        e.publish(vec![TestEvent::Cleared]);
    }
    settle(&d, &engines.iter().collect::<Vec<_>>());
    assert_eq!(metric(&d, "kv_indexer_pairs"), 0);
    let leaf = engines[0].store(None, 8);
    settle(&d, &engines.iter().collect::<Vec<_>>());
    assert_eq!(engines[0].reported(&d, leaf), 8);
}

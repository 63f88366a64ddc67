//! Restarting warm from `--snapshot-dir` with the real binary and real ZMQ
//! engines: the same /dump and registrations right after the restart; the
//! batches published while the daemon was down replayed from the engine's
//! ring from exactly the saved watermark; a downtime longer than the ring
//! resyncs rather than keeping evicted blocks; an engine that restarted
//! meanwhile leaves no stale block (on its registered rank or a rank named
//! inside its batches); a killed daemon restarts from its periodic snapshot.

mod snapshot_support;
mod support;

use kv_indexer::StorageTier;
use serde_json::{json, Value};
use snapshot_support::{facts, held, well_formed, TempDir};
use support::daemon::Daemon;
use support::model_sink::Tiers as TruthTiers;
use support::publisher::{PublisherConfig, TestEvent, TestPublisher};
use support::wait_until;

const KEY: &str = "m:default";

fn engine(seed: u64, batch_dp_rank: Option<u32>) -> TestPublisher {
    TestPublisher::new(PublisherConfig { block_size: 4, seed, batch_dp_rank, ..PublisherConfig::default() })
}

/// Daemon flags: model `m`, block size 4, snapshots in `dir` only on stop.
fn args<'a>(workers: Option<&'a str>, dir: &'a str) -> Vec<&'a str> {
    let mut v = vec!["--block-size", "4", "--model-name", "m", "--snapshot-dir", dir, "--snapshot-interval-s", "0"];
    if let Some(w) = workers {
        v.extend(["--workers", w]);
    }
    v
}

/// Registers an engine with its replay endpoint (`--workers` cannot name one).
fn register(d: &Daemon, instance: u64, p: &TestPublisher, model: &str, tenant: &str) {
    let body = json!({"instance_id": instance, "endpoint": p.endpoint, "replay_endpoint": p.replay_endpoint,
                      "model_name": model, "tenant_id": tenant, "block_size": 4});
    assert_eq!(d.post_json("/register", body).0, 201);
}

/// Random history, then a fixed chain so the engine surely holds something.
fn history(p: &mut TestPublisher, batches: usize) {
    p.publish_random(batches);
    let chain = p.new_store(StorageTier::Device, None, 3);
    p.publish(vec![chain]);
}

fn dump(d: &Daemon) -> Value {
    d.dump()
}

fn same(held: &snapshot_support::Tiers, truth: &TruthTiers) -> bool {
    held.iter().zip(truth.iter()).all(|(a, b)| a == b)
}

/// Waits until the daemon's view of `instance:rank` is the engine's truth.
fn converges(d: &Daemon, key: &str, instance: u64, rank: u32, p: &TestPublisher) -> bool {
    wait_until(|| same(&held(&dump(d), key, instance, rank), p.truth()))
}

fn stop(d: &mut Daemon) {
    assert_eq!(d.terminate(), Some(0));
    assert!(d.log().iter().any(|l| l.contains("snapshot written on stop")), "{:?}", d.log());
}

#[test]
fn a_restart_serves_the_same_dump_and_registrations_as_before_the_stop() {
    let dir = TempDir::new("warm");
    let (mut p, mut q) = (engine(3, None), engine(4, None));
    let workers = format!("1={}", p.endpoint);
    let dir_arg = dir.arg();
    let mut a = Daemon::start(&args(Some(&workers), &dir_arg));
    register(&a, 2, &q, "n", "t");
    assert!(p.wait_subscribed(1) && q.wait_subscribed(1));
    history(&mut p, 30);
    history(&mut q, 30);
    assert!(converges(&a, KEY, 1, 0, &p));
    assert!(converges(&a, "n:t", 2, 0, &q));
    let before = dump(&a);
    let workers_before = a.get_json("/workers").1;
    stop(&mut a);
    assert!(well_formed(&dir.file()));

    let b = Daemon::start(&args(Some(&workers), &dir_arg));
    assert!(wait_until(|| b.get("/health").0 == 200));
    assert_eq!(facts(&dump(&b)), facts(&before), "the restored dump equals the one before the stop");
    let strip = |v: &Value| {
        let mut v = v.clone();
        for w in v.as_array_mut().unwrap() {
            w.as_object_mut().unwrap().remove("status");
            w.as_object_mut().unwrap().remove("listeners");
        }
        v
    };
    assert_eq!(strip(&b.get_json("/workers").1), strip(&workers_before), "registrations restored");

    // Both engines go on; the restarted daemon follows them.
    assert!(p.wait_subscribed(2) && q.wait_subscribed(2));
    p.publish_random(5);
    q.publish_random(5);
    assert!(converges(&b, KEY, 1, 0, &p));
    assert!(converges(&b, "n:t", 2, 0, &q));
}

#[test]
fn batches_published_while_down_are_replayed_from_the_saved_watermark() {
    let dir = TempDir::new("replay");
    let mut p = engine(5, None);
    let dir_arg = dir.arg();
    let mut a = Daemon::start(&args(None, &dir_arg));
    register(&a, 1, &p, "m", "default");
    assert!(p.wait_subscribed(1));
    history(&mut p, 20);
    assert!(converges(&a, KEY, 1, 0, &p));
    let watermark = p.next_seq() - 1;
    stop(&mut a);

    // Nobody listens: these reach only the engine's replay ring.
    p.publish_random(15);
    let b = Daemon::start(&args(None, &dir_arg));
    assert!(p.wait_subscribed(2));
    p.publish_random(1);
    assert!(converges(&b, KEY, 1, 0, &p));
    // The first daemon's fill on connecting asked from 0, if it asked. The
    // second asks from the saved watermark: the ring's batch there shows
    // the engine is the same process.
    assert_eq!(p.replay_requests().last(), Some(&watermark), "replayed from the saved watermark");
}

#[test]
fn a_downtime_longer_than_the_ring_resyncs_instead_of_keeping_evicted_blocks() {
    let dir = TempDir::new("resync");
    let mut p = engine(6, None);
    let dir_arg = dir.arg();
    let mut a = Daemon::start(&args(None, &dir_arg));
    register(&a, 1, &p, "m", "default");
    assert!(p.wait_subscribed(1));
    p.publish_random(10);
    let TestEvent::Stored { hashes, .. } = p.new_store(StorageTier::Device, None, 4) else { unreachable!() };
    p.publish(vec![TestEvent::Stored { tier: StorageTier::Device, parent: None, hashes: hashes.clone() }]);
    assert!(converges(&a, KEY, 1, 0, &p));
    stop(&mut a);

    // While down the engine evicts the chain, and its ring rolls over.
    p.publish(vec![TestEvent::Removed { tier: StorageTier::Device, hashes: hashes.clone() }]);
    p.publish_random(5);
    p.drop_buffer();
    // A ring keeps the newest batches: it starts past the saved watermark.
    p.publish_random(2);
    let b = Daemon::start(&args(None, &dir_arg));
    assert!(wait_until(|| b.get("/health").0 == 200));
    assert!(held(&dump(&b), KEY, 1, 0)[0].contains(&hashes[0]), "restored warm first");
    assert!(p.wait_subscribed(2));
    let fresh = p.new_store(StorageTier::Device, None, 2);
    let TestEvent::Stored { hashes: fresh_hashes, .. } = fresh.clone() else { unreachable!() };
    p.publish(vec![fresh]);
    assert!(wait_until(|| held(&dump(&b), KEY, 1, 0)[0].contains(&fresh_hashes[1])));
    let now = held(&dump(&b), KEY, 1, 0);
    for (tier, set) in now.iter().enumerate() {
        assert!(set.is_subset(&p.truth()[tier]), "stale blocks in tier {tier}: {set:?}");
    }
    assert!(hashes.iter().all(|h| !now[0].contains(h)), "evicted blocks are gone");
    assert!(b.get("/metrics").1.contains("kv_indexer_resyncs_total 1"));
}

#[test]
fn an_engine_that_restarted_while_down_leaves_no_stale_block() {
    let dir = TempDir::new("engine-restart");
    // q names rank 3 inside its batches while registered as rank 0.
    let (mut p, mut q) = (engine(7, None), engine(8, Some(3)));
    let dir_arg = dir.arg();
    let mut a = Daemon::start(&args(None, &dir_arg));
    register(&a, 1, &p, "m", "default");
    register(&a, 2, &q, "m", "default");
    assert!(p.wait_subscribed(1) && q.wait_subscribed(1));
    history(&mut p, 20);
    history(&mut q, 20);
    assert!(converges(&a, KEY, 1, 0, &p) && converges(&a, KEY, 2, 3, &q));
    let old = dump(&a);
    let old_blocks: Vec<u64> =
        [held(&old, KEY, 1, 0), held(&old, KEY, 2, 3)].iter().flatten().flatten().copied().collect();
    assert!(!old_blocks.is_empty());
    stop(&mut a);

    // New processes on the same ports: seq back to 0, empty cache and ring.
    p.restart(true);
    q.restart(true);
    p.publish_random(3);
    q.publish_random(3);
    let b = Daemon::start(&args(None, &dir_arg));
    assert!(wait_until(|| b.get("/health").0 == 200));
    assert!(p.wait_subscribed(1) && q.wait_subscribed(1));
    p.publish_random(1);
    q.publish_random(1);
    assert!(converges(&b, KEY, 1, 0, &p));
    assert!(converges(&b, KEY, 2, 3, &q));
    let now = dump(&b);
    let all: Vec<u64> = [held(&now, KEY, 1, 0), held(&now, KEY, 2, 3), held(&now, KEY, 2, 0)]
        .iter()
        .flatten()
        .flatten()
        .copied()
        .collect();
    assert!(old_blocks.iter().all(|h| !all.contains(h)), "a block of the old processes survived");
    assert!(b.get("/metrics").1.contains("kv_indexer_restarts_total 2"));
}

#[test]
fn a_killed_daemon_restarts_from_its_last_periodic_snapshot() {
    let dir = TempDir::new("periodic");
    let mut p = engine(9, None);
    let workers = format!("1={}", p.endpoint);
    let dir_arg = dir.arg();
    let mut periodic = args(Some(&workers), &dir_arg);
    periodic[7] = "1";
    periodic.extend(["--log-level", "debug"]);
    let mut a = Daemon::start(&periodic);
    assert!(p.wait_subscribed(1));
    history(&mut p, 10);
    assert!(converges(&a, KEY, 1, 0, &p));
    let expected = facts(&dump(&a));
    let pairs = held(&dump(&a), KEY, 1, 0).iter().map(|t| t.len() as u64).sum::<u64>();
    // The writer logs what each snapshot holds (at debug).
    let saved = format!(", {pairs} pairs, ");
    let saved_all =
        wait_until(|| a.log().iter().any(|l| l.contains("snapshot written (periodic)") && l.contains(&saved)));
    assert!(saved_all, "a periodic snapshot holds the state: {:?}", a.log());
    drop(a); // SIGKILL: no stop snapshot

    let b = Daemon::start(&args(Some(&workers), &dir_arg));
    assert!(wait_until(|| b.get("/health").0 == 200));
    assert_eq!(facts(&dump(&b)), expected);
}

#[test]
fn a_reachable_peer_replaces_the_snapshot_for_the_workers_it_knows() {
    let dir = TempDir::new("peer");
    let (mut p, mut r) = (engine(10, None), engine(11, None));
    let dir_arg = dir.arg();
    let mut a = Daemon::start(&args(None, &dir_arg));
    register(&a, 1, &p, "m", "default");
    register(&a, 5, &r, "m", "default");
    assert!(p.wait_subscribed(1) && r.wait_subscribed(1));
    history(&mut p, 10);
    history(&mut r, 10);
    let TestEvent::Stored { hashes: y, .. } = p.new_store(StorageTier::Device, None, 3) else { unreachable!() };
    p.publish(vec![TestEvent::Stored { tier: StorageTier::Device, parent: None, hashes: y.clone() }]);
    assert!(converges(&a, KEY, 1, 0, &p) && converges(&a, KEY, 5, 0, &r));
    let r_before = held(&dump(&a), KEY, 5, 0);
    stop(&mut a);

    // A live peer that follows only engine 1, and sees it evict y[2] and store x.
    let c = Daemon::start(&[]);
    register(&c, 1, &p, "m", "default");
    assert!(p.wait_subscribed(2));
    p.publish(vec![TestEvent::Removed { tier: StorageTier::Device, hashes: vec![y[2]] }]);
    let TestEvent::Stored { hashes: x, .. } = p.new_store(StorageTier::Device, None, 2) else { unreachable!() };
    p.publish(vec![TestEvent::Stored { tier: StorageTier::Device, parent: None, hashes: x.clone() }]);
    assert!(converges(&c, KEY, 1, 0, &p));

    let mut b = Daemon::start(&[
        "--snapshot-dir",
        &dir_arg,
        "--snapshot-interval-s",
        "0",
        "--peers",
        &c.base,
        "--slow-joiner-ms",
        "50",
    ]);
    assert!(wait_until(|| b.get("/health").0 == 200));
    let mine = held(&dump(&b), KEY, 1, 0);
    assert_eq!(mine, held(&dump(&c), KEY, 1, 0), "the peer's blocks for the worker it knows");
    assert!(mine[0].contains(&x[1]) && !mine[0].contains(&y[2]));
    assert_eq!(held(&dump(&b), KEY, 5, 0), r_before, "the snapshot's blocks for the worker it does not");
    assert!(b.wait_logged("replaces the snapshot's blocks of 1 worker(s)"), "{:?}", b.log());
}

#[test]
fn a_remove_right_after_a_restart_takes_every_piece_of_a_larger_engine_block() {
    // Engine blocks of 8 tokens, index blocks of 4: each is indexed as two pieces.
    let dir = TempDir::new("split");
    let mut p = TestPublisher::new(PublisherConfig { block_size: 8, seed: 12, ..PublisherConfig::default() });
    let dir_arg = dir.arg();
    let mut a = Daemon::start(&args(None, &dir_arg));
    register(&a, 1, &p, "m", "default");
    assert!(p.wait_subscribed(1));
    let TestEvent::Stored { hashes, .. } = p.new_store(StorageTier::Device, None, 3) else { unreachable!() };
    p.publish(vec![TestEvent::Stored { tier: StorageTier::Device, parent: None, hashes: hashes.clone() }]);
    let tokens = p.chain_tokens(hashes[2]);
    let score = |d: &Daemon| {
        let (status, v) = d.post_json("/query", json!({"model_name": "m", "token_ids": tokens}));
        assert_eq!(status, 200, "{v}");
        v["scores"]["1"]["0"].as_u64().unwrap_or(0) // matched tokens
    };
    assert!(wait_until(|| score(&a) == 24), "six pieces of 4 tokens indexed: {}", score(&a));
    stop(&mut a);

    let b = Daemon::start(&args(None, &dir_arg));
    assert!(wait_until(|| b.get("/health").0 == 200));
    assert_eq!(score(&b), 24, "restored");
    assert!(p.wait_subscribed(2));
    // The first event the new daemon sees: the last engine block goes.
    p.publish(vec![TestEvent::Removed { tier: StorageTier::Device, hashes: vec![hashes[2]] }]);
    assert!(wait_until(|| score(&b) == 16), "both pieces of the removed block go: {}", score(&b));
    // Only pieces the index held were named: none counted as unknown.
    let metrics = b.get("/metrics").1;
    for (outcome, n) in [("removed", 2), ("unknown_removed", 0)] {
        let line = format!("kv_indexer_blocks_total{{outcome=\"{outcome}\"}} {n}");
        assert!(metrics.lines().any(|l| l == line), "no `{line}` in {metrics}");
    }
}

#[test]
fn an_engine_restarted_while_down_that_published_past_the_watermark_leaves_no_stale_block() {
    // As above, but the new process has published more batches than the
    // old one had when the daemon stopped: the ring fill from the saved
    // watermark + 1 gets the new process's batches, and nothing steps back.
    let dir = TempDir::new("engine-restart-past");
    let mut p = engine(9, None);
    let dir_arg = dir.arg();
    let mut a = Daemon::start(&args(None, &dir_arg));
    register(&a, 1, &p, "m", "default");
    assert!(p.wait_subscribed(1));
    history(&mut p, 5);
    assert!(converges(&a, KEY, 1, 0, &p));
    let old: Vec<u64> = held(&dump(&a), KEY, 1, 0).iter().flatten().copied().collect();
    assert!(!old.is_empty());
    stop(&mut a);

    // A new process on the same port: seq from 0, empty cache; it
    // publishes 21 batches (past the old watermark, 5) while the daemon is down.
    // Stores only: a clear among them would hide the old blocks.
    p.restart(true);
    for _ in 0..21 {
        let store = p.new_store(StorageTier::Device, None, 2);
        p.publish(vec![store]);
    }
    let b = Daemon::start(&args(None, &dir_arg));
    assert!(wait_until(|| b.get("/health").0 == 200));
    assert!(p.wait_subscribed(1));
    let store = p.new_store(StorageTier::Device, None, 2);
    p.publish(vec![store]);
    let exact = converges(&b, KEY, 1, 0, &p);
    let now: Vec<u64> = held(&dump(&b), KEY, 1, 0).iter().flatten().copied().collect();
    let stale: Vec<&u64> = old.iter().filter(|h| now.contains(h)).collect();
    assert!(stale.is_empty(), "{} blocks of the old process survived: {stale:?}", stale.len());
    assert!(exact, "the daemon never matched the new process");
}

#[test]
fn a_workers_file_line_without_a_replay_endpoint_drops_the_one_the_snapshot_saved() {
    let dir = TempDir::new("file-replay");
    let dir_arg = dir.arg();
    let file = dir.0.join("workers.jsonl");
    let file_arg = file.to_str().unwrap().to_string();
    let mut p = engine(31, None);
    let endpoint = p.endpoint.clone();
    let line = |replay: Option<&str>| {
        let mut v = json!({"instance_id": 1, "endpoint": endpoint, "model_name": "m", "block_size": 4});
        if let Some(r) = replay {
            v["replay_endpoint"] = json!(r);
        }
        format!("{v}\n")
    };
    std::fs::write(&file, line(p.replay_endpoint.as_deref())).unwrap();
    let mut with_file = args(None, &dir_arg);
    with_file.extend(["--workers-file", &file_arg]);
    let mut a = Daemon::start(&with_file);
    assert!(p.wait_subscribed(1));
    history(&mut p, 5);
    assert!(converges(&a, KEY, 1, 0, &p));
    stop(&mut a);
    // The engine's replay port now belongs to nobody the file names: the
    // operator drops it from the line.
    std::fs::write(&file, line(None)).unwrap();
    let asked = p.replay_requests().len();
    let b = Daemon::start(&with_file);
    assert!(p.wait_subscribed(2));
    history(&mut p, 3);
    assert!(converges(&b, KEY, 1, 0, &p));
    let (_, workers) = b.get_json("/workers");
    assert_eq!(workers[0]["listeners"]["0"]["replay_endpoint"], Value::Null, "{workers}");
    assert_eq!(p.replay_requests().len(), asked, "the ring the file no longer names was asked");
}

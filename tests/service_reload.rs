//! `--workers-file` through the real binary and real engines: read at
//! start, and on SIGHUP reconciled with what is registered: exactly the
//! engines whose lines came or went (or changed) are registered or
//! unregistered, and their blocks come and go in queries, while unchanged
//! engines keep their listener and state. A bad file changes nothing and
//! the log names its line; a registration made over HTTP is never the
//! file's to change; a warm restart from a snapshot hands the file its
//! registrations back.

mod snapshot_support;
mod support;

use kv_indexer::StorageTier;
use serde_json::{json, Value};
use snapshot_support::TempDir;
use std::path::{Path, PathBuf};
use support::daemon::Daemon;
use support::publisher::{PublisherConfig, TestEvent, TestPublisher};
use support::wait_until;

fn engine(seed: u64) -> TestPublisher {
    TestPublisher::new(PublisherConfig { block_size: 4, seed, ..PublisherConfig::default() })
}

/// A workers-file line registering `p` as `instance` of model `m`.
fn line(instance: u64, p: &TestPublisher) -> String {
    json!({"instance_id": instance, "endpoint": p.endpoint, "model_name": "m", "block_size": 4}).to_string()
}

fn write(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

fn file_in(dir: &TempDir) -> PathBuf {
    dir.0.join("workers.jsonl")
}

fn hangup(d: &Daemon) {
    // SAFETY: kill(2) on the daemon this test started.
    assert_eq!(unsafe { libc::kill(d.pid() as i32, libc::SIGHUP) }, 0);
}

/// How many reads of the file ended with `outcome` so far.
fn reads(d: &Daemon, outcome: &str) -> u64 {
    let series = format!("kv_indexer_workers_file_reloads_total{{outcome=\"{outcome}\"}} ");
    let text = d.get("/metrics").1;
    text.lines().find_map(|l| l.strip_prefix(&series)?.parse::<f64>().ok()).unwrap_or(-1.0) as u64
}

/// Sends SIGHUP and waits until the read it causes ended with `outcome`.
fn reload(d: &Daemon, outcome: &str) {
    let before = reads(d, outcome);
    hangup(d);
    assert!(wait_until(|| reads(d, outcome) == before + 1), "no {outcome} read after SIGHUP");
}

/// Publishes a fresh 3-block chain; returns its local hashes.
fn publish_chain(p: &mut TestPublisher) -> Vec<u64> {
    let TestEvent::Stored { hashes, .. } = p.new_store(StorageTier::Device, None, 3) else { unreachable!() };
    let leaf = *hashes.last().unwrap();
    p.publish(vec![TestEvent::Stored { tier: StorageTier::Device, parent: None, hashes }]);
    p.chain_locals(leaf)
}

/// Tokens of `locals` `instance` holds (0 when none, or no index).
fn score(d: &Daemon, locals: &[u64], instance: u64) -> u64 {
    let (_, v) = d.post_json("/query_by_hash", json!({"block_hashes": locals, "model_name": "m"}));
    v["scores"][instance.to_string()]["0"].as_u64().unwrap_or(0)
}

fn instances(d: &Daemon) -> Vec<u64> {
    d.get_json("/workers").1.as_array().unwrap().iter().map(|w| w["instance_id"].as_u64().unwrap()).collect()
}

fn listener(d: &Daemon, instance: u64) -> Value {
    let workers = d.get_json("/workers").1;
    let w = workers.as_array().unwrap().iter().find(|w| w["instance_id"] == instance).cloned();
    w.map_or(Value::Null, |w| w["listeners"]["0"].clone())
}

#[test]
fn sighup_registers_and_unregisters_exactly_the_lines_that_changed() {
    let dir = TempDir::new("workers-file");
    let path = file_in(&dir);
    let (mut a, mut b, mut c) = (engine(1), engine(2), engine(3));
    write(&path, &["# engines of model m".into(), line(1, &a), String::new(), line(2, &b)]);
    let mut d = Daemon::start(&["--workers-file", path.to_str().unwrap()]);
    assert!(a.wait_subscribed(1) && b.wait_subscribed(1));
    assert_eq!((reads(&d, "applied"), instances(&d)), (1, vec![1, 2]), "read at start");
    let a_chains: Vec<Vec<u64>> = (0..3).map(|_| publish_chain(&mut a)).collect();
    let b_chain = publish_chain(&mut b);
    assert!(wait_until(|| a_chains.iter().all(|c| score(&d, c, 1) == 12) && score(&d, &b_chain, 2) == 12));
    assert!(wait_until(|| listener(&d, 1)["last_seq"] == 2));

    // b's line goes, c's comes, a's stays (moved, and a comment added).
    write(&path, &[line(3, &c), "  # a is unchanged".into(), format!("  {}  ", line(1, &a))]);
    reload(&d, "applied");
    assert!(
        d.wait_logged("2 entries: 1 registered, 1 unregistered (0 of them changed and registered anew), 1 unchanged")
    );
    assert_eq!(instances(&d), vec![1, 3]);
    assert_eq!(score(&d, &b_chain, 2), 0, "b's blocks went with its line");
    let a_now = listener(&d, 1);
    assert_eq!(
        (&a_now["last_seq"], &a_now["batches_received"]),
        (&json!(2), &json!(3)),
        "a's listener stayed: {a_now}"
    );
    assert!(a_chains.iter().all(|c| score(&d, c, 1) == 12), "a keeps its blocks");
    assert!(c.wait_subscribed(1));
    let c_chain = publish_chain(&mut c);
    assert!(wait_until(|| score(&d, &c_chain, 3) == 12), "c's blocks come");
    let a_next = publish_chain(&mut a);
    assert!(wait_until(|| listener(&d, 1)["last_seq"] == 3 && score(&d, &a_next, 1) == 12), "a's stream goes on");

    // a's line changes (another engine at another address): registered anew.
    let mut a2 = engine(11);
    write(&path, &[line(3, &c), line(1, &a2)]);
    reload(&d, "applied");
    assert!(d.wait_logged("1 registered, 1 unregistered (1 of them changed and registered anew), 1 unchanged"));
    assert!(a_chains.iter().all(|c| score(&d, c, 1) == 0), "the old engine's blocks are gone");
    assert!(a2.wait_subscribed(1));
    let a2_chain = publish_chain(&mut a2);
    assert!(wait_until(|| score(&d, &a2_chain, 1) == 12));
    assert_eq!(score(&d, &c_chain, 3), 12, "c untouched");

    // An /unregister may end a line's registration; the next read brings it back.
    assert_eq!(d.post_json("/unregister", json!({"instance_id": 3, "model_name": "m"})).0, 200);
    assert_eq!(instances(&d), vec![1]);
    reload(&d, "applied");
    assert_eq!(instances(&d), vec![1, 3]);
    assert_eq!(reads(&d, "refused") + reads(&d, "partial"), 0);
}

#[test]
fn a_bad_file_changes_nothing_and_the_log_names_its_line() {
    let dir = TempDir::new("workers-file-bad");
    let path = file_in(&dir);
    let (mut a, b, mut h) = (engine(1), engine(2), engine(5));
    let good = vec![line(1, &a)];
    write(&path, &good);
    let mut d = Daemon::start(&["--workers-file", path.to_str().unwrap()]);
    assert!(a.wait_subscribed(1));
    let chain = publish_chain(&mut a);
    assert!(wait_until(|| score(&d, &chain, 1) == 12));
    // Over HTTP, instance 5 is not the file's.
    let body = json!({"instance_id": 5, "endpoint": h.endpoint, "model_name": "m", "block_size": 4});
    assert_eq!(d.post_json("/register", body).0, 201);
    assert!(h.wait_subscribed(1));
    let before = instances(&d);
    let shown = |v: Value| -> Value { v.as_array().unwrap().iter().map(|w| w["endpoints"].clone()).collect() };
    let endpoints = shown(d.get_json("/workers").1);

    let name = path.display().to_string();
    let bad_block_size = line(2, &b).replace("\"block_size\":4", "\"block_size\":0");
    let cases: Vec<(Vec<String>, String)> = vec![
        (vec![line(2, &b), "{\"instance_id\": 3,".into()], format!("workers file {name} line 2: ")),
        (vec![line(2, &b), "# fine".into(), bad_block_size], format!("workers file {name} line 3: `block_size`")),
        (
            vec![line(1, &a), line(2, &b), line(1, &b)],
            "line 3: instance 1 dp_rank 0 is listed already on line 1".into(),
        ),
        (
            vec![line(1, &a), line(5, &b)],
            format!("workers file {name} line 2: instance 5 dp_rank 0 is registered already"),
        ),
    ];
    for (refused, (lines, message)) in cases.into_iter().enumerate() {
        write(&path, &lines);
        reload(&d, "refused");
        assert_eq!(reads(&d, "refused"), refused as u64 + 1);
        assert!(d.wait_logged(&message), "{message:?} not in {:?}", d.log());
        assert!(d.log().iter().any(|l| l.contains(&message) && l.ends_with("nothing changed")), "{:?}", d.log());
        assert_eq!(instances(&d), before, "nothing registered or unregistered: {lines:?}");
        assert_eq!(shown(d.get_json("/workers").1), endpoints);
        assert_eq!(score(&d, &chain, 1), 12, "a keeps its blocks");
        let last_ok = d.get("/metrics").1.contains("\nkv_indexer_workers_file_last_reload_successful 0\n");
        assert!(last_ok, "the failure shows");
    }
    std::fs::remove_file(&path).unwrap();
    reload(&d, "refused");
    assert!(d.wait_logged(&format!("workers file {name}: cannot read it")));
    assert_eq!(instances(&d), before);

    write(&path, &[line(1, &a), line(2, &b)]);
    reload(&d, "applied");
    assert_eq!(instances(&d), vec![1, 2, 5]);
    assert!(d.get("/metrics").1.contains("\nkv_indexer_workers_file_last_reload_successful 1\n"));
    assert!(d.get("/metrics").1.contains("\nkv_indexer_workers_file_entries 2\n"), "instance 5 is not the file's");
    assert_eq!(score(&d, &chain, 1), 12);
}

#[test]
fn a_bad_file_stops_the_start_and_names_its_line() {
    let dir = TempDir::new("workers-file-start");
    let path = file_in(&dir);
    let a = engine(1);
    write(&path, &[line(1, &a), "# next".into(), "not json".into()]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kv-indexer"))
        .args(["--port", "0", "--host", "127.0.0.1", "--no-pin", "--workers-file", path.to_str().unwrap()])
        .env_remove("NOTIFY_SOCKET")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("workers file {} line 3: ", path.display())), "{stderr}");
    assert!(!stderr.contains("listening on"), "{stderr}");
    // A key in --workers and in the file: one of them must own it.
    write(&path, &[line(1, &a)]);
    let workers = format!("1={}", a.endpoint);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kv-indexer"))
        .args(["--port", "0", "--host", "127.0.0.1", "--no-pin", "--workers-file", path.to_str().unwrap()])
        .args(["--block-size", "4", "--model-name", "m", "--workers", &workers])
        .env_remove("NOTIFY_SOCKET")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 1: instance 1 dp_rank 0 is in --workers too"), "{stderr}");
}

#[test]
fn a_warm_restart_gives_the_file_its_registrations_back() {
    let dir = TempDir::new("workers-file-warm");
    let path = file_in(&dir);
    let (mut a, mut b) = (engine(1), engine(2));
    write(&path, &[line(1, &a), line(2, &b)]);
    let args = ["--workers-file", path.to_str().unwrap(), "--snapshot-dir", &dir.arg(), "--snapshot-interval-s", "0"];
    let mut d = Daemon::start(&args);
    assert!(a.wait_subscribed(1) && b.wait_subscribed(1));
    let (a_chain, b_chain) = (publish_chain(&mut a), publish_chain(&mut b));
    assert!(wait_until(|| score(&d, &a_chain, 1) == 12 && score(&d, &b_chain, 2) == 12));
    assert_eq!(d.terminate(), Some(0));

    let d = Daemon::start(&args);
    assert_eq!(instances(&d), vec![1, 2]);
    assert_eq!((score(&d, &a_chain, 1), score(&d, &b_chain, 2)), (12, 12), "warm");
    assert!(d.get("/metrics").1.contains("\nkv_indexer_workers_file_entries 2\n"));
    // b's line goes: the restored registration is the file's to end.
    write(&path, &[line(1, &a)]);
    reload(&d, "applied");
    assert_eq!(instances(&d), vec![1]);
    assert_eq!((score(&d, &a_chain, 1), score(&d, &b_chain, 2)), (12, 0));
}

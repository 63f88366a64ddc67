//! A snapshot file that cannot be trusted is detected, named in one log
//! line, and ignored: the daemon starts empty (no index, no registration:
//! never half-loaded) and its next write replaces the file. A directory
//! another daemon holds is refused at startup.

mod snapshot_support;
mod support;

use serde_json::json;
use snapshot_support::{format, header_len, reseal, well_formed, TempDir, TRAILER_BYTES};
use std::process::{Command, Stdio};
use support::daemon::Daemon;
use support::publisher::{PublisherConfig, TestPublisher};
use support::wait_until;

/// A valid snapshot with one registration and some blocks.
fn valid_snapshot() -> Vec<u8> {
    let dir = TempDir::new("source");
    let mut p = TestPublisher::new(PublisherConfig { block_size: 4, seed: 11, ..PublisherConfig::default() });
    let workers = format!("1={}", p.endpoint);
    let dir_arg = dir.arg();
    let mut d = Daemon::start(&[
        "--block-size",
        "4",
        "--workers",
        &workers,
        "--snapshot-dir",
        &dir_arg,
        "--log-level",
        "debug",
    ]);
    assert!(p.wait_subscribed(1));
    let chain = p.new_store(kv_indexer::StorageTier::Device, None, 5);
    p.publish(vec![chain]);
    assert!(wait_until(|| d.get("/dump").1.contains("block_hash")));
    assert_eq!(d.terminate(), Some(0));
    // The writer logs what the snapshot holds (at debug).
    let written = d.log().iter().find(|l| l.contains("snapshot written (stop)")).cloned().unwrap_or_default();
    assert!(written.contains(" 5 pairs, 1 registrations, "), "{:?}", d.log());
    assert!(well_formed(&dir.file()));
    std::fs::read(dir.file()).unwrap()
}

#[test]
fn an_untrustworthy_file_is_reported_and_ignored_never_half_loaded() {
    let valid = valid_snapshot();
    let h = header_len(&valid);
    let mut flipped = valid.clone();
    *flipped.last_mut().unwrap() ^= 0x01;
    let mut future = valid.clone();
    future[8..12].copy_from_slice(&(format(&valid) + 1).to_le_bytes());
    let mut old = valid.clone();
    // Format 3 still loads; 2 is the newest no longer read.
    old[8..12].copy_from_slice(&2u32.to_le_bytes());
    // Checksum right, content wrong: the header, the registrations and
    // every event read, then the records' end is not one; nothing of what
    // was read may be applied.
    let mut last = valid.clone();
    let end = valid.len() - TRAILER_BYTES - 1;
    assert_eq!(last[end], 0, "the records' end");
    last[end] = 9;
    reseal(&mut last);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", Vec::new(), "the file is empty"),
        ("truncated", valid[..valid.len() / 2].to_vec(), "truncated"),
        ("events-cut", valid[..end].to_vec(), "truncated"),
        ("header-cut", valid[..h - 3].to_vec(), "truncated"),
        ("corrupt", flipped, "checksum mismatch"),
        ("foreign", b"{\"some\": \"json\"}\n".to_vec(), "not a kv-indexer snapshot"),
        ("future", future, "written by a newer kv-indexer"),
        ("old", old, "written by an older kv-indexer in format 2"),
        ("last", last, "unknown record kind 9"),
    ];
    for (name, bytes, phrase) in cases {
        let dir = TempDir::new(name);
        std::fs::write(dir.file(), &bytes).unwrap();
        // Only the resealed one has a checksum that agrees.
        assert_eq!(well_formed(&dir.file()), name == "last", "{name}");
        let mut d = Daemon::start(&["--snapshot-dir", &dir.arg(), "--snapshot-interval-s", "0"]);
        assert!(wait_until(|| d.get("/health").0 == 200), "{name}: ready");
        assert!(d.wait_logged("ignoring snapshot"), "{name}: no report in {:?}", d.log());
        let line = d.log().iter().find(|l| l.contains("ignoring snapshot")).cloned().unwrap();
        assert!(line.contains(" WARN ignoring") && line.contains(phrase), "{name}: {line}");
        assert!(line.contains(&dir.file().display().to_string()), "{name}: names the file: {line}");
        assert_eq!(d.log().iter().filter(|l| l.contains("snapshot")).count(), 1, "{name}: one line");
        assert_eq!(d.get_json("/dump").1, json!({}), "{name}: no index");
        assert_eq!(d.get_json("/workers").1, json!([]), "{name}: no registration");
        assert_eq!(d.terminate(), Some(0));
        let replaced = well_formed(&dir.file()) && std::fs::read(dir.file()).unwrap() != bytes;
        assert!(replaced, "{name}: the stop snapshot replaces the bad file");
    }
}

#[test]
fn a_file_bad_past_its_registrations_starts_the_command_line_as_without_one() {
    let valid = valid_snapshot();
    let mut cut = valid[..valid.len() - TRAILER_BYTES - 1].to_vec();
    cut.truncate(cut.len() - 3);
    let p = TestPublisher::new(PublisherConfig { block_size: 4, seed: 12, ..PublisherConfig::default() });
    let workers = format!("7={}", p.endpoint);
    for (name, bytes, flags, phrase) in [
        ("cut", cut, vec![], "truncated"),
        ("max-pairs", valid.clone(), vec!["--max-pairs", "4"], "more (block, worker) pairs than --max-pairs 4"),
    ] {
        let dir = TempDir::new(name);
        std::fs::write(dir.file(), &bytes).unwrap();
        let dir_arg = dir.arg();
        let mut args = vec!["--snapshot-dir", &dir_arg, "--snapshot-interval-s", "0", "--block-size", "4"];
        args.extend(["--workers", &workers]);
        args.extend(flags);
        let mut d = Daemon::start(&args);
        assert!(wait_until(|| d.get("/health").0 == 200), "{name}: ready");
        assert!(d.wait_logged("ignoring snapshot"), "{name}: no report in {:?}", d.log());
        let line = d.log().iter().find(|l| l.contains("ignoring snapshot")).cloned().unwrap();
        assert!(line.contains(phrase), "{name}: {line}");
        assert_eq!(d.log().iter().filter(|l| l.contains("snapshot")).count(), 1, "{name}: one line");
        // The command line's worker, and none of the snapshot's (instance 1).
        let (_, workers) = d.get_json("/workers");
        let ids: Vec<u64> = workers.as_array().unwrap().iter().map(|w| w["instance_id"].as_u64().unwrap()).collect();
        assert_eq!(ids, vec![7], "{name}: {workers}");
        assert!(!d.get("/dump").1.contains("block_hash"), "{name}: no block of the snapshot");
        assert_eq!(d.terminate(), Some(0));
    }
}

#[test]
fn a_directory_held_by_another_daemon_is_refused() {
    let dir = TempDir::new("locked");
    let first = Daemon::start(&["--snapshot-dir", &dir.arg()]);
    let out = Command::new(env!("CARGO_BIN_EXE_kv-indexer"))
        .args(["--port", "0", "--host", "127.0.0.1", "--no-pin", "--snapshot-dir", &dir.arg()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("another kv-indexer holds it"), "{stderr}");
    drop(first);
}

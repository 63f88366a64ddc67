//! The daemon's log lines as journald and an operator read them: a syslog
//! priority when stderr is the journal, a timestamp otherwise, JSON lines on
//! request; one line for an endpoint that cannot be reached (not one per
//! retry), one for a gap that recovered, one for a restart, and values
//! written as values, never as Rust's `Some(..)`.

mod support;

use kv_indexer::StorageTier;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::daemon::Daemon;
use support::publisher::{PublisherConfig, TestEvent, TestPublisher};
use support::wait_until;

/// Whether `line` starts with `2024-12-01T12:50:45.007Z `.
fn stamped(line: &str) -> bool {
    let b = line.as_bytes();
    let digits = |r: std::ops::Range<usize>| r.into_iter().all(|i| b.get(i).is_some_and(u8::is_ascii_digit));
    b.len() >= 25
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[19] == b'.'
        && digits(20..23)
        && &b[23..25] == b"Z "
}

/// Waits until some logged line contains `needle`.
fn wait_for_line(d: &mut Daemon, needle: &str) -> bool {
    wait_until(|| d.log().iter().any(|l| l.contains(needle)))
}

fn unreachable_endpoint() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("tcp://127.0.0.1:{port}")
}

fn publish_chain(p: &mut TestPublisher, blocks: usize) {
    let TestEvent::Stored { hashes, .. } = p.new_store(StorageTier::Device, None, blocks) else { unreachable!() };
    p.publish(vec![TestEvent::Stored { tier: StorageTier::Device, parent: None, hashes }]);
}

#[test]
fn stderr_that_is_the_journal_gets_syslog_priorities() {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills both descriptors, which we then own.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::fstat(fds[1], &mut st) }, 0);
    let mut child = Command::new(env!("CARGO_BIN_EXE_kv-indexer"))
        .args(["--port", "0", "--host", "127.0.0.1", "--no-pin"])
        .args(["--block-size", "4", "--workers", &format!("1={}", unreachable_endpoint())])
        .env("JOURNAL_STREAM", format!("{}:{}", st.st_dev, st.st_ino))
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::null())
        .stderr(Stdio::from(write))
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(std::fs::File::from(read)).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    // The listener may fail to connect before the API listens, or after.
    let seen = |lines: &[String], needle: &str| lines.iter().any(|l| l.contains(needle));
    while !(seen(&lines, "cannot connect") && seen(&lines, "listening on")) && Instant::now() < deadline {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(100)) {
            lines.push(l);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let priority = |needle: &str| lines.iter().find(|l| l.contains(needle)).map(|l| l[..3].to_string());
    assert_eq!(priority("listening on").as_deref(), Some("<6>"), "{lines:#?}");
    assert_eq!(priority("cannot connect").as_deref(), Some("<4>"), "{lines:#?}");
    for l in &lines {
        let ok = ["<3>", "<4>", "<6>", "<7>"].iter().any(|p| l.starts_with(p));
        assert!(ok && !stamped(&l[3..]), "a journal line has a priority and no timestamp: {l:?}");
    }
}

#[test]
fn elsewhere_every_line_has_a_timestamp_and_json_lines_parse() {
    let mut d = Daemon::start(&[]);
    assert!(d.log().iter().all(|l| stamped(l)), "{:?}", d.log());
    let _ = d.terminate();
    assert!(wait_for_line(&mut d, " INFO stopped"), "{:?}", d.log());
    assert!(d.log().iter().all(|l| stamped(l)), "{:?}", d.log());

    let mut d = Daemon::start(&["--log-format", "json"]);
    let _ = d.terminate();
    // The last lines may still be on their way from the pipe.
    assert!(wait_for_line(&mut d, "\"msg\":\"stopped\""), "{:?}", d.log());
    for l in d.log() {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}"));
        assert!(stamped(&format!("{} ", v["ts"].as_str().unwrap())), "{l}");
        assert!(["error", "warn", "info", "debug"].contains(&v["level"].as_str().unwrap()), "{l}");
        assert!(v["msg"].is_string(), "{l}");
    }
}

#[test]
fn an_unreachable_endpoint_is_one_warning_not_one_per_retry() {
    let mut d = Daemon::start(&[]);
    let endpoint = unreachable_endpoint();
    let body = json!({"instance_id": 1, "endpoint": endpoint, "model_name": "m", "block_size": 4});
    assert_eq!(d.post_json("/register", body).0, 201);
    let needle = format!("cannot connect to {endpoint}");
    assert!(wait_for_line(&mut d, &needle), "{:?}", d.log());
    // The listener retries every 100 ms or so meanwhile; the line stays one.
    std::thread::sleep(Duration::from_millis(1_500));
    let n = d.log().iter().filter(|l| l.contains(&needle)).count();
    assert_eq!(n, 1, "{:?}", d.log());
    assert!(d.log().iter().all(|l| l.contains("WARN") || !l.contains(&needle)));
}

#[test]
fn a_recovered_gap_and_a_restart_are_logged_with_plain_numbers() {
    let mut d = Daemon::start(&[]);
    let mut p = TestPublisher::new(PublisherConfig { block_size: 4, ..PublisherConfig::default() });
    let body = json!({"instance_id": 1, "endpoint": p.endpoint, "replay_endpoint": p.replay_endpoint,
                      "model_name": "m", "block_size": 4});
    assert_eq!(d.post_json("/register", body).0, 201);
    assert!(p.wait_subscribed(1));
    publish_chain(&mut p, 2);
    p.lose_next(2);
    publish_chain(&mut p, 2);
    publish_chain(&mut p, 2);
    publish_chain(&mut p, 2);
    assert!(wait_for_line(&mut d, "gap 1..3 in the stream of"), "{:?}", d.log());
    let line = d.log().iter().find(|l| l.contains("gap 1..3")).unwrap().clone();
    assert!(line.contains(" INFO ") && line.contains("recovered: 2 batches replayed from"), "{line}");

    // The engine restarts: seq 0 again after 3.
    p.restart(false);
    publish_chain(&mut p, 1);
    assert!(wait_for_line(&mut d, "restarted (seq 0 after 3)"), "{:?}", d.log());
    let _ = d.terminate();
    assert!(wait_for_line(&mut d, " INFO stopped"), "{:?}", d.log());
    assert!(d.log().iter().all(|l| !l.contains("Some(") && !l.contains("None")), "{:?}", d.log());
}

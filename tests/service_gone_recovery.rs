//! `--engine-gone-s` while the ready gate is closed: a listener whose
//! engine never answers clears its workers once its deadline passes,
//! even during startup recovery, and a peer's dump applied after that
//! clear puts the dead engine's blocks back. Nothing clears them again
//! while the engine stays away.

mod support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, OnceLock};

use support::daemon::{request, Daemon};
use support::fake_peer::dump_of;
use support::wait_until;

/// The daemon's `kv_indexer_engine_gone_clears_total`.
fn gone_clears(base: &str) -> u64 {
    let (_, text) = request("GET", &format!("{base}/metrics"), None);
    let line = text.lines().find(|l| l.starts_with("kv_indexer_engine_gone_clears_total "));
    line.and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) as u64
}

/// A peer that answers `/dump` with `body` only once the daemon at `base`
/// has counted an engine-gone clear: the order the race needs, made sure.
fn peer_after_gone_clear(base: Arc<OnceLock<String>>, body: Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let cleared = wait_until(|| base.get().is_some_and(|b| gone_clears(b) >= 1));
            assert!(cleared, "the daemon never cleared the dead engine's worker");
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(&body);
        }
    });
    url
}

/// Blocks the daemon lists for `instance`, over every index.
fn blocks_of(d: &Daemon, instance: u64) -> usize {
    let dump = d.dump();
    let indexes = dump.as_object().unwrap().values();
    let events = indexes.flat_map(|ix| ix["events"].as_array().unwrap().iter());
    let of = events.filter(|e| e["worker_id"] == instance);
    of.map(|e| e["event"]["data"]["stored"]["blocks"].as_array().map_or(0, Vec::len)).sum()
}

#[test]
fn a_dead_engines_blocks_from_a_peer_dump_are_cleared_after_recovery() {
    // Nothing listens here: the engine is dead from the start.
    let dead = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let base = Arc::new(OnceLock::new());
    let peer = peer_after_gone_clear(base.clone(), dump_of("m", 1, 3));
    let workers = format!("1=tcp://{dead}");
    let args = [
        "--model-name",
        "m",
        "--block-size",
        "4",
        "--workers",
        &workers,
        "--peers",
        &peer,
        "--slow-joiner-ms",
        "0",
        "--engine-gone-s",
        "1",
        "--heartbeat-ms",
        "200",
    ];
    let d = Daemon::start(&args);
    base.set(d.base.clone()).unwrap();
    assert!(wait_until(|| d.get("/health").0 == 200), "the daemon never finished recovering");
    assert_eq!(gone_clears(&d.base), 1);
    // The engine has been unreachable for more than --engine-gone-s, and
    // stays so: its worker should list nothing.
    let listed = wait_until(|| blocks_of(&d, 1) == 0);
    assert!(listed, "worker 1 still lists {} blocks of an engine gone for good", blocks_of(&d, 1));
}

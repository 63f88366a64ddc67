//! What the daemon tells systemd (`Type=notify`), read from a real notify
//! socket: it extends the start timeout while it recovers, says READY=1
//! once it serves, and reports the worker gate in STATUS= without holding
//! READY=1 back for it (an engine loading weights for minutes must not make
//! systemd kill the daemon at TimeoutStartSec).

mod support;

use serde_json::json;
use std::os::unix::net::UnixDatagram;
use std::time::Duration;
use support::daemon::Daemon;

fn next(rx: &UnixDatagram) -> String {
    let mut buf = [0u8; 512];
    let n = rx.recv(&mut buf).expect("a notify datagram within the timeout");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn start_timeout_is_extended_then_ready_and_the_worker_gate_is_a_status() {
    let path = std::env::temp_dir().join(format!("kv-indexer-notify-test-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let rx = UnixDatagram::bind(&path).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let dead_peer = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let d = Daemon::start_env(
        &["--peers", &format!("http://127.0.0.1:{dead_peer}"), "--slow-joiner-ms", "300"],
        &[("NOTIFY_SOCKET", path.to_str().unwrap()), ("KV_INDEXER_MIN_INITIAL_WORKERS", "1")],
    );
    assert_eq!(next(&rx), "EXTEND_TIMEOUT_USEC=30000000\nSTATUS=starting");
    assert_eq!(next(&rx), "READY=1\nSTATUS=waiting for workers: 0 of 1 registered");
    assert_eq!(d.get("/health").0, 503);
    let body = json!({"instance_id": 1, "endpoint": "tcp://127.0.0.1:1", "model_name": "m", "block_size": 4});
    assert_eq!(d.post_json("/register", body).0, 201);
    assert_eq!(next(&rx), "STATUS=ready");
    assert_eq!(d.get("/health").0, 200);
    drop(d);
    std::fs::remove_file(&path).unwrap();
}

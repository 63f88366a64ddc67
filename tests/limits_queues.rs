//! Bounds on what the control plane can make the daemon keep: registered
//! peers (the registry's indexes: `src/registry/limits_tests.rs`).

mod support;

use serde_json::json;
use support::daemon::Daemon;

/// `peers::PEERS_MAX`, as docs/limits.md states it.
const PEERS_MAX: usize = 256;

#[test]
fn peers_stop_at_their_limit() {
    let d = Daemon::start(&[]);
    for i in 0..PEERS_MAX {
        let (status, v) = d.post_json("/register_peer", json!({"url": format!("http://127.0.0.1:{}", 1000 + i)}));
        assert_eq!(status, 201, "{v}");
    }
    let (status, v) = d.post_json("/register_peer", json!({"url": "http://127.0.0.1:9"}));
    assert_eq!(status, 409, "{v}");
    assert!(v["error"].as_str().unwrap().contains("deregister one"), "{v}");
    assert_eq!(d.get_json("/peers").1.as_array().unwrap().len(), PEERS_MAX);
    // A known one is still accepted (nothing to add), and room frees up.
    assert_eq!(d.post_json("/register_peer", json!({"url": "http://127.0.0.1:1000"})).0, 201);
    assert_eq!(d.post_json("/deregister_peer", json!({"url": "http://127.0.0.1:1000"})).0, 200);
    assert_eq!(d.post_json("/register_peer", json!({"url": "http://127.0.0.1:9"})).0, 201);
}

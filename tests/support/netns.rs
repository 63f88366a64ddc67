//! A private network for a test that must vanish a host the way the
//! network does: packets to it dropped, no reset, so that only the
//! daemon's TCP keepalive can tell. The test runs again in a network
//! namespace of its own (`unshare --net --map-root-user`, util-linux),
//! where it may change routes: every 127/8 address is local as usual, and
//! `vanish` drops what is sent to one of them or from it.

use std::process::Command;

/// Set inside the private network.
const INSIDE: &str = "KVI_PRIVATE_NETWORK";
/// The routing table whose only route drops everything.
const DROP_TABLE: &str = "100";

/// Call first: true inside the private network (set up, go on with the
/// test); false outside, once the test has run inside and passed there
/// (return then).
pub fn private_network(test: &str) -> bool {
    if std::env::var_os(INSIDE).is_some() {
        set_up();
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let status = Command::new("unshare")
        .args(["--net", "--map-root-user"])
        .arg(exe)
        .args([test, "--exact", "--nocapture", "--test-threads", "1"])
        .env(INSIDE, "1")
        .status()
        .expect("running unshare (util-linux) for a private network namespace");
    assert!(status.success(), "{test} failed in its private network: {status}");
    false
}

/// Whether this process runs in the private network.
pub fn inside() -> bool {
    std::env::var_os(INSIDE).is_some()
}

/// Drops (true) or delivers again (false) every packet sent to `addr`
/// or from it: a host whose network is gone neither hears nor answers.
pub fn vanish(addr: &str, on: bool) {
    assert!(inside(), "vanish needs the private network");
    let verb = if on { "add" } else { "del" };
    for way in ["to", "from"] {
        ip(&["rule", verb, "pref", "5", way, addr, "lookup", DROP_TABLE]);
    }
}

fn set_up() {
    ip(&["link", "set", "lo", "up"]);
    // The local table's rule moves behind the one `vanish` adds.
    ip(&["rule", "add", "pref", "10", "lookup", "local"]);
    ip(&["rule", "del", "pref", "0", "lookup", "local"]);
    ip(&["route", "add", "blackhole", "0.0.0.0/0", "table", DROP_TABLE]);
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip (iproute2)");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

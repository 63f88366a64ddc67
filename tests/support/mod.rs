//! Shared helpers for integration tests: a real ZMQ test publisher with a
//! replay buffer, a fault-injecting proxy, a TCP relay that can blackhole a
//! host (in a private network, as the network does), checks against ground truth, an exact model sink, a small
//! deterministic PRNG, and a bounded wait.
//! Each test binary uses a different subset.
#![allow(dead_code)]

pub mod daemon;
pub mod fake_peer;
pub mod fault_engine;
pub mod fault_proxy;
pub mod gate_sink;
pub mod harness;
pub mod http_gen;
pub mod index_sink;
pub mod model_sink;
pub mod netns;
pub mod prom_lint;
pub mod publisher;
pub mod rng;
pub mod tcp_relay;
pub mod truth_check;

use std::time::{Duration, Instant};

/// Generous bound for conditions that should hold within milliseconds;
/// only reached when something is broken.
pub const WAIT_MS: u64 = 20_000;

/// Polls `cond` until it holds or `WAIT_MS` passes; returns whether it held.
pub fn wait_until(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_millis(WAIT_MS);
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

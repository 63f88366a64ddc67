//! A daemon restarted with `--peers` under faults: it takes its state from
//! the first peer that answers `/dump` in full, holds exactly that before
//! any new batch arrives, then follows the engines and converges to the
//! same state as its peer. Peers that die in the middle of a dump (half a
//! body then a close, a hang past `--peer-timeout-ms`, an endless trickle)
//! are skipped whole: nothing of them is applied; the next peer is tried,
//! or the daemon starts empty and says so.
//!
//! Every engine has two proxies with their own faults, one per daemon.
//!
//! Soak: `KV_INDEXER_FAULT_ROUNDS=20 cargo test --release --test faults_recovery -- --nocapture`.

mod support;

use std::sync::atomic::Ordering;

use support::daemon::Daemon;
use support::fake_peer::{dump_of, Failure, FakePeer};
use support::fault_engine::{rounds, Engine, MODEL};
use support::fault_proxy::Faults;
use support::publisher::{Encoding, PublisherConfig};
use support::truth_check::{assert_exact, dump_facts, dump_list, report, truth_orphans};
use support::wait_until;

const FAULTS: Faults = Faults::new(10, 5, 5);
const ARGS: [&str; 2] = ["--replay-timeout-ms", "10000"];
/// The fake peers' worker: any block of it on a daemon came from a partial dump.
const FAKE_INSTANCE: u64 = 4_242;

fn engines(seed: u64) -> Vec<Engine> {
    (0..3u64)
        .map(|i| {
            let cfg = PublisherConfig {
                encoding: if i % 2 == 0 { Encoding::Tagged } else { Encoding::Positional },
                ring_capacity: Some(1_000 + rounds() * 200),
                seed: seed + i,
                ..PublisherConfig::default()
            };
            Engine::new(400 + i, cfg, FAULTS, 2)
        })
        .collect()
}

/// Random batches under faults, then faults off and every daemon settled.
fn run_faulty(engines: &mut [Engine], batches: usize, settled: &[&Daemon]) {
    engines.iter().for_each(|e| e.set_faults(FAULTS));
    for _ in 0..batches / 10 {
        engines.iter_mut().for_each(|e| e.workload(10));
    }
    engines.iter().for_each(Engine::stop_faults);
    engines.iter_mut().for_each(|e| e.settle(settled));
}

/// Starts a daemon recovering from `peers`, registers the engines on path
/// 1 and waits until it is ready.
fn start_recovering(peers: &[&str], engines: &[Engine]) -> Daemon {
    let peers = peers.join(",");
    let mut args = ARGS.to_vec();
    args.extend(["--peers", &peers, "--slow-joiner-ms", "100", "--peer-timeout-ms", "500"]);
    let b = Daemon::start(&args);
    engines.iter().for_each(|e| e.register(&b, 1));
    assert!(wait_until(|| b.get("/health").0 == 200), "never ready after recovery");
    b
}

#[test]
fn a_restarted_daemon_recovers_from_its_peer_and_converges_with_it() {
    let mut engines = engines(500);
    let a = Daemon::start(&ARGS);
    let b = Daemon::start(&ARGS);
    engines.iter().for_each(|e| e.register(&a, 0));
    engines.iter().for_each(|e| e.register(&b, 1));
    run_faulty(&mut engines, 100, &[&a, &b]);
    drop(b); // killed
    let mut checked = Default::default();
    for _ in 0..rounds() {
        run_faulty(&mut engines, 50, &[&a]);
        assert_exact(&a, &engines);
    }

    // Engines registered only after the checks: a ring fill from 0 laid
    // over the recovered state would make the dumps differ while it runs.
    let mut b = start_recovering(&[&a.base], &[]);
    assert!(b.wait_logged(&format!("recovered from peer {}", a.base)), "{:?}", b.log());
    // No batch reached it: what it holds came from the peer, in full,
    // orphans (blocks whose parent their worker no longer holds) included.
    assert_eq!(dump_facts(&b), dump_facts(&a), "the recovered state is the peer's");
    let orphans = truth_orphans(&engines);
    assert!(!orphans.is_empty(), "the engines hold orphans, so their recovery is checked");
    assert_eq!(dump_list(&b).orphans, orphans, "each orphan is placed where it hangs");
    engines.iter().for_each(|e| e.register(&b, 1));

    for _ in 0..rounds() {
        run_faulty(&mut engines, 60, &[&a, &b]);
        assert_exact(&a, &engines);
        checked = assert_exact(&b, &engines);
        assert_eq!(dump_facts(&a), dump_facts(&b), "peers agree");
    }
    report("a_restarted_daemon_recovers_from_its_peer", &engines, &checked, &b);
}

#[test]
fn a_peer_dying_mid_dump_is_skipped_whole_and_the_next_one_used() {
    let mut engines = engines(600);
    let a = Daemon::start(&ARGS);
    engines.iter().for_each(|e| e.register(&a, 0));
    run_faulty(&mut engines, 100, &[&a]);
    assert_exact(&a, &engines);

    let half = FakePeer::start(Failure::HalfBody, dump_of(MODEL, FAKE_INSTANCE, 200));
    let hang = FakePeer::start(Failure::Hang, dump_of(MODEL, FAKE_INSTANCE, 200));
    let mut b = start_recovering(&[&half.url, &hang.url, &a.base], &engines);
    for peer in [&half, &hang] {
        assert_eq!(peer.served.load(Ordering::Relaxed), 1, "{} was asked once", peer.url);
        assert!(b.wait_logged(&format!("recovery: peer {} failed", peer.url)), "{:?}", b.log());
    }
    assert!(b.wait_logged(&format!("recovered from peer {}", a.base)), "{:?}", b.log());
    let recovered = dump_facts(&b);
    assert!(recovered.iter().all(|f| f.0 != FAKE_INSTANCE), "part of a broken dump was applied");
    assert_eq!(recovered, dump_facts(&a));

    run_faulty(&mut engines, 60, &[&a, &b]);
    assert_exact(&a, &engines);
    let checked = assert_exact(&b, &engines);
    report("a_peer_dying_mid_dump_is_skipped_whole", &engines, &checked, &b);
}

#[test]
fn no_peer_answering_in_full_starts_empty_and_says_so() {
    let mut engines = engines(700);
    let a = Daemon::start(&ARGS);
    engines.iter().for_each(|e| e.register(&a, 0));
    run_faulty(&mut engines, 100, &[&a]);

    let body = dump_of(MODEL, FAKE_INSTANCE, 200);
    let half = FakePeer::start(Failure::HalfBody, body.clone());
    let hang = FakePeer::start(Failure::Hang, body.clone());
    let trickle = FakePeer::start(Failure::Trickle, body);
    let mut b = start_recovering(&[&half.url, &hang.url, &trickle.url], &engines);
    assert!(
        b.wait_logged("no peer gave a usable dump (3 tried; each one's reason is above); starting empty"),
        "{:?}",
        b.log()
    );
    // The engines' held batches may drain as soon as the gate opens; the
    // broken peers' instance must never show.
    let broken: Vec<_> = dump_facts(&b).into_iter().filter(|f| f.0 == FAKE_INSTANCE).collect();
    assert!(broken.is_empty(), "nothing of a broken dump was applied: {broken:?}");

    // The engines' rings still hold seq 0: replays rebuild everything.
    run_faulty(&mut engines, 60, &[&a, &b]);
    assert_exact(&a, &engines);
    let checked = assert_exact(&b, &engines);
    report("no_peer_answering_in_full_starts_empty", &engines, &checked, &b);
}

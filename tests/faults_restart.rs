//! Restarts under faults. An engine that restarts comes back with an empty
//! cache and seq 0: no block of its old process may survive, whether it
//! rebinds its socket (a new process: the daemon sees a reconnect) or keeps
//! it (nothing tells the restart but seq 0: on one connection a lost seq 0
//! looks like a run of duplicates to any seq-based rule, so that one batch
//! passes the proxy unharmed). A daemon that restarts without a peer starts
//! empty and rebuilds from the engines' replay rings.
//!
//! Soak: `KV_INDEXER_FAULT_ROUNDS=20 cargo test --release --test faults_restart -- --nocapture`.

mod support;

use std::collections::BTreeSet;

use kv_indexer::StorageTier;
use support::daemon::Daemon;
use support::fault_engine::{rounds, Engine};
use support::fault_proxy::Faults;
use support::publisher::{Encoding, PublisherConfig, ReplyForm};
use support::truth_check::{assert_exact, assert_no_stale, counters, dump_facts_of, metric, report, Fact};
use support::wait_until;

const FAULTS: Faults = Faults::new(10, 5, 5);

fn engine(instance: u64, seed: u64, ring_capacity: Option<usize>, encoding: Encoding) -> Engine {
    let cfg = PublisherConfig {
        encoding,
        ring_capacity,
        reply_form: if seed.is_multiple_of(2) { ReplyForm::FourFrames } else { ReplyForm::ThreeFrames },
        seed,
        ..PublisherConfig::default()
    };
    Engine::new(instance, cfg, FAULTS, 1)
}

fn settle_all(d: &Daemon, engines: &mut [Engine]) {
    engines.iter().for_each(Engine::stop_faults);
    engines.iter_mut().for_each(|e| e.settle(&[d]));
}

#[test]
fn engine_restarts_mid_stream_leave_no_stale_block() {
    let d = Daemon::start(&["--replay-timeout-ms", "10000"]);
    // Same socket with replay; new socket with replay; new socket without.
    let mut engines = vec![
        engine(300, 80, Some(2_000), Encoding::Tagged),
        engine(301, 81, Some(2_000), Encoding::Positional),
        engine(302, 82, None, Encoding::Tagged),
    ];
    let rebind = [false, true, true];
    engines.iter().for_each(|e| e.register(&d, 0));
    let mut checked = Default::default();
    let mut old_listed = 0;
    for _ in 0..2 * rounds() {
        engines.iter().for_each(|e| e.set_faults(FAULTS));
        engines.iter_mut().for_each(|e| e.workload(80));
        settle_all(&d, &mut engines);
        let before: BTreeSet<Fact> = dump_facts_of(&d, &engines);
        for (e, &rebind) in engines.iter_mut().zip(&rebind) {
            e.set_faults(FAULTS);
            e.restart(rebind, &[true]);
        }
        engines.iter_mut().for_each(|e| e.workload(40));
        settle_all(&d, &mut engines);
        // Hashes are never reused, so any block listed before is the old process's.
        let after = dump_facts_of(&d, &engines);
        old_listed += before.intersection(&after).count();
        assert_eq!(old_listed, 0, "blocks of old processes survived their restart");
        assert_exact(&d, &engines[..2]);
        assert_no_stale(&d, &engines[2..]);
        engines[2].republish();
        engines[2].settle(&[&d]);
        checked = assert_exact(&d, &engines);
    }
    let injected: u64 = engines.iter().map(|e| e.restarts).sum();
    let c = counters(&d);
    assert!(c["restarts"].as_u64() >= Some(injected), "every restart seen: {c}");
    report("engine_restarts_mid_stream", &engines, &checked, &d);
}

/// Publishes `n` batches that only store (no remove or clear could hide a
/// surviving old block).
fn stores_only(e: &mut Engine, n: usize) {
    for _ in 0..n {
        let store = e.publisher.new_store(StorageTier::Device, None, 2);
        e.publish(vec![store]);
    }
}

#[test]
fn a_young_engine_restarted_before_the_daemon_reconnects_leaves_no_stale_block() {
    // The old process published 4 batches; the new one publishes 10 while
    // the daemon is not connected yet (ZMQ reconnects with a backoff), so
    // the first batch the daemon sees, seq 10, lies *above* the old
    // watermark: only the reconnect says a new process sent it.
    let d = Daemon::start(&["--replay-timeout-ms", "10000"]);
    let mut engines = vec![engine(310, 90, Some(1_000), Encoding::Tagged)];
    engines[0].set_faults(Faults::NONE);
    engines[0].register(&d, 0);
    stores_only(&mut engines[0], 3);
    engines[0].settle(&[&d]);
    let before = dump_facts_of(&d, &engines);
    assert_eq!(before.len(), 7);

    let e = &mut engines[0];
    e.quiesce();
    e.restarts += 1;
    e.publisher.restart(true);
    assert!(e.publisher.wait_subscribed(1));
    e.set_faults(Faults::BLACKOUT);
    stores_only(e, 10);
    e.quiesce();
    e.proxies[0].rebind();
    e.set_faults(FAULTS);
    assert!(e.proxies[0].wait_subscribed(1), "daemon never reconnected");
    stores_only(e, 5);
    settle_all(&d, &mut engines);
    let after = dump_facts_of(&d, &engines);
    let old: Vec<&Fact> = before.intersection(&after).collect();
    assert!(old.is_empty(), "{} blocks of the old process survived: {old:?}", old.len());
    let checked = assert_exact(&d, &engines);
    report("a_young_engine_restarted_before_the_daemon_reconnects", &engines, &checked, &d);
}

/// Publishes under faults to `d`, restarts it (SIGKILL, then a new binary),
/// publishes more; returns the new daemon and engines, settled.
fn restart_daemon_midway(ring_capacity: usize, seed: u64) -> (Daemon, Vec<Engine>) {
    let args = ["--replay-timeout-ms", "10000"];
    let mut engines: Vec<Engine> = (0..2)
        .map(|i| {
            let encoding = if i == 0 { Encoding::Tagged } else { Encoding::Positional };
            engine(320 + i, seed + i, Some(ring_capacity), encoding)
        })
        .collect();
    let d = Daemon::start(&args);
    engines.iter().for_each(|e| e.register(&d, 0));
    engines.iter_mut().for_each(|e| e.workload(100));
    drop(d); // killed: no clean stop
             // Published while no daemon runs.
    engines.iter_mut().for_each(|e| e.workload(50));
    engines.iter().for_each(Engine::quiesce);
    let d = Daemon::start(&args);
    engines.iter().for_each(|e| e.register(&d, 0));
    engines.iter_mut().for_each(|e| e.workload(50));
    settle_all(&d, &mut engines);
    (d, engines)
}

#[test]
fn a_restarted_daemon_without_peers_replays_from_zero_and_converges() {
    let (d, engines) = restart_daemon_midway(1_000, 100);
    for e in &engines {
        assert!(e.publisher.replay_requests().contains(&0), "the new daemon asked for the whole stream");
    }
    let checked = assert_exact(&d, &engines);
    let c = counters(&d);
    assert_eq!(c["batches_missed_at_join"], 0, "{c}");
    report("a_restarted_daemon_without_peers_replays_from_zero", &engines, &checked, &d);
}

#[test]
fn a_restarted_daemon_whose_engines_rolled_past_seq_zero_never_holds_a_stale_block() {
    // The rings keep 16 batches; the new daemon joins near seq 150. What it
    // cannot know: every block stored by the batches that left the rings
    // and not announced since. Those blocks, and the blocks stored under
    // them later (refused: unknown parent), stay missing until the engines
    // announce them again. It starts empty, so nothing it holds can be stale.
    let (d, mut engines) = restart_daemon_midway(16, 110);
    let (listed, missing) = assert_no_stale(&d, &engines);
    let c = counters(&d);
    assert!(c["batches_missed_at_join"].as_u64() > Some(0), "{c}");
    eprintln!("after joining late: {listed} blocks listed, none stale, {missing} missing");
    engines.iter_mut().for_each(Engine::republish);
    engines.iter_mut().for_each(|e| e.settle(&[&d]));
    let checked = assert_exact(&d, &engines);
    report("a_restarted_daemon_whose_engines_rolled_past_seq_zero", &engines, &checked, &d);
}

#[test]
fn a_restarted_daemon_replays_a_long_history_without_holes() {
    // Engines buffer 10,000 batches by default: a daemon that joins late
    // asks for all of them at once (its ring fill on connecting, the engine
    // idle), far more than a socket's default high-water mark (1,000
    // messages), and must get them all.
    const HISTORY: usize = 10_000;
    let args = ["--replay-timeout-ms", "10000"];
    let mut engines = vec![engine(330, 120, Some(HISTORY + 100), Encoding::Tagged)];
    engines[0].set_faults(Faults::NONE);
    stores_only(&mut engines[0], HISTORY);
    engines[0].quiesce();
    let d = Daemon::start(&args);
    engines[0].register(&d, 0);
    // No live batch yet: the fill alone brings the whole history.
    let checked = assert_exact(&d, &engines);
    let requests = engines[0].publisher.replay_requests();
    eprintln!("a long history: {} replay requests from {:?}", requests.len(), requests);
    // Counted when the fill ends, which may be after its last batch showed
    // (replies lost at the tail are asked for again first).
    let filled = || metric(&d, "kv_indexer_batches_filled_total");
    assert!(wait_until(|| filled() == HISTORY as u64), "filled {}", filled());
    let c = counters(&d);
    assert_eq!((c["batches_replayed"].as_u64(), c["resyncs"].as_u64()), (Some(0), Some(0)), "{c}");
    engines[0].settle(&[&d]);
    report("a_restarted_daemon_replays_a_long_history", &engines, &checked, &d);
}

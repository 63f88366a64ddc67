//! Gaps the daemon cannot fill: older than the engine's replay ring, or
//! with no replay endpoint at all. The worker must then be resynced
//! (cleared, counted in `kv_indexer_resyncs_total`) rather than kept with
//! blocks the lost batches may have evicted: once later events arrive it
//! lists only blocks its engine holds (a subset; stores whose parent was
//! lost are refused), and it converges exactly once the engine announces
//! its blocks again.
//!
//! Soak: `KV_INDEXER_FAULT_ROUNDS=20 cargo test --release --test faults_resync -- --nocapture`.

mod support;

use support::daemon::Daemon;
use support::fault_engine::{rounds, Engine};
use support::fault_proxy::{FaultStats, Faults};
use support::publisher::{Encoding, PublisherConfig};
use support::truth_check::{assert_exact, assert_no_stale, counters, report};

const FAULTS: Faults = Faults::new(10, 5, 5);

fn engines(count: u64, ring_capacity: Option<usize>, seed: u64) -> Vec<Engine> {
    (0..count)
        .map(|i| {
            let cfg = PublisherConfig {
                encoding: if i % 2 == 0 { Encoding::Tagged } else { Encoding::Positional },
                ring_capacity,
                seed: seed + i,
                ..PublisherConfig::default()
            };
            Engine::new(200 + i, cfg, FAULTS, 1)
        })
        .collect()
}

/// Faults off, every trailing gap found; then the worker may only miss blocks.
fn settle_no_stale(d: &Daemon, engines: &mut [Engine]) -> (usize, usize) {
    engines.iter().for_each(Engine::stop_faults);
    engines.iter_mut().for_each(|e| e.settle(&[d]));
    assert_no_stale(d, engines)
}

/// The engines announce their blocks again; the daemon must then be exact.
fn republish_exact(d: &Daemon, engines: &mut [Engine]) -> support::truth_check::Checked {
    engines.iter_mut().for_each(Engine::republish);
    engines.iter_mut().for_each(|e| e.settle(&[d]));
    assert_exact(d, engines)
}

#[test]
fn a_gap_older_than_the_ring_resyncs_and_never_leaves_stale_blocks() {
    let d = Daemon::start(&["--replay-timeout-ms", "10000"]);
    // A ring of 8 batches: a blackout of 20 cannot be replayed.
    let mut engines = engines(2, Some(8), 60);
    engines.iter().for_each(|e| e.register(&d, 0));
    let mut blackouts = 0u64;
    let mut checked = Default::default();
    for round in 0..3 * rounds() {
        engines.iter().for_each(|e| e.set_faults(FAULTS));
        engines.iter_mut().for_each(|e| e.workload(60));
        // Engine 0 loses 20 batches (the ring keeps 8); engine 1 loses 3
        // and its ring is emptied (the replay returns nothing asked for).
        for (i, e) in engines.iter_mut().enumerate() {
            e.quiesce();
            e.set_faults(Faults::BLACKOUT);
            e.workload(if i == 0 { 20 } else { 3 });
            if i == 1 {
                e.publisher.drop_buffer();
            }
            e.quiesce();
            e.set_faults(FAULTS);
            blackouts += 1;
        }
        engines.iter_mut().for_each(|e| e.workload(40));
        let (listed, missing) = settle_no_stale(&d, &mut engines);
        let resyncs = counters(&d)["resyncs"].as_u64().unwrap();
        assert!(resyncs >= blackouts, "round {round}: {resyncs} resyncs after {blackouts} unreplayable gaps");
        eprintln!("round {round}: after the resyncs, {listed} blocks listed, none stale, {missing} still missing");
        checked = republish_exact(&d, &mut engines);
    }
    let c = counters(&d);
    assert!(c["batches_lost"].as_u64() > Some(0) && c["replays_partial"].as_u64() > Some(0), "{c}");
    report("a_gap_older_than_the_ring_resyncs", &engines, &checked, &d);
}

#[test]
fn gaps_without_a_replay_endpoint_are_counted_and_resynced() {
    let d = Daemon::start(&[]);
    let mut engines = engines(2, None, 70);
    engines.iter().for_each(|e| e.register(&d, 0));
    let mut checked = Default::default();
    for round in 0..rounds() {
        engines.iter().for_each(|e| e.set_faults(FAULTS));
        for _ in 0..20 {
            engines.iter_mut().for_each(|e| e.workload(10));
        }
        let (listed, missing) = settle_no_stale(&d, &mut engines);
        eprintln!("round {round}: after the resyncs, {listed} blocks listed, none stale, {missing} still missing");
        checked = republish_exact(&d, &mut engines);
    }
    let mut s = FaultStats::default();
    engines.iter().for_each(|e| s += e.stats());
    let c = counters(&d);
    let given_up = c["batches_lost"].as_u64().unwrap() + c["batches_missed_at_join"].as_u64().unwrap();
    assert!(given_up >= s.dropped, "every dropped batch is counted as lost: {c} {s:?}");
    assert!(c["resyncs"].as_u64() > Some(0) && c["replays_ok"].as_u64() == Some(0), "{c}");
    report("gaps_without_a_replay_endpoint", &engines, &checked, &d);
}

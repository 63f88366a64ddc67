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

use serde_json::{json, Value};
use support::daemon::Daemon;
use support::fault_engine::{rounds, Engine};
use support::fault_proxy::{FaultStats, Faults};
use support::publisher::{Encoding, PublisherConfig};
use support::truth_check::{assert_exact, assert_no_stale, counters, report, COUNTERS};

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

/// How much each counter of `after` grew since `before`.
fn grown(before: &Value, after: &Value) -> Value {
    let mut out = json!({});
    for (name, v) in after.as_object().unwrap() {
        out[name] = (v.as_u64().unwrap() - before[name].as_u64().unwrap()).into();
    }
    out
}

/// Engine `e` loses its next `lost` batches (with `empty_ring`, its ring is
/// emptied too), then publishes one clean batch and waits until `d` shows
/// it. The engine publishes nothing else meanwhile, so when the daemon
/// asks for the gap the ring holds exactly what the blackout left in it,
/// whatever the timing. Returns how the daemon's counters grew.
fn blackout(d: &Daemon, e: &mut Engine, lost: usize, empty_ring: bool) -> Value {
    let before = counters(d);
    e.set_faults(Faults::BLACKOUT);
    e.workload(lost);
    if empty_ring {
        e.publisher.drop_buffer();
    }
    e.stop_faults();
    e.settle(&[d]);
    grown(&before, &counters(d))
}

/// `changes`, with every other counter unchanged.
fn only(changes: Value) -> Value {
    let mut want = json!({});
    for n in COUNTERS {
        want[n] = changes.get(n).cloned().unwrap_or(json!(0));
    }
    want
}

#[test]
fn a_gap_older_than_the_ring_resyncs_and_never_leaves_stale_blocks() {
    let d = Daemon::start(&["--replay-timeout-ms", "10000"]);
    // Rings of 8 batches: a blackout of 20 cannot be replayed whole.
    let mut engines = engines(2, Some(8), 60);
    engines.iter().for_each(|e| e.register(&d, 0));
    let mut checked = Default::default();
    for round in 0..3 * rounds() {
        engines.iter().for_each(|e| e.set_faults(FAULTS));
        engines.iter_mut().for_each(|e| e.workload(60));
        // Every batch so far dealt with: the blackouts start from a known seq.
        settle_no_stale(&d, &mut engines);
        // Engine 0 loses 20 batches; its ring then holds the last 7 of them
        // and the clean batch that reveals the gap: 7 are replayed, 13 lost.
        let partial = blackout(&d, &mut engines[0], 20, false);
        let want = only(json!({"gaps_detected": 1, "replays_partial": 1, "batches_replayed": 7,
                               "batches_lost": 13, "resyncs": 1}));
        assert_eq!(partial, want, "round {round}: a gap of 20 with a ring of 8");
        // Engine 1 loses 3 and its ring is emptied: the replay returns none.
        let failed = blackout(&d, &mut engines[1], 3, true);
        let want = only(json!({"gaps_detected": 1, "replays_failed": 1, "batches_lost": 3, "resyncs": 1}));
        assert_eq!(failed, want, "round {round}: a gap of 3 with an emptied ring");
        let (listed, missing) = assert_no_stale(&d, &engines);
        eprintln!("round {round}: after the resyncs, {listed} blocks listed, none stale, {missing} still missing");
        // More faults on top of the resynced workers, then convergence.
        engines.iter().for_each(|e| e.set_faults(FAULTS));
        engines.iter_mut().for_each(|e| e.workload(40));
        settle_no_stale(&d, &mut engines);
        checked = republish_exact(&d, &mut engines);
    }
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

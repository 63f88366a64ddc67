//! Transport faults between engines and the real daemon, with replay
//! endpoints: a fault proxy drops, duplicates and reorders 20% of the
//! batches of four engines (both encodings, both replay reply forms, every
//! hash form) under a random workload over all four tiers. Once the faults
//! stop, every gap must have been replayed: the daemon's dump equals the
//! engines' ground truth block for block, every chain answers its exact
//! depth, and nothing was given up as lost.
//!
//! Each round ends with the check, then the faults resume.
//!
//! Soak: `KV_INDEXER_FAULT_ROUNDS=50 cargo test --release --test faults_replay -- --nocapture`
//! runs 50 rounds (the figures are printed).

mod support;

use support::daemon::Daemon;
use support::fault_engine::{rounds, Engine};
use support::fault_proxy::{FaultStats, Faults};
use support::publisher::{Encoding, HashForm, PublisherConfig, ReplyForm};
use support::truth_check::{assert_exact, counters, report};

/// Batches each engine publishes per round.
const BATCHES_PER_ROUND: usize = 200;
/// Batches an engine publishes before the next engine's turn.
const BURST: usize = 10;

#[test]
fn drops_duplicates_and_reorders_are_replayed_to_an_exact_index() {
    let rounds = rounds();
    let d = Daemon::start(&["--replay-timeout-ms", "10000"]);
    // The ring outlives the run: every gap is still buffered when asked for.
    let ring = (rounds * BATCHES_PER_ROUND + 100).max(1_000);
    let mut engines: Vec<Engine> = (0..4u64)
        .map(|i| {
            let cfg = PublisherConfig {
                encoding: if i % 2 == 0 { Encoding::Tagged } else { Encoding::Positional },
                reply_form: if i < 2 { ReplyForm::FourFrames } else { ReplyForm::ThreeFrames },
                hash_form: HashForm::Mixed,
                ring_capacity: Some(ring),
                seed: 40 + i,
                ..PublisherConfig::default()
            };
            Engine::new(100 + i, cfg, Faults::new(10, 5, 5), 1)
        })
        .collect();
    engines.iter().for_each(|e| e.register(&d, 0));

    let mut checked = Default::default();
    for _ in 0..rounds {
        engines.iter().for_each(|e| e.set_faults(Faults::new(10, 5, 5)));
        for _ in 0..BATCHES_PER_ROUND / BURST {
            engines.iter_mut().for_each(|e| e.workload(BURST));
        }
        engines.iter().for_each(Engine::stop_faults);
        engines.iter_mut().for_each(|e| e.settle(&[&d]));
        checked = assert_exact(&d, &engines);
    }
    let mut s = FaultStats::default();
    engines.iter().for_each(|e| s += e.stats());
    assert!(s.dropped > 0 && s.duplicated > 0 && s.reordered > 0, "every fault was injected: {s:?}");
    let c = counters(&d);
    assert_eq!((c["batches_lost"].as_u64(), c["resyncs"].as_u64()), (Some(0), Some(0)), "nothing given up: {c}");
    assert!(c["gaps_detected"].as_u64() > Some(0) && c["replays_ok"].as_u64() > Some(0), "{c}");
    assert!(c["duplicates_dropped"].as_u64() > Some(0), "{c}");
    report("drops_duplicates_and_reorders_are_replayed", &engines, &checked, &d);
}

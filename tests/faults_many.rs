//! Sixteen engines at once, each behind its own fault proxy (20% of
//! batches dropped, duplicated or reordered): both encodings, both reply
//! forms, every hash form; twelve with a replay ring, four without; a few
//! engines stalled (their proxy paused) while the others run, a few
//! restarted. No engine's faults may leak into another's worker, and once
//! the faults stop every worker ends exactly where its engine is (those
//! without a ring once their engine announces its blocks again).
//!
//! Soak: `KV_INDEXER_FAULT_ROUNDS=20 cargo test --release --test faults_many -- --nocapture`.

mod support;

use support::daemon::Daemon;
use support::fault_engine::{rounds, Engine};
use support::fault_proxy::Faults;
use support::publisher::{Encoding, HashForm, PublisherConfig, ReplyForm};
use support::truth_check::{assert_exact, assert_no_stale, counters, report};

const ENGINES: u64 = 16;
const FAULTS: Faults = Faults::new(10, 5, 5);
/// Engines `0..WITHOUT_RING` have no replay endpoint.
const WITHOUT_RING: usize = 4;

#[test]
fn sixteen_faulty_engines_each_end_exactly_where_their_engine_is() {
    let d = Daemon::start(&["--replay-timeout-ms", "10000"]);
    let mut engines: Vec<Engine> = (0..ENGINES)
        .map(|i| {
            let cfg = PublisherConfig {
                encoding: if i % 2 == 0 { Encoding::Tagged } else { Encoding::Positional },
                hash_form: [HashForm::Uint, HashForm::Int, HashForm::Bytes, HashForm::Mixed][i as usize % 4],
                reply_form: if i % 3 == 0 { ReplyForm::ThreeFrames } else { ReplyForm::FourFrames },
                ring_capacity: (i as usize >= WITHOUT_RING).then_some(1_000 + rounds() * 200),
                seed: 900 + i,
                ..PublisherConfig::default()
            };
            Engine::new(1_000 + i, cfg, FAULTS, 1)
        })
        .collect();
    engines.iter().for_each(|e| e.register(&d, 0));

    let mut checked = Default::default();
    for _ in 0..rounds() {
        engines.iter().for_each(|e| e.set_faults(FAULTS));
        for step in 0..12 {
            // Engines 5..8 stall for a while: the others must not wait for them.
            if step == 3 || step == 8 {
                engines[5..8].iter().for_each(|e| e.proxies[0].pause(step == 3));
            }
            // Engines 8 (same socket) and 9 (new socket) restart once a round.
            if step == 6 {
                engines[8].restart(false, &[true]);
                engines[9].restart(true, &[true]);
            }
            engines.iter_mut().for_each(|e| e.workload(10));
        }
        engines.iter().for_each(Engine::stop_faults);
        engines.iter_mut().for_each(|e| e.settle(&[&d]));
        assert_no_stale(&d, &engines[..WITHOUT_RING]);
        assert_exact(&d, &engines[WITHOUT_RING..]);
        engines[..WITHOUT_RING].iter_mut().for_each(Engine::republish);
        engines[..WITHOUT_RING].iter_mut().for_each(|e| e.settle(&[&d]));
        checked = assert_exact(&d, &engines);
    }
    assert!(checked.orphans > 0, "the engines hold orphans, so the dump's marks of them are checked");
    let c = counters(&d);
    let injected: u64 = engines.iter().map(|e| e.restarts).sum();
    assert!(c["restarts"].as_u64() >= Some(injected), "{c}");
    report("sixteen_faulty_engines", &engines, &checked, &d);
}

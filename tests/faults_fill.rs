//! Ring fills through the daemon. A daemon started with no peer and no
//! snapshot next to engines that published and went idle answers from their
//! replay rings, block for block, before any engine publishes again; a ring
//! that no longer reaches back to seq 0 fills what it holds and nothing
//! stale (a store whose parent left the ring is refused); fills racing live
//! batches under transport faults end exact, with no restart or resync.

mod support;

use kv_indexer::StorageTier;
use support::daemon::Daemon;
use support::fault_engine::Engine;
use support::fault_proxy::Faults;
use support::publisher::{Encoding, HashForm, PublisherConfig, ReplyForm, TestEvent};
use support::truth_check::{assert_exact, assert_no_stale, counters, metric, report};
use support::wait_until;

const ARGS: [&str; 2] = ["--replay-timeout-ms", "10000"];

/// `n` engines (both encodings, both reply forms, every hash form) keeping
/// `ring` batches, behind proxies injecting `faults`.
fn engines(n: u64, first: u64, ring: usize, faults: Faults) -> Vec<Engine> {
    (0..n)
        .map(|i| {
            let cfg = PublisherConfig {
                encoding: if i % 2 == 0 { Encoding::Tagged } else { Encoding::Positional },
                reply_form: if i < 2 { ReplyForm::FourFrames } else { ReplyForm::ThreeFrames },
                hash_form: HashForm::Mixed,
                ring_capacity: Some(ring),
                seed: first + i,
                ..PublisherConfig::default()
            };
            Engine::new(first + i, cfg, faults, 1)
        })
        .collect()
}

#[test]
fn a_daemon_started_next_to_idle_engines_answers_from_their_rings() {
    const HISTORY: usize = 250;
    let mut engines = engines(4, 500, 1_000, Faults::NONE);
    // Published with no daemon listening: only the rings have it.
    engines.iter_mut().for_each(|e| e.workload(HISTORY));
    engines.iter().for_each(Engine::quiesce);
    let mut d = Daemon::start(&ARGS);
    engines.iter().for_each(|e| e.register(&d, 0));
    // No engine publishes from here on: only the fills can make this exact.
    let checked = assert_exact(&d, &engines);
    let c = counters(&d);
    assert_eq!(metric(&d, "kv_indexer_ring_fills_total"), 4);
    assert_eq!(metric(&d, "kv_indexer_batches_filled_total"), 4 * HISTORY as u64, "{c}");
    assert_eq!(
        (c["replays_ok"].as_u64(), c["resyncs"].as_u64(), c["batches_missed_at_join"].as_u64()),
        (Some(0), Some(0), Some(0))
    );
    for e in &engines {
        let line = format!(
            "instance {} dp_rank 0 ({}): filled {HISTORY} batches (0..={})",
            e.instance,
            e.proxies[0].endpoint,
            HISTORY - 1
        );
        assert!(d.wait_logged(&line), "no line {line:?} in {:?}", d.log());
    }
    report("a_daemon_started_next_to_idle_engines", &engines, &checked, &d);
}

/// `n` batches that grow chains and evict now and then, never clearing:
/// most stores hang under a block stored long before.
fn grow(e: &mut Engine, n: usize) {
    for i in 0..n {
        let held: Vec<u64> = e.publisher.truth()[StorageTier::Device.index()].iter().copied().collect();
        let parent = (!held.is_empty() && i % 4 != 0).then(|| held[(i * 7) % held.len()]);
        let mut events = vec![e.publisher.new_store(StorageTier::Device, parent, 1 + i % 2)];
        if i % 5 == 4 && !held.is_empty() {
            events.push(TestEvent::Removed { tier: StorageTier::Device, hashes: vec![held[(i * 3) % held.len()]] });
        }
        e.publish(events);
    }
}

/// A counter of `/metrics` with one label, e.g. `kv_indexer_blocks_total{outcome="unknown_parent"}`.
fn labelled(d: &Daemon, sample: &str) -> u64 {
    let (_, text) = d.get("/metrics");
    let line = text.lines().find(|l| l.starts_with(sample)).unwrap_or_else(|| panic!("no {sample}"));
    line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64
}

#[test]
fn a_ring_that_no_longer_reaches_seq_zero_fills_what_it_holds_and_nothing_stale() {
    const RING: usize = 32;
    const HISTORY: usize = 300;
    let mut engines = engines(2, 510, RING, Faults::NONE);
    engines.iter_mut().for_each(|e| grow(e, HISTORY));
    engines.iter().for_each(Engine::quiesce);
    let d = Daemon::start(&ARGS);
    engines.iter().for_each(|e| e.register(&d, 0));
    let filled = || metric(&d, "kv_indexer_batches_filled_total");
    assert!(wait_until(|| filled() == 2 * RING as u64), "filled {}", filled());
    // A fresh marker batch each: once it shows, the fills are applied.
    engines.iter_mut().for_each(|e| e.settle(&[&d]));
    let (listed, missing) = assert_no_stale(&d, &engines);
    let c = counters(&d);
    assert_eq!(c["batches_missed_at_join"].as_u64(), Some(2 * (HISTORY - RING) as u64), "{c}");
    assert_eq!((c["resyncs"].as_u64(), c["batches_lost"].as_u64()), (Some(0), Some(0)), "{c}");
    // Stores under blocks stored before the rings' first batch are refused.
    let refused = labelled(&d, "kv_indexer_blocks_total{outcome=\"unknown_parent\"}");
    eprintln!("rings of {RING} after {HISTORY} batches: {listed} blocks listed, none stale, {missing} missing, {refused} refused");
    assert!(listed > 2 && missing > 0 && refused > 0, "listed {listed}, missing {missing}, refused {refused}");
    // What the rings could not say, the engines say again.
    engines.iter_mut().for_each(Engine::republish);
    engines.iter_mut().for_each(|e| e.settle(&[&d]));
    let checked = assert_exact(&d, &engines);
    report("a_ring_that_no_longer_reaches_seq_zero", &engines, &checked, &d);
}

#[test]
fn fills_racing_live_batches_under_faults_end_exact() {
    let faults = Faults::new(10, 5, 5);
    let mut engines = engines(4, 520, 2_000, faults);
    engines.iter_mut().for_each(|e| e.workload(100));
    engines.iter().for_each(Engine::quiesce);
    let d = Daemon::start(&ARGS);
    // Each registration's fill races the bursts every engine publishes next.
    for i in 0..engines.len() {
        engines[i].register(&d, 0);
        engines.iter_mut().for_each(|e| e.workload(10));
    }
    for _ in 0..10 {
        engines.iter_mut().for_each(|e| e.workload(10));
    }
    engines.iter().for_each(Engine::stop_faults);
    engines.iter_mut().for_each(|e| e.settle(&[&d]));
    let checked = assert_exact(&d, &engines);
    let c = counters(&d);
    assert_eq!(
        (c["restarts"].as_u64(), c["resyncs"].as_u64(), c["batches_lost"].as_u64()),
        (Some(0), Some(0), Some(0)),
        "{c}"
    );
    assert!(metric(&d, "kv_indexer_batches_filled_total") >= 4 * 100, "{c}");
    report("fills_racing_live_batches_under_faults", &engines, &checked, &d);
}

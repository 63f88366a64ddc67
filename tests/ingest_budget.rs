//! The ingest budget under a flood: batches received and not yet applied
//! stay within it (held, queued, kept from rings), what is dropped at it is
//! counted and comes back from the engines' rings, and once things settle
//! every block the rings hold is indexed, exactly.

mod support;

use std::sync::Arc;

use kv_indexer::ingest::{Ingest, IngestConfig};
use kv_indexer::{StorageTier, WorkerId};
use support::harness::{assert_converges, settle, spec_for, test_config};
use support::model_sink::ModelSink;
use support::publisher::{PublisherConfig, TestPublisher};
use support::wait_until;

#[test]
fn a_flood_past_the_budget_ends_with_every_ring_held_block_indexed() {
    const ENGINES: u64 = 24;
    const BATCHES: usize = 60;
    let budget = 1 << 20;
    // Startup recovery: the gate is closed, so everything the engines send
    // waits in the budget, which a flood of 24 x 60 stores of 100 blocks
    // (several MiB decoded) overflows.
    let ingest = Ingest::start(IngestConfig { ready_gate_open: false, budget_bytes: budget, ..test_config() }).unwrap();
    let sink = Arc::new(ModelSink::new());
    let mut engines: Vec<(WorkerId, TestPublisher)> = (0..ENGINES)
        .map(|i| {
            let cfg =
                PublisherConfig { seed: 100 + i, ring_capacity: Some(BATCHES + 10), ..PublisherConfig::default() };
            (WorkerId::new(100 + i, 0), TestPublisher::new(cfg))
        })
        .collect();
    for (w, p) in &mut engines {
        ingest.add_listener(spec_for(*w, p, &sink)).unwrap();
        assert!(p.wait_subscribed(1));
    }
    let mut peak = 0;
    for _ in 0..BATCHES {
        for (_, p) in &mut engines {
            let store = p.new_store(StorageTier::Device, None, 100);
            p.publish(vec![store]);
        }
        peak = peak.max(ingest.counters().budget_bytes);
    }
    let seen = |c: &kv_indexer::ingest::IngestCounters| c.held_batches + c.held_dropped + c.budget_dropped;
    assert!(wait_until(|| seen(&ingest.counters()) == ENGINES * BATCHES as u64), "{:?}", ingest.counters());
    let c = ingest.counters();
    eprintln!(
        "flood: {} held, {} dropped at the held share, {} at the budget; peak {peak} bytes",
        c.held_batches, c.held_dropped, c.budget_dropped
    );
    assert!(c.budget_dropped > 0, "the flood never reached the budget: {c:?}");
    // At most one batch past the budget: each is charged once decoded.
    let batch_max = 200 << 10;
    assert!(peak.max(c.budget_bytes) <= budget as u64 + batch_max, "peak {peak}: {c:?}");

    ingest.open_ready_gate();
    for (w, p) in &mut engines {
        p.publish_random(1);
        settle(&ingest, *w, p);
        assert_converges(&sink, *w, p);
    }
    let c = ingest.counters();
    assert_eq!((c.batches_lost, c.resyncs, c.held_batches), (0, 0, 0), "{c:?}");
    assert!(wait_until(|| ingest.counters().budget_bytes == 0), "{:?}", ingest.counters());
}

//! Ingest into the real `Index`: after gaps, replays, a restart and a
//! dp-rank override, each worker's blocks in the index (read back through
//! its dump) are exactly what a query can see of its engine's cache, and
//! queries built from the engine's own chains find the full depth.

mod support;

use std::sync::Arc;

use kv_indexer::ingest::{EventSink, Ingest, ListenerSpec};
use kv_indexer::{StorageTier, WorkerId};
use support::harness::{settle, test_config};
use support::index_sink::IndexSink;
use support::publisher::{Encoding, PublisherConfig, TestEvent, TestPublisher};
use support::rng::Rng;
use support::wait_until;

const WORKERS: u64 = 6;

fn spec(worker: WorkerId, publisher: &TestPublisher, sink: &Arc<IndexSink>) -> ListenerSpec {
    ListenerSpec {
        worker,
        endpoint: publisher.endpoint.clone(),
        replay_endpoint: publisher.replay_endpoint.clone(),
        block_size: 4,
        sink: Arc::clone(sink) as Arc<dyn EventSink>,
    }
}

#[test]
fn the_index_ends_exactly_where_the_engines_are() {
    let ingest = Ingest::start(test_config()).unwrap();
    let sink = Arc::new(IndexSink::new(4));
    let mut engines = Vec::new();
    for i in 0..WORKERS {
        let publisher = TestPublisher::new(PublisherConfig {
            encoding: if i % 2 == 0 { Encoding::Tagged } else { Encoding::Positional },
            batch_dp_rank: (i == 1).then_some(5),
            seed: 40 + i,
            ..PublisherConfig::default()
        });
        let registered = WorkerId::new(900 + i, 0);
        ingest.add_listener(spec(registered, &publisher, &sink)).unwrap();
        let effective = if i == 1 { WorkerId::new(901, 5) } else { registered };
        engines.push((registered, effective, publisher));
    }
    for (_, _, p) in &mut engines {
        assert!(p.wait_subscribed(1));
    }
    let mut rng = Rng::new(99);
    for round in 0..80 {
        for (i, (_, _, p)) in engines.iter_mut().enumerate() {
            if round == 40 && i == 2 {
                p.restart(false);
            }
            if rng.chance(4) {
                p.lose_next(1 + rng.below(2) as usize);
            }
            p.publish_random(1);
        }
    }
    for (_, _, p) in &mut engines {
        p.lose_none();
        p.publish_random(1);
    }
    let mut pairs = 0;
    for (registered, _, p) in &engines {
        settle(&ingest, *registered, p);
        pairs += p.truth().iter().map(|t| t.len() as u64).sum::<u64>();
    }
    let dumped = sink.dumped();
    for (_, effective, p) in &engines {
        let held = dumped.get(effective).cloned().unwrap_or_default();
        assert_eq!(&held, p.truth(), "worker {effective}");
    }
    assert_eq!(sink.0.stats().pairs, pairs);
    let c = ingest.counters();
    // A replay racing the restart may also give up a batch (and resync);
    // either way the state above is exact.
    assert_eq!(c.restarts, 1);
    assert!(c.replays_ok > 0);

    // A query along an engine's own chain finds the worker at full depth.
    for (_, effective, p) in &engines {
        let device = &p.visible_truth()[StorageTier::Device.index()];
        for &leaf in device.iter().take(5) {
            let query = p.chain_locals(leaf);
            let matches = sink.0.find_matches(&query);
            let depth = matches.workers.iter().find(|m| m.worker == *effective).map(|m| m.device);
            assert_eq!(depth, Some(query.len() as u32), "worker {effective}, leaf {leaf}");
        }
    }
}

#[test]
fn a_lost_eviction_never_leaves_a_matchable_block_in_the_index() {
    let ingest = Ingest::start(test_config()).unwrap();
    let sink = Arc::new(IndexSink::new(4));
    let worker = WorkerId::new(950, 0);
    let mut p = TestPublisher::new(PublisherConfig { ring_capacity: None, ..PublisherConfig::default() });
    ingest.add_listener(spec(worker, &p, &sink)).unwrap();
    assert!(p.wait_subscribed(1));
    let store = p.new_store(StorageTier::Device, None, 4);
    let TestEvent::Stored { hashes, .. } = store.clone() else { unreachable!() };
    p.publish(vec![store]);
    let query = p.chain_locals(hashes[3]);
    let depth_of = |sink: &IndexSink| {
        sink.0.find_matches(&query).workers.iter().find(|m| m.worker == worker).map_or(0, |m| m.device)
    };
    assert!(wait_until(|| depth_of(&sink) == 4));

    // The engine evicts the chain's last two blocks; the news is lost.
    p.lose_next(1);
    p.publish(vec![TestEvent::Removed { tier: StorageTier::Device, hashes: hashes[2..].to_vec() }]);
    p.publish_random(3);
    settle(&ingest, worker, &p);
    assert!(depth_of(&sink) < 3, "the index still matches evicted blocks");
    let dumped = sink.dumped().remove(&worker).unwrap_or_default();
    for (tier, held) in dumped.iter().enumerate() {
        assert!(held.is_subset(&p.truth()[tier]), "stale blocks in tier {tier}");
    }
    assert_eq!(ingest.counters().resyncs, 1);
}

//! Many workers at once over two listener threads and two shards, with a
//! mix of encodings, reply forms, dp-rank overrides and lost batches: every
//! worker must end exactly where its engine is.

mod support;

use std::sync::Arc;

use kv_indexer::ingest::Ingest;
use kv_indexer::WorkerId;
use support::harness::{assert_converges, settle, spec_for, test_config};
use support::model_sink::ModelSink;
use support::publisher::{Encoding, HashForm, PublisherConfig, ReplyForm, TestPublisher};
use support::rng::Rng;

const WORKERS: u64 = 24;
const ROUNDS: usize = 60;

#[test]
fn many_workers_converge_to_their_engines() {
    let ingest = Ingest::start(test_config()).unwrap();
    let sink = Arc::new(ModelSink::new());
    let mut engines = Vec::new();
    for i in 0..WORKERS {
        let cfg = PublisherConfig {
            encoding: if i % 2 == 0 { Encoding::Tagged } else { Encoding::Positional },
            hash_form: [HashForm::Uint, HashForm::Int, HashForm::Bytes, HashForm::Mixed][i as usize % 4],
            reply_form: if i % 3 == 0 { ReplyForm::ThreeFrames } else { ReplyForm::FourFrames },
            // Every fourth engine names its rank inside the batches.
            batch_dp_rank: publisher_rank(i),
            seed: 1_000 + i,
            ..PublisherConfig::default()
        };
        let publisher = TestPublisher::new(cfg);
        let registered = WorkerId::new(500 + i / 2, (i % 2) as u32);
        ingest.add_listener(spec_for(registered, &publisher, &sink)).unwrap();
        let effective = match publisher_rank(i) {
            Some(rank) => WorkerId::new(registered.instance_id, rank),
            None => registered,
        };
        engines.push((registered, effective, publisher));
    }
    for (_, _, publisher) in &mut engines {
        assert!(publisher.wait_subscribed(1));
    }
    let mut rng = Rng::new(7);
    for _ in 0..ROUNDS {
        for (_, _, publisher) in &mut engines {
            if rng.chance(3) {
                publisher.lose_next(1 + rng.below(3) as usize);
            }
            publisher.publish_random(1 + rng.below(3) as usize);
        }
    }
    // A final batch each, so no engine ends on a lost one.
    for (_, _, publisher) in &mut engines {
        publisher.lose_none();
        publisher.publish_random(1);
    }
    for (registered, effective, publisher) in &engines {
        settle(&ingest, *registered, publisher);
        assert_converges(&sink, *effective, publisher);
    }
    let c = ingest.counters();
    assert_eq!((c.batches_lost, c.resyncs, c.restarts), (0, 0, 0));
    assert!(c.replays_ok > 0);
    assert_eq!(c.replays_ok, c.gaps_detected);
    assert_eq!(sink.workers().len(), engines.len());
    // Every published event is one the converter keeps.
    assert!(c.skips.iter().all(|&(_, n)| n == 0), "{:?}", c.skips);
}

fn publisher_rank(i: u64) -> Option<u32> {
    (i % 4 == 1).then_some(7)
}

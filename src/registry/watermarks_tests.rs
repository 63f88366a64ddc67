//! A peer's watermarks: each running listener's, named with its index, and
//! adopted only by the listener of the same key, endpoint and index, from
//! a dump that listed that index, while the ready gate is closed.

use super::*;
use crate::event::WorkerId;
use crate::index::Budget;
use crate::ingest::{Ingest, IngestConfig, Watermark};
use crate::registry::RegisterArgs;
use std::sync::Arc;

fn registry(gate_open: bool) -> (Arc<Ingest>, Registry) {
    let cfg = IngestConfig {
        listener_threads: 1,
        shard_threads: 1,
        pin_threads: false,
        ready_gate_open: gate_open,
        ..IngestConfig::default()
    };
    let ingest = Arc::new(Ingest::start(cfg).unwrap());
    let r = Registry::new(ingest.clone(), 0, Arc::new(Budget::unlimited()));
    (ingest, r)
}

/// Nothing listens on these ports: the listeners stay pending.
fn endpoint(instance: u64) -> String {
    format!("tcp://127.0.0.1:{}", 9 + instance)
}

fn register(r: &Registry, instance: u64, model: &str) {
    let args = RegisterArgs {
        instance_id: instance,
        dp_rank: 0,
        endpoint: endpoint(instance),
        replay_endpoint: None,
        model_name: model.into(),
        tenant_id: "default".into(),
        block_size: 4,
    };
    r.register(args).unwrap();
}

fn mark(instance: u64, model: &str, endpoint: String, seq: u64) -> PeerWatermark {
    PeerWatermark {
        model_name: model.into(),
        tenant_id: "default".into(),
        mark: StreamMark {
            worker: WorkerId::new(instance, 0),
            endpoint,
            watermark: Watermark { seq, digest: Some(seq * 11) },
            ranks: vec![3],
        },
    }
}

fn last_seqs(r: &Registry) -> Vec<(u64, Option<u64>)> {
    let mut v: Vec<_> = r.listener_infos().values().map(|i| (i.worker.instance_id, i.last_seq)).collect();
    v.sort();
    v
}

#[test]
fn a_dump_names_each_running_listener_s_watermark_with_its_index_and_ranks() {
    let (ingest, r) = registry(false);
    let kept = Watermark { seq: 41, digest: Some(7) };
    ingest.seed_watermark(WorkerId::new(1, 0), kept, &[2, 5]).unwrap();
    register(&r, 1, "a");
    register(&r, 2, "b");
    let marks = r.peer_watermarks().unwrap();
    let want = PeerWatermark {
        model_name: "a".into(),
        tenant_id: "default".into(),
        mark: StreamMark { worker: WorkerId::new(1, 0), endpoint: endpoint(1), watermark: kept, ranks: vec![2, 5] },
    };
    // Worker 2 has dealt with nothing: no watermark to give.
    assert_eq!(marks, vec![want]);
    ingest.shutdown();
}

#[test]
fn only_the_listener_of_the_same_key_endpoint_and_index_adopts_a_watermark() {
    let (ingest, r) = registry(false);
    for (instance, model) in [(1, "a"), (2, "a"), (3, "a"), (4, "b")] {
        register(&r, instance, model);
    }
    let listed: Listed = [(("a".to_string(), "default".to_string()), 4)].into_iter().collect();
    let marks = vec![
        mark(1, "a", endpoint(1), 10),
        // Another endpoint here.
        mark(2, "a", "tcp://10.0.0.2:5557".into(), 20),
        // It fed another index there.
        mark(3, "b", endpoint(3), 30),
        // The dump did not list "b": its blocks here are not the peer's.
        mark(4, "b", endpoint(4), 40),
        // Nobody registered it here.
        mark(5, "a", endpoint(5), 50),
    ];
    let adopted = r.adopt_peer_watermarks("peer", marks, &listed);
    assert_eq!(adopted, Adopted { adopted: 1, skipped: 4 });
    // Answered, and published, before the call returned.
    assert_eq!(last_seqs(&r), vec![(1, Some(10)), (2, None), (3, None), (4, None)]);
    let marks = r.peer_watermarks().unwrap();
    assert_eq!(marks.len(), 1);
    assert_eq!(marks[0].mark.ranks, vec![3], "the peer's stream's other ranks are its too");
    // A second dump's finds it taken: the stream has dealt with nothing, so
    // it takes this one too (recovery applies one dump).
    let again = r.adopt_peer_watermarks("peer", vec![mark(1, "a", endpoint(1), 11)], &listed);
    assert_eq!(again.adopted, 1);
    ingest.shutdown();
}

#[test]
fn once_the_gate_is_open_no_watermark_is_adopted() {
    let (ingest, r) = registry(true);
    register(&r, 1, "a");
    let listed: Listed = [(("a".to_string(), "default".to_string()), 4)].into_iter().collect();
    let adopted = r.adopt_peer_watermarks("peer", vec![mark(1, "a", endpoint(1), 10)], &listed);
    assert_eq!(adopted, Adopted { adopted: 0, skipped: 1 });
    assert_eq!(last_seqs(&r), vec![(1, None)]);
    ingest.shutdown();
}

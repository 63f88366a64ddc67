//! How batches meet the shards: nothing is held back from a shard that
//! could apply it. A listener sends a batch for a shard asleep on its
//! empty queue at once, even while it is stuck sending to another shard's
//! full queue; it gathers only for a busy shard. Shown by what was applied
//! while a gated sink holds one shard busy, never by a clock.

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use kv_indexer::ingest::{Ingest, IngestConfig};
use kv_indexer::WorkerId;
use support::gate_sink::{GateSink, OpenOnDrop};
use support::harness::{spec_with, test_config};
use support::publisher::{PublisherConfig, TestPublisher};
use support::wait_until;
use xxhash_rust::xxh3::xxh3_64;

const SHARDS: usize = 2;

/// The shard that owns `worker` (the pipeline's stable hash; checked below
/// against the queue depths the pipeline reports).
fn shard_of(worker: WorkerId) -> usize {
    let mut key = [0u8; 12];
    key[..8].copy_from_slice(&worker.instance_id.to_le_bytes());
    key[8..].copy_from_slice(&worker.dp_rank.to_le_bytes());
    (xxh3_64(&key) % SHARDS as u64) as usize
}

/// `[ts, [AllBlocksCleared], rank]`: a one-event batch for dp rank `rank`.
fn cleared_batch(rank: u32) -> Vec<u8> {
    use rmp::encode::*;
    let mut buf = Vec::new();
    write_array_len(&mut buf, 3).unwrap();
    write_f64(&mut buf, 1_700_000_000.0).unwrap();
    write_array_len(&mut buf, 1).unwrap();
    write_map_len(&mut buf, 1).unwrap();
    write_str(&mut buf, "type").unwrap();
    write_str(&mut buf, "AllBlocksCleared").unwrap();
    write_uint(&mut buf, u64::from(rank)).unwrap();
    buf
}

#[test]
fn a_batch_for_an_idle_shard_is_applied_while_another_shards_queue_is_full() {
    // One publisher names two dp ranks, one on each shard, so a single
    // listener's held run holds both workers' batches in publish order.
    let instance = 70;
    let a = WorkerId::new(instance, 0);
    let b = (1..).map(|r| WorkerId::new(instance, r)).find(|&w| shard_of(w) != shard_of(a)).unwrap();
    let cfg = IngestConfig {
        listener_threads: 1,
        shard_threads: SHARDS,
        // One queue message: the shard of `a` is full after one gathering.
        shard_queue_batches: 1,
        // Batches are held until the gate opens, then sent in one go.
        ready_gate_open: false,
        ..test_config()
    };
    let ingest = Ingest::start(cfg).unwrap();
    let sink = Arc::new(GateSink::closed_for(&[a]));
    let _open_on_failure = OpenOnDrop(sink.clone());
    let mut publisher = TestPublisher::new(PublisherConfig::default());
    ingest.add_listener(spec_with(a, &publisher, sink.clone())).unwrap();
    assert!(publisher.wait_subscribed(1));
    // b's batch first, then more of a's than a's shard can take while
    // its sink holds it: the listener ends up blocked on a's full queue.
    let a_batches = 3 * 64 + 5;
    publisher.send_payload(cleared_batch(b.dp_rank));
    for _ in 0..a_batches {
        publisher.send_payload(cleared_batch(a.dp_rank));
    }
    assert!(wait_until(|| ingest.counters().held_batches == 1 + a_batches as u64));
    ingest.sync_shards().unwrap();
    ingest.open_ready_gate();

    // b's shard was asleep: its batch went at once, and is applied while
    // the listener is still stuck behind a's shard (whose first batch
    // waits in the sink and whose queue is full).
    assert!(wait_until(|| sink.applied_of(b) == 1), "b's batch waited for a's shard");
    // a's shard takes its first message and waits in the sink; the next
    // fills its queue (the queue can show one message before the shard
    // took the first, so the wait comes first).
    assert!(wait_until(|| sink.waited.load(Ordering::Relaxed) == 1), "a's shard never took its first batch");
    assert!(wait_until(|| ingest.counters().shard_queue_depths[shard_of(a)] == 1), "a's queue never filled");
    assert_eq!(sink.applied_of(a), 0);
    assert_eq!(sink.waited.load(Ordering::Relaxed), 1);
    assert!(ingest.counters().held_batches > 0, "the listener got past a's full queue");

    sink.open();
    assert!(wait_until(|| sink.applied_of(a) == a_batches), "a's batches were not all applied");
    let c = ingest.counters();
    assert_eq!((c.batches_applied, c.held_batches, c.held_dropped), (1 + a_batches as u64, 0, 0));
    assert_eq!(sink.applied.lock().first(), Some(&b));
    ingest.shutdown();
}

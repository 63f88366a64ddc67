//! Writer shards: each owns a disjoint set of workers (by a stable hash of
//! the worker id), converts their raw events and applies them to the sink.
//!
//! Everything that changes one worker's state goes through its shard's FIFO
//! queue, in the order the listener sent it: batches, restart and resync
//! clears, removal. That is the whole ordering argument: one queue, one
//! consumer, per worker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam::channel::{Receiver, SendTimeoutError, Sender, TryRecvError};
use rustc_hash::FxHashMap;
use xxhash_rust::xxh3::xxh3_64;

use super::budget::Charge;
use super::config::SHUTDOWN_CHECK_MS;
use super::counters::Counters;
use super::sink::EventSink;
use crate::event::{Event, WorkerId};
use crate::wire::{RawEvent, SkipCounters, WorkerConverter};

/// One unit of work for a shard.
pub(crate) enum ShardMsg {
    /// A decoded batch of one worker, in seq order, with the engine's
    /// timestamp of it (Unix seconds) for the lag histogram.
    /// Its charge to the ingest budget is given back once it is applied.
    Batch {
        worker: WorkerId,
        block_size: u32,
        sink: Arc<dyn EventSink>,
        events: Vec<RawEvent>,
        ts: f64,
        charge: Charge,
    },
    /// Drop every block of the worker (publisher restart or resync) and
    /// forget the converter's per-worker state.
    Clear { worker: WorkerId, sink: Arc<dyn EventSink> },
    /// Remove the worker from its sink; acknowledged once done.
    Remove { worker: WorkerId, sink: Arc<dyn EventSink>, done: Sender<()> },
    /// Acknowledged once every earlier message has been handled.
    Sync(Sender<()>),
    /// Several of the above, in order (what one listener wake-up made).
    Many(Vec<ShardMsg>),
    /// Nothing to do: wakes the shard so it sees a shutdown.
    Wake,
}

/// The shard that owns `worker`, stable across runs for a given shard count.
pub(crate) fn shard_for(worker: WorkerId, shards: usize) -> usize {
    let mut key = [0u8; 12];
    key[..8].copy_from_slice(&worker.instance_id.to_le_bytes());
    key[8..].copy_from_slice(&worker.dp_rank.to_le_bytes());
    (xxh3_64(&key) % shards.max(1) as u64) as usize
}

/// Sends `msg`, blocking while the shard's queue is full (back-pressure),
/// but giving up when the pipeline shuts down. Returns whether it was sent.
pub(crate) fn send_blocking(tx: &Sender<ShardMsg>, mut msg: ShardMsg, shutdown: &AtomicBool) -> bool {
    loop {
        match tx.send_timeout(msg, Duration::from_millis(SHUTDOWN_CHECK_MS)) {
            Ok(()) => return true,
            Err(SendTimeoutError::Timeout(back)) => {
                if shutdown.load(Ordering::Relaxed) {
                    return false;
                }
                msg = back;
            }
            Err(SendTimeoutError::Disconnected(_)) => return false,
        }
    }
}

/// One shard's state: its workers' converters. Run by a thread of its own
/// (`run_shard`) or, when the pipeline has one listener thread and one
/// shard, by that listener thread (`Outbox::Local`), which then applies
/// each batch where it decoded it: no queue, no second thread to wake.
pub(crate) struct Shard {
    workers: FxHashMap<WorkerId, WorkerConverter>,
    out: Vec<Event>,
    skips: Arc<SkipCounters>,
    counters: Arc<Counters>,
}

impl Shard {
    pub(crate) fn new(skips: Arc<SkipCounters>, counters: Arc<Counters>) -> Shard {
        Shard { workers: FxHashMap::default(), out: Vec::new(), skips, counters }
    }

    /// Handles one message, in the order its sender sent it.
    pub(crate) fn handle(&mut self, msg: ShardMsg) {
        match msg {
            ShardMsg::Batch { worker, block_size, sink, events, ts, charge: _charge } => {
                let converter = self.workers.entry(worker).or_insert_with(|| WorkerConverter::new(block_size));
                if converter.block_size() != block_size {
                    // Re-registered with another block size: earlier parents
                    // were cut at the old size and cannot be continued.
                    *converter = WorkerConverter::new(block_size);
                }
                self.out.clear();
                let retain_held = |tier, hashes: &mut Vec<u64>| sink.retain_held(worker, tier, hashes);
                converter.convert(worker, &events, &mut self.out, &self.skips, &retain_held);
                sink.apply_all(&self.out);
                self.counters.event_lag.observe(ts);
                self.counters.batches_applied.fetch_add(1, Ordering::Relaxed);
                self.counters.events_applied.fetch_add(self.out.len() as u64, Ordering::Relaxed);
            }
            ShardMsg::Clear { worker, sink } => {
                if let Some(converter) = self.workers.get_mut(&worker) {
                    converter.reset();
                }
                sink.apply(&Event::cleared(worker));
            }
            ShardMsg::Remove { worker, sink, done } => {
                self.workers.remove(&worker);
                sink.remove_worker(worker);
                self.counters.workers_removed.fetch_add(1, Ordering::Relaxed);
                let _ = done.send(());
            }
            ShardMsg::Sync(done) => {
                let _ = done.send(());
            }
            ShardMsg::Many(msgs) => msgs.into_iter().for_each(|msg| self.handle(msg)),
            ShardMsg::Wake => {}
        }
    }
}

/// The shard thread's loop: runs until shutdown or until every sender is
/// gone. It sleeps in `recv` while its queue is empty (shutdown sends it a
/// `Wake`), so an idle shard costs nothing. `parked` is true while it
/// sleeps there (set just before, cleared once it has a message): listeners
/// read it to send an idle shard what they have at once (`Outbox`).
pub(crate) fn run_shard(rx: Receiver<ShardMsg>, mut shard: Shard, shutdown: Arc<AtomicBool>, parked: Arc<AtomicBool>) {
    while !shutdown.load(Ordering::Relaxed) {
        let msg = match rx.try_recv() {
            Ok(msg) => msg,
            Err(TryRecvError::Disconnected) => return,
            Err(TryRecvError::Empty) => {
                parked.store(true, Ordering::Relaxed);
                let next = rx.recv();
                parked.store(false, Ordering::Relaxed);
                let Ok(msg) = next else {
                    return;
                };
                msg
            }
        };
        shard.handle(msg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_choice_is_stable_and_in_range() {
        let w = WorkerId::new(42, 3);
        for shards in 1..9 {
            let s = shard_for(w, shards);
            assert!(s < shards);
            assert_eq!(s, shard_for(w, shards));
        }
    }

    #[test]
    fn workers_spread_over_shards() {
        let mut hits = [0usize; 4];
        for instance in 0..400u64 {
            hits[shard_for(WorkerId::new(instance, 0), 4)] += 1;
        }
        assert!(hits.iter().all(|&h| h > 50), "uneven spread: {hits:?}");
    }
}

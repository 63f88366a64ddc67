//! What the replay driver needs from an index under test, and a sticky
//! writer pool for indexes that are applied from the caller's threads.
//!
//! A backend turns ops into its own event values before timing starts,
//! accepts them from the single issuer thread in trace order, tells how
//! many events of a worker it has applied (so the driver can bound how far
//! queries run ahead of events), drains, and answers queries from reader
//! threads. The `WriterPool` gives every worker one owner thread, fed by a
//! bounded crossbeam channel, as the daemon's writer shards do.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam::channel::{bounded, Sender};
use crossbeam::utils::CachePadded;

use super::workload::{Op, Workload};

/// Memory an index reports about itself.
#[derive(Copy, Clone, Debug, Default)]
pub struct IndexMemory {
    /// Live (block, worker) pairs.
    pub pairs: u64,
    /// Bytes the index's own structures hold.
    pub bytes: u64,
}

/// An index under test, with its write path.
pub trait Backend: Sync {
    /// An event in the backend's own form, built before timing.
    type Event: Send + 'static;
    /// A query block hash in the backend's own form.
    type Hash: Copy + Send + Sync + 'static;

    /// Short name for tables.
    fn label(&self) -> String;
    /// Builds the event for `op` (never a query); `event_id` counts events from 0.
    fn build_event(&self, op: &Op, wl: &Workload, event_id: u64) -> Self::Event;
    /// The backend's form of a local block hash.
    fn hash(local: u64) -> Self::Hash;
    /// Accepts `worker`'s next event; called by one thread, in trace order. May block.
    fn submit(&self, worker: u32, event: Self::Event);
    /// Events of `worker` known to be applied (may trail the truth, must reach it).
    fn applied_events(&self, worker: u32) -> u64;
    /// Returns once every submitted event is applied.
    fn drain(&self);
    /// Device-tier depth (blocks) per worker with a nonzero depth, into `out`.
    fn find_matches(&self, hashes: &[Self::Hash], out: &mut Vec<(u32, u32)>);
    /// The index's own accounting, when it has one.
    fn memory(&self) -> Option<IndexMemory>;
    /// Events the index refused or found inconsistent so far (0 when it cannot tell).
    fn event_problems(&self) -> u64 {
        0
    }
}

/// Most events waiting in one writer's channel before the issuer blocks.
pub const WRITER_QUEUE_EVENTS: usize = 4096;

/// Sticky writer threads: worker `w` is owned by thread `w % threads`.
pub struct WriterPool<E: Send + 'static> {
    senders: Vec<Sender<(u32, E)>>,
    sent: Vec<CachePadded<AtomicU64>>,
    applied: Arc<Vec<CachePadded<AtomicU64>>>,
    problems: Arc<AtomicU64>,
    handles: Vec<JoinHandle<()>>,
}

impl<E: Send + 'static> WriterPool<E> {
    /// Starts `threads` writers over `workers` workers; `apply` returns the
    /// number of problems an event caused.
    pub fn new<F>(threads: usize, workers: u32, apply: F) -> Self
    where
        F: Fn(&E) -> u64 + Send + Sync + 'static,
    {
        assert!(threads > 0, "at least one writer thread");
        let apply = Arc::new(apply);
        let applied: Arc<Vec<_>> = Arc::new((0..workers).map(|_| CachePadded::new(AtomicU64::new(0))).collect());
        let problems = Arc::new(AtomicU64::new(0));
        let mut senders = Vec::with_capacity(threads);
        let mut handles = Vec::with_capacity(threads);
        for t in 0..threads {
            let (tx, rx) = bounded::<(u32, E)>(WRITER_QUEUE_EVENTS);
            senders.push(tx);
            let (apply, applied, problems) = (apply.clone(), applied.clone(), problems.clone());
            let handle = std::thread::Builder::new()
                .name(format!("writer-{t}"))
                .spawn(move || {
                    for (worker, event) in rx {
                        let p = apply(&event);
                        if p > 0 {
                            problems.fetch_add(p, Ordering::Relaxed);
                        }
                        drop(event);
                        applied[worker as usize].fetch_add(1, Ordering::Release);
                    }
                })
                .expect("spawn writer thread");
            handles.push(handle);
        }
        Self {
            senders,
            sent: (0..workers).map(|_| CachePadded::new(AtomicU64::new(0))).collect(),
            applied,
            problems,
            handles,
        }
    }

    /// Queues `worker`'s next event on its owner thread (blocks when full).
    pub fn submit(&self, worker: u32, event: E) {
        self.sent[worker as usize].fetch_add(1, Ordering::Relaxed);
        let t = worker as usize % self.senders.len();
        self.senders[t].send((worker, event)).expect("writer thread is gone");
    }

    /// Events of `worker` applied so far.
    pub fn applied(&self, worker: u32) -> u64 {
        self.applied[worker as usize].load(Ordering::Acquire)
    }

    /// Waits until every submitted event is applied.
    pub fn drain(&self) {
        for (w, sent) in self.sent.iter().enumerate() {
            let target = sent.load(Ordering::Relaxed);
            while self.applied[w].load(Ordering::Acquire) < target {
                std::thread::yield_now();
            }
        }
    }

    /// Problems the writers counted so far.
    pub fn problems(&self) -> u64 {
        self.problems.load(Ordering::Relaxed)
    }
}

impl<E: Send + 'static> Drop for WriterPool<E> {
    fn drop(&mut self) {
        // Closing the channels ends the writer loops.
        self.senders.clear();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

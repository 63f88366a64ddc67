//! Dynamo's indexers (dynamo-kv-router 1.6.1) as replay backends.
//!
//! Both run inside Dynamo's own `ThreadPoolIndexer`, as its standalone
//! service does: events go through its sticky worker threads and unbounded
//! flume queues, queries call the shared backend inline on reader threads.
//!
//! - `radix`: `ConcurrentRadixTreeCompressed`, fed the engines' opaque
//!   hashes, different on every engine (vLLM's default random seed).
//! - `radix_shared`: the same tree fed opaque hashes that are equal on every
//!   engine for equal content (vLLM with a fixed hash seed). The tree keeps
//!   one external hash per edge position, so only this variant gives exact
//!   answers; it is the fair throughput comparison.
//! - `positional`: `PositionalIndexer` (jump size 32), fed Dynamo-chain
//!   sequence hashes as block hashes; with opaque hashes it finds nothing.
//!
//! The pool does not say when an event is applied, so every
//! `MARKER_EVERY_EVENTS` events of a worker a flush marker is queued on that
//! worker's lane; its completion proves everything before it was applied.
//! `applied_events` thus trails the truth by at most that many events.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Waker};

use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, WorkerWithDpRank,
};
use dynamo_kv_router::{
    ConcurrentRadixTreeCompressed, LocalBlockHash, PositionalIndexer, RouterEvent, SyncIndexer, ThreadPoolIndexer,
};

use crate::trace::backend::{Backend, IndexMemory};
use crate::trace::hashes::shared_hash;
use crate::trace::workload::{Op, OpKind, Workload};

/// Events of one worker between two flush markers.
pub const MARKER_EVERY_EVENTS: u64 = 16;
/// Jump size of the positional indexer (Dynamo's usual setting).
pub const POSITIONAL_JUMP: usize = 32;

type Marker = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Which hashes the events carry.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Hashes {
    /// The engines' opaque hashes.
    Engine,
    /// Opaque hashes shared by all engines (`trace::hashes::shared_hash`,
    /// the same kv-indexer gets with `--our-hashes shared`).
    SharedEngine,
    /// Dynamo-chain sequence hashes.
    Sequence,
}

/// One of Dynamo's indexers in its thread pool.
pub struct Dynamo<T: SyncIndexer> {
    label: String,
    hashes: Hashes,
    pool: Arc<ThreadPoolIndexer<T>>,
    sent: Vec<AtomicU64>,
    known_applied: Vec<AtomicU64>,
    markers: Mutex<Vec<VecDeque<(u64, Marker)>>>,
}

/// The radix tree over opaque engine hashes.
pub fn radix(wl: &Workload, threads: usize) -> Dynamo<ConcurrentRadixTreeCompressed> {
    Dynamo::new("dynamo-radix", Hashes::Engine, ConcurrentRadixTreeCompressed::new(), wl, threads)
}

/// The radix tree over opaque hashes equal across engines.
pub fn radix_shared(wl: &Workload, threads: usize) -> Dynamo<ConcurrentRadixTreeCompressed> {
    Dynamo::new("dynamo-radix-shared", Hashes::SharedEngine, ConcurrentRadixTreeCompressed::new(), wl, threads)
}

/// The positional index over Dynamo-chain sequence hashes.
pub fn positional(wl: &Workload, threads: usize) -> Dynamo<PositionalIndexer> {
    Dynamo::new("dynamo-positional", Hashes::Sequence, PositionalIndexer::new(POSITIONAL_JUMP), wl, threads)
}

fn poll_once(f: &mut Marker) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    f.as_mut().poll(&mut cx).is_ready()
}

impl<T: SyncIndexer> Dynamo<T> {
    fn new(label: &str, hashes: Hashes, backend: T, wl: &Workload, threads: usize) -> Self {
        let workers = wl.config.workers as usize;
        Self {
            label: label.into(),
            hashes,
            pool: Arc::new(ThreadPoolIndexer::new(backend, threads, wl.config.block_size as u32)),
            sent: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            known_applied: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            markers: Mutex::new((0..workers).map(|_| VecDeque::new()).collect()),
        }
    }

    fn hash_of(&self, engine: u64, seq: u64) -> ExternalSequenceBlockHash {
        ExternalSequenceBlockHash(match self.hashes {
            Hashes::Engine => engine,
            Hashes::SharedEngine => shared_hash(seq),
            Hashes::Sequence => seq,
        })
    }
}

impl<T: SyncIndexer> Backend for Dynamo<T> {
    type Event = RouterEvent;
    type Hash = LocalBlockHash;

    fn label(&self) -> String {
        self.label.clone()
    }

    fn build_event(&self, op: &Op, wl: &Workload, event_id: u64) -> RouterEvent {
        let range = op.start..op.start + op.len as usize;
        let data = match op.kind {
            OpKind::Stored { parent } => KvCacheEventData::Stored(KvCacheStoreData {
                parent_hash: parent.map(|(engine, seq)| self.hash_of(engine, seq)),
                start_position: None,
                blocks: wl.stored[range]
                    .iter()
                    .map(|b| KvCacheStoredBlockData {
                        block_hash: self.hash_of(b.engine_hash, b.seq_hash),
                        tokens_hash: LocalBlockHash(b.local_hash),
                        mm_extra_info: None,
                    })
                    .collect(),
            }),
            OpKind::Removed => KvCacheEventData::Removed(KvCacheRemoveData {
                block_hashes: wl.removed[range].iter().map(|b| self.hash_of(b.engine_hash, b.seq_hash)).collect(),
            }),
            OpKind::Query => unreachable!("queries are not events"),
        };
        RouterEvent::new(op.worker as u64, KvCacheEvent { event_id, data, dp_rank: 0 })
    }

    fn hash(local: u64) -> LocalBlockHash {
        LocalBlockHash(local)
    }

    fn submit(&self, worker: u32, event: RouterEvent) {
        self.pool.enqueue_event(event).expect("Dynamo's indexer is offline");
        let n = self.sent[worker as usize].fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_multiple_of(MARKER_EVERY_EVENTS) {
            let pool = self.pool.clone();
            let lane = WorkerWithDpRank::new(worker as u64, 0);
            let mut marker: Marker = Box::pin(async move {
                pool.flush_worker_lane_and_wait(lane).await.expect("flush marker");
            });
            // The first poll queues the marker behind this event.
            if poll_once(&mut marker) {
                self.known_applied[worker as usize].fetch_max(n, Ordering::Relaxed);
            } else {
                self.markers.lock().unwrap()[worker as usize].push_back((n, marker));
            }
        }
    }

    fn applied_events(&self, worker: u32) -> u64 {
        let mut markers = self.markers.lock().unwrap();
        let q = &mut markers[worker as usize];
        while let Some((n, m)) = q.front_mut() {
            if !poll_once(m) {
                break;
            }
            self.known_applied[worker as usize].fetch_max(*n, Ordering::Relaxed);
            q.pop_front();
        }
        self.known_applied[worker as usize].load(Ordering::Relaxed)
    }

    fn drain(&self) {
        let pool = self.pool.clone();
        let mut all: Marker = Box::pin(async move {
            pool.flush().await;
        });
        while !poll_once(&mut all) {
            std::thread::yield_now();
        }
        let mut markers = self.markers.lock().unwrap();
        for (w, q) in markers.iter_mut().enumerate() {
            q.clear();
            let n = self.sent[w].load(Ordering::Relaxed);
            self.known_applied[w].store(n, Ordering::Relaxed);
        }
    }

    fn find_matches(&self, hashes: &[LocalBlockHash], out: &mut Vec<(u32, u32)>) {
        let scores = self.pool.backend().find_matches(hashes, false);
        out.extend(scores.scores.iter().filter(|(_, d)| **d > 0).map(|(w, d)| (w.worker_id as u32, *d)));
    }

    fn memory(&self) -> Option<IndexMemory> {
        None
    }
}

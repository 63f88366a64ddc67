//! The ingest pipeline's public face: starts the listener and shard
//! threads, adds and removes listeners, and reports status and counters.
//! Sockets are created and connected here, on the caller's thread, so a bad
//! endpoint is an error returned to the caller; then they move to the
//! least-loaded listener thread, which owns them from then on.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam::channel::{bounded, Sender};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::budget::{Budget, BUDGET_LOG_INTERVAL_MS};
use super::config::{
    IngestConfig, BLOCK_SIZE_MAX, CONTROL_QUEUE_MAX, CONTROL_TIMEOUT_MS, DP_RANKS_PER_LISTENER_MAX, LISTENERS_MAX,
};
use super::counters::{Counters, IngestCounters};
use super::lag::EventLagCounts;
use super::listener::{run_listener_thread, Control, NewListener, ThreadCtx};
use super::log::LogLimiter;
use super::outbox::{queue_len, Outbox};
use super::poller::Doorbell;
use super::sequencer::Watermark;
use super::shard::{run_shard, shard_for, Shard, ShardMsg};
use super::sink::EventSink;
use super::status::{ListenerId, ListenerInfo, ListenerShared, ListenerSpec};
use super::stream::HeldAccount;
use super::subscriber::{OpenError, Subscriber};
use super::zmq_context::ZmqContext;
use crate::endpoint::ADDRESS_BYTES_MAX;
use crate::event::WorkerId;
use crate::wire::SkipCounters;

/// Most watermarks kept for removed listeners. Past it an arbitrary one is
/// forgotten, which only means that key's next registration starts fresh.
const WATERMARKS_KEPT_MAX: usize = 65_536;

/// Why an ingest call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IngestError {
    /// The configuration is unusable.
    InvalidConfig(String),
    /// ZMQ rejected the endpoint.
    BadEndpoint { endpoint: String, reason: String },
    /// A field of the listener spec is out of range.
    InvalidSpec(String),
    /// A listener for this (instance, dp_rank) already runs.
    AlreadyRegistered(WorkerId),
    /// No listener has this id.
    UnknownListener(ListenerId),
    /// `LISTENERS_MAX` listeners already run.
    TooManyListeners(usize),
    /// A pipeline thread did not answer in time.
    Timeout(&'static str),
    /// The pipeline is shut down.
    ShutDown,
    /// ZMQ could not create a socket or thread.
    Resource(String),
}

impl fmt::Display for IngestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IngestError::InvalidConfig(why) => write!(f, "invalid ingest configuration: {why}"),
            IngestError::BadEndpoint { endpoint, reason } => {
                write!(f, "bad endpoint {endpoint:?}: {reason}; expected a ZMQ address such as tcp://host:5557")
            }
            IngestError::InvalidSpec(why) => write!(f, "invalid listener: {why}"),
            IngestError::AlreadyRegistered(w) => write!(
                f,
                "instance {} dp_rank {} already has a listener; unregister it first",
                w.instance_id, w.dp_rank
            ),
            IngestError::UnknownListener(id) => write!(f, "no {id}"),
            IngestError::TooManyListeners(max) => {
                write!(f, "{max} listeners already run; unregister some first")
            }
            IngestError::Timeout(what) => {
                write!(f, "{what} did not complete within {CONTROL_TIMEOUT_MS} ms; an event sink may be stuck")
            }
            IngestError::ShutDown => write!(f, "the ingest pipeline is shut down"),
            IngestError::Resource(why) => write!(f, "cannot create ingest resources: {why}"),
        }
    }
}

impl std::error::Error for IngestError {}

/// A running listener as the registry knows it.
struct ListenerEntry {
    spec: ListenerSpec,
    shared: Arc<ListenerShared>,
    thread: usize,
}

#[derive(Default)]
struct Registry {
    listeners: BTreeMap<ListenerId, ListenerEntry>,
    /// Keys with a listener, including one being removed.
    by_worker: FxHashMap<WorkerId, ListenerId>,
    /// Watermarks of removed listeners, by key.
    watermarks: FxHashMap<WorkerId, Watermark>,
    /// Extra dp ranks a seeded key's earlier stream wrote to (`seed_watermark`).
    seeded_ranks: FxHashMap<WorkerId, Vec<u32>>,
    next_id: u64,
    thread_load: Vec<usize>,
}

/// The ingest pipeline: listener threads, writer shards and their registry.
/// Shared as `Arc<Ingest>`; `shutdown` (or drop) stops every thread.
pub struct Ingest {
    // Senders first: dropping them lets threads see the end, and sockets
    // still queued in a control channel close before the context does.
    listener_txs: Vec<Sender<Control>>,
    /// One per listener thread, rung after its control channel gets a message.
    bells: Vec<Arc<Doorbell>>,
    shards: Vec<Sender<ShardMsg>>,
    /// Rung after each message to the shard when a listener thread runs it.
    shard_bell: Option<Arc<Doorbell>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    registry: Mutex<Registry>,
    counters: Arc<Counters>,
    skips: Arc<SkipCounters>,
    held_gauge: Arc<AtomicU64>,
    budget: Arc<Budget>,
    /// Listeners running, read by listener threads to size new sockets.
    listeners_running: Arc<AtomicUsize>,
    gate_open: Arc<AtomicBool>,
    shutdown: Arc<AtomicBool>,
    cfg: IngestConfig,
    /// Tells this pipeline's inproc monitor addresses from another's.
    uid: u64,
    ctx: ZmqContext,
}

static NEXT_INGEST_UID: AtomicU64 = AtomicU64::new(0);

/// Pins the calling thread to `core`, if given. A refusal (a seccomp
/// filter answering EPERM, a cpuset without that core) leaves the thread
/// where the scheduler puts it, which costs some cache locality and nothing
/// else: one warning for the whole process, never a failure.
fn pin(core: Option<core_affinity::CoreId>) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let Some(core) = core else { return };
    if !core_affinity::set_for_current(core) && !WARNED.swap(true, Ordering::Relaxed) {
        let why = std::io::Error::last_os_error();
        crate::warn!("cannot pin threads to cores ({why}); running unpinned (--no-pin silences this)");
    }
}

/// Starts a pipeline thread named `name`, pinned to `core` if given.
fn spawn(
    name: String,
    core: Option<core_affinity::CoreId>,
    run: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, IngestError> {
    let body = move || {
        pin(core);
        run()
    };
    std::thread::Builder::new().name(name).spawn(body).map_err(|e| IngestError::Resource(e.to_string()))
}

impl Ingest {
    /// Starts the listener and shard threads.
    pub fn start(cfg: IngestConfig) -> Result<Ingest, IngestError> {
        cfg.validate().map_err(IngestError::InvalidConfig)?;
        let (listener_count, shard_count) = cfg.thread_counts();
        let ctx = ZmqContext::new().map_err(IngestError::Resource)?;
        let counters = Arc::new(Counters::default());
        let skips = Arc::new(SkipCounters::default());
        let held_gauge = Arc::new(AtomicU64::new(0));
        let budget = Budget::new(cfg.budget_bytes);
        let listener_count_all = Arc::new(AtomicUsize::new(0));
        let gate_open = Arc::new(AtomicBool::new(cfg.ready_gate_open));
        let shutdown = Arc::new(AtomicBool::new(false));
        let cores = if cfg.pin_threads { core_affinity::get_core_ids().unwrap_or_default() } else { Vec::new() };
        let core_for = |i: usize| (!cores.is_empty()).then(|| cores[i % cores.len()]);

        let mut threads = Vec::new();
        let spawn_err = |e: std::io::Error| IngestError::Resource(e.to_string());
        let (shards, receivers): (Vec<_>, Vec<_>) =
            (0..shard_count).map(|_| bounded(queue_len(cfg.shard_queue_batches))).unzip();
        let parked: Vec<Arc<AtomicBool>> = (0..shard_count).map(|_| Arc::default()).collect();
        // One listener thread and one shard: the listener thread runs the
        // shard itself (on one core, handing each batch to another thread
        // cost a third of ingest CPU), and the API's messages to it ring
        // its bell.
        let inline = listener_count == 1 && shard_count == 1;
        let bells: Vec<_> =
            (0..listener_count).map(|_| Doorbell::new().map(Arc::new)).collect::<Result<_, _>>().map_err(spawn_err)?;
        let mut local = None;
        for (j, rx) in receivers.into_iter().enumerate() {
            let shard = Shard::new(skips.clone(), counters.clone());
            if inline {
                local = Some(Outbox::Local { shard, api: rx });
                continue;
            }
            let (shutdown, parked) = (shutdown.clone(), parked[j].clone());
            threads.push(spawn(format!("kvi-shard-{j}"), core_for(listener_count + j), move || {
                run_shard(rx, shard, shutdown, parked)
            })?);
        }
        let mut listener_txs = Vec::new();
        for (i, bell) in bells.iter().enumerate() {
            let (tx, rx) = bounded(CONTROL_QUEUE_MAX);
            listener_txs.push(tx);
            let t = ThreadCtx {
                bell: bell.clone(),
                ctx: ctx.clone(),
                cfg: cfg.clone(),
                outbox: RefCell::new(local.take().unwrap_or_else(|| {
                    Outbox::queues(shards.clone(), parked.clone(), shutdown.clone(), budget.clone())
                })),
                counters: counters.clone(),
                frames: RefCell::default(),
                held: HeldAccount { gauge: held_gauge.clone() },
                budget: budget.clone(),
                listeners: listener_count_all.clone(),
                budget_log: RefCell::new(LogLimiter::every(Duration::from_millis(BUDGET_LOG_INTERVAL_MS))),
                gate_open: gate_open.clone(),
                shutdown: shutdown.clone(),
            };
            threads.push(spawn(format!("kvi-listen-{i}"), core_for(i), move || run_listener_thread(t, rx))?);
        }
        let registry = Registry { thread_load: vec![0; listener_count], ..Registry::default() };
        Ok(Ingest {
            listener_txs,
            shard_bell: inline.then(|| bells[0].clone()),
            bells,
            shards,
            threads: Mutex::new(threads),
            registry: Mutex::new(registry),
            counters,
            skips,
            held_gauge,
            budget,
            listeners_running: listener_count_all,
            gate_open,
            shutdown,
            cfg,
            uid: NEXT_INGEST_UID.fetch_add(1, Ordering::Relaxed),
            ctx,
        })
    }

    /// Subscribes to one publisher. Returns once the socket is connecting;
    /// its status is `pending` until the first connection succeeds.
    pub fn add_listener(&self, spec: ListenerSpec) -> Result<ListenerId, IngestError> {
        if self.shutdown.load(Ordering::Relaxed) {
            return Err(IngestError::ShutDown);
        }
        check_spec(&spec)?;
        let mut reg = self.registry.lock();
        if reg.by_worker.contains_key(&spec.worker) {
            return Err(IngestError::AlreadyRegistered(spec.worker));
        }
        if reg.listeners.len() >= LISTENERS_MAX {
            return Err(IngestError::TooManyListeners(LISTENERS_MAX));
        }
        // Checked first, so a bad endpoint leaves no socket or monitor behind.
        self.check_endpoint(&spec.endpoint)?;
        if let Some(replay) = &spec.replay_endpoint {
            self.check_endpoint(replay)?;
        }
        // Ids are never reused, even after a failed add: each names an
        // inproc monitor address that must stay unique.
        let id = ListenerId(reg.next_id);
        reg.next_id += 1;
        let monitor_base = format!("inproc://kv-indexer-ingest-{}-monitor-{}", self.uid, id.0);
        let listeners = reg.listeners.len() + 1;
        let first = Subscriber::open(&self.ctx, &self.cfg, (&monitor_base, 1), &spec.endpoint, listeners).map_err(
            |e| match e {
                OpenError::Endpoint(e) => {
                    IngestError::BadEndpoint { endpoint: spec.endpoint.clone(), reason: e.to_string() }
                }
                OpenError::Resource(e) => res(e),
            },
        )?;
        let last_seq = reg.watermarks.get(&spec.worker).copied();
        let ranks_written = reg.seeded_ranks.get(&spec.worker).cloned().unwrap_or_default();
        let label = format!("instance {} dp_rank {} ({})", spec.worker.instance_id, spec.worker.dp_rank, spec.endpoint);
        let shared = Arc::new(ListenerShared::new(label, last_seq));
        let thread = (0..reg.thread_load.len()).min_by_key(|&i| reg.thread_load[i]).unwrap_or(0);
        let entry = ListenerEntry { spec: spec.clone(), shared: Arc::clone(&shared), thread };
        let new = NewListener { id, spec, first, monitor_base, shared, last_seq, ranks_written };
        self.listener_txs[thread]
            .send_timeout(Control::Add(Box::new(new)), Duration::from_millis(CONTROL_TIMEOUT_MS))
            .map_err(|_| IngestError::Timeout("adding a listener"))?;
        self.bells[thread].ring();
        reg.thread_load[thread] += 1;
        self.listeners_running.fetch_add(1, Ordering::Relaxed);
        reg.watermarks.remove(&entry.spec.worker);
        reg.seeded_ranks.remove(&entry.spec.worker);
        reg.by_worker.insert(entry.spec.worker, id);
        reg.listeners.insert(id, entry);
        Ok(id)
    }

    /// Closes a listener. Once this returns, nothing more from it reaches
    /// a shard; its watermark is kept for a later registration of the key.
    /// Returns every dp rank its stream named (the registered one first,
    /// then ranks its batches overrode it with): the workers it fed, whose
    /// blocks stay until `remove_worker`.
    pub fn remove_listener(&self, id: ListenerId) -> Result<Vec<u32>, IngestError> {
        let entry = self.registry.lock().listeners.remove(&id).ok_or(IngestError::UnknownListener(id))?;
        let (done_tx, done_rx) = bounded(1);
        let timeout = Duration::from_millis(CONTROL_TIMEOUT_MS);
        let outcome = self.listener_txs[entry.thread]
            .send_timeout(Control::Remove { id, done: done_tx }, timeout)
            .ok()
            .and_then(|()| {
                self.bells[entry.thread].ring();
                done_rx.recv_timeout(timeout).ok()
            });
        let mut reg = self.registry.lock();
        reg.by_worker.remove(&entry.spec.worker);
        reg.thread_load[entry.thread] -= 1;
        self.listeners_running.fetch_sub(1, Ordering::Relaxed);
        let Some(removed) = outcome else {
            return Err(IngestError::Timeout("removing a listener"));
        };
        if let Some(last) = removed.last_seq {
            if reg.watermarks.len() >= WATERMARKS_KEPT_MAX {
                if let Some(&old) = reg.watermarks.keys().next() {
                    reg.watermarks.remove(&old);
                }
            }
            reg.watermarks.insert(entry.spec.worker, last);
        }
        Ok(removed.ranks)
    }

    /// Seeds the watermark of `worker`'s next listener, as if an earlier
    /// listener of the key had dealt with batches up to `last_seq` (a
    /// snapshot's). With a replay endpoint its first ring fill asks from
    /// that seq and goes on from it only if the ring's batch there is the
    /// one applied (its digest, when known); otherwise it is a new process.
    /// Live, `last_seq + 1` applies, a later seq is a gap, and a seq at or
    /// below it is a restart. A restart clears the registered rank and
    /// `ranks_written` (other dp ranks that stream wrote to). Call before
    /// `add_listener` for the key.
    pub fn seed_watermark(
        &self,
        worker: WorkerId,
        last_seq: Watermark,
        ranks_written: &[u32],
    ) -> Result<(), IngestError> {
        let mut reg = self.registry.lock();
        if reg.by_worker.contains_key(&worker) {
            return Err(IngestError::AlreadyRegistered(worker));
        }
        if !reg.watermarks.contains_key(&worker) && reg.watermarks.len() >= WATERMARKS_KEPT_MAX {
            return Err(IngestError::InvalidSpec(format!("more than {WATERMARKS_KEPT_MAX} watermarks")));
        }
        reg.watermarks.insert(worker, last_seq);
        let mut ranks: Vec<u32> = Vec::new();
        for &r in ranks_written {
            if r != worker.dp_rank && !ranks.contains(&r) && ranks.len() + 1 < DP_RANKS_PER_LISTENER_MAX {
                ranks.push(r);
            }
        }
        reg.seeded_ranks.insert(worker, ranks);
        Ok(())
    }

    /// The watermark (highest seq dealt with) of every running listener that
    /// has one, by key. A snapshot pairs these with the index state.
    pub fn watermarks(&self) -> Vec<(WorkerId, Watermark)> {
        let reg = self.registry.lock();
        reg.listeners.values().filter_map(|e| e.shared.watermark().map(|w| (e.spec.worker, w))).collect()
    }

    /// Removes `worker` from `sink` through its shard, after every batch of
    /// it already queued. Returns once done. Remove its listener first, or
    /// later live events bring the worker back.
    pub fn remove_worker(&self, worker: WorkerId, sink: Arc<dyn EventSink>) -> Result<(), IngestError> {
        if self.shutdown.load(Ordering::Relaxed) {
            return Err(IngestError::ShutDown);
        }
        {
            // A watermark a removed listener of this key left is forgotten
            // with its blocks: the next registration starts a fresh stream
            // and fills from the ring's start, rather than asking only for
            // what came after blocks that are gone.
            let mut reg = self.registry.lock();
            if !reg.by_worker.contains_key(&worker) {
                reg.watermarks.remove(&worker);
                reg.seeded_ranks.remove(&worker);
            }
        }
        let (done_tx, done_rx) = bounded(1);
        let timeout = Duration::from_millis(CONTROL_TIMEOUT_MS);
        let msg = ShardMsg::Remove { worker, sink, done: done_tx };
        self.to_shard(shard_for(worker, self.shards.len()), msg)
            .map_err(|_| IngestError::Timeout("removing a worker"))?;
        done_rx.recv_timeout(timeout).map_err(|_| IngestError::Timeout("removing a worker"))
    }

    /// Every listener's status, by id.
    pub fn listener_status(&self) -> Vec<ListenerInfo> {
        let gate_open = self.gate_open.load(Ordering::Acquire);
        let reg = self.registry.lock();
        reg.listeners.iter().map(|(&id, e)| info(id, e, gate_open)).collect()
    }

    /// Opens the ready gate: listeners apply the batches they held, in
    /// order, then run live. Idempotent.
    pub fn open_ready_gate(&self) {
        self.gate_open.store(true, Ordering::Release);
        self.bells.iter().for_each(|b| b.ring());
    }

    /// A snapshot of the counters, queue depths and skip reasons.
    pub fn counters(&self) -> IngestCounters {
        let mut snap = self.counters.snapshot();
        snap.shard_queue_depths = self.shards.iter().map(|tx| tx.len()).collect();
        snap.held_batches = self.held_gauge.load(Ordering::Relaxed);
        snap.budget_bytes = self.budget.used() as u64;
        snap.budget_bytes_max = self.budget.bytes_max() as u64;
        snap.skips = self.skips.snapshot();
        snap
    }

    /// How far applied batches lagged behind their engines' clocks, so far.
    pub fn event_lag(&self) -> EventLagCounts {
        self.counters.event_lag.snapshot()
    }

    /// Waits until every shard has handled everything queued to it so far.
    /// Batches still in sockets or held by listeners are not covered.
    pub fn sync_shards(&self) -> Result<(), IngestError> {
        let timeout = Duration::from_millis(CONTROL_TIMEOUT_MS);
        let mut waits = Vec::with_capacity(self.shards.len());
        for i in 0..self.shards.len() {
            let (done_tx, done_rx) = bounded(1);
            self.to_shard(i, ShardMsg::Sync(done_tx)).map_err(|_| IngestError::Timeout("syncing shards"))?;
            waits.push(done_rx);
        }
        for rx in waits {
            rx.recv_timeout(timeout).map_err(|_| IngestError::Timeout("syncing shards"))?;
        }
        Ok(())
    }

    /// Queues `msg` to shard `i` (waking the listener thread that runs it,
    /// if one does).
    fn to_shard(&self, i: usize, msg: ShardMsg) -> Result<(), ()> {
        self.shards[i].send_timeout(msg, Duration::from_millis(CONTROL_TIMEOUT_MS)).map_err(|_| ())?;
        if let Some(bell) = &self.shard_bell {
            bell.ring();
        }
        Ok(())
    }

    /// The configuration the pipeline runs with.
    pub fn config(&self) -> &IngestConfig {
        &self.cfg
    }

    /// Stops every thread and closes every socket. Listeners and shards are
    /// woken at once; a send blocked on a full shard notices within 50 ms.
    /// Idempotent.
    pub fn shutdown(&self) {
        self.shutdown.store(true, Ordering::Relaxed);
        self.bells.iter().for_each(|b| b.ring());
        for tx in &self.shards {
            // A full queue means the shard is awake and sees the flag soon.
            let _ = tx.try_send(ShardMsg::Wake);
        }
        let threads = std::mem::take(&mut *self.threads.lock());
        for handle in threads {
            let _ = handle.join();
        }
    }

    /// Lets ZMQ parse `endpoint` without keeping a connection.
    fn check_endpoint(&self, endpoint: &str) -> Result<(), IngestError> {
        let probe = self.ctx.socket(zmq::DEALER).map_err(res)?;
        probe.set_linger(0).map_err(res)?;
        probe
            .connect(endpoint)
            .map_err(|e| IngestError::BadEndpoint { endpoint: endpoint.to_string(), reason: e.to_string() })
    }
}

impl Drop for Ingest {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A ZMQ call that failed for want of resources; out of descriptors, says
/// what to raise.
fn res(e: zmq::Error) -> IngestError {
    IngestError::Resource(if e == zmq::Error::EMFILE {
        format!("{e}: each worker holds about six file descriptors; raise the daemon's open-files limit (LimitNOFILE)")
    } else {
        e.to_string()
    })
}

fn check_spec(spec: &ListenerSpec) -> Result<(), IngestError> {
    if spec.block_size == 0 || spec.block_size > BLOCK_SIZE_MAX {
        return Err(IngestError::InvalidSpec(format!(
            "block_size {} is outside 1..={BLOCK_SIZE_MAX}",
            spec.block_size
        )));
    }
    let endpoints = std::iter::once(&spec.endpoint).chain(spec.replay_endpoint.as_ref());
    for endpoint in endpoints {
        if endpoint.is_empty() || endpoint.len() > ADDRESS_BYTES_MAX || endpoint.contains('\0') {
            return Err(IngestError::BadEndpoint {
                endpoint: endpoint.chars().take(64).collect(),
                reason: format!("must be 1..={ADDRESS_BYTES_MAX} bytes without NUL"),
            });
        }
    }
    Ok(())
}

fn info(id: ListenerId, e: &ListenerEntry, gate_open: bool) -> ListenerInfo {
    let (status, last_error, connected) = e.shared.state(gate_open);
    ListenerInfo {
        id,
        worker: e.spec.worker,
        endpoint: e.spec.endpoint.clone(),
        replay_endpoint: e.spec.replay_endpoint.clone(),
        block_size: e.spec.block_size,
        status,
        last_error,
        connected,
        last_seq: e.shared.last_seq(),
        batches_received: e.shared.batches_received.load(Ordering::Relaxed),
        since_last_batch: e.shared.since_last_batch(),
    }
}

//! (model, tenant) -> index, and which engine feeds which index.
//!
//! `/register` creates the index of a (model, tenant) on first use (its
//! block size is fixed then) and starts a listener; `/unregister` closes
//! listeners and removes workers through their writer shards, after their
//! pending events, and drops the index once no registration is left on it
//! (as Dynamo does: queries for it answer 404 again, and a new
//! registration may choose another block size). Every check is done before anything changes, so a refused
//! request leaves no trace. Queries look an index up without the registry's
//! lock.

pub mod event_status;
#[cfg(test)]
mod limits_tests;
pub mod readiness;
pub mod staging;
pub mod state_metrics;
mod swap;

pub use swap::IndexRef;

use crate::event::{Event, StorageTier, WorkerId};
use crate::index::{ApplyOutcome, Budget, Index, IndexConfig};
use crate::ingest::{EventSink, Ingest, IngestError, ListenerId, ListenerInfo, ListenerSpec};
use crate::predict::{Booked, PredictLimits, Predictions, RoutedError, RoutedRequest};
use dashmap::DashMap;
use event_status::ApplyCounters;
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Tenant used when a request names none.
pub const TENANT_DEFAULT: &str = "default";

/// Longest model name or tenant an index may have, in bytes (and salt a
/// registration may carry): every path that creates an index checks it, so
/// every index fits a snapshot.
pub const NAME_BYTES_MAX: usize = 256;

/// Most (model, tenant) indexes a daemon keeps. An index goes with its
/// last registration, but one recovered from a peer or a snapshot without
/// registrations stays, so this bounds what those can leave behind.
pub const INDEXES_MAX: usize = 1_024;

/// Least time between two log lines about shed blocks.
pub const SHED_LOG_INTERVAL_MS: u64 = 10_000;

/// Tells the operator, at most once per `SHED_LOG_INTERVAL_MS`, that the
/// pair cap is shedding stores and what to raise; counters carry the totals.
struct ShedLog {
    started: Instant,
    /// Milliseconds since `started` of the last line; `u64::MAX`: none yet.
    last_ms: AtomicU64,
    /// Blocks shed since the last line.
    pending: AtomicU64,
}

impl ShedLog {
    fn new() -> ShedLog {
        ShedLog { started: Instant::now(), last_ms: AtomicU64::new(u64::MAX), pending: AtomicU64::new(0) }
    }

    fn note(&self, shed: u32, budget: &Budget) {
        self.pending.fetch_add(shed as u64, Ordering::Relaxed);
        let now = self.started.elapsed().as_millis() as u64;
        let last = self.last_ms.load(Ordering::Relaxed);
        if last != u64::MAX && now.saturating_sub(last) < SHED_LOG_INTERVAL_MS {
            return;
        }
        if self.last_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            return; // another thread logs this interval
        }
        let n = self.pending.swap(0, Ordering::Relaxed);
        let since = if last == u64::MAX { String::new() } else { format!(" in the last {} s", (now - last) / 1000) };
        crate::warn!(
            "memory cap reached: refused {n} stored block(s){since}; {} of --max-pairs {} (block, worker) pairs \
             and {} entries are live. Queries miss the refused blocks until engines free some; \
             raise --max-pairs if the host has memory to spare (see kv_indexer_index_bytes)",
            budget.pairs(),
            budget.pairs_max().unwrap_or(0),
            budget.entries()
        );
    }
}

/// One (model, tenant) index and the sink its listeners feed.
pub struct IndexHandle {
    pub model_name: String,
    pub tenant_id: String,
    index: swap::IndexSlot,
    /// Placements routers booked (`/routed`), beside the index, never in it.
    pub predictions: Predictions,
    counters: Arc<ApplyCounters>,
    budget: Arc<Budget>,
    shed_log: Arc<ShedLog>,
    /// Registered workers, for answers that list them even with no match.
    registered: RwLock<Vec<WorkerId>>,
}

impl IndexHandle {
    /// The current index, for a short read or write.
    pub fn index(&self) -> IndexRef {
        self.index.get()
    }

    /// The current index, to hold for long (a streamed dump): holding it
    /// pins no epoch.
    pub fn index_arc(&self) -> Arc<Index> {
        self.index.arc()
    }

    /// Puts `index` (of the same block size) in place of the current one,
    /// whole: readers see the old one or the new one. For recovery, while
    /// the ready gate holds every writer of this index: a write under way
    /// elsewhere could land in the old one.
    pub fn replace_index(&self, index: Index) {
        debug_assert_eq!(index.block_size(), self.index().block_size());
        self.index.replace(index);
    }

    /// Drops every block and booking of `worker` and forgets it.
    pub fn remove_worker(&self, worker: WorkerId) {
        self.index().remove_worker(worker);
        self.predictions.drop_worker(worker);
    }

    /// The workers registered to this index, sorted.
    pub fn registered(&self) -> Vec<WorkerId> {
        self.registered.read().clone()
    }

    fn set_registered(&self, worker: WorkerId, on: bool) {
        let mut r = self.registered.write();
        r.retain(|w| *w != worker);
        if on {
            r.push(worker);
            r.sort_unstable();
        }
    }

    /// Applies an event from outside the ingest pipeline (peer recovery).
    pub fn apply(&self, event: &Event) -> ApplyOutcome {
        let mut outcome = ApplyOutcome::default();
        self.apply_each(std::slice::from_ref(event), |o| outcome = *o);
        outcome
    }

    /// Applies events in order: the index, then their worker's bookings and
    /// the counters; `seen` gets each outcome.
    fn apply_each(&self, events: &[Event], mut seen: impl FnMut(&ApplyOutcome)) {
        let mut noted = Noted::new(self);
        self.index().apply_all(events, |e, o| {
            noted.note(e, o);
            seen(o);
        });
        noted.finish();
    }
}

/// What applied events leave beside the index: their worker's bookings,
/// the counters, and one line for what the shared cap shed.
struct Noted<'a> {
    handle: &'a IndexHandle,
    now_ms: Option<u64>,
    shed: u32,
}

impl<'a> Noted<'a> {
    fn new(handle: &'a IndexHandle) -> Self {
        Noted { handle, now_ms: (!handle.predictions.is_empty()).then(crate::predict::now_ms), shed: 0 }
    }

    fn note(&mut self, e: &Event, o: &ApplyOutcome) {
        if let Some(now_ms) = self.now_ms {
            self.handle.predictions.on_event(e, o, now_ms);
        }
        self.handle.counters.add(&e.kind, o);
        self.shed = self.shed.saturating_add(o.shed);
    }

    fn finish(self) {
        if self.shed > 0 {
            self.handle.shed_log.note(self.shed, &self.handle.budget);
        }
    }
}

impl EventSink for IndexHandle {
    fn apply(&self, event: &Event) {
        IndexHandle::apply(self, event);
    }

    fn apply_all(&self, events: &[Event]) {
        self.apply_each(events, |_| {});
    }

    fn retain_held(&self, worker: WorkerId, tier: StorageTier, engine_hashes: &mut Vec<u64>) {
        self.index().retain_held(worker, tier, engine_hashes);
    }

    fn remove_worker(&self, worker: WorkerId) {
        IndexHandle::remove_worker(self, worker);
    }
}

/// One registered (instance, dp_rank).
#[derive(Clone, Debug)]
pub struct Registration {
    pub worker: WorkerId,
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub model_name: String,
    pub tenant_id: String,
    pub listener: ListenerId,
    pub origin: Origin,
}

/// Who made a registration: a reload of `--workers-file` changes only
/// those the file made; `/unregister` may end any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `/register`, `--workers` or a snapshot.
    Api,
    /// `--workers-file`, with the entry as the file gave it (a snapshot
    /// may have added a replay endpoint to what was registered).
    File(Box<RegisterArgs>),
}

/// Reads of `--workers-file` (at start and on SIGHUP), by outcome.
#[derive(Debug, Default)]
pub struct FileReloads {
    /// Every change made.
    pub applied: AtomicU64,
    /// Checked and begun, but some registrations failed (each logged).
    pub partial: AtomicU64,
    /// Refused (unreadable, a bad line, a conflict): nothing changed.
    pub refused: AtomicU64,
    /// The last read was refused or partial.
    pub last_failed: AtomicBool,
}

/// A `/register` request, validated for shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterArgs {
    pub instance_id: u64,
    pub dp_rank: u32,
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub model_name: String,
    pub tenant_id: String,
    pub block_size: u32,
}

impl RegisterArgs {
    /// The (instance, dp rank) registered: the listener's key.
    pub fn worker(&self) -> WorkerId {
        WorkerId::new(self.instance_id, self.dp_rank)
    }
}

/// Why the registry refused: each maps to one HTTP status.
#[derive(Debug, PartialEq, Eq)]
pub enum RegistryError {
    /// 400: an invalid value (endpoint, block size).
    Invalid(String),
    /// 404: no such model, tenant, instance or rank.
    NotFound(String),
    /// 409: conflicts with what is registered.
    Conflict(String),
    /// 503: the pipeline could not do it now.
    Unavailable(String),
}

impl std::fmt::Display for RegistryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryError::Invalid(m)
            | RegistryError::NotFound(m)
            | RegistryError::Conflict(m)
            | RegistryError::Unavailable(m) => f.write_str(m),
        }
    }
}

type Key = (String, String);

/// The registry of indexes and listeners.
pub struct Registry {
    indexes: DashMap<Key, Arc<IndexHandle>>,
    /// Registrations by worker; held through a whole register or unregister.
    registrations: Mutex<BTreeMap<WorkerId, Registration>>,
    ingest: Arc<Ingest>,
    jump: usize,
    pub counters: Arc<ApplyCounters>,
    /// Pairs and entries all indexes may hold together (`--max-pairs`).
    pub budget: Arc<Budget>,
    /// Cap, TTLs and counters of every index's predictions.
    pub predict: Arc<PredictLimits>,
    /// What became of each read of `--workers-file`.
    pub file_reloads: FileReloads,
    shed_log: Arc<ShedLog>,
    /// Held while an index may be created.
    creating: Mutex<()>,
}

impl Registry {
    /// A registry whose indexes search with `jump` and share `budget`.
    pub fn new(ingest: Arc<Ingest>, jump: usize, budget: Arc<Budget>) -> Registry {
        Registry {
            indexes: DashMap::new(),
            registrations: Mutex::new(BTreeMap::new()),
            ingest,
            jump,
            counters: Default::default(),
            budget,
            predict: Arc::new(PredictLimits::default()),
            file_reloads: FileReloads::default(),
            shed_log: Arc::new(ShedLog::new()),
            creating: Mutex::new(()),
        }
    }

    /// The same registry with predictions under `limits` (before any index exists).
    pub fn with_predict(mut self, limits: PredictLimits) -> Registry {
        self.predict = Arc::new(limits);
        self
    }

    pub fn ingest(&self) -> &Arc<Ingest> {
        &self.ingest
    }

    /// The index of (model, tenant), if any.
    pub fn index(&self, model_name: &str, tenant_id: &str) -> Option<Arc<IndexHandle>> {
        self.indexes.get(&(model_name.to_string(), tenant_id.to_string())).map(|e| e.value().clone())
    }

    /// Every index, sorted by (model, tenant).
    pub fn indexes(&self) -> Vec<Arc<IndexHandle>> {
        let mut v: Vec<_> = self.indexes.iter().map(|e| e.value().clone()).collect();
        v.sort_by(|a, b| (&a.model_name, &a.tenant_id).cmp(&(&b.model_name, &b.tenant_id)));
        v
    }

    /// The index of (model, tenant), created with `block_size` if absent.
    /// Refuses a block size that differs from the existing index's.
    pub fn index_or_create(
        &self,
        model_name: &str,
        tenant_id: &str,
        block_size: u32,
    ) -> Result<Arc<IndexHandle>, RegistryError> {
        if block_size == 0 {
            return Err(RegistryError::Invalid("block_size must be at least 1".into()));
        }
        for (what, name) in [("model name", model_name), ("tenant", tenant_id)] {
            if name.is_empty() || name.len() > NAME_BYTES_MAX {
                return Err(RegistryError::Invalid(format!(
                    "the {what} must be 1..={NAME_BYTES_MAX} bytes, not {}",
                    name.len()
                )));
            }
        }
        let key = (model_name.to_string(), tenant_id.to_string());
        // Creations are serialized so the count check holds; lookups of
        // existing indexes (queries) never take this lock.
        let _creating = self.creating.lock();
        if self.indexes.len() >= INDEXES_MAX && !self.indexes.contains_key(&key) {
            return Err(RegistryError::Conflict(format!(
                "{INDEXES_MAX} (model, tenant) indexes exist already; no index for model={model_name:?} \
                 tenant={tenant_id:?} is created"
            )));
        }
        let handle = self
            .indexes
            .entry(key)
            .or_insert_with(|| {
                crate::info!("created index model={model_name:?} tenant={tenant_id:?} block_size={block_size}");
                Arc::new(IndexHandle {
                    model_name: model_name.to_string(),
                    tenant_id: tenant_id.to_string(),
                    index: swap::IndexSlot::new(self.new_index(block_size)),
                    predictions: Predictions::new(self.predict.clone()),
                    counters: self.counters.clone(),
                    budget: self.budget.clone(),
                    shed_log: self.shed_log.clone(),
                    registered: RwLock::new(Vec::new()),
                })
            })
            .value()
            .clone();
        if handle.index().block_size() != block_size {
            return Err(RegistryError::Conflict(format!(
                "model={model_name:?} tenant={tenant_id:?} has block_size {}, not {block_size}",
                handle.index().block_size()
            )));
        }
        Ok(handle)
    }

    /// An index as this registry makes them (its jump, the shared budget),
    /// in no handle yet: recovery stages a peer's dump in it.
    pub fn new_index(&self, block_size: u32) -> Index {
        Index::new(IndexConfig { block_size, jump: self.jump, depth_max: 0, budget: self.budget.clone() })
    }

    /// Puts a staged index (`new_index`) in place of (model, tenant)'s,
    /// creating its handle if absent; checked as `index_or_create` is.
    pub fn install_index(&self, model_name: &str, tenant_id: &str, index: Index) -> Result<(), RegistryError> {
        let handle = self.index_or_create(model_name, tenant_id, index.block_size())?;
        handle.replace_index(index);
        Ok(())
    }

    /// Registers an engine's publisher and starts listening to it.
    pub fn register(&self, args: RegisterArgs) -> Result<(), RegistryError> {
        self.register_as(args, Origin::Api)
    }

    /// `register`, recording who asked (see `Origin`).
    pub fn register_as(&self, args: RegisterArgs, origin: Origin) -> Result<(), RegistryError> {
        crate::endpoint::validate_zmq_endpoint(&args.endpoint).map_err(RegistryError::Invalid)?;
        if let Some(r) = &args.replay_endpoint {
            crate::endpoint::validate_zmq_endpoint(r)
                .map_err(|e| RegistryError::Invalid(format!("replay_endpoint: {e}")))?;
        }
        if args.block_size == 0 {
            return Err(RegistryError::Invalid("block_size must be at least 1".into()));
        }
        let worker = args.worker();
        let mut registered = self.registrations.lock();
        if registered.contains_key(&worker) {
            return Err(RegistryError::Conflict(format!(
                "instance {} dp_rank {} is already registered; unregister it first",
                args.instance_id, args.dp_rank
            )));
        }
        if let Some(other) = registered.values().find(|r| {
            r.worker.instance_id == args.instance_id
                && (r.model_name != args.model_name || r.tenant_id != args.tenant_id)
        }) {
            return Err(RegistryError::Conflict(format!(
                "instance {} is registered under model={:?} tenant={:?}",
                args.instance_id, other.model_name, other.tenant_id
            )));
        }
        let key = (args.model_name.clone(), args.tenant_id.clone());
        let existed = self.indexes.contains_key(&key);
        let handle = self.index_or_create(&args.model_name, &args.tenant_id, args.block_size)?;
        let spec = ListenerSpec {
            worker,
            endpoint: args.endpoint.clone(),
            replay_endpoint: args.replay_endpoint.clone(),
            block_size: args.block_size,
            sink: handle.clone(),
        };
        let listener = match self.ingest.add_listener(spec) {
            Ok(id) => id,
            Err(e) => {
                // Leave no trace of a refused registration.
                if !existed && handle.index().workers().is_empty() {
                    self.indexes.remove(&key);
                }
                return Err(match e {
                    IngestError::BadEndpoint { .. } | IngestError::InvalidSpec(_) => {
                        RegistryError::Invalid(e.to_string())
                    }
                    IngestError::AlreadyRegistered(_) => RegistryError::Conflict(e.to_string()),
                    _ => RegistryError::Unavailable(e.to_string()),
                });
            }
        };
        crate::info!(
            "registered instance {} dp_rank {} endpoint {} model={:?} tenant={:?}{}",
            args.instance_id,
            args.dp_rank,
            args.endpoint,
            args.model_name,
            args.tenant_id,
            args.replay_endpoint.as_deref().map(|r| format!(" replay {r}")).unwrap_or_default()
        );
        handle.set_registered(worker, true);
        registered.insert(
            worker,
            Registration {
                worker,
                endpoint: args.endpoint,
                replay_endpoint: args.replay_endpoint,
                model_name: args.model_name,
                tenant_id: args.tenant_id,
                listener,
                origin,
            },
        );
        Ok(())
    }

    /// Marks the registration of `entry`'s key as made by `--workers-file`
    /// (one a snapshot restored, merged with the file's entry); false if
    /// that key is not registered.
    pub fn adopt_from_file(&self, entry: &RegisterArgs) -> bool {
        let mut registered = self.registrations.lock();
        let Some(r) = registered.get_mut(&entry.worker()) else {
            return false;
        };
        r.origin = Origin::File(Box::new(entry.clone()));
        true
    }

    /// Unregisters an instance of a model: from every tenant when `tenant_id`
    /// is None, every rank when `dp_rank` is None. Its blocks go too: those
    /// of the named ranks, and those of every worker a removed registration's
    /// listener fed, whatever ranks its batches named.
    pub fn unregister(
        &self,
        instance_id: u64,
        model_name: &str,
        tenant_id: Option<&str>,
        dp_rank: Option<u32>,
    ) -> Result<(), RegistryError> {
        let mut registered = self.registrations.lock();
        let regs: Vec<Registration> = registered
            .values()
            .filter(|r| {
                r.worker.instance_id == instance_id
                    && r.model_name == model_name
                    && tenant_id.is_none_or(|t| r.tenant_id == t)
                    && dp_rank.is_none_or(|d| r.worker.dp_rank == d)
            })
            .cloned()
            .collect();
        let mut held = self.held_workers(instance_id, model_name, tenant_id, dp_rank);
        let scope = format!(
            "{}{}",
            tenant_id.map(|t| format!(" tenant={t:?}")).unwrap_or_default(),
            dp_rank.map(|d| format!(" dp_rank {d}")).unwrap_or_default()
        );
        if regs.is_empty() && held.is_empty() {
            return Err(RegistryError::NotFound(format!(
                "instance {instance_id} is not registered for model={model_name:?}{scope}"
            )));
        }
        for r in &regs {
            self.close_registration(r, &mut registered, &mut held);
        }
        self.remove_held(&held);
        let touched = regs.iter().filter_map(|r| self.index(&r.model_name, &r.tenant_id));
        self.drop_unregistered_indexes(touched.chain(held.iter().map(|(h, _)| h.clone())), &registered);
        crate::info!(
            "unregistered instance {instance_id} model={model_name:?}{scope}: {} listener(s), {} worker(s)",
            regs.len(),
            held.len()
        );
        Ok(())
    }

    /// The workers of an instance of a model that some index holds blocks of
    /// (of every tenant when `tenant_id` is None, every rank when `dp_rank` is).
    fn held_workers(
        &self,
        instance_id: u64,
        model_name: &str,
        tenant_id: Option<&str>,
        dp_rank: Option<u32>,
    ) -> Vec<(Arc<IndexHandle>, WorkerId)> {
        let mut held = Vec::new();
        for h in self.indexes.iter().map(|e| e.value().clone()) {
            if h.model_name != model_name || tenant_id.is_some_and(|t| h.tenant_id != t) {
                continue;
            }
            for w in h.index().workers() {
                if w.instance_id == instance_id && dp_rank.is_none_or(|d| w.dp_rank == d) {
                    held.push((h.clone(), w));
                }
            }
        }
        held
    }

    /// Ends registration `r`: closes its listener, forgets it, drops its
    /// bookings, and adds to `held` every worker its listener fed.
    fn close_registration(
        &self,
        r: &Registration,
        registered: &mut BTreeMap<WorkerId, Registration>,
        held: &mut Vec<(Arc<IndexHandle>, WorkerId)>,
    ) {
        let fed = self.ingest.remove_listener(r.listener);
        registered.remove(&r.worker);
        let Some(h) = self.index(&r.model_name, &r.tenant_id) else {
            return;
        };
        h.set_registered(r.worker, false);
        // Its bookings go even if it never stored a block (and so is not held).
        h.predictions.drop_worker(r.worker);
        let instance_id = r.worker.instance_id;
        let ranks = fed.unwrap_or_else(|e| {
            // Which ranks it fed is unknown: take every rank of the
            // instance that no registration still feeds itself.
            crate::warn!(
                "closing the listener of instance {} dp_rank {}: {e}; removing all its unregistered ranks",
                r.worker.instance_id,
                r.worker.dp_rank
            );
            let workers = h.index().workers().into_iter();
            let orphans = workers.filter(|w| w.instance_id == instance_id && !registered.contains_key(w));
            std::iter::once(r.worker.dp_rank).chain(orphans.map(|w| w.dp_rank)).collect()
        });
        for rank in ranks {
            let w = WorkerId::new(instance_id, rank);
            // A rank another registration owns stays with it, even if this
            // listener's batches named it too.
            if registered.contains_key(&w) {
                continue;
            }
            if !held.iter().any(|(x, y)| Arc::ptr_eq(x, &h) && *y == w) {
                held.push((h.clone(), w));
            }
        }
    }

    /// Removes each held worker's blocks through its shard.
    fn remove_held(&self, held: &[(Arc<IndexHandle>, WorkerId)]) {
        for (h, w) in held {
            let sink: Arc<dyn EventSink> = h.clone();
            if let Err(e) = self.ingest.remove_worker(*w, sink) {
                // The shard did not answer; remove directly rather than leave blocks behind.
                crate::warn!("removing worker {w} through its shard: {e}; removing it directly");
                h.remove_worker(*w);
            }
        }
    }

    /// Drops each of `touched` that no registration is left on (as Dynamo does).
    fn drop_unregistered_indexes(
        &self,
        touched: impl Iterator<Item = Arc<IndexHandle>>,
        registered: &BTreeMap<WorkerId, Registration>,
    ) {
        let mut emptied: Vec<Arc<IndexHandle>> = Vec::new();
        for h in touched {
            let key = (h.model_name.clone(), h.tenant_id.clone());
            let still_registered = registered.values().any(|r| (&r.model_name, &r.tenant_id) == (&key.0, &key.1));
            if !still_registered && !emptied.iter().any(|e| Arc::ptr_eq(e, &h)) {
                // Only this handle: a racing creation cannot have replaced it
                // (creations by registration take `registrations`, held here).
                self.indexes.remove_if(&key, |_, v| Arc::ptr_eq(v, &h));
                crate::info!("dropped index model={:?} tenant={:?}: no worker is registered on it", key.0, key.1);
                emptied.push(h);
            }
        }
    }

    /// Books a routed request's blocks as predicted for its worker. At the
    /// cap, expired bookings of every index are swept and the booking is
    /// tried once more.
    pub fn routed(&self, req: &RoutedRequest) -> Result<Booked, RegistryError> {
        let tenant = req.tenant_id.as_deref().unwrap_or(TENANT_DEFAULT);
        let Some(h) = self.index(&req.model_name, tenant) else {
            return Err(RegistryError::NotFound(format!("no indexer for model={} tenant={tenant}", req.model_name)));
        };
        let registered = h.registered();
        let book = |now| crate::predict::book(req, &h.index(), &registered, &h.predictions, now);
        let now = crate::predict::now_ms();
        let mut booked = book(now);
        if let Err(RoutedError::Full { .. }) = booked {
            for other in self.indexes() {
                other.predictions.sweep(now);
            }
            booked = book(now);
        }
        booked.map_err(|e| match e {
            RoutedError::NotFound(m) => RegistryError::NotFound(m),
            RoutedError::Full { asked, message } => {
                self.predict.counters.refused.fetch_add(asked, Ordering::Relaxed);
                RegistryError::Unavailable(message)
            }
        })
    }

    /// Every registration, sorted by worker.
    pub fn registrations(&self) -> Vec<Registration> {
        self.registrations.lock().values().cloned().collect()
    }

    /// Registered instances (distinct instance ids).
    pub fn instance_count(&self) -> usize {
        let mut ids: Vec<u64> = self.registrations.lock().keys().map(|w| w.instance_id).collect();
        ids.dedup();
        ids.len()
    }

    /// Listener status by listener id.
    pub fn listener_infos(&self) -> BTreeMap<ListenerId, ListenerInfo> {
        self.ingest.listener_status().into_iter().map(|i| (i.id, i)).collect()
    }
}

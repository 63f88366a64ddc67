//! The API: one function per endpoint, over the registry, the peers and
//! the readiness state. Request bodies are parsed by `codec` (hot ones
//! without a JSON tree) and replies are written straight into the thread's
//! scratch buffer. A failed request changes nothing.

use super::access_log::AccessLog;
use super::auth::{AdminToken, CHALLENGE};
use super::codec::{self, BodyError};
use super::endpoints::Route;
use super::metrics::HttpMetrics;
use crate::dump::binary;
use crate::dump::stream::{DumpStream, Format, Source};
use crate::hash::{local_hashes_into, seed_for};
use crate::ingest::ListenerStatus;
use crate::metrics::Prom;
use crate::peers::{PeerAdded, Peers, PEERS_MAX};
use crate::registry::readiness::Readiness;
use crate::registry::{Registry, RegistryError, TENANT_DEFAULT};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Everything the endpoints need.
pub struct Api {
    pub registry: Arc<Registry>,
    pub peers: Arc<Peers>,
    pub readiness: Arc<Readiness>,
    pub metrics: HttpMetrics,
    /// When set, mutating endpoints need it as a bearer token.
    pub admin_token: Option<AdminToken>,
    /// Requests refused for a missing or wrong admin token.
    pub auth_refused: AtomicU64,
    /// The access log `/reopen_logs` reopens, if configured.
    pub access_log: Option<Arc<AccessLog>>,
    /// Dumps being sent now (see `DUMPS_AT_ONCE_MAX`).
    pub dumps: Arc<AtomicUsize>,
}

/// Most `/dump` replies being sent at once: each holds a piece of about
/// `dump::stream::PIECE_BYTES` (one worker's events at least) and its
/// indexes until its client has read it or the write timed out; past this
/// a dump is refused with 503 and `Retry-After`.
pub const DUMPS_AT_ONCE_MAX: usize = 2;

/// One of the `DUMPS_AT_ONCE_MAX` places, held in `Scratch` until the
/// dump's reply is written.
pub struct DumpSlot(Arc<AtomicUsize>);

impl DumpSlot {
    fn take(dumps: &Arc<AtomicUsize>) -> Option<DumpSlot> {
        let taken =
            dumps.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < DUMPS_AT_ONCE_MAX).then_some(n + 1));
        taken.is_ok().then(|| DumpSlot(Arc::clone(dumps)))
    }
}

impl Drop for DumpSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Per-thread buffers a handler may reuse across requests.
#[derive(Default)]
pub struct Scratch {
    pub tokens: Vec<u32>,
    pub hashes: Vec<u64>,
    /// The reply's body.
    pub out: Vec<u8>,
    /// The model the request named, for the access log (reused buffer).
    pub(super) model: String,
    pub(super) has_model: bool,
    /// A dump's place, given back once its reply is written.
    pub(super) dump_slot: Option<DumpSlot>,
}

/// Scratch past this many bytes is dropped after its request.
const SCRATCH_KEPT_BYTES: usize = 1 << 20;

impl Scratch {
    /// Drops buffers that one huge request or reply (a dump, a query of
    /// millions of tokens) grew, so an idle keep-alive connection does not
    /// pin that memory.
    pub fn release_large(&mut self) {
        self.dump_slot = None;
        if self.out.capacity() > SCRATCH_KEPT_BYTES {
            self.out = Vec::new();
        }
        if self.tokens.capacity() * std::mem::size_of::<u32>() > SCRATCH_KEPT_BYTES {
            self.tokens = Vec::new();
        }
        if self.hashes.capacity() * std::mem::size_of::<u64>() > SCRATCH_KEPT_BYTES {
            self.hashes = Vec::new();
        }
    }

    /// Notes the model the request named (for the access log).
    pub fn set_model(&mut self, model: &str) {
        self.model.clear();
        self.model.push_str(model);
        self.has_model = true;
    }
}

/// A body written piece by piece (chunked): `fill` appends the next
/// piece to the buffer it is given and says whether more follows.
pub trait BodyStream {
    fn fill(&mut self, out: &mut Vec<u8>) -> bool;
}

impl BodyStream for DumpStream {
    fn fill(&mut self, out: &mut Vec<u8>) -> bool {
        DumpStream::fill(self, out)
    }
}

/// What to send back. The body is in `Scratch::out`, or streamed.
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    /// An extra header line, without its CRLF (`WWW-Authenticate` with a
    /// 401, `Allow` with a 405).
    pub header: Option<String>,
    /// A body streamed in pieces instead of `Scratch::out` (`/dump`).
    pub stream: Option<Box<dyn BodyStream>>,
}

impl Reply {
    pub const fn json(status: u16) -> Reply {
        Reply { status, content_type: "application/json", header: None, stream: None }
    }

    /// `{"error": message}` as the body (replacing what `out` held), with `status`.
    pub fn error(out: &mut Vec<u8>, status: u16, message: &str) -> Reply {
        out.clear();
        codec::write_error(out, message);
        Reply::json(status)
    }
}

/// What a handler sees of a request.
pub struct Incoming<'a> {
    /// The endpoint table's route of `path`, if it has one.
    pub route: Option<Route>,
    pub method: &'a str,
    pub path: &'a str,
    /// The query string, without `?`.
    pub query: &'a str,
    /// Complete and within the body limit.
    pub body: &'a [u8],
    /// The `Authorization` header, if any.
    pub authorization: Option<&'a str>,
    /// The client asks for the compact dump format (`Accept`).
    pub accepts_compact_dump: bool,
}

/// A refused request: its status and the message of its `{"error": ...}`.
struct Refusal(u16, String);

impl From<BodyError> for Refusal {
    fn from(e: BodyError) -> Refusal {
        Refusal(e.status(), e.message().to_string())
    }
}

impl From<RegistryError> for Refusal {
    fn from(e: RegistryError) -> Refusal {
        match e {
            RegistryError::Invalid(m) => Refusal(400, m),
            RegistryError::NotFound(m) => Refusal(404, m),
            RegistryError::Conflict(m) => Refusal(409, m),
            RegistryError::Unavailable(m) => Refusal(503, m),
        }
    }
}

type Answer = Result<Reply, Refusal>;

/// `{"status":"ok"}` with `status`.
fn ok(s: &mut Scratch, status: u16) -> Answer {
    s.out.clear();
    s.out.extend_from_slice(br#"{"status":"ok"}"#);
    Ok(Reply::json(status))
}

/// `value` as the JSON body, with 200.
fn json(s: &mut Scratch, value: &impl Serialize) -> Answer {
    s.out.clear();
    serde_json::to_writer(&mut s.out, value).map_err(|e| Refusal(500, e.to_string()))?;
    Ok(Reply::json(200))
}

/// The value of query-string parameter `name`, `+` and `%XX` decoded.
fn query_param(query: &str, name: &str) -> Option<String> {
    let decode = |s: &str| percent_encoding::percent_decode_str(&s.replace('+', " ")).decode_utf8_lossy().into_owned();
    query.split('&').filter_map(|kv| kv.split_once('=')).find(|(k, _)| decode(k) == name).map(|(_, v)| decode(v))
}

/// An instance's status is the first of its listeners' in this order (Dynamo's).
fn precedence(s: ListenerStatus) -> usize {
    use ListenerStatus::*;
    [Paused, Active, Pending, Failed].iter().position(|&x| x == s).unwrap_or(0)
}

/// One `/workers` entry.
#[derive(Serialize)]
struct WorkerView {
    instance_id: u64,
    source: &'static str,
    status: ListenerStatus,
    model_name: String,
    tenant_id: String,
    routing_group: String,
    block_size: u32,
    endpoints: BTreeMap<u32, String>,
    listeners: BTreeMap<u32, ListenerView>,
}

/// A listener as `/workers` shows it: Dynamo's fields, then how stale its
/// worker's state may be (ours).
#[derive(Serialize)]
struct ListenerView {
    endpoint: String,
    /// The engine's ring it asks (ours).
    #[serde(skip_serializing_if = "Option::is_none")]
    replay_endpoint: Option<String>,
    status: ListenerStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_error: Option<String>,
    connected: bool,
    /// Highest engine seq dealt with; null before the first.
    last_seq: Option<u64>,
    /// Seconds since its last batch arrived (since it was added, before the first).
    last_batch_age_s: f64,
    batches_received: u64,
}

impl Api {
    fn query(&self, body: &[u8], s: &mut Scratch, by_hash: bool) -> Answer {
        let req = if by_hash {
            codec::parse_query_by_hash(body, &mut s.hashes)
        } else {
            codec::parse_query(body, &mut s.tokens)
        }?;
        s.set_model(&req.model_name);
        let tenant = req.tenant_id.as_deref().unwrap_or(TENANT_DEFAULT);
        let Some(h) = self.registry.index(&req.model_name, tenant) else {
            return Err(Refusal(404, format!("no indexer for model={} tenant={tenant}", req.model_name)));
        };
        let block_size = h.index().block_size();
        if !by_hash {
            let seed = seed_for(req.lora_name.as_deref(), req.cache_salt.as_deref());
            s.hashes.clear();
            local_hashes_into(&s.tokens, block_size as usize, seed, &mut s.hashes);
        }
        let matches = h.index().find_matches(&s.hashes);
        // Dynamo lists only workers that matched; every registered one on request.
        let registered = if req.include_unmatched { h.registered() } else { Vec::new() };
        let predicted = if h.predictions.is_empty() {
            Vec::new()
        } else {
            h.predictions.lookup(&matches, &s.hashes, crate::predict::now_ms())
        };
        s.out.clear();
        codec::write_query_response(&mut s.out, &matches, &registered, &predicted, block_size, s.hashes.len());
        Ok(Reply::json(200))
    }

    fn routed(&self, body: &[u8], s: &mut Scratch) -> Answer {
        let req = crate::predict::parse_routed(body)?;
        s.set_model(&req.model_name);
        let b = self.registry.routed(&req)?;
        json(s, &serde_json::json!({"status": "ok", "predicted_blocks": b.predicted_blocks, "ttl_ms": b.ttl_ms}))
    }

    fn register(&self, body: &[u8], s: &mut Scratch) -> Answer {
        let args = codec::parse_register(body)?;
        s.set_model(&args.model_name);
        self.registry.register(args)?;
        ok(s, 201)
    }

    fn unregister(&self, body: &[u8], s: &mut Scratch) -> Answer {
        let r = codec::parse_unregister(body)?;
        s.set_model(&r.model_name);
        self.registry.unregister(r.instance_id, &r.model_name, r.tenant_id.as_deref(), r.dp_rank)?;
        ok(s, 200)
    }

    /// `/workers`: one entry per (instance, model, tenant) as Dynamo 1.6.1
    /// lists them, with its listeners by rank; the tenant is written both as
    /// `tenant_id` (Dynamo's docs) and `routing_group` (its 1.6.1 code).
    fn workers(&self, query: &str, s: &mut Scratch) -> Answer {
        let model = query_param(query, "model_name");
        let tenant = query_param(query, "tenant_id").or_else(|| query_param(query, "routing_group"));
        let infos = self.registry.listener_infos();
        let mut views: BTreeMap<(u64, String, String), WorkerView> = BTreeMap::new();
        for r in self.registry.registrations() {
            if model.as_ref().is_some_and(|m| &r.model_name != m) || tenant.as_ref().is_some_and(|t| &r.tenant_id != t)
            {
                continue;
            }
            let info = infos.get(&r.listener);
            let status = info.map_or(ListenerStatus::Failed, |i| i.status);
            let last_error = info.and_then(|i| i.last_error.clone());
            let listener = ListenerView {
                endpoint: r.endpoint.clone(),
                replay_endpoint: r.replay_endpoint.clone(),
                status,
                last_error,
                connected: info.is_some_and(|i| i.connected),
                last_seq: info.and_then(|i| i.last_seq),
                // Milliseconds are what the clock behind it resolves.
                last_batch_age_s: info.map_or(0.0, |i| i.since_last_batch.as_millis() as f64 / 1e3),
                batches_received: info.map_or(0, |i| i.batches_received),
            };
            let key = (r.worker.instance_id, r.model_name.clone(), r.tenant_id.clone());
            let v = views.entry(key).or_insert_with(|| WorkerView {
                instance_id: r.worker.instance_id,
                source: "zmq",
                status,
                block_size: self.registry.index(&r.model_name, &r.tenant_id).map_or(0, |h| h.index().block_size()),
                routing_group: r.tenant_id.clone(),
                model_name: r.model_name,
                tenant_id: r.tenant_id,
                endpoints: BTreeMap::new(),
                listeners: BTreeMap::new(),
            });
            v.status = std::cmp::max_by_key(v.status, status, |&s| precedence(s));
            v.endpoints.entry(r.worker.dp_rank).or_insert_with(|| r.endpoint.clone());
            v.listeners.entry(r.worker.dp_rank).or_insert(listener);
        }
        json(s, &views.values().collect::<Vec<_>>())
    }

    /// `/dump`, streamed from the live indexes (`dump::stream`): compact
    /// when the client asks for it, else JSON.
    fn dump(&self, s: &mut Scratch, compact: bool) -> Answer {
        let Some(slot) = DumpSlot::take(&self.dumps) else {
            crate::warn!("GET /dump refused: {DUMPS_AT_ONCE_MAX} dumps are being sent; the client may retry");
            let message = format!("{DUMPS_AT_ONCE_MAX} dumps are being sent; retry shortly");
            return Ok(Reply { header: Some("Retry-After: 1".into()), ..Reply::error(&mut s.out, 503, &message) });
        };
        s.dump_slot = Some(slot);
        let sources = self
            .registry
            .indexes()
            .iter()
            .map(|h| Source { model_name: h.model_name.clone(), tenant_id: h.tenant_id.clone(), index: h.index_arc() })
            .collect();
        let (format, content_type) =
            if compact { (Format::Compact, binary::MEDIA_TYPE) } else { (Format::Json, "application/json") };
        s.out.clear();
        Ok(Reply { content_type, stream: Some(Box::new(DumpStream::new(format, sources))), ..Reply::json(200) })
    }

    fn peer(&self, body: &[u8], s: &mut Scratch, add: bool) -> Answer {
        let url = codec::parse_peer(body)?;
        if !add {
            if !self.peers.remove(&url) {
                return Err(Refusal(404, format!("peer {url} is not registered")));
            }
            crate::info!("peer {url} deregistered");
            return ok(s, 200);
        }
        match self.peers.add(url.clone()) {
            PeerAdded::Added => crate::info!("peer {url} registered"),
            PeerAdded::AlreadyKnown => {}
            PeerAdded::Full => {
                return Err(Refusal(409, format!("{PEERS_MAX} peers are registered already; deregister one first")))
            }
        }
        ok(s, 201)
    }

    fn health(&self, s: &mut Scratch) -> Answer {
        match self.readiness.check(&self.registry) {
            Ok(()) => ok(s, 200),
            Err(why) => {
                json(s, &serde_json::json!({"status": "starting", "reason": why}))?;
                Ok(Reply::json(503))
            }
        }
    }

    fn reopen_logs(&self, s: &mut Scratch) -> Answer {
        if let Err(e) = self.access_log.as_ref().map_or(Ok(()), |log| log.reopen()) {
            crate::warn!("reopening the access log: {e}");
            return Err(Refusal(500, e));
        }
        ok(s, 200)
    }

    fn metrics_text(&self, s: &mut Scratch) -> Answer {
        let mut p = Prom::default();
        self.metrics.render(&mut p);
        crate::registry::state_metrics::render(&mut p, &self.registry, &self.readiness);
        let (help, refused) = ("Mutating requests refused for a missing or wrong admin token.", &self.auth_refused);
        p.single("kv_indexer_auth_refused_total", "counter", help, refused.load(Ordering::Relaxed) as f64);
        crate::metrics::process::render(&mut p);
        if let Some(log) = &self.access_log {
            let help = "Access log lines dropped because the writer's queue was full.";
            p.single("kv_indexer_access_log_dropped_total", "counter", help, log.dropped() as f64);
        }
        s.out.clear();
        s.out.extend_from_slice(p.text.as_bytes());
        Ok(Reply { status: 200, content_type: "text/plain; version=0.0.4", header: None, stream: None })
    }

    /// Checks the method and the admin token, then answers.
    fn answer(&self, req: &Incoming<'_>, route: Route, s: &mut Scratch) -> Answer {
        let spec = route.spec();
        // HEAD is GET without the body (the server leaves it out).
        let get = spec.method == "GET";
        if req.method != spec.method && !(get && req.method == "HEAD") {
            let message = format!("{} takes {}, not {}", req.path, spec.method, req.method);
            let allow = if get { "GET, HEAD" } else { spec.method };
            return Ok(Reply { header: Some(format!("Allow: {allow}")), ..Reply::error(&mut s.out, 405, &message) });
        }
        if let (true, Some(token)) = (spec.mutating, &self.admin_token) {
            if let Err(e) = token.check(req.authorization) {
                self.auth_refused.fetch_add(1, Ordering::Relaxed);
                let header = Some(format!("WWW-Authenticate: {CHALLENGE}"));
                return Ok(Reply { header, ..Reply::error(&mut s.out, 401, e) });
            }
        }
        let body = req.body;
        match route {
            Route::Health => self.health(s),
            Route::Metrics => self.metrics_text(s),
            Route::Workers => self.workers(req.query, s),
            Route::Dump => self.dump(s, req.accepts_compact_dump),
            Route::Peers => json(s, &self.peers.list()),
            Route::Register => self.register(body, s),
            Route::Unregister => self.unregister(body, s),
            Route::Query => self.query(body, s, false),
            Route::QueryByHash => self.query(body, s, true),
            Route::RegisterPeer => self.peer(body, s, true),
            Route::DeregisterPeer => self.peer(body, s, false),
            Route::ReopenLogs => self.reopen_logs(s),
            Route::Routed => self.routed(body, s),
        }
    }

    /// Answers a request whose head and body were read, within the limits.
    pub fn handle(&self, req: &Incoming<'_>, s: &mut Scratch) -> Reply {
        let answer = match req.route {
            Some(route) => self.answer(req, route, s),
            None => Err(Refusal(404, format!("no endpoint {}", req.path))),
        };
        answer.unwrap_or_else(|Refusal(status, message)| Reply::error(&mut s.out, status, &message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings_decode() {
        assert_eq!(query_param("model_name=a%3Ab&tenant_id=x+y", "model_name").as_deref(), Some("a:b"));
        assert_eq!(query_param("model_name=a%3Ab&tenant_id=x+y", "tenant_id").as_deref(), Some("x y"));
        assert_eq!(query_param("a=%", "a").as_deref(), Some("%"));
        assert_eq!(query_param("a=%4", "a").as_deref(), Some("%4"));
        assert_eq!(query_param("", "a"), None);
    }

    #[test]
    fn dumps_at_once_are_capped_until_their_replies_are_written() {
        let dumps = Arc::new(AtomicUsize::new(0));
        let mut held: Vec<_> = (0..DUMPS_AT_ONCE_MAX).map(|_| DumpSlot::take(&dumps).expect("a free place")).collect();
        assert!(DumpSlot::take(&dumps).is_none(), "every place is taken");
        let mut s = Scratch { dump_slot: held.pop(), ..Scratch::default() };
        s.release_large();
        assert_eq!(dumps.load(Ordering::Relaxed), DUMPS_AT_ONCE_MAX - 1, "a written reply gives its place back");
        let again = DumpSlot::take(&dumps);
        assert!(again.is_some());
        drop((held, again));
        assert_eq!(dumps.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn scratch_a_huge_request_grew_is_released() {
        let mut s = Scratch { tokens: vec![0; 64], hashes: vec![0; 64], out: vec![0; 64], ..Scratch::default() };
        s.release_large();
        assert_eq!((s.tokens.capacity(), s.hashes.capacity(), s.out.capacity()), (64, 64, 64), "small buffers stay");
        s.tokens = vec![0; SCRATCH_KEPT_BYTES];
        s.hashes = vec![0; SCRATCH_KEPT_BYTES];
        s.out = vec![0; SCRATCH_KEPT_BYTES + 1];
        s.release_large();
        assert_eq!((s.tokens.capacity(), s.hashes.capacity(), s.out.capacity()), (0, 0, 0));
    }

    #[test]
    fn listener_statuses_are_written_by_name() {
        use ListenerStatus::*;
        for status in [Pending, Active, Paused, Failed] {
            assert_eq!(serde_json::to_value(status).unwrap(), status.as_str());
        }
    }
}

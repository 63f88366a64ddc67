//! The API: one function per endpoint, over the registry, the peers and
//! the readiness state. Request bodies are parsed by `codec` (hot ones
//! without a JSON tree) and replies are written straight into the thread's
//! scratch buffer. A failed request changes nothing.

use super::access_log::AccessLog;
use super::auth::{AdminToken, CHALLENGE};
use super::codec::{self, BodyError};
use super::endpoints::Route;
use super::metrics::HttpMetrics;
use super::server::{error_body, Handler, Incoming, Reply, Scratch};
use crate::dump::{self, DumpEntry};
use crate::hash::{local_hashes_into, seed_for};
use crate::ingest::ListenerStatus;
use crate::metrics::Prom;
use crate::peers::{PeerAdded, Peers, PEERS_MAX};
use crate::readiness::Readiness;
use crate::registry::{RegisterArgs, Registry, RegistryError, TENANT_DEFAULT};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Everything the endpoints need.
pub struct Api {
    pub registry: Arc<Registry>,
    pub peers: Arc<Peers>,
    pub readiness: Arc<Readiness>,
    pub metrics: Arc<HttpMetrics>,
    /// When set, mutating endpoints need it as a bearer token.
    pub admin_token: Option<AdminToken>,
    /// Requests refused for a missing or wrong admin token.
    pub auth_refused: AtomicU64,
    /// The access log `/reopen_logs` reopens, if configured.
    pub access_log: Option<Arc<AccessLog>>,
}

fn ok_status(out: &mut Vec<u8>) {
    out.clear();
    codec::write_status_ok(out);
}

fn fail(out: &mut Vec<u8>, status: u16, message: &str) -> Reply {
    error_body(out, message);
    Reply::json(status)
}

fn body_error(out: &mut Vec<u8>, e: BodyError) -> Reply {
    fail(out, e.status(), e.message())
}

fn registry_error(out: &mut Vec<u8>, e: RegistryError) -> Reply {
    match e {
        RegistryError::Invalid(m) => fail(out, 400, &m),
        RegistryError::NotFound(m) => fail(out, 404, &m),
        RegistryError::Conflict(m) => fail(out, 409, &m),
        RegistryError::Unavailable(m) => fail(out, 503, &m),
    }
}

/// Decodes `%XX` and `+` in a query-string component.
fn url_decode(s: &str) -> String {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 3 <= b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query_param(query: &str, name: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| url_decode(k) == name)
        .map(|(_, v)| url_decode(v))
}

impl Api {
    fn query(&self, body: &[u8], s: &mut Scratch, by_hash: bool) -> Reply {
        let parsed = if by_hash {
            codec::parse_query_by_hash(body, &mut s.hashes)
        } else {
            codec::parse_query(body, &mut s.tokens)
        };
        let req = match parsed {
            Ok(r) => r,
            Err(e) => return body_error(&mut s.out, e),
        };
        s.set_model(&req.model_name);
        let tenant = req.tenant_id.as_deref().unwrap_or(TENANT_DEFAULT);
        let Some(h) = self.registry.index(&req.model_name, tenant) else {
            return fail(&mut s.out, 404, &format!("no indexer for model={} tenant={}", req.model_name, tenant));
        };
        let block_size = h.index.block_size();
        if !by_hash {
            let seed = seed_for(req.lora_name.as_deref(), req.cache_salt.as_deref());
            s.hashes.clear();
            local_hashes_into(&s.tokens, block_size as usize, seed, &mut s.hashes);
        }
        let matches = h.index.find_matches(&s.hashes);
        // Dynamo lists only workers that matched; every registered one on request.
        let registered = if req.include_unmatched { h.registered() } else { Vec::new() };
        let predicted = if h.predictions.is_empty() {
            Vec::new()
        } else {
            h.predictions.lookup(&matches, &s.hashes, crate::predict::now_ms())
        };
        s.out.clear();
        codec::write_query_response_predicted(
            &mut s.out,
            &matches,
            &registered,
            &predicted,
            block_size,
            s.hashes.len(),
        );
        Reply::json(200)
    }

    fn routed(&self, body: &[u8], s: &mut Scratch) -> Reply {
        let req = match crate::predict::parse_routed(body) {
            Ok(r) => r,
            Err(e) => return body_error(&mut s.out, e),
        };
        s.set_model(&req.model_name);
        match self.registry.routed(&req) {
            Ok(b) => {
                s.out.clear();
                let body =
                    serde_json::json!({"status": "ok", "predicted_blocks": b.predicted_blocks, "ttl_ms": b.ttl_ms});
                s.out.extend_from_slice(body.to_string().as_bytes());
                Reply::json(200)
            }
            Err(e) => registry_error(&mut s.out, e),
        }
    }

    fn register(&self, body: &[u8], s: &mut Scratch) -> Reply {
        let r = match codec::parse_register(body) {
            Ok(r) => r,
            Err(e) => return body_error(&mut s.out, e),
        };
        s.set_model(&r.model_name);
        let args = RegisterArgs {
            instance_id: r.instance_id,
            dp_rank: r.dp_rank.unwrap_or(0),
            endpoint: r.endpoint,
            replay_endpoint: r.replay_endpoint,
            model_name: r.model_name,
            tenant_id: r.tenant_id.unwrap_or_else(|| TENANT_DEFAULT.to_string()),
            block_size: r.block_size,
        };
        match self.registry.register(args) {
            Ok(()) => {
                ok_status(&mut s.out);
                Reply::json(201)
            }
            Err(e) => registry_error(&mut s.out, e),
        }
    }

    fn unregister(&self, body: &[u8], s: &mut Scratch) -> Reply {
        let r = match codec::parse_unregister(body) {
            Ok(r) => r,
            Err(e) => return body_error(&mut s.out, e),
        };
        s.set_model(&r.model_name);
        match self.registry.unregister(r.instance_id, &r.model_name, r.tenant_id.as_deref(), r.dp_rank) {
            Ok(()) => {
                ok_status(&mut s.out);
                Reply::json(200)
            }
            Err(e) => registry_error(&mut s.out, e),
        }
    }

    fn workers(&self, query: &str, s: &mut Scratch) -> Reply {
        let model = query_param(query, "model_name");
        let tenant = query_param(query, "tenant_id").or_else(|| query_param(query, "routing_group"));
        let infos = self.registry.listener_infos();
        let regs: Vec<_> = self
            .registry
            .registrations()
            .into_iter()
            .filter(|r| {
                model.as_ref().is_none_or(|m| &r.model_name == m) && tenant.as_ref().is_none_or(|t| &r.tenant_id == t)
            })
            .collect();
        // One entry per (instance, model, tenant), one listener per rank.
        let mut views: Vec<codec::WorkerInfo> = Vec::new();
        for r in &regs {
            let info = infos.get(&r.listener);
            let listener = codec::WorkerListener {
                dp_rank: r.worker.dp_rank,
                endpoint: r.endpoint.clone(),
                status: info.map_or(ListenerStatus::Failed, |i| i.status),
                last_error: info.and_then(|i| i.last_error.clone()),
            };
            match views.iter_mut().find(|v| {
                v.instance_id == r.worker.instance_id && v.model_name == r.model_name && v.tenant_id == r.tenant_id
            }) {
                Some(v) => v.listeners.push(listener),
                None => views.push(codec::WorkerInfo {
                    instance_id: r.worker.instance_id,
                    model_name: r.model_name.clone(),
                    tenant_id: r.tenant_id.clone(),
                    block_size: self.registry.index(&r.model_name, &r.tenant_id).map_or(0, |h| h.index.block_size()),
                    listeners: vec![listener],
                }),
            }
        }
        s.out.clear();
        codec::write_workers(&mut s.out, &views);
        Reply::json(200)
    }

    fn dump(&self, s: &mut Scratch) -> Reply {
        let entries: Vec<DumpEntry> = self
            .registry
            .indexes()
            .iter()
            .map(|h| DumpEntry {
                model_name: h.model_name.clone(),
                tenant_id: h.tenant_id.clone(),
                block_size: h.index.block_size(),
                events: h.index.dump_events(),
            })
            .collect();
        s.out.clear();
        dump::write_dump(&mut s.out, &entries);
        Reply::json(200)
    }

    fn peer(&self, body: &[u8], s: &mut Scratch, add: bool) -> Reply {
        let url = match codec::parse_peer(body) {
            Ok(p) => p.url,
            Err(e) => return body_error(&mut s.out, e),
        };
        if add {
            match self.peers.add(url.clone()) {
                PeerAdded::Added => crate::info!("peer {url} registered"),
                PeerAdded::AlreadyKnown => {}
                PeerAdded::Full => {
                    let m = format!("{PEERS_MAX} peers are registered already; deregister one first");
                    return fail(&mut s.out, 409, &m);
                }
            }
            ok_status(&mut s.out);
            Reply::json(201)
        } else if self.peers.remove(&url) {
            crate::info!("peer {url} deregistered");
            ok_status(&mut s.out);
            Reply::json(200)
        } else {
            fail(&mut s.out, 404, &format!("peer {url} is not registered"))
        }
    }

    fn health(&self, s: &mut Scratch) -> Reply {
        s.out.clear();
        match self.readiness.check(&self.registry) {
            Ok(()) => {
                ok_status(&mut s.out);
                Reply::json(200)
            }
            Err(why) => {
                let body = serde_json::json!({"status": "starting", "reason": why});
                s.out.extend_from_slice(body.to_string().as_bytes());
                Reply::json(503)
            }
        }
    }

    fn reopen_logs(&self, s: &mut Scratch) -> Reply {
        match self.access_log.as_ref().map_or(Ok(()), |log| log.reopen()) {
            Ok(()) => {
                ok_status(&mut s.out);
                Reply::json(200)
            }
            Err(e) => {
                crate::warn!("reopening the access log: {e}");
                fail(&mut s.out, 500, &e)
            }
        }
    }

    fn metrics_text(&self, s: &mut Scratch) -> Reply {
        let mut p = Prom::default();
        self.metrics.render(&mut p);
        crate::state_metrics::render(&mut p, &self.registry, &self.readiness);
        p.single(
            "kv_indexer_auth_refused_total",
            "counter",
            "Mutating requests refused for a missing or wrong admin token.",
            self.auth_refused.load(Ordering::Relaxed) as f64,
        );
        crate::process_metrics::render(&mut p);
        if let Some(log) = &self.access_log {
            p.single(
                "kv_indexer_access_log_dropped_total",
                "counter",
                "Access log lines dropped because the writer's queue was full.",
                log.dropped() as f64,
            );
        }
        s.out.clear();
        s.out.extend_from_slice(p.text.as_bytes());
        Reply { status: 200, content_type: "text/plain; version=0.0.4", www_authenticate: None, allow: None }
    }
}

impl Handler for Api {
    fn handle(&self, req: &Incoming<'_>, s: &mut Scratch) -> Reply {
        let Incoming { route, method, path, query, body, authorization } = *req;
        let Some(route) = route else {
            return fail(&mut s.out, 404, &format!("no endpoint {path}"));
        };
        let spec = route.spec();
        if method != spec.method {
            let mut reply = fail(&mut s.out, 405, &format!("{path} takes {}, not {method}", spec.method));
            reply.allow = Some(spec.method);
            return reply;
        }
        if let (true, Some(token)) = (spec.mutating, &self.admin_token) {
            if let Err(e) = token.check(authorization) {
                self.auth_refused.fetch_add(1, Ordering::Relaxed);
                let mut reply = fail(&mut s.out, 401, e.message());
                reply.www_authenticate = Some(CHALLENGE);
                return reply;
            }
        }
        match route {
            Route::Health => self.health(s),
            Route::Metrics => self.metrics_text(s),
            Route::Workers => self.workers(query, s),
            Route::Dump => self.dump(s),
            Route::Peers => {
                s.out.clear();
                codec::write_peers(&mut s.out, &self.peers.list());
                Reply::json(200)
            }
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
}

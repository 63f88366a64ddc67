//! Startup recovery from a peer, and the list of peers.
//!
//! With `--peers`, listeners connect first and hold what engines send (the
//! ready gate is closed); after the slow-joiner window the first peer that
//! answers `/dump` in full gives us its indexes, which are applied; then the
//! gate opens and the held events drain, converging the weakly consistent
//! snapshot. A peer that fails mid-dump is skipped whole: nothing partial is
//! applied. No peer reachable: start empty, and say so. Over a local
//! snapshot (`--snapshot-dir`), the peer's blocks replace the snapshot's for
//! every worker the dump names; the others keep the snapshot's.

use crate::http::codec::{parse_dump, DumpEntry};
use crate::registry::Registry;
use parking_lot::Mutex;
use std::io::Read;
use std::time::Duration;

/// Largest dump accepted from a peer, in bytes.
pub const DUMP_BYTES_MAX: u64 = 4 << 30;

/// What recovery did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    pub peer: Option<String>,
    pub indexes: usize,
    pub events: u64,
    pub blocks_stored: u64,
}

/// Fetches and parses one peer's dump.
pub fn fetch_dump(peer: &str, timeout: Duration) -> Result<Vec<DumpEntry>, String> {
    let agent = ureq::AgentBuilder::new().timeout_connect(timeout).timeout_read(timeout).build();
    let resp = agent.get(&format!("{peer}/dump")).call().map_err(|e| e.to_string())?;
    let mut body = Vec::new();
    resp.into_reader().take(DUMP_BYTES_MAX + 1).read_to_end(&mut body).map_err(|e| format!("reading the dump: {e}"))?;
    if body.len() as u64 > DUMP_BYTES_MAX {
        return Err(format!("dump over {DUMP_BYTES_MAX} bytes"));
    }
    parse_dump(&body).map_err(|e| format!("malformed dump: {}", e.message()))
}

/// Applies dump entries to the registry's indexes (created as needed).
pub fn apply_dump(registry: &Registry, entries: &[DumpEntry], out: &mut Recovered) {
    for entry in entries {
        let handle = match registry.index_or_create(&entry.model_name, &entry.tenant_id, entry.block_size) {
            Ok(h) => h,
            Err(e) => {
                crate::warn!("recovery: skipping model={:?} tenant={:?}: {e:?}", entry.model_name, entry.tenant_id);
                continue;
            }
        };
        out.indexes += 1;
        for ev in &entry.events {
            let o = handle.apply(ev);
            out.events += 1;
            out.blocks_stored += o.stored as u64;
        }
    }
}

/// Drops, before a peer's dump is applied over a snapshot, the blocks of
/// every worker the dump names: a live peer saw what happened to them while
/// this daemon was down. Workers it does not name keep the snapshot's.
fn drop_workers_named(registry: &Registry, entries: &[DumpEntry]) -> usize {
    let mut dropped = 0;
    for entry in entries {
        let Some(h) = registry.index(&entry.model_name, &entry.tenant_id) else { continue };
        let mut named: Vec<_> = entry.events.iter().map(|e| e.worker).collect();
        named.sort_unstable();
        named.dedup();
        for w in named {
            dropped += h.index.remove_worker(w) as usize;
        }
    }
    dropped
}

/// Recovers from the first peer that answers; logs the outcome. With
/// `over_snapshot`, the peer's blocks replace the snapshot's for every
/// worker its dump names; nothing is dropped unless a dump arrived whole.
pub fn recover(registry: &Registry, peers: &[String], timeout: Duration, over_snapshot: bool) -> Recovered {
    let mut out = Recovered::default();
    for peer in peers {
        match fetch_dump(peer, timeout) {
            Ok(entries) => {
                if over_snapshot {
                    let n = drop_workers_named(registry, &entries);
                    crate::info!("peer {peer}'s dump replaces the snapshot's blocks of {n} worker(s)");
                }
                apply_dump(registry, &entries, &mut out);
                out.peer = Some(peer.clone());
                crate::info!(
                    "recovered from peer {peer}: {} index(es), {} events, {} blocks",
                    out.indexes,
                    out.events,
                    out.blocks_stored
                );
                return out;
            }
            Err(e) => crate::warn!("recovery: peer {peer} failed: {e}"),
        }
    }
    let keeping = if over_snapshot { "keeping the snapshot's state" } else { "starting empty" };
    crate::warn!("recovery: no peer answered ({} tried); {keeping}", peers.len());
    out
}

/// Peers known to this daemon (for recovery; they do not sync live).
#[derive(Default)]
pub struct Peers {
    list: Mutex<Vec<String>>,
}

impl Peers {
    pub fn new(initial: Vec<String>) -> Peers {
        Peers { list: Mutex::new(initial) }
    }

    /// Adds a peer; false if it was already known.
    pub fn add(&self, url: String) -> bool {
        let mut l = self.list.lock();
        if l.contains(&url) {
            return false;
        }
        l.push(url);
        true
    }

    /// Removes a peer; false if unknown.
    pub fn remove(&self, url: &str) -> bool {
        let mut l = self.list.lock();
        let before = l.len();
        l.retain(|p| p != url);
        l.len() != before
    }

    pub fn list(&self) -> Vec<String> {
        self.list.lock().clone()
    }
}

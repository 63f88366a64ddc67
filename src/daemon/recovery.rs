//! Startup recovery from a peer.
//!
//! With `--peers`, listeners connect first and hold what engines send (the
//! ready gate is closed); after the slow-joiner window the first peer that
//! answers `/dump` in full gives us its indexes, which are applied; then the
//! gate opens and the held events drain, converging the weakly consistent
//! snapshot. A peer that fails mid-dump is skipped whole: nothing partial is
//! applied. No peer reachable: start empty, and say so. Over a local
//! snapshot (`--snapshot-dir`), the peer's blocks replace the snapshot's for
//! every worker the dump names; the others keep the snapshot's.
//!
//! The dump is applied by `Index::load_dump`, the loader snapshot restore
//! uses too (it orders a peer's chains parents first and places orphans).

use crate::dump::{check_dump_bytes, parse_dump_counted, DumpEntry, DumpParse, DUMP_BYTES_MAX};
use crate::registry::Registry;
use std::io::Read;
use std::time::Duration;

/// What recovery did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    pub peer: Option<String>,
    pub indexes: usize,
    pub events: u64,
    pub blocks_stored: u64,
    /// Blocks the dump lists that could not be placed (a parent the dump
    /// does not hold for that worker, the shared cap).
    pub blocks_refused: u64,
    /// Chains placed under ancestors their worker does not hold (orphans).
    pub orphans: u64,
}

/// Fetches and parses one peer's dump; `timeout` bounds the whole request,
/// body included, so a peer that trickles bytes cannot hold startup.
pub fn fetch_dump(peer: &str, timeout: Duration) -> Result<DumpParse, String> {
    let agent = ureq::AgentBuilder::new().timeout_connect(timeout).timeout(timeout).build();
    let resp = agent.get(&format!("{peer}/dump")).call().map_err(|e| e.to_string())?;
    // Refused before a byte of it is read when the peer says how long it is.
    if let Some(announced) = resp.header("Content-Length").and_then(|n| n.trim().parse::<u64>().ok()) {
        check_dump_bytes(announced).map_err(|e| e.message().to_string())?;
    }
    let mut body = Vec::new();
    resp.into_reader().take(DUMP_BYTES_MAX + 1).read_to_end(&mut body).map_err(|e| format!("reading the dump: {e}"))?;
    check_dump_bytes(body.len() as u64).map_err(|e| e.message().to_string())?;
    parse_dump_counted(&body).map_err(|e| format!("malformed dump: {}", e.message()))
}

/// Applies dump entries to the registry's indexes (created as needed).
pub fn apply_dump(registry: &Registry, entries: &[DumpEntry], out: &mut Recovered) {
    for entry in entries {
        let handle = match registry.index_or_create(&entry.model_name, &entry.tenant_id, entry.block_size) {
            Ok(h) => h,
            Err(e) => {
                crate::warn!("recovery: skipping model={:?} tenant={:?}: {e}", entry.model_name, entry.tenant_id);
                continue;
            }
        };
        out.indexes += 1;
        let loaded = handle.load(&entry.events);
        out.events += loaded.events;
        out.blocks_stored += loaded.blocks_stored;
        out.blocks_refused += loaded.blocks_refused;
        out.orphans += loaded.orphans;
    }
}

/// Drops, before a peer's dump is applied over a snapshot, the blocks of
/// every worker the dump names: a live peer saw what happened to them while
/// this daemon was down. Workers it does not name keep the snapshot's.
fn drop_workers_named(registry: &Registry, entries: &[DumpEntry]) -> usize {
    let mut dropped = 0;
    for entry in entries {
        let Some(h) = registry.index(&entry.model_name, &entry.tenant_id) else { continue };
        let mut named: Vec<_> = entry.events.iter().map(|e| e.event.worker).collect();
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
            Ok(parsed) => {
                let entries = parsed.entries;
                let foreign: u64 = parsed.unsupported_residency.iter().sum();
                if foreign > 0 {
                    crate::warn!(
                        "recovery: peer {peer}'s dump has {foreign} event(s) of a residency domain other than \
                         \"worker\"; they are skipped (dynamo_kvrouter_kv_cache_events_applied{{status=\"unsupported_residency_domain\"}})"
                    );
                }
                registry.counters.add_unsupported_residency(parsed.unsupported_residency);
                if over_snapshot {
                    let n = drop_workers_named(registry, &entries);
                    crate::info!("peer {peer}'s dump replaces the snapshot's blocks of {n} worker(s)");
                }
                apply_dump(registry, &entries, &mut out);
                out.peer = Some(peer.clone());
                crate::info!(
                    "recovered from peer {peer}: {} index(es), {} events, {} blocks ({} chains under \
                     ancestors their worker does not hold), {} refused",
                    out.indexes,
                    out.events,
                    out.blocks_stored,
                    out.orphans,
                    out.blocks_refused
                );
                return out;
            }
            Err(e) => crate::warn!("recovery: peer {peer} failed: {e}"),
        }
    }
    let keeping = if over_snapshot { "keeping the snapshot's state" } else { "starting empty" };
    crate::warn!("recovery: no peer gave a usable dump ({} tried; each one's reason is above); {keeping}", peers.len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dump_over_the_limit_is_refused_before_it_is_downloaded() {
        use std::io::{Read, Write};
        // Between the old parser limit (2 GiB) and the fetch limit (4 GiB): one limit now.
        for bytes in [(2 << 30) + 1, 3 << 30, DUMP_BYTES_MAX] {
            assert!(check_dump_bytes(bytes).is_ok(), "{bytes}");
        }
        assert!(check_dump_bytes(DUMP_BYTES_MAX + 1).is_err());
        // A peer announcing more than the limit, then sending nothing.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let peer = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut request = [0u8; 1024];
            let _ = s.read(&mut request);
            let announce = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{{", DUMP_BYTES_MAX + 1);
            s.write_all(announce.as_bytes()).unwrap();
            // Holds the connection until the client gives up on it.
            let _ = s.read(&mut request);
        });
        let err = fetch_dump(&url, std::time::Duration::from_secs(20)).unwrap_err();
        assert_eq!(err, format!("the dump is {} bytes; the limit is {DUMP_BYTES_MAX}", DUMP_BYTES_MAX + 1));
        peer.join().unwrap();
    }
}

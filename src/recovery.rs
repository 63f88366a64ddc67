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
//! A dump is a set of stored chains, not a log: Dynamo lists its lower-tier
//! blocks one per event in hash-map order, children before parents. The
//! index refuses a store whose parent the worker does not hold, so stored
//! chains are applied parent first (`parent_first`).

use crate::dump::{check_dump_bytes, parse_dump_counted, DumpEntry, DumpParse, DUMP_BYTES_MAX};
use crate::event::{Event, EventKind, WorkerId};
use crate::registry::Registry;
use rustc_hash::FxHashMap;
use std::io::Read;
use std::time::Duration;

/// What recovery did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    pub peer: Option<String>,
    pub indexes: usize,
    pub events: u64,
    pub blocks_stored: u64,
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
        for i in parent_first(&entry.events) {
            let o = handle.apply(&entry.events[i]);
            out.events += 1;
            out.blocks_stored += o.stored as u64;
        }
    }
}

/// The order to apply dump events in: each stored chain after the event
/// that stores its parent block (of the same worker, in any tier), when the
/// dump has one. Only runs of consecutive stores are reordered, so a remove
/// or clear keeps its place. The walk is iterative and visits each event
/// once; a parent cycle (a malformed dump) is cut where it closes.
pub fn parent_first(events: &[Event]) -> Vec<usize> {
    let mut order = Vec::with_capacity(events.len());
    let mut start = 0;
    while start < events.len() {
        let is_store = |e: &Event| matches!(e.kind, EventKind::Stored { .. });
        let end = start + events[start..].iter().take_while(|e| is_store(e) == is_store(&events[start])).count();
        if is_store(&events[start]) {
            stores_parent_first(events, start..end, &mut order);
        } else {
            order.extend(start..end);
        }
        start = end;
    }
    order
}

fn stores_parent_first(events: &[Event], run: std::ops::Range<usize>, order: &mut Vec<usize>) {
    // Which event of the run stores each (worker, engine hash).
    let mut producer: FxHashMap<(WorkerId, u64), usize> = FxHashMap::default();
    for i in run.clone() {
        if let EventKind::Stored { blocks, .. } = &events[i].kind {
            for b in blocks {
                producer.entry((events[i].worker, b.engine_hash)).or_insert(i);
            }
        }
    }
    let parent_event = |i: usize| match &events[i].kind {
        EventKind::Stored { parent: Some(p), .. } => producer.get(&(events[i].worker, *p)).copied(),
        _ => None,
    };
    // 0: not seen, 1: waiting for its parent, 2: placed.
    let mut state = vec![0u8; run.len()];
    let mut stack = Vec::new();
    for first in run.clone() {
        stack.push(first);
        while let Some(&i) = stack.last() {
            let slot = i - run.start;
            if state[slot] == 2 {
                stack.pop();
                continue;
            }
            let parent = parent_event(i).filter(|&p| p != i && state[p - run.start] == 0);
            match (state[slot], parent) {
                (0, Some(p)) => {
                    state[slot] = 1;
                    stack.push(p);
                }
                _ => {
                    state[slot] = 2;
                    order.push(i);
                    stack.pop();
                }
            }
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
    crate::warn!("recovery: no peer gave a usable dump ({} tried; each one's reason is above); {keeping}", peers.len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{StorageTier, StoredBlock};
    use crate::index::{Index, IndexConfig};

    fn store(worker: WorkerId, tier: StorageTier, parent: Option<u64>, hashes: &[u64]) -> Event {
        let blocks = hashes.iter().map(|&h| StoredBlock { engine_hash: h, local_hash: h ^ 0xABCD }).collect();
        Event::stored(worker, tier, parent, blocks)
    }

    #[test]
    fn chains_listed_children_first_are_all_applied() {
        let (w, host) = (WorkerId::new(1, 0), StorageTier::HostPinned);
        // As Dynamo dumps a lower tier: one block per event, in no order.
        let events = vec![
            store(w, StorageTier::Device, Some(10), &[11]),
            store(w, host, Some(21), &[22]),
            store(w, host, Some(11), &[20]),
            store(w, host, Some(20), &[21]),
            store(w, StorageTier::Device, None, &[10]),
        ];
        let order = parent_first(&events);
        assert_eq!(order, vec![4, 0, 2, 3, 1]);
        let index = Index::new(IndexConfig::new(16));
        let stored: u32 = order.iter().map(|&i| index.apply(&events[i]).stored).sum();
        assert_eq!(stored, 5, "every block of the dump must be applied");
    }

    #[test]
    fn removes_and_clears_keep_their_place_and_cycles_end() {
        let w = WorkerId::new(1, 0);
        let d = StorageTier::Device;
        let events = vec![
            store(w, d, Some(2), &[1]),
            store(w, d, Some(1), &[2]),
            Event::removed(w, d, vec![1]),
            store(w, d, Some(3), &[4]),
            store(w, d, None, &[3]),
        ];
        let order = parent_first(&events);
        assert_eq!(order, vec![1, 0, 2, 4, 3]);
    }
}

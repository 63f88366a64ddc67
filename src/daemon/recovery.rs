//! Startup recovery from a peer.
//!
//! With `--peers`, listeners connect first and hold what engines send (the
//! ready gate is closed); after the slow-joiner window the first peer that
//! answers `/dump` in full gives us its indexes; then the gate opens and
//! the held events drain, converging the weakly consistent snapshot.
//!
//! The dump is read as it arrives and loaded into fresh indexes nobody
//! sees (`registry::staging`), which take the old ones' places only once
//! it arrived whole: a peer that fails mid-dump (a dropped connection, a malformed,
//! truncated or refused dump, silence past `--peer-timeout-ms`) is skipped
//! with a warning that names it and why, nothing of its dump applied, and
//! the next peer is tried. No peer gives one: start empty (or keep the
//! snapshot's state), and say so. Over a local snapshot (`--snapshot-dir`),
//! the peer's blocks replace the snapshot's for every worker the dump
//! names; the others keep the snapshot's.
//!
//! We ask for the compact format (`dump::binary`, `Accept`), and read JSON
//! from a peer that answers JSON (Dynamo's service, an older kv-indexer).
//! No size limit but `--max-pairs`: what the index holds is shed past it
//! as a live store is, and a dump whose stores wait for parents it has not
//! sent is refused past it (`index::Loader`). `--peer-timeout-ms` bounds
//! the connection and each wait for the next bytes, not the whole dump, so
//! a large dump that keeps arriving is never cut short; and so that a peer
//! trickling bytes cannot hold startup either, past the first such window
//! the dump must bring `PACE_BYTES_MIN` a window on average (`Paced`).

use crate::dump::{binary, read_dump_json, ReadFailed, Skipped};
use crate::registry::staging::Staging;
use crate::registry::Registry;
use std::io::BufReader;
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

/// Bytes read from a peer at a time.
const READ_BUFFER_BYTES: usize = 1 << 20;
/// Least a peer's dump must bring per `--peer-timeout-ms` on average once
/// the first such window is over (64 KiB; a dump of ours streams at
/// hundreds of MB/s).
pub const PACE_BYTES_MIN: u64 = 64 << 10;

/// A reader that fails once, past the first window, fewer than
/// `PACE_BYTES_MIN` bytes a window came on average (the socket's own
/// timeout ends a single wait longer than a window). A small dump that
/// comes slowly gets the first window free; a peer that trickles bytes
/// cannot hold startup.
struct Paced<R> {
    r: R,
    window: Duration,
    started: std::time::Instant,
    bytes: u64,
}

impl<R: std::io::Read> std::io::Read for Paced<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.r.read(buf)?;
        self.bytes += n as u64;
        let elapsed = self.started.elapsed();
        let windows = (elapsed.as_nanos() / self.window.as_nanos().max(1)) as u64;
        if n > 0 && windows >= 2 && self.bytes < PACE_BYTES_MIN.saturating_mul(windows - 1) {
            let message = format!(
                "the peer sent {} bytes in {} ms, under {PACE_BYTES_MIN} per --peer-timeout-ms",
                self.bytes,
                elapsed.as_millis()
            );
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, message));
        }
        Ok(n)
    }
}

/// Reads one peer's dump into `sink` as it arrives: compact if the peer
/// answers so, else JSON. `timeout` bounds the connection and each wait
/// for bytes. Returns what was left out, and the encoding read.
pub fn fetch_dump(
    peer: &str,
    timeout: Duration,
    sink: &mut dyn crate::dump::DumpSink,
) -> Result<(Skipped, &'static str), String> {
    let agent = ureq::AgentBuilder::new().timeout_connect(timeout).timeout_read(timeout).build();
    let accept = format!("{}, application/json;q=0.5", binary::MEDIA_TYPE);
    let resp = agent.get(&format!("{peer}/dump")).set("Accept", &accept).call().map_err(|e| e.to_string())?;
    let compact = resp.header("Content-Type").is_some_and(|t| t.trim().starts_with(binary::MEDIA_TYPE));
    let paced = Paced { r: resp.into_reader(), window: timeout, started: std::time::Instant::now(), bytes: 0 };
    let body = BufReader::with_capacity(READ_BUFFER_BYTES, paced);
    let read = if compact {
        binary::read_compact(body, sink).map(|_| (Skipped::default(), "compact"))
    } else {
        read_dump_json(body, sink).map(|s| (s, "JSON"))
    };
    read.map_err(|e: ReadFailed| e.message())
}

/// Recovers from the first peer that gives its dump whole; logs the
/// outcome. With `over_snapshot`, the peer's blocks replace the snapshot's
/// for every worker its dump names.
pub fn recover(registry: &Registry, peers: &[String], timeout: Duration, over_snapshot: bool) -> Recovered {
    let mut out = Recovered::default();
    for peer in peers {
        let started = std::time::Instant::now();
        let mut staging = Staging::new(registry, "recovery");
        let (skipped, format) = match fetch_dump(peer, timeout, &mut staging) {
            Ok(read) => read,
            Err(e) => {
                crate::warn!("recovery: peer {peer} failed: {e}; nothing of its dump is applied");
                continue;
            }
        };
        let foreign: u64 = skipped.unsupported_residency.iter().sum();
        if foreign > 0 {
            crate::warn!(
                "recovery: peer {peer}'s dump has {foreign} event(s) of a residency domain other than \
                 \"worker\"; they are skipped (dynamo_kvrouter_kv_cache_events_applied{{status=\"unsupported_residency_domain\"}})"
            );
        }
        registry.counters.add_unsupported_residency(skipped.unsupported_residency);
        let kept = match staging.keep(over_snapshot) {
            Ok(kept) => kept,
            Err(e) => {
                crate::warn!("recovery: peer {peer} failed: {e}; nothing of its dump is applied");
                continue;
            }
        };
        if over_snapshot {
            crate::info!("peer {peer}'s dump replaces the snapshot's blocks of {} worker(s)", kept.replaced_workers);
        }
        out = Recovered {
            peer: Some(peer.clone()),
            indexes: kept.indexes,
            events: kept.loaded.events,
            blocks_stored: kept.loaded.blocks_stored,
            blocks_refused: kept.loaded.blocks_refused,
            orphans: kept.loaded.orphans,
        };
        crate::info!(
            "recovered from peer {peer} ({format} dump) in {} ms: {} index(es), {} events, {} blocks ({} chains \
             under ancestors their worker does not hold), {} refused",
            started.elapsed().as_millis(),
            out.indexes,
            out.events,
            out.blocks_stored,
            out.orphans,
            out.blocks_refused
        );
        return out;
    }
    let keeping = if over_snapshot { "keeping the snapshot's state" } else { "starting empty" };
    crate::warn!("recovery: no peer gave a usable dump ({} tried; each one's reason is above); {keeping}", peers.len());
    out
}

#[cfg(test)]
#[path = "recovery_tests.rs"]
mod tests;

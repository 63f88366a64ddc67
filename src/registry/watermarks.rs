//! A peer's watermarks: read for the compact dump a replica asks for, and
//! adopted from such a dump by the replica's running listeners, so each
//! resumes its engine's stream where the peer's indexes stand rather than
//! from the ring's start.
//!
//! Writing (`Registry::peer_watermarks`), in the order a snapshot's
//! capture takes: the watermarks first, then the writer shards drain what
//! was queued (every batch up to them), then the dump streams the indexes.
//! So each index is at or past each watermark, and a replica that replays
//! from it converges (stores and removes are idempotent). Shards that do
//! not drain in time: no watermarks, and the replica fills from 0.
//!
//! Adopting (`Registry::adopt_peer_watermarks`: startup recovery, the
//! ready gate closed, the dump put in place whole): a watermark goes to
//! the running listener of its key if that listener reads the same
//! endpoint, its registration feeds the same (model, tenant) index, and
//! the dump listed that index with this daemon's block size (so the index
//! now holds the peer's blocks of that worker). A listener whose stream
//! has already dealt with anything keeps its own (`Stream::adopt`). Over a
//! snapshot, the peer's watermark replaces the snapshot's for the keys it
//! names, as the peer's blocks replaced the snapshot's.

use super::{Registry, INDEXES_MAX};
use crate::dump::binary::PeerWatermark;
use crate::dump::DumpSink;
use crate::index::DumpEvent;
use crate::ingest::{Adoption, StreamMark};
use rustc_hash::FxHashMap;

/// The indexes a dump listed, with their block sizes.
pub type Listed = FxHashMap<(String, String), u32>;

/// A sink that passes a dump on to `inner` and keeps what adopting its
/// watermarks needs: the watermarks, and the indexes the dump listed.
pub struct KeepWatermarks<'s> {
    inner: &'s mut dyn DumpSink,
    pub marks: Vec<PeerWatermark>,
    pub listed: Listed,
}

impl<'s> KeepWatermarks<'s> {
    pub fn new(inner: &'s mut dyn DumpSink) -> KeepWatermarks<'s> {
        KeepWatermarks { inner, marks: Vec::new(), listed: Listed::default() }
    }
}

impl DumpSink for KeepWatermarks<'_> {
    fn index(&mut self, model_name: &str, tenant_id: &str, block_size: u32) -> Result<(), String> {
        self.inner.index(model_name, tenant_id, block_size)?;
        // As many as a registry keeps: an index past them was not taken.
        if self.listed.len() < INDEXES_MAX {
            // One listed twice keeps its first size (staging refuses another).
            self.listed.entry((model_name.to_owned(), tenant_id.to_owned())).or_insert(block_size);
        }
        Ok(())
    }

    fn event(&mut self, event: DumpEvent) -> Result<(), String> {
        self.inner.event(event)
    }

    fn watermarks(&mut self, marks: Vec<PeerWatermark>) -> Result<(), String> {
        self.marks = marks;
        Ok(())
    }
}

/// What adopting a peer's watermarks did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Watermarks a listener took.
    pub adopted: usize,
    /// Watermarks left unused (each logged with why).
    pub skipped: usize,
}

impl Registry {
    /// Every running listener's watermark, with the index its registration
    /// feeds, for a peer's dump; then the writer shards drained, so the
    /// indexes dumped after this are at or past each. Err: why none can be
    /// given (the shards did not drain in time).
    pub fn peer_watermarks(&self) -> Result<Vec<PeerWatermark>, String> {
        let marks = self.ingest.stream_marks();
        self.ingest
            .sync_shards()
            .map_err(|e| format!("{e}; the writer shards are too busy for consistent watermarks"))?;
        let by_listener: FxHashMap<_, _> = self.registrations().into_iter().map(|r| (r.listener, r)).collect();
        let mut out = Vec::with_capacity(marks.len());
        for (id, mark) in marks {
            // A listener removed meanwhile has no registration: left out.
            let Some(r) = by_listener.get(&id) else { continue };
            out.push(PeerWatermark { model_name: r.model_name.clone(), tenant_id: r.tenant_id.clone(), mark });
        }
        Ok(out)
    }

    /// Has the running listeners take the watermarks of `peer`'s dump,
    /// which listed `listed` and is now in place (see the module doc).
    /// Call while the ready gate is closed; returns once every listener
    /// asked has answered.
    pub fn adopt_peer_watermarks(&self, peer: &str, marks: Vec<PeerWatermark>, listed: &Listed) -> Adopted {
        let mut out = Adopted::default();
        let registrations: FxHashMap<_, _> = self.registrations().into_iter().map(|r| (r.worker, r)).collect();
        let mut asked: Vec<StreamMark> = Vec::new();
        for PeerWatermark { model_name, tenant_id, mark } in marks {
            let w = mark.worker;
            let why = match registrations.get(&w) {
                None => Some("no worker of this key is registered here".to_string()),
                Some(r) if (&r.model_name, &r.tenant_id) != (&model_name, &tenant_id) => Some(format!(
                    "it fed model={model_name:?} tenant={tenant_id:?} there, model={:?} tenant={:?} here",
                    r.model_name, r.tenant_id
                )),
                Some(_) => {
                    let here = self.index(&model_name, &tenant_id).map(|h| h.index().block_size());
                    let there = listed.get(&(model_name.clone(), tenant_id.clone())).copied();
                    (here.is_none() || here != there).then(|| "its index was not taken from the dump".to_string())
                }
            };
            match why {
                Some(why) => {
                    crate::debug!("recovery: peer {peer}'s watermark of worker {w} is not used: {why}");
                    out.skipped += 1;
                }
                None => asked.push(mark),
            }
        }
        for (mark, adoption) in asked.iter().zip(self.ingest.adopt_watermarks(&asked)) {
            let (w, seq) = (mark.worker, mark.watermark.seq);
            match adoption {
                Adoption::Adopted => {
                    crate::debug!("recovery: worker {w} resumes from peer {peer}'s watermark, batch {seq}");
                    out.adopted += 1;
                    continue;
                }
                Adoption::NoListener => {
                    crate::debug!("recovery: peer {peer}'s watermark of worker {w} is not used: no listener runs")
                }
                Adoption::OtherEndpoint(here) => crate::debug!(
                    "recovery: peer {peer}'s watermark of worker {w} is not used: it read {}, this daemon reads {here}",
                    mark.endpoint
                ),
                Adoption::Refused(why) => {
                    crate::info!("recovery: peer {peer}'s watermark of worker {w} is not used: {why}")
                }
            }
            out.skipped += 1;
        }
        out
    }
}

#[cfg(test)]
#[path = "watermarks_tests.rs"]
mod tests;

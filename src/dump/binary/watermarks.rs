//! The watermarks record of a format-2 compact dump: per running listener
//! of the writing peer, where its stream stood when the dump began, so a
//! replica's listener of the same key resumes from there (see the module
//! doc of `dump::binary` for the layout, `registry::watermarks` for who
//! writes and adopts them).

use super::{Res, Source};
use crate::endpoint::ADDRESS_BYTES_MAX;
use crate::event::WorkerId;
use crate::ingest::{StreamMark, Watermark, DP_RANKS_PER_LISTENER_MAX, LISTENERS_MAX};
use rustc_hash::FxHashSet;
use std::io::Read;

/// One listener's watermark as a peer's dump carries it: the index its
/// registration feeds, and its place in its stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerWatermark {
    pub model_name: String,
    pub tenant_id: String,
    pub mark: StreamMark,
}

/// Writes the record's body (after its kind).
pub(super) fn put(out: &mut Vec<u8>, marks: &[PeerWatermark]) {
    out.extend_from_slice(&(marks.len() as u32).to_le_bytes());
    for PeerWatermark { model_name, tenant_id, mark } in marks {
        out.extend_from_slice(&mark.worker.instance_id.to_le_bytes());
        out.extend_from_slice(&mark.worker.dp_rank.to_le_bytes());
        super::put_name(out, &mark.endpoint);
        super::put_name(out, model_name);
        super::put_name(out, tenant_id);
        out.extend_from_slice(&mark.watermark.seq.to_le_bytes());
        match mark.watermark.digest {
            Some(d) => {
                out.push(1);
                out.extend_from_slice(&d.to_le_bytes());
            }
            None => out.push(0),
        }
        out.extend_from_slice(&(mark.ranks.len() as u32).to_le_bytes());
        for r in &mark.ranks {
            out.extend_from_slice(&r.to_le_bytes());
        }
    }
}

/// Reads the record's body (after its kind), every count checked against
/// its limit before anything is allocated; a key listed twice is refused.
pub(super) fn read<R: Read>(s: &mut Source<R>) -> Res<Vec<PeerWatermark>> {
    let n = s.count(LISTENERS_MAX, "watermarks")?;
    let mut marks = Vec::with_capacity(n);
    let mut keys = FxHashSet::default();
    for _ in 0..n {
        let at = s.offset;
        let worker = WorkerId::new(s.u64()?, s.u32()?);
        let endpoint = s.text(ADDRESS_BYTES_MAX, "endpoint")?;
        let model_name = s.name("model name")?;
        let tenant_id = s.name("tenant id")?;
        let seq = s.u64()?;
        let digest = match s.u8()? {
            0 => None,
            1 => Some(s.u64()?),
            b => return Err(s.malformed(at, format!("digest flag byte {b}"))),
        };
        // The registered rank is not among them: one fewer than a stream names.
        let m = s.count(DP_RANKS_PER_LISTENER_MAX - 1, "dp ranks")?;
        let ranks = (0..m).map(|_| s.u32()).collect::<Res<Vec<u32>>>()?;
        if !keys.insert(worker) {
            return Err(s.malformed(at, format!("the watermark of worker {worker} is listed twice")));
        }
        let mark = StreamMark { worker, endpoint, watermark: Watermark { seq, digest }, ranks };
        marks.push(PeerWatermark { model_name, tenant_id, mark });
    }
    Ok(marks)
}

impl<R: Read> Source<R> {
    /// A string of 1..=`max` UTF-8 bytes.
    fn text(&mut self, max: usize, what: &str) -> Res<String> {
        let at = self.offset;
        let n = self.u32()? as usize;
        if n == 0 || n > max {
            return Err(self.malformed(at, format!("an {what} of {n} bytes, outside 1..={max}")));
        }
        let mut b = vec![0u8; n];
        self.fill(&mut b)?;
        String::from_utf8(b).map_err(|_| self.malformed(at, format!("the {what} is not UTF-8")))
    }
}

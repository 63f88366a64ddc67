//! Taking a snapshot of a running registry without stopping it.
//!
//! Order matters (see the module doc of `snapshot`): watermarks first, then
//! the writer shards drain everything queued so far (which includes every
//! batch up to those watermarks), then registrations, then the indexes,
//! each read out a worker at a time as the file is written
//! (`dump::stream`, as `/dump` reads them: each worker's blocks at one
//! instant, after the drain). The indexes may then be a little ahead of
//! the watermarks, never behind, but for a stream that starts over in
//! between (docs/limits.md, "Known corners"). A worker's shard waits only while that
//! worker is read; queries do not wait at all.

use super::SavedRegistration;
use crate::dump::stream::{DumpStream, Source};
use crate::registry::{RegisterArgs, Registry};
use rustc_hash::FxHashMap;

/// A snapshot being taken: its registrations, and its indexes' records
/// still to read out.
pub struct Captured {
    pub registrations: Vec<SavedRegistration>,
    pub events: DumpStream,
}

/// Reads the watermarks, drains the writer shards and reads the
/// registrations; the indexes are read out as `events` is. Fails, writing
/// nothing, when the writer shards do not drain in time: the indexes could
/// then miss batches the watermarks claim.
pub fn capture(registry: &Registry) -> Result<Captured, String> {
    let watermarks: FxHashMap<_, _> = registry.ingest().watermarks().into_iter().collect();
    registry
        .ingest()
        .sync_shards()
        .map_err(|e| format!("{e}; the writer shards are too busy for a consistent snapshot"))?;
    let mut registrations = Vec::new();
    for r in registry.registrations() {
        // An index is never removed while a registration uses it.
        let Some(h) = registry.index(&r.model_name, &r.tenant_id) else { continue };
        let args = RegisterArgs {
            instance_id: r.worker.instance_id,
            dp_rank: r.worker.dp_rank,
            endpoint: r.endpoint,
            replay_endpoint: r.replay_endpoint,
            model_name: r.model_name,
            tenant_id: r.tenant_id,
            block_size: h.index().block_size(),
        };
        registrations.push(SavedRegistration { args, last_seq: watermarks.get(&r.worker).copied() });
    }
    let sources = registry
        .indexes()
        .iter()
        .map(|h| Source { model_name: h.model_name.clone(), tenant_id: h.tenant_id.clone(), index: h.index_arc() })
        .collect();
    Ok(Captured { registrations, events: DumpStream::records(sources) })
}

//! Taking a snapshot of a running registry without stopping it.
//!
//! Order matters (see the module doc of `snapshot`): watermarks first, then
//! the writer shards drain everything queued so far (which includes every
//! batch up to those watermarks), then registrations and index dumps. The
//! indexes may then be a little ahead of the watermarks, never behind.
//! Each index is dumped under its own writer lock, so its shards wait for
//! that one dump; queries do not wait at all.

use super::{now_unix_ms, SavedRegistration, Snapshot};
use crate::registry::{RegisterArgs, Registry};
use rustc_hash::FxHashMap;

/// Captures the registry's state. Fails, writing nothing, when the writer
/// shards do not drain in time: the dumps could then miss batches the
/// watermarks claim.
pub fn capture(registry: &Registry) -> Result<Snapshot, String> {
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
    let indexes = registry.indexes().iter().map(|h| h.dump()).collect();
    Ok(Snapshot {
        created_unix_ms: now_unix_ms(),
        daemon_version: crate::version().to_string(),
        registrations,
        indexes,
    })
}

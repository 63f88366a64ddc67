//! When the daemon may say it is ready for routing: peer recovery is over
//! and enough instances are registered. `/health`, the `kv_indexer_ready`
//! gauge and systemd's STATUS line all read it.

use crate::registry::Registry;
use std::sync::atomic::{AtomicBool, Ordering};

/// When the daemon may say it is ready.
pub struct Readiness {
    /// Peer recovery finished (or was not asked for).
    pub recovered: AtomicBool,
    /// Registered instances needed before ready.
    pub min_workers: usize,
}

impl Readiness {
    /// Ready, or why not.
    pub fn check(&self, registry: &Registry) -> Result<(), String> {
        if !self.recovered.load(Ordering::Acquire) {
            return Err("recovering state from peers".into());
        }
        let n = registry.instance_count();
        if n < self.min_workers {
            return Err(format!("waiting for workers: {n} of {} registered", self.min_workers));
        }
        Ok(())
    }
}

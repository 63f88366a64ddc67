//! The background writer: one thread that saves a snapshot every interval
//! until stopped. Writes never overlap (`SnapshotDir` allows one at a time),
//! and a stop waits for a write in progress, so at most one snapshot is in
//! memory and the stop path's own final write never races it.

use super::file::SnapshotDir;
use crate::registry::Registry;
use crossbeam::channel::{bounded, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// A running periodic writer.
pub struct Periodic {
    stop: Sender<()>,
    handle: JoinHandle<()>,
}

impl Periodic {
    /// Starts writing `registry`'s state to `dir` every `interval_s` seconds.
    pub fn start(dir: Arc<SnapshotDir>, registry: Arc<Registry>, interval_s: u64) -> std::io::Result<Periodic> {
        let (stop, stopped) = bounded::<()>(1);
        let interval = Duration::from_secs(interval_s.max(1));
        let handle = std::thread::Builder::new().name("kvi-snapshot".into()).spawn(move || loop {
            match stopped.recv_timeout(interval) {
                Err(RecvTimeoutError::Timeout) => {
                    dir.save_logged(&registry, "periodic");
                }
                Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
            }
        })?;
        Ok(Periodic { stop, handle })
    }

    /// Stops the thread, after the write in progress if any.
    pub fn stop(self) {
        let _ = self.stop.try_send(());
        let _ = self.handle.join();
    }
}

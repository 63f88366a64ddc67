//! The background writer: one thread that saves a snapshot every interval
//! until stopped. Writes never overlap (`SnapshotDir` allows one at a time),
//! and a stop waits for a write in progress, so at most one snapshot is in
//! memory and the stop path's own final write never races it. A stop that
//! had to wait for a write says so, and the daemon then skips its own: a
//! stop costs at most one write (the file is a few hundred ms older, which
//! the seeded watermarks replay from the engines' rings).

use super::file::SnapshotDir;
use crate::registry::Registry;
use crossbeam::channel::{bounded, RecvTimeoutError, Sender};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// A running periodic writer.
pub struct Periodic {
    stop: Sender<()>,
    handle: JoinHandle<()>,
    writing: Arc<AtomicBool>,
    /// Whether the latest write succeeded.
    last_ok: Arc<AtomicBool>,
}

impl Periodic {
    /// Starts writing `registry`'s state to `dir` every `interval_s` seconds.
    pub fn start(dir: Arc<SnapshotDir>, registry: Arc<Registry>, interval_s: u64) -> std::io::Result<Periodic> {
        let (stop, stopped) = bounded::<()>(1);
        let interval = Duration::from_secs(interval_s.max(1));
        let writing = Arc::new(AtomicBool::new(false));
        let last_ok = Arc::new(AtomicBool::new(false));
        let (flag, ok) = (writing.clone(), last_ok.clone());
        let handle = std::thread::Builder::new().name("kvi-snapshot".into()).spawn(move || loop {
            match stopped.recv_timeout(interval) {
                Err(RecvTimeoutError::Timeout) => {
                    flag.store(true, Ordering::Release);
                    ok.store(dir.save_logged(&registry, "periodic").is_some(), Ordering::Release);
                    flag.store(false, Ordering::Release);
                }
                Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
            }
        })?;
        Ok(Periodic { stop, handle, writing, last_ok })
    }

    /// Stops the thread, after the write in progress if any; true when it
    /// waited for one that succeeded (a snapshot was written just now).
    pub fn stop(self) -> bool {
        let was_writing = self.writing.load(Ordering::Acquire);
        let _ = self.stop.try_send(());
        let _ = self.handle.join();
        was_writing && self.last_ok.load(Ordering::Acquire)
    }
}

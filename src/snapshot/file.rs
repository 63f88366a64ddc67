//! The snapshot directory: one file, `snapshot.bin`, replaced atomically,
//! and a lock so two daemons never share a directory.
//!
//! A write goes to `snapshot.bin.tmp` in the same directory as the state
//! is read out (`write`: a piece at a time), is fsynced, renamed over
//! `snapshot.bin`, and the directory is fsynced so the rename itself is
//! durable. A crash at any point leaves either the old file or the new
//! one, never a mix; a stale temp file is removed at open. A read opens
//! the file through a fixed buffer and reads its header and registrations
//! (`read::open`); the events follow as `restore` applies them.

use super::capture::capture;
use super::codec::SnapshotError;
use super::read::{open, Opened};
use super::write::write;
use crate::registry::Registry;
use parking_lot::Mutex;
use std::fs::{self, File, OpenOptions};
use std::io::BufReader;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The snapshot's file name inside `--snapshot-dir`.
pub const FILE_NAME: &str = "snapshot.bin";
const TEMP_NAME: &str = "snapshot.bin.tmp";
const LOCK_NAME: &str = "snapshot.lock";

/// Bytes read from the file at a time.
const READ_BUFFER_BYTES: usize = 1 << 20;

/// A snapshot file opened at startup, its events still to apply.
pub struct Saved {
    pub path: PathBuf,
    pub opened: Opened<BufReader<File>>,
}

/// What one write did, for the log and the benchmark.
#[derive(Clone, Copy, Debug, Default)]
pub struct WriteStats {
    pub bytes: u64,
    pub pairs: u64,
    pub registrations: usize,
    pub indexes: usize,
    /// Reading watermarks, draining shards, reading registrations.
    pub capture_ms: f64,
    /// Reading the indexes out as the file is written, fsync and rename.
    pub write_ms: f64,
}

/// An opened, locked snapshot directory.
pub struct SnapshotDir {
    dir: PathBuf,
    /// Held open for the process's life: its `flock` is the directory lock.
    _lock: File,
    /// One write at a time (the periodic thread and the stop path).
    writing: Mutex<()>,
}

impl SnapshotDir {
    /// Creates the directory if needed and locks it for this process.
    pub fn open(dir: &Path) -> Result<SnapshotDir, String> {
        fs::create_dir_all(dir).map_err(|e| format!("--snapshot-dir {}: cannot create it: {e}", dir.display()))?;
        let lock_path = dir.join(LOCK_NAME);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| format!("--snapshot-dir {}: cannot open {LOCK_NAME}: {e}", dir.display()))?;
        // SAFETY: flock on a file descriptor we own and keep open.
        let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            return Err(format!(
                "--snapshot-dir {}: another kv-indexer holds it; give each daemon its own directory",
                dir.display()
            ));
        }
        let _ = fs::remove_file(dir.join(TEMP_NAME));
        Ok(SnapshotDir { dir: dir.to_path_buf(), _lock: lock, writing: Mutex::new(()) })
    }

    /// The snapshot file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// Opens the snapshot (its header and registrations read); `Ok(None)`
    /// when there is none.
    pub fn read(&self) -> Result<Option<Opened<BufReader<File>>>, SnapshotError> {
        let file = match File::open(self.path()) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(SnapshotError::Io(e.to_string())),
        };
        let len = file.metadata().map_err(|e| SnapshotError::Io(e.to_string()))?.len();
        open(BufReader::with_capacity(READ_BUFFER_BYTES, file), len).map(Some)
    }

    /// Opens the snapshot for startup: `None` when there is none or it
    /// cannot be used, said in one log line.
    pub fn load(&self) -> Option<Saved> {
        let path = self.path();
        match self.read() {
            Ok(Some(opened)) => Some(Saved { path, opened }),
            Ok(None) => {
                crate::info!("no snapshot at {}; starting without one", path.display());
                None
            }
            Err(e) => {
                crate::warn!("ignoring snapshot {}: {e}; starting without it ({})", path.display(), e.hint());
                None
            }
        }
    }

    /// Captures the registry's state and writes it; one write at a time.
    pub fn save(&self, registry: &Registry) -> Result<WriteStats, String> {
        let _one = self.writing.lock();
        let t = Instant::now();
        let captured = capture(registry)?;
        let capture_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let tmp = self.dir.join(TEMP_NAME);
        let result = (|| {
            let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(&tmp)?;
            let written =
                write(&mut f, super::now_unix_ms(), crate::version(), &captured.registrations, captured.events)?;
            f.sync_all()?;
            drop(f);
            fs::rename(&tmp, self.path())?;
            File::open(&self.dir)?.sync_all()?;
            Ok(written)
        })();
        let written = result.map_err(|e: std::io::Error| {
            let _ = fs::remove_file(&tmp);
            format!("writing {}: {e}", self.path().display())
        })?;
        Ok(WriteStats {
            bytes: written.bytes,
            pairs: written.counts.blocks,
            registrations: written.registrations,
            indexes: written.counts.indexes as usize,
            capture_ms,
            write_ms: t.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// `save`, logged: the outcome at debug, a failure at warn.
    pub fn save_logged(&self, registry: &Registry, why: &str) -> Option<WriteStats> {
        match self.save(registry) {
            Ok(s) => {
                crate::debug!(
                    "snapshot written ({why}): {} bytes, {} pairs, {} registrations, {} indexes in {:.0} ms \
                     (capture {:.0} ms, write {:.0} ms)",
                    s.bytes,
                    s.pairs,
                    s.registrations,
                    s.indexes,
                    s.capture_ms + s.write_ms,
                    s.capture_ms,
                    s.write_ms
                );
                Some(s)
            }
            Err(e) => {
                crate::warn!("snapshot not written ({why}): {e}; the previous snapshot stays");
                None
            }
        }
    }
}

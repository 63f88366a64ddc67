//! What the API can see of a listener while its thread runs it: connection
//! state, last error, watermark and when its last batch arrived, shared
//! through atomics and one small lock.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::config::LAST_ERROR_LEN_MAX;
use super::sequencer::Watermark;
use super::sink::EventSink;
use crate::event::WorkerId;
use crate::log::truncate_utf8;

/// What `add_listener` needs to subscribe to one publisher.
#[derive(Clone)]
pub struct ListenerSpec {
    /// Instance and registered dp rank (a rank inside a batch overrides it).
    pub worker: WorkerId,
    /// The engine's ZMQ PUB endpoint, e.g. `tcp://10.0.0.5:5557`.
    pub endpoint: String,
    /// The engine's ZMQ ROUTER replay endpoint, if it has one.
    pub replay_endpoint: Option<String>,
    /// Tokens per block of the index this worker feeds.
    pub block_size: u32,
    /// The (model, tenant) index the events go to.
    pub sink: Arc<dyn EventSink>,
}

/// Opaque id of one listener, unique within an `Ingest`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenerId(pub u64);

impl fmt::Display for ListenerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "listener-{}", self.0)
    }
}

/// A listener's state as the HTTP API reports it (serialized as its `as_str` name).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ListenerStatus {
    /// Not connected yet (or reconnecting after a disconnect).
    Pending,
    /// Connected and applying events.
    Active,
    /// Connected, holding events until the ready gate opens.
    Paused,
    /// The endpoint answered but is no ZMQ publisher we can talk to (the
    /// handshake failed); see `last_error`. Cleared by a later good connection.
    Failed,
}

impl ListenerStatus {
    /// The name used by the HTTP API.
    pub fn as_str(self) -> &'static str {
        match self {
            ListenerStatus::Pending => "pending",
            ListenerStatus::Active => "active",
            ListenerStatus::Paused => "paused",
            ListenerStatus::Failed => "failed",
        }
    }
}

/// A snapshot of one listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerInfo {
    pub id: ListenerId,
    /// The registered worker: instance and registered dp rank.
    pub worker: WorkerId,
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub block_size: u32,
    pub status: ListenerStatus,
    pub last_error: Option<String>,
    /// Whether its SUB socket is connected to the engine now.
    pub connected: bool,
    /// Highest seq dealt with on this listener's stream.
    pub last_seq: Option<u64>,
    /// Batches received on this listener.
    pub batches_received: u64,
    /// Time since its last live batch arrived (since it was added, before
    /// the first): how stale its worker's state may be.
    pub since_last_batch: Duration,
}

/// State written by the listener thread, read by the API.
#[derive(Debug)]
pub(crate) struct ListenerShared {
    /// Names the listener in log lines: instance, rank and endpoint.
    pub label: String,
    /// Changed and read whole, so a status never shows without the error
    /// that explains it.
    conn: Mutex<Conn>,
    /// Published by the listener thread only when it moved (see `flush`):
    /// seq and digest are read together.
    watermark: Mutex<Option<Watermark>>,
    /// Batches received on this listener.
    pub batches_received: AtomicU64,
    /// `clock_ms()` when the last live batch arrived, or the listener was added.
    last_batch_ms: AtomicU64,
}

/// Milliseconds on a monotonic clock that starts with the process.
fn clock_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

#[derive(Debug, Default)]
struct Conn {
    connected: bool,
    failed: bool,
    last_error: Option<String>,
}

impl ListenerShared {
    pub(crate) fn new(label: String, watermark: Option<Watermark>) -> Self {
        Self {
            label,
            conn: Mutex::new(Conn::default()),
            watermark: Mutex::new(watermark),
            batches_received: AtomicU64::new(0),
            last_batch_ms: AtomicU64::new(clock_ms()),
        }
    }

    /// A live batch arrived now.
    pub(crate) fn note_batch(&self) {
        self.last_batch_ms.store(clock_ms(), Ordering::Relaxed);
    }

    /// Time since the last live batch (or since the listener was added).
    pub(crate) fn since_last_batch(&self) -> Duration {
        Duration::from_millis(clock_ms().saturating_sub(self.last_batch_ms.load(Ordering::Relaxed)))
    }

    /// The status, the last error and whether connected, read together.
    pub(crate) fn state(&self, gate_open: bool) -> (ListenerStatus, Option<String>, bool) {
        let c = self.conn.lock();
        let status = if c.failed {
            ListenerStatus::Failed
        } else if !c.connected {
            ListenerStatus::Pending
        } else if !gate_open {
            ListenerStatus::Paused
        } else {
            ListenerStatus::Active
        };
        (status, c.last_error.clone(), c.connected)
    }

    /// A good connection, which ends whatever went wrong before.
    pub(crate) fn set_connected(&self) {
        let mut c = self.conn.lock();
        if !c.connected {
            crate::info!("listener {}: connected", self.label);
        }
        *c = Conn { connected: true, failed: false, last_error: None };
    }

    /// The connection lost, with why: `error` unless the listener has
    /// failed, whose reason stays.
    pub(crate) fn set_disconnected(&self, error: String) {
        let mut c = self.conn.lock();
        if std::mem::replace(&mut c.connected, false) {
            crate::warn!("listener {}: disconnected; reconnecting", self.label);
        }
        if !c.failed {
            c.last_error = Some(cut(error));
        }
    }

    /// The peer is not a publisher (or not one we can speak to).
    pub(crate) fn set_failed(&self, error: String) {
        let mut c = self.conn.lock();
        if !std::mem::replace(&mut c.failed, true) {
            crate::warn!("listener {}: failed: {error}", self.label);
        }
        c.last_error = Some(cut(error));
    }

    pub(crate) fn is_failed(&self) -> bool {
        self.conn.lock().failed
    }

    pub(crate) fn set_error(&self, error: String) {
        self.conn.lock().last_error = Some(cut(error));
    }

    /// Clears `last_error` after a replay recovered a gap in full, unless
    /// the listener failed or is not connected (their errors still hold).
    pub(crate) fn clear_replay_error(&self) {
        let mut c = self.conn.lock();
        if c.connected && !c.failed {
            c.last_error = None;
        }
    }

    pub(crate) fn set_watermark(&self, watermark: Option<Watermark>) {
        *self.watermark.lock() = watermark;
    }

    pub(crate) fn watermark(&self) -> Option<Watermark> {
        *self.watermark.lock()
    }

    pub(crate) fn last_seq(&self) -> Option<u64> {
        self.watermark().map(|w| w.seq)
    }
}

/// `error` cut to `LAST_ERROR_LEN_MAX` bytes on a char boundary.
fn cut(mut error: String) -> String {
    error.truncate(truncate_utf8(&error, LAST_ERROR_LEN_MAX).len());
    error
}

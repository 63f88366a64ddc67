//! What the API can see of a listener while its thread runs it: connection
//! state, last error and watermark, shared through atomics and one small lock.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::config::LAST_ERROR_LEN_MAX;
use super::sink::EventSink;
use crate::event::WorkerId;

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

/// A listener's state as the HTTP API reports it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
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
    /// Highest seq dealt with on this listener's stream.
    pub last_seq: Option<u64>,
    /// Batches received on this listener.
    pub batches_received: u64,
}

/// Marks "no seq yet" in `last_seq`: the replay end marker, never a live seq.
const NO_SEQ: u64 = u64::MAX;

/// State written by the listener thread, read by the API.
#[derive(Debug)]
pub(crate) struct ListenerShared {
    /// Names the listener in log lines: instance, rank and endpoint.
    pub label: String,
    connected: AtomicBool,
    failed: AtomicBool,
    last_seq: AtomicU64,
    /// Batches received on this listener.
    pub batches_received: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl ListenerShared {
    pub(crate) fn new(label: String, last_seq: Option<u64>) -> Self {
        Self {
            label,
            connected: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            last_seq: AtomicU64::new(last_seq.unwrap_or(NO_SEQ)),
            batches_received: AtomicU64::new(0),
            last_error: Mutex::new(None),
        }
    }

    pub(crate) fn status(&self, gate_open: bool) -> ListenerStatus {
        if self.failed.load(Ordering::Relaxed) {
            ListenerStatus::Failed
        } else if !self.connected.load(Ordering::Relaxed) {
            ListenerStatus::Pending
        } else if !gate_open {
            ListenerStatus::Paused
        } else {
            ListenerStatus::Active
        }
    }

    pub(crate) fn set_connected(&self, connected: bool) {
        if self.connected.swap(connected, Ordering::Relaxed) != connected {
            if connected {
                crate::info!("listener {}: connected", self.label);
            } else {
                crate::warn!("listener {}: disconnected; reconnecting", self.label);
            }
        }
        if connected {
            // A good connection ends whatever went wrong before.
            self.failed.store(false, Ordering::Relaxed);
            *self.last_error.lock() = None;
        }
    }

    pub(crate) fn set_failed(&self, error: String) {
        if !self.failed.swap(true, Ordering::Relaxed) {
            crate::warn!("listener {}: failed: {error}", self.label);
        }
        self.set_error(error);
    }

    pub(crate) fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    pub(crate) fn set_error(&self, mut error: String) {
        if error.len() > LAST_ERROR_LEN_MAX {
            let mut cut = LAST_ERROR_LEN_MAX;
            while !error.is_char_boundary(cut) {
                cut -= 1;
            }
            error.truncate(cut);
        }
        *self.last_error.lock() = Some(error);
    }

    pub(crate) fn last_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }

    pub(crate) fn set_last_seq(&self, seq: Option<u64>) {
        self.last_seq.store(seq.unwrap_or(NO_SEQ), Ordering::Relaxed);
    }

    pub(crate) fn last_seq(&self) -> Option<u64> {
        Some(self.last_seq.load(Ordering::Relaxed)).filter(|&s| s != NO_SEQ)
    }
}

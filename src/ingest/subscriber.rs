//! One connection attempt to a publisher: a SUB socket that ZMQ does not
//! reconnect in its lifetime (`ZMQ_RECONNECT_IVL` of `NEVER_MS`) and the
//! PAIR socket reading its monitor. A socket thus carries at most one
//! connection, so every batch read from it came from the process that
//! answered that connection, and a batch read from the next socket came
//! from whatever answered next. The listener opens the next socket itself
//! (`listener.rs`), after a backoff, once this one's attempt failed or its
//! connection dropped and what it had received was read.
//!
//! Not -1 ("never reconnect"): libzmq 4.3 then ends the endpoint when the
//! connection drops and closes the socket's side of the pipe at once,
//! dropping what was received and not yet read, and aborting the process
//! (`fq.cpp`, `!_more`) when that lands between two frames the reader is
//! taking (`tests/ingest_disconnect_backlog.rs`; at fleet size it happened
//! within seconds of startup). With a reconnect merely due in hours
//! (`NEVER_MS`), the pipe stays whole until the listener has read it and
//! closes the socket. A failed connect says so on the monitor (`CLOSED`,
//! or only `CONNECT_RETRIED` when the address does not resolve); an
//! attempt that has not connected within `CONNECT_ATTEMPT_MS` is given up
//! too.
//!
//! The monitor is stopped before its reading end closes (`Drop`): libzmq's
//! I/O thread sends monitor events with a blocking send, and a socket that
//! is still ending its connection (its delayed reconnect, its close) sends
//! some after the listener is done with it. Sent to a reader already gone,
//! one such event stopped the context's only I/O thread for good, and with
//! it every connection the daemon would make next.

use super::budget::sub_queue_messages;
use super::config::{IngestConfig, CONNECT_ATTEMPT_MS};
use super::zmq_context::{ZmqContext, ZmqSocket};

/// A reconnect interval no dropped socket lives to see (about six hours
/// after the drop; the listener closes it once read), so ZMQ keeps a
/// dropped connection's pipe for the listener to read.
const NEVER_MS: i32 = i32::MAX / 100;

/// Longest ZMTP heartbeat TTL libzmq takes (sent in deciseconds, 16 bits).
const HEARTBEAT_TTL_MS_MAX: i32 = 6_553_500;

/// One connection attempt's sockets.
pub(crate) struct Subscriber {
    pub sub: ZmqSocket,
    /// PAIR socket receiving `sub`'s monitor events.
    pub monitor: ZmqSocket,
    /// The connection's number for this listener (1 for its first socket).
    pub conn: u32,
}

/// Why a socket could not be opened: ZMQ refused the endpoint, or
/// resources ran out.
#[derive(Debug)]
pub(crate) enum OpenError {
    Endpoint(zmq::Error),
    Resource(zmq::Error),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Endpoint(e) => write!(f, "endpoint refused: {e}"),
            OpenError::Resource(e) => write!(f, "{e}"),
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        // Before the monitor's reading end closes: see `stop_monitor`.
        self.sub.stop_monitor();
    }
}

impl Subscriber {
    /// Opens connection attempt `conn` to `endpoint`; `monitor_base` names
    /// the listener (`inproc://...`), unique in the process; `listeners`
    /// running share the budget's room for unread messages.
    pub(crate) fn open(
        ctx: &ZmqContext,
        cfg: &IngestConfig,
        (monitor_base, conn): (&str, u32),
        endpoint: &str,
        listeners: usize,
    ) -> Result<Subscriber, OpenError> {
        let res = OpenError::Resource;
        let sub = ctx.socket(zmq::SUB).map_err(res)?;
        sub.set_linger(0).map_err(res)?;
        let queue = sub_queue_messages(cfg.budget_bytes, listeners, cfg.sub_rcvhwm_batches);
        sub.set_rcvhwm(queue).map_err(res)?;
        // One connection per socket: the listener reconnects with a new one.
        sub.set_reconnect_ivl(NEVER_MS).map_err(res)?;
        sub.set_reconnect_ivl_max(0).map_err(res)?;
        sub.set_connect_timeout(CONNECT_ATTEMPT_MS as i32).map_err(res)?;
        if cfg.heartbeat_ivl_ms > 0 {
            // Silence for three intervals after a ping drops the connection
            // (a host gone without a reset; the monitor says DISCONNECTED),
            // and the TTL in our pings tells the engine to drop ours as soon,
            // so a vanished indexer does not keep a queue there either.
            let timeout_ms = cfg.heartbeat_ivl_ms.saturating_mul(3);
            sub.set_heartbeat_ivl(cfg.heartbeat_ivl_ms).map_err(res)?;
            sub.set_heartbeat_timeout(timeout_ms).map_err(res)?;
            sub.set_heartbeat_ttl(timeout_ms.min(HEARTBEAT_TTL_MS_MAX)).map_err(res)?;
        }
        sub.set_subscribe(b"").map_err(res)?;
        let monitor_endpoint = format!("{monitor_base}-{conn}");
        let events = [
            zmq::SocketEvent::CONNECTED,
            zmq::SocketEvent::CLOSED,
            zmq::SocketEvent::CONNECT_RETRIED,
            zmq::SocketEvent::HANDSHAKE_SUCCEEDED,
            zmq::SocketEvent::DISCONNECTED,
            zmq::SocketEvent::HANDSHAKE_FAILED_NO_DETAIL,
            zmq::SocketEvent::HANDSHAKE_FAILED_PROTOCOL,
            zmq::SocketEvent::HANDSHAKE_FAILED_AUTH,
        ]
        .iter()
        .fold(0i32, |mask, e| mask | i32::from(e.to_raw()));
        sub.monitor(&monitor_endpoint, events).map_err(res)?;
        let monitor = ctx.socket(zmq::PAIR).map_err(res)?;
        monitor.set_linger(0).map_err(res)?;
        monitor.connect(&monitor_endpoint).map_err(res)?;
        sub.connect(endpoint).map_err(OpenError::Endpoint)?;
        Ok(Subscriber { sub, monitor, conn })
    }
}

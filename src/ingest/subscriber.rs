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
//! A host gone without a reset (power lost, link cut) is noticed by the
//! kernel: TCP keepalive probes after `heartbeat_ivl_ms` of silence (whole
//! seconds), three unanswered end the connection. Not ZMTP heartbeats:
//! libzmq stops reading a connection whose queue to us is full, and its
//! heartbeat timer, which only a message read resets, then dropped live
//! connections of a daemon merely behind (876 of 1,024 engines in the
//! fleet bench); and a heartbeat due on a connection that errored while
//! its input was stopped aborts libzmq 4.3 (`stream_engine_base.cpp`,
//! `!_io_error`). The kernel answers probes whatever we read, so only a
//! silent host counts.
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

/// Unanswered keepalive probes that end a connection.
const KEEPALIVE_PROBES: i32 = 3;

/// One connection attempt's sockets.
pub(crate) struct Subscriber {
    pub sub: ZmqSocket,
    /// PAIR socket receiving `sub`'s monitor events.
    pub monitor: ZmqSocket,
    /// The connection's number for this listener (1 for its first socket).
    pub conn: u32,
    /// Messages `sub` may queue unread (its `ZMQ_RCVHWM`).
    pub queue: i32,
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
            // Probes after this much silence, this far apart; the third
            // unanswered drops the connection (the monitor says DISCONNECTED).
            let secs = keepalive_secs(cfg.heartbeat_ivl_ms);
            sub.set_tcp_keepalive(1).map_err(res)?;
            sub.set_tcp_keepalive_idle(secs).map_err(res)?;
            sub.set_tcp_keepalive_intvl(secs).map_err(res)?;
            sub.set_tcp_keepalive_cnt(KEEPALIVE_PROBES).map_err(res)?;
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
        Ok(Subscriber { sub, monitor, conn, queue })
    }
}

/// The kernel's keepalive timers count whole seconds: `ms` rounded up, at
/// least one.
fn keepalive_secs(ms: i32) -> i32 {
    ms.saturating_add(999).div_euclid(1_000).max(1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn keepalive_rounds_up_to_whole_seconds() {
        let secs: Vec<i32> = [1, 200, 1_000, 1_001, 2_500, 600_000].map(super::keepalive_secs).to_vec();
        assert_eq!(secs, [1, 1, 1, 2, 3, 600]);
    }
}

//! What a SUB socket's monitor says about its one connection attempt (TCP
//! up, ZMQ handshake done or failed, connect failed, dropped), turned into
//! the listener's status and `last_error`, and into the facts its listener
//! needs: whether the publisher is reachable now (a handshake succeeded and
//! the connection has not dropped since: ring fills and `engine_gone` go by
//! it), and whether the attempt is over (the listener then opens the next
//! one). A dead host that sent no reset is a dropped connection too, once
//! TCP keepalive gives up on it (`subscriber.rs`).

use std::time::Duration;

use super::config::{CONNECT_LOG_INTERVAL_MS, RECV_BURST_MAX};
use super::log::LogLimiter;
use super::status::ListenerShared;

/// The listener's connection, across its sockets, as their monitors told it.
pub(crate) struct Connection {
    /// Whether a ZMQ handshake ever succeeded (for clearer errors).
    ever_connected: bool,
    /// TCP connected, ZMQ handshake not done yet.
    handshaking: bool,
    /// A handshake succeeded on the current socket and has not dropped since.
    up: bool,
    /// Connection failures: the first at once, then one line per
    /// `CONNECT_LOG_INTERVAL_MS` while the endpoint stays unreachable.
    log: LogLimiter,
}

/// What one read of a monitor found.
#[derive(Default)]
pub(crate) struct MonitorRead {
    /// The handshake succeeded.
    pub came_up: bool,
    /// The attempt is over: the connection dropped, the connect failed, or
    /// the handshake failed. `came_up` may be set too.
    pub over: bool,
    /// The read stopped at the burst cap: events may be left.
    pub more: bool,
}

impl Connection {
    pub(crate) fn new() -> Connection {
        Connection {
            ever_connected: false,
            handshaking: false,
            up: false,
            log: LogLimiter::every(Duration::from_millis(CONNECT_LOG_INTERVAL_MS)),
        }
    }

    /// Whether the publisher is reachable: handshake done, not dropped since.
    pub(crate) fn is_up(&self) -> bool {
        self.up
    }

    /// Reads the events queued on `monitor` (at most `RECV_BURST_MAX`);
    /// stops after the one that ends the attempt.
    pub(crate) fn read(&mut self, monitor: &zmq::Socket, endpoint: &str, shared: &ListenerShared) -> MonitorRead {
        let mut read = MonitorRead::default();
        for _ in 0..RECV_BURST_MAX {
            let Ok(frames) = monitor.recv_multipart(zmq::DONTWAIT) else {
                return read;
            };
            let Some(head) = frames.first().filter(|f| f.len() >= 6) else {
                continue;
            };
            let event = u16::from_ne_bytes([head[0], head[1]]);
            let value = u32::from_ne_bytes([head[2], head[3], head[4], head[5]]);
            read.came_up |= event == zmq::SocketEvent::HANDSHAKE_SUCCEEDED.to_raw();
            if self.on_event(event, value, endpoint, shared) {
                read.over = true;
                return read;
            }
        }
        read.more = true;
        read
    }

    /// The attempt ended without a handshake; the next is made in
    /// `retry_ms`: says so where the operator looks.
    pub(crate) fn retrying(&mut self, endpoint: &str, shared: &ListenerShared, retry_ms: u64) {
        if shared.is_failed() {
            // A failure's reason says more than "retrying": keep it.
            return;
        }
        let error = if self.ever_connected {
            format!("lost connection to {endpoint}; reconnecting, next try in {retry_ms} ms")
        } else {
            format!("cannot connect to {endpoint}; retrying in {retry_ms} ms (is the engine's KV event publisher up?)")
        };
        self.log.warn(|| format!("listener {}: {error}", shared.label));
        shared.set_error(error);
    }

    /// Applies one monitor event; true if it ends the attempt.
    fn on_event(&mut self, event: u16, value: u32, endpoint: &str, shared: &ListenerShared) -> bool {
        use zmq::SocketEvent as E;
        if event == E::CONNECTED.to_raw() {
            // TCP is up; the peer is not known to be a publisher until the
            // ZMQ handshake succeeds.
            self.handshaking = true;
            crate::debug!("listener of {endpoint}: TCP connected, ZMQ handshake under way");
        } else if event == E::HANDSHAKE_SUCCEEDED.to_raw() {
            self.handshaking = false;
            self.up = true;
            self.ever_connected = true;
            // A later outage is news again: its first failure is logged at once.
            self.log.reset();
            shared.set_connected();
        } else if event == E::DISCONNECTED.to_raw() {
            self.up = false;
            if std::mem::take(&mut self.handshaking) {
                shared.set_failed(format!(
                    "{endpoint} closed the connection during the ZMQ handshake; is it the engine's KV event PUB socket?"
                ));
            } else {
                shared.set_disconnected(format!("lost connection to {endpoint}; reconnecting"));
            }
            return true;
        } else if event == E::CLOSED.to_raw() || event == E::CONNECT_RETRIED.to_raw() {
            // The connect failed (refused, timed out, no such address): the
            // attempt is over (the socket's own retry is weeks away). After a
            // handshake the drop says so first.
            if !self.up {
                self.handshaking = false;
                return true;
            }
        } else if event == E::HANDSHAKE_FAILED_PROTOCOL.to_raw()
            || event == E::HANDSHAKE_FAILED_NO_DETAIL.to_raw()
            || event == E::HANDSHAKE_FAILED_AUTH.to_raw()
        {
            self.handshaking = false;
            let cause = std::io::Error::from_raw_os_error(value as i32);
            shared.set_failed(format!(
                "ZMQ handshake with {endpoint} failed ({cause}); is it the engine's KV event PUB socket?"
            ));
        }
        false
    }

    /// The attempt is over with no event to say so (the watchdog).
    pub(crate) fn abandon(&mut self) {
        self.handshaking = false;
        self.up = false;
    }
}

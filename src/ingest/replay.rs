//! One replay request in flight: a DEALER socket asking a publisher's ROUTER
//! for the batches from `from` on, and the bookkeeping to judge the answer.
//! The listener thread polls this socket with its SUB sockets, so a slow or
//! dead replay endpoint costs nothing but its own deadline.

use std::time::{Duration, Instant};

/// A replay request and what it has delivered so far.
pub(crate) struct ReplayRun {
    pub socket: zmq::Socket,
    /// The missing range asked for: `from..to`.
    pub from: u64,
    pub to: u64,
    pub deadline: Instant,
    /// Replies received (bounded by `replay_batches_max`).
    pub replies: usize,
    /// Batches of `from..to` delivered and applied.
    pub applied: u64,
    /// Seqs of `from..to` found missing so far.
    pub missing: u64,
}

impl ReplayRun {
    /// Connects to `endpoint` and asks for every buffered batch from `from` on.
    pub(crate) fn start(
        ctx: &zmq::Context,
        endpoint: &str,
        from: u64,
        to: u64,
        timeout_ms: u64,
    ) -> Result<ReplayRun, String> {
        let err = |what: &str, e: zmq::Error| format!("replay {what} {endpoint}: {e}");
        let socket = ctx.socket(zmq::DEALER).map_err(|e| err("socket for", e))?;
        socket.set_linger(0).map_err(|e| err("linger on", e))?;
        socket.connect(endpoint).map_err(|e| err("connect to", e))?;
        // The pipe exists from connect on, so this queues even before the
        // TCP connection is up; only a full pipe would refuse it.
        socket
            .send_multipart(crate::wire::replay_request_frames(from), zmq::DONTWAIT)
            .map_err(|e| err("request to", e))?;
        Ok(ReplayRun {
            socket,
            from,
            to,
            deadline: Instant::now() + Duration::from_millis(timeout_ms),
            replies: 0,
            applied: 0,
            missing: 0,
        })
    }
}

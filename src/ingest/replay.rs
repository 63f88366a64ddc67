//! The socket a ring request travels on: a DEALER connected to the
//! engine's replay ROUTER, with the request `[b"", from as u64 big-endian]`
//! sent. What the request is for and how its answer is judged is the
//! stream's (`stream/ask.rs`); a request asked again gets a new socket, so
//! replies still in flight for the old one go with it.

use super::zmq_context::{ZmqContext, ZmqSocket};

/// A DEALER socket connected to `endpoint` with the request for `from..`
/// sent; up to `queue` replies (and the end marker) can wait unread: past
/// that the engine's ROUTER drops them, and they are asked for again.
pub(crate) fn request(ctx: &ZmqContext, endpoint: &str, from: u64, queue: usize) -> Result<ZmqSocket, String> {
    let err = |what: &str, e: zmq::Error| format!("replay {what} {endpoint}: {e}");
    let socket = ctx.socket(zmq::DEALER).map_err(|e| err("socket for", e))?;
    socket.set_linger(0).map_err(|e| err("linger on", e))?;
    let hwm = i32::try_from(queue.saturating_add(1)).unwrap_or(i32::MAX);
    socket.set_rcvhwm(hwm).map_err(|e| err("high-water mark on", e))?;
    socket.connect(endpoint).map_err(|e| err("connect to", e))?;
    // The pipe exists from connect on, so this queues even before the
    // TCP connection is up; only a full pipe would refuse it.
    socket.send_multipart([&b""[..], &from.to_be_bytes()], zmq::DONTWAIT).map_err(|e| err("request to", e))?;
    Ok(socket)
}

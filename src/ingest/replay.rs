//! One replay request in flight: a DEALER socket asking a publisher's ROUTER
//! for the batches from `from` on, and the bookkeeping to judge the answer.
//! Two things ask: a gap in the live stream (`from..to`, `to` the batch that
//! showed the gap), and a ring fill when a listener connects, which asks for
//! everything the ring holds past the watermark and ends at the ring's end
//! marker, or at the first live batch past the watermark if one comes first.
//! The listener thread polls this socket with its SUB sockets, so a slow or
//! dead replay endpoint costs nothing but its own deadline: a request ends
//! once no reply came for the timeout, and in any case at
//! `REPLAY_SPAN_TIMEOUTS` timeouts from the first of the runs made back to
//! back while live batches wait (or once those overflow), so a long ring
//! that keeps answering is read whole and a trickling one cannot hold the
//! stream. An engine sends
//! its whole buffer at once from a ROUTER socket, which silently drops what
//! overflows the pipe (1,000 messages by default): a long replay comes back
//! with holes, or stops short, though the engine still holds the batches.
//! The listener then asks again from the first missing seq (`retry`), as
//! long as each request makes progress.

use std::time::{Duration, Instant};

use super::config::REPLAY_SPAN_TIMEOUTS;
use super::sequencer::Watermark;
use super::zmq_context::{ZmqContext, ZmqSocket};

/// A replay request and what it has delivered so far.
pub(crate) struct ReplayRun {
    pub socket: ZmqSocket,
    /// A ring fill on connecting, not a gap's replay.
    pub fill: bool,
    /// The range asked for: `from..to`. A fill's `to` is unknown until a
    /// live batch past the watermark arrives (its seq); until then the
    /// ring's end marker ends the fill.
    pub from: u64,
    pub to: Option<u64>,
    /// A fill from a watermark asks from its seq: the ring must answer with
    /// that very batch first (same seq and digest), or it is another
    /// process's ring (or one that rolled past it). None once it did.
    pub verify: Option<Watermark>,
    /// When the run started, and how long it may go without a reply.
    pub started: Instant,
    timeout: Duration,
    /// Replies received (bounded by `replay_batches_max`), every request together.
    pub replies: usize,
    /// Batches of `from..to` delivered and applied.
    pub applied: u64,
    /// The first seq applied and the last (for a fill's log line).
    pub applied_seqs: Option<(u64, u64)>,
    /// Seqs of `from..to` found missing so far.
    pub missing: u64,
    /// Requests sent again (bounded by `REPLAY_RETRIES_MAX`).
    pub retries: u32,
    /// `applied` when the current request was sent.
    applied_at_request: u64,
    /// When the last reply arrived (or the current request was sent).
    pub last_reply: Instant,
    /// Live batches were dropped while it ran (the held queue was full).
    pub overflowed: bool,
}

impl ReplayRun {
    /// Connects to `endpoint` and asks for every buffered batch from `from`
    /// on; up to `batches_max` replies (and the end marker) can wait unread.
    pub(crate) fn start(
        ctx: &ZmqContext,
        endpoint: &str,
        fill: bool,
        (from, to): (u64, Option<u64>),
        timeout_ms: u64,
        batches_max: usize,
    ) -> Result<ReplayRun, String> {
        Ok(ReplayRun {
            socket: request(ctx, endpoint, from, batches_max)?,
            fill,
            from,
            to,
            verify: None,
            started: Instant::now(),
            timeout: Duration::from_millis(timeout_ms),
            replies: 0,
            applied: 0,
            applied_seqs: None,
            missing: 0,
            retries: 0,
            applied_at_request: 0,
            last_reply: Instant::now(),
            overflowed: false,
        })
    }

    /// No reply came for the timeout (since the request or the last reply).
    pub(crate) fn silent(&self, now: Instant) -> bool {
        now >= self.last_reply + self.timeout
    }

    /// The run, or the runs back to back it ends (from `since`), went past
    /// `REPLAY_SPAN_TIMEOUTS` timeouts.
    pub(crate) fn ran_past(&self, now: Instant, since: Option<Instant>) -> bool {
        now >= since.map_or(self.started, |s| s.min(self.started)) + self.timeout * REPLAY_SPAN_TIMEOUTS
    }

    /// Whether the current request delivered any batch yet.
    pub(crate) fn progressed(&self) -> bool {
        self.applied > self.applied_at_request
    }

    /// Counts batch `seq` as delivered and applied.
    pub(crate) fn note_applied(&mut self, seq: u64) {
        self.applied += 1;
        self.applied_seqs = Some(self.applied_seqs.map_or((seq, seq), |(first, _)| (first, seq)));
    }

    /// Whether `seq` lies past the range asked for.
    pub(crate) fn past_end(&self, seq: u64) -> bool {
        self.to.is_some_and(|to| seq >= to)
    }

    /// A fill's live bound: the first live batch `seq` past the watermark
    /// `last` ends the fill there (the live stream has it and what follows).
    /// Returns whether `seq` is the fill's first bound (at most one a fill).
    pub(crate) fn bound_by_live(&mut self, seq: u64, last: Option<u64>) -> bool {
        if !self.fill || last.is_some_and(|last| seq <= last) || self.past_end(seq) {
            return false;
        }
        // A later, lower bound (a publisher stepping back) moves `to` down.
        self.to.replace(seq).is_none()
    }

    /// Asks again from `from` on a new socket: replies still in flight for
    /// the old request go with the old socket. Range, start and counts stay.
    pub(crate) fn retry(
        &mut self,
        ctx: &ZmqContext,
        endpoint: &str,
        from: u64,
        batches_max: usize,
    ) -> Result<(), String> {
        self.socket = request(ctx, endpoint, from, batches_max)?;
        self.retries += 1;
        self.applied_at_request = self.applied;
        self.last_reply = Instant::now();
        Ok(())
    }
}

/// A DEALER socket connected to `endpoint` with the request for `from..` sent.
fn request(ctx: &ZmqContext, endpoint: &str, from: u64, batches_max: usize) -> Result<ZmqSocket, String> {
    let err = |what: &str, e: zmq::Error| format!("replay {what} {endpoint}: {e}");
    let socket = ctx.socket(zmq::DEALER).map_err(|e| err("socket for", e))?;
    socket.set_linger(0).map_err(|e| err("linger on", e))?;
    // Room for every reply we would take, so our side never adds to the
    // drops of the engine's ROUTER however slowly we apply.
    let hwm = i32::try_from(batches_max.saturating_add(1)).unwrap_or(i32::MAX);
    socket.set_rcvhwm(hwm).map_err(|e| err("high-water mark on", e))?;
    socket.connect(endpoint).map_err(|e| err("connect to", e))?;
    // The pipe exists from connect on, so this queues even before the
    // TCP connection is up; only a full pipe would refuse it.
    // The request: `[b"", from as u64 big-endian]`.
    socket.send_multipart([&b""[..], &from.to_be_bytes()], zmq::DONTWAIT).map_err(|e| err("request to", e))?;
    Ok(socket)
}

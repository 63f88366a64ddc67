//! One request to a publisher's ring and what it has delivered so far; the
//! socket that carries it is the listener's (`Port::ask`). Two things ask:
//! a ring fill (after each new connection, at startup, after the engine was
//! gone), which asks for everything the ring holds past the watermark and
//! ends at the ring's end marker or at the first live batch past the
//! watermark; and a gap in the live stream (`from..to`, `to` the batch that
//! showed it). Either asks from the watermark itself when there is one:
//! the ring must answer with that very batch first (same seq and digest),
//! which proves it is the process whose batches the stream holds.
//!
//! An engine sends its whole ring at once from a ROUTER socket, which
//! silently drops what overflows the pipe (1,000 messages by default): a
//! long answer comes with holes, or stops short, though the engine still
//! holds the batches. The stream then asks again from the first missing
//! seq (`retry`) as long as each request makes progress.

use std::time::{Duration, Instant};

use super::super::decode::Batch;
use super::super::sequencer::Watermark;

/// A request to the ring and what it delivered.
#[derive(Debug)]
pub(crate) struct Ask {
    /// The newest connection when it was asked: a ring that proves to be
    /// the stream's process proves every connection up to this one.
    pub conn: u32,
    /// Asked from this seq: the watermark, or 0 without one.
    pub from: u64,
    /// The first seq it is for: past the watermark, or 0 without one.
    pub first: u64,
    /// The batch the ring must answer first: the watermark, while unproven.
    pub verify: Option<Watermark>,
    /// The end of what it is for (exclusive): a gap's trigger, or the
    /// first live batch past the watermark that bounds a fill. None: a fill
    /// until the ring's end marker.
    pub to: Option<u64>,
    /// When it was asked first, and when the last reply came (or the
    /// current request went out).
    pub started: Instant,
    pub last_reply: Instant,
    /// Replies received (bounded by `replay_batches_max`), every request together.
    pub replies: usize,
    /// Batches it delivered that were applied.
    pub applied: u64,
    /// The first seq applied and the last (for the fill's log line).
    pub applied_seqs: Option<(u64, u64)>,
    /// Seqs of its range found missing so far.
    pub missing: u64,
    /// Requests sent again (bounded by `REPLAY_RETRIES_MAX`).
    pub retries: u32,
    /// `applied` and `replies` when the current request was sent.
    applied_at_request: u64,
    replies_at_request: usize,
    /// Live batches were dropped while it ran (the held queue was full).
    pub overflowed: bool,
    /// A gap's replay whose ring starts past the watermark (rolled past it,
    /// or another process's): what it sends before the gap's trigger waits
    /// here until the ring's copy of the trigger says whose it is.
    pub rolled: Option<Vec<Batch>>,
    /// Live batches up to this seq were dropped unjudged while it ran,
    /// newer maybe than its answer: if the answer ends before it, the ring
    /// is asked once more (a minimum, never an end: they may be a dead
    /// process's).
    pub reach: Option<u64>,
    /// A gap's replay that became a fill when its first answer started
    /// the stream: its outcome is counted as a replay's.
    pub from_replay: bool,
    /// A fill that reads the ring again after a fill no live batch
    /// followed: which of `LATE_JOIN_READS_MS` it is.
    pub late_read: Option<usize>,
}

impl Ask {
    pub(crate) fn new(conn: u32, verify: Option<Watermark>, to: Option<u64>, now: Instant) -> Ask {
        Ask {
            conn,
            from: verify.map_or(0, |w| w.seq),
            first: verify.map_or(0, |w| w.seq + 1),
            verify,
            to,
            started: now,
            last_reply: now,
            replies: 0,
            applied: 0,
            applied_seqs: None,
            missing: 0,
            retries: 0,
            applied_at_request: 0,
            replies_at_request: 0,
            overflowed: false,
            rolled: None,
            reach: None,
            from_replay: false,
            late_read: None,
        }
    }

    /// No reply came for `timeout` (since the request or the last reply).
    pub(crate) fn silent(&self, now: Instant, timeout: Duration) -> bool {
        now >= self.last_reply + timeout
    }

    /// Whether the current request delivered any batch yet.
    pub(crate) fn progressed(&self) -> bool {
        self.applied > self.applied_at_request
    }

    /// Whether anything at all answered the current request.
    pub(crate) fn answered(&self) -> bool {
        self.replies > self.replies_at_request
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
    /// Returns whether `seq` is the fill's bound now.
    pub(crate) fn bound_by_live(&mut self, seq: u64, last: Option<u64>) -> bool {
        if last.is_some_and(|last| seq <= last) || self.past_end(seq) {
            return false;
        }
        // A later, lower bound (a publisher stepping back) moves `to` down.
        self.to.replace(seq).is_none()
    }

    /// Notes a new request from the first missing seq: range, start and
    /// counts stay.
    pub(crate) fn retried(&mut self, now: Instant) {
        self.retries += 1;
        self.applied_at_request = self.applied;
        self.replies_at_request = self.replies;
        self.last_reply = now;
    }
}

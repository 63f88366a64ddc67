//! Live batches a stream holds while its ring is asked or the ready gate is
//! closed, in arrival order, each with the connection it came on. Bounded
//! per stream in batches (`held_batches_max`) and in bytes (a share of the
//! ingest budget, which every batch is charged to): past either, the
//! newest batch is dropped, which keeps the held run contiguous (the loss
//! shows up as a gap once the stream catches up). The batch that
//! showed a gap and the one that bounds a fill are kept past the limits:
//! the stream cannot go on without them, and there is one of each at most.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::super::decode::Batch;

/// What every stream holds, together: batches, as `/metrics` shows them.
#[derive(Debug, Default)]
pub(crate) struct HeldAccount {
    pub gauge: Arc<AtomicU64>,
}

/// One stream's held batches.
#[derive(Debug, Default)]
pub(crate) struct Held {
    queue: VecDeque<Batch>,
    /// Bytes of the batches held (as charged to the budget).
    bytes: usize,
    /// Batches are being dropped (a limit was reached); said once until the
    /// queue empties.
    pub dropping: bool,
    /// Since when live batches have waited behind a ring: set when a batch
    /// is held while the ring is asked, or the ring is asked while batches
    /// are held; None once the stream has caught up (`caught_up`: a batch
    /// taken out to be judged may be held again as a gap's trigger, and has
    /// waited all along). Batches held while the gate is closed only start
    /// waiting when a ring is asked for them.
    pub waiting_since: Option<Instant>,
    /// The newest seq dropped unjudged (for want of room, or of proof of
    /// its connection) since the stream last caught up: the ring is read
    /// past it once the held ones are judged.
    pub dropped_newest: Option<u64>,
}

/// Why a batch could not be held.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Full;

impl Held {
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The held batches, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Batch> {
        self.queue.iter()
    }

    /// Holds `batch` last, unless a limit is reached (`Full`: the caller
    /// drops it and counts it).
    pub(crate) fn push(
        &mut self,
        account: &HeldAccount,
        batch: Batch,
        (batches_max, bytes_max): (usize, usize),
    ) -> Result<(), Full> {
        if self.queue.len() >= batches_max || self.bytes + batch.charge.bytes() > bytes_max {
            return Err(Full);
        }
        self.push_unbounded(account, batch, false);
        Ok(())
    }

    /// Holds `batch` past the limits, first or last.
    pub(crate) fn push_unbounded(&mut self, account: &HeldAccount, batch: Batch, front: bool) {
        self.bytes += batch.charge.bytes();
        account.gauge.fetch_add(1, Ordering::Relaxed);
        if front {
            self.queue.push_front(batch);
        } else {
            self.queue.push_back(batch);
        }
    }

    /// Takes the oldest batch.
    pub(crate) fn pop(&mut self, account: &HeldAccount) -> Option<Batch> {
        let Some(batch) = self.queue.pop_front() else {
            self.dropping = false;
            return None;
        };
        self.bytes -= batch.charge.bytes();
        account.gauge.fetch_sub(1, Ordering::Relaxed);
        if self.queue.is_empty() {
            self.dropping = false;
        }
        Some(batch)
    }

    /// The stream judged everything held and asks nothing: no batch waits.
    pub(crate) fn caught_up(&mut self) {
        debug_assert!(self.queue.is_empty());
        self.waiting_since = None;
    }

    /// Drops every batch `keep` refuses; how many went.
    pub(crate) fn drop_unless(&mut self, account: &HeldAccount, keep: impl Fn(&Batch) -> bool) -> u64 {
        let before = self.queue.len();
        let mut dropped_bytes = 0;
        self.queue.retain(|b| {
            let kept = keep(b);
            if !kept {
                dropped_bytes += b.charge.bytes();
            }
            kept
        });
        let dropped = before - self.queue.len();
        self.bytes -= dropped_bytes;
        account.gauge.fetch_sub(dropped as u64, Ordering::Relaxed);
        if self.queue.is_empty() {
            self.dropping = false;
            self.waiting_since = None;
        }
        dropped as u64
    }

    /// Drops everything, and forgets what overflowed; how many went.
    pub(crate) fn clear(&mut self, account: &HeldAccount) -> u64 {
        self.dropped_newest = None;
        self.drop_unless(account, |_| false)
    }

    /// Notes a batch dropped unjudged.
    pub(crate) fn dropped_unjudged(&mut self, seq: u64) {
        self.dropped_newest = Some(self.dropped_newest.map_or(seq, |s| s.max(seq)));
    }
}

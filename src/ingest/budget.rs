//! One daemon-wide budget, in bytes, for engine batches received but not
//! yet applied: decoded batches a stream holds (behind a ring request, or
//! while the ready gate is closed), keeps from a ring until its trigger
//! proves it, or has handed to a shard that has yet to apply it. Each
//! decoded batch carries a `Charge` for its bytes, given back when the
//! batch is applied or dropped, wherever that happens, so the count cannot
//! drift.
//!
//! What happens at the budget keeps memory bounded without blocking an
//! engine (a PUB socket never blocks) and without losing anything silently:
//!
//! - A live batch that arrives with the budget spent is dropped before it
//!   is decoded (counted): its stream sees a gap at its next batch, which
//!   the engine's ring replays, or a resync when the ring no longer has it.
//! - One stream holds at most `HELD_SHARE` of the budget: one slow ring
//!   cannot take all of it from the others.
//! - A listener sends to the shards only while what they have queued is
//!   under half the budget; past it, it waits for them (and its sockets'
//!   receive queues, sized from the budget, fill; past those, the engine's
//!   PUB drops, and the loss is a gap as above).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Least time between two lines saying a listener thread dropped batches
/// at the budget.
pub(crate) const BUDGET_LOG_INTERVAL_MS: u64 = 10_000;

/// Most of the budget one stream's held batches may take: 1 / this.
pub(crate) const HELD_SHARE: usize = 16;

/// Typical bytes of one engine message (a batch of a few blocks), for
/// sizing the sockets' receive queues in messages from a budget in bytes.
pub(crate) const MESSAGE_BYTES_TYPICAL: usize = 2 << 10;

/// Fewest messages a SUB socket may queue unread, whatever the count.
pub(crate) const SUB_QUEUE_MIN: i32 = 16;

/// Messages each of `listeners` SUB sockets may queue unread: together a
/// quarter of the budget at typical sizes, within `SUB_QUEUE_MIN..=most`.
/// A socket opened while fewer listeners ran is shrunk as their number
/// grows (`Listener::fit_queue`): libzmq applies a lower high-water mark
/// to the connection's queue in place.
pub(crate) fn sub_queue_messages(budget_bytes: usize, listeners: usize, most: i32) -> i32 {
    let share = budget_bytes / 4 / MESSAGE_BYTES_TYPICAL / listeners.max(1);
    i32::try_from(share).unwrap_or(i32::MAX).clamp(SUB_QUEUE_MIN.min(most), most)
}

/// The daemon's budget and what is charged to it.
#[derive(Debug)]
pub(crate) struct Budget {
    bytes_max: usize,
    /// Bytes of every live charge.
    used: AtomicUsize,
    /// Of those, bytes handed to the shards and not yet applied.
    queued: AtomicUsize,
}

impl Budget {
    pub(crate) fn new(bytes_max: usize) -> Arc<Budget> {
        Arc::new(Budget { bytes_max, used: AtomicUsize::new(0), queued: AtomicUsize::new(0) })
    }

    pub(crate) fn bytes_max(&self) -> usize {
        self.bytes_max
    }

    /// Bytes charged now.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Whether `more` bytes would pass the budget.
    pub(crate) fn full(&self, more: usize) -> bool {
        self.used().saturating_add(more) > self.bytes_max
    }

    /// Whether the shards have half the budget queued: a sender waits.
    pub(crate) fn shards_behind(&self) -> bool {
        self.queued.load(Ordering::Relaxed) > self.bytes_max / 2
    }

    /// Charges `bytes` for a batch already in hand (whatever the budget
    /// says: what decides is `full`, before a batch is decoded).
    pub(crate) fn charge(self: &Arc<Budget>, bytes: usize) -> Charge {
        self.used.fetch_add(bytes, Ordering::Relaxed);
        Charge { budget: Some(Arc::clone(self)), bytes, queued: false }
    }
}

/// Bytes of one batch charged to the budget; given back when dropped.
#[derive(Debug, Default)]
pub(crate) struct Charge {
    budget: Option<Arc<Budget>>,
    bytes: usize,
    queued: bool,
}

impl Charge {
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The batch goes to a shard's queue: counted there until applied.
    pub(crate) fn queue(&mut self) {
        if let Some(b) = self.budget.as_ref().filter(|_| !self.queued) {
            b.queued.fetch_add(self.bytes, Ordering::Relaxed);
            self.queued = true;
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.used.fetch_sub(self.bytes, Ordering::Relaxed);
            if self.queued {
                b.queued.fetch_sub(self.bytes, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_is_given_back_wherever_its_batch_goes() {
        let budget = Budget::new(100);
        let a = budget.charge(60);
        assert!(!budget.full(40) && budget.full(41));
        let mut b = budget.charge(30);
        b.queue();
        b.queue();
        assert_eq!((budget.used(), budget.queued.load(Ordering::Relaxed)), (90, 30));
        drop(b);
        assert_eq!((budget.used(), budget.queued.load(Ordering::Relaxed)), (60, 0));
        drop(a);
        assert_eq!(budget.used(), 0);
        // A charge of no budget (tests) gives back nothing.
        drop(Charge::default());
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn sub_queues_share_a_quarter_of_the_budget() {
        // 128 MiB over 64 listeners: 256 messages of 2 KiB each.
        assert_eq!(sub_queue_messages(128 << 20, 64, 100_000), 256);
        assert_eq!(sub_queue_messages(128 << 20, 1_024, 100_000), 16);
        assert_eq!(sub_queue_messages(128 << 20, 4_096, 100_000), SUB_QUEUE_MIN, "never under the least");
        assert_eq!(sub_queue_messages(1 << 40, 1, 100_000), 100_000, "never over the configured most");
        assert_eq!(sub_queue_messages(128 << 20, 0, 10), 10);
    }

    #[test]
    fn senders_wait_once_the_shards_have_half_the_budget() {
        let budget = Budget::new(100);
        let mut c = budget.charge(51);
        assert!(!budget.shards_behind());
        c.queue();
        assert!(budget.shards_behind());
    }
}

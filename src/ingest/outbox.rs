//! How a listener thread reaches the shards, in the order it makes its
//! messages. Nothing is held back for a shard that could apply it: with one
//! listener thread and one shard the listener thread runs the shard itself
//! and handles each message at once. With shard threads, a message for a
//! shard asleep on its empty queue is sent at once (one wake-up); messages
//! for a shard that is busy are gathered and travel as one queue message
//! (`ShardMsg::Many`) when it is next seen asleep (checked at every send),
//! when `GATHERED_MAX` wait, or when the listener's round ends, whichever
//! comes first. So what a busy shard has queued, not a clock, decides how
//! much is gathered: a busy shard would not have looked sooner, and an idle
//! one waits at most for the listener to decode one more message.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam::channel::{Receiver, Sender};

use std::time::Duration;

use super::budget::Budget;
use super::shard::{send_blocking, shard_for, Shard, ShardMsg};
use crate::event::WorkerId;

/// Most messages a listener gathers for one busy shard before sending them.
const GATHERED_MAX: usize = 64;

/// A shard queue's length in messages that holds at most `batches` batches.
pub(crate) fn queue_len(batches: usize) -> usize {
    batches.div_ceil(GATHERED_MAX).max(1)
}

/// A listener thread's way to the shards.
pub(crate) enum Outbox {
    /// This thread runs the pipeline's one shard. Its queue carries only
    /// the API's messages, each followed by a ring of the thread's bell.
    Local { shard: Shard, api: Receiver<ShardMsg> },
    /// Shard threads, whether each is asleep on its empty queue (`run_shard`),
    /// and what this round gathered for each while it was busy.
    Queues {
        queues: Vec<Sender<ShardMsg>>,
        parked: Vec<Arc<AtomicBool>>,
        gathered: Vec<Vec<ShardMsg>>,
        shutdown: Arc<AtomicBool>,
        /// What the shards have queued counts in it: past half of it, a
        /// sender waits for them.
        budget: Arc<Budget>,
    },
}

impl Outbox {
    pub(crate) fn queues(
        queues: Vec<Sender<ShardMsg>>,
        parked: Vec<Arc<AtomicBool>>,
        shutdown: Arc<AtomicBool>,
        budget: Arc<Budget>,
    ) -> Outbox {
        debug_assert_eq!(queues.len(), parked.len());
        let gathered = queues.iter().map(|_| Vec::new()).collect();
        Outbox::Queues { queues, parked, gathered, shutdown, budget }
    }

    /// Hands `msg` to the shard that owns `worker`: handled now when this
    /// thread runs it; else sent now if that shard is asleep, gathered while
    /// it is busy (see the module doc). Whatever this thread gathered for a
    /// shard that has fallen asleep since goes too. False if the pipeline
    /// shut down first.
    pub(crate) fn send(&mut self, worker: WorkerId, msg: ShardMsg) -> bool {
        match self {
            Outbox::Local { shard, .. } => {
                shard.handle(msg);
                true
            }
            Outbox::Queues { queues, parked, gathered, shutdown, budget } => {
                gathered[shard_for(worker, queues.len())].push(msg);
                let mut sent = true;
                for ((queue, parked), msgs) in queues.iter().zip(parked.iter()).zip(gathered.iter_mut()) {
                    let due = msgs.len() >= GATHERED_MAX || (!msgs.is_empty() && parked.load(Ordering::Relaxed));
                    if due {
                        sent &= send_gathered(queue, msgs, shutdown, budget);
                    }
                }
                sent
            }
        }
    }

    /// Sends what this round gathered (before the thread sleeps or takes a
    /// control message); handles the API's messages to a shard it runs.
    pub(crate) fn flush(&mut self) {
        match self {
            Outbox::Local { shard, api } => {
                while let Ok(msg) = api.try_recv() {
                    shard.handle(msg);
                }
            }
            Outbox::Queues { queues, gathered, shutdown, budget, .. } => {
                for (queue, msgs) in queues.iter().zip(gathered) {
                    if !msgs.is_empty() {
                        send_gathered(queue, msgs, shutdown, budget);
                    }
                }
            }
        }
    }
}

fn send_gathered(queue: &Sender<ShardMsg>, msgs: &mut Vec<ShardMsg>, shutdown: &AtomicBool, budget: &Budget) -> bool {
    // The shards are behind by half the budget: wait for them, so what they
    // have queued stays bounded in bytes (the sockets' queues fill meanwhile,
    // then the engines' PUB sockets drop, and the loss is a gap). What is
    // gathered here counts only once sent: counted before, a gathering past
    // half the budget waited for itself, for ever.
    while budget.shards_behind() {
        if shutdown.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    for msg in msgs.iter_mut() {
        if let ShardMsg::Batch { charge, .. } = msg {
            charge.queue();
        }
    }
    let msg = match msgs.len() {
        1 => msgs.pop().unwrap_or(ShardMsg::Wake),
        _ => ShardMsg::Many(std::mem::take(msgs)),
    };
    send_blocking(queue, msg, shutdown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam::channel::bounded;

    fn busy() -> Arc<AtomicBool> {
        Arc::new(AtomicBool::new(false))
    }

    /// Two workers, one on each of two shards.
    fn workers_on_two_shards() -> (WorkerId, WorkerId) {
        let a = WorkerId::new(1, 0);
        let b = (2..).map(|i| WorkerId::new(i, 0)).find(|&w| shard_for(w, 2) != shard_for(a, 2)).unwrap();
        (a, b)
    }

    /// Which of `marks` a `Sync` message carries.
    fn mark_of(msg: &ShardMsg, marks: &[Sender<()>]) -> usize {
        let ShardMsg::Sync(done) = msg else { panic!("expected a Sync") };
        marks.iter().position(|m| m.same_channel(done)).expect("a known mark")
    }

    #[test]
    fn a_busy_shards_messages_travel_together() {
        let (tx, rx) = bounded(queue_len(4 * GATHERED_MAX));
        assert_eq!(queue_len(4 * GATHERED_MAX), 4);
        let mut outbox = Outbox::queues(vec![tx], vec![busy()], Arc::new(AtomicBool::new(false)), Budget::new(1 << 20));
        let worker = WorkerId::new(1, 0);
        let (done, acks) = bounded(2 * GATHERED_MAX);
        for _ in 0..3 {
            assert!(outbox.send(worker, ShardMsg::Sync(done.clone())));
        }
        assert!(rx.is_empty(), "nothing leaves for a busy shard before the flush");
        outbox.flush();
        let Ok(ShardMsg::Many(msgs)) = rx.try_recv() else { panic!("expected one message of three") };
        assert_eq!(msgs.len(), 3);
        outbox.send(worker, ShardMsg::Sync(done.clone()));
        outbox.flush();
        assert!(matches!(rx.try_recv(), Ok(ShardMsg::Sync(_))), "a lone message goes as itself");
        for _ in 0..GATHERED_MAX {
            outbox.send(worker, ShardMsg::Sync(done.clone()));
        }
        assert!(matches!(rx.try_recv(), Ok(ShardMsg::Many(m)) if m.len() == GATHERED_MAX), "a full gathering goes");
        outbox.flush();
        assert!(rx.is_empty());
        drop(acks);
    }

    #[test]
    fn a_shard_asleep_gets_each_message_at_once() {
        let (tx, rx) = bounded(queue_len(4 * GATHERED_MAX));
        let parked = Arc::new(AtomicBool::new(true));
        let mut outbox = Outbox::queues(vec![tx], vec![parked], Arc::new(AtomicBool::new(false)), Budget::new(1 << 20));
        let marks: Vec<Sender<()>> = (0..3).map(|_| bounded(1).0).collect();
        for (i, mark) in marks.iter().enumerate() {
            assert!(outbox.send(WorkerId::new(1, 0), ShardMsg::Sync(mark.clone())));
            let msg = rx.try_recv().expect("sent without waiting for more or for the round's end");
            assert_eq!(mark_of(&msg, &marks), i);
        }
        outbox.flush();
        assert!(rx.is_empty());
    }

    #[test]
    fn a_shard_that_falls_asleep_gets_what_was_gathered_in_order() {
        let (a, b) = workers_on_two_shards();
        let (sa, sb) = (shard_for(a, 2), shard_for(b, 2));
        let (queues, receivers): (Vec<_>, Vec<_>) = (0..2).map(|_| bounded(queue_len(256))).unzip();
        let parked = vec![busy(), busy()];
        let mut outbox = Outbox::queues(queues, parked.clone(), Arc::new(AtomicBool::new(false)), Budget::new(1 << 20));
        let marks: Vec<Sender<()>> = (0..4).map(|_| bounded(1).0).collect();
        // Shard b is busy: its two messages wait.
        outbox.send(b, ShardMsg::Sync(marks[0].clone()));
        outbox.send(b, ShardMsg::Sync(marks[1].clone()));
        assert!(receivers[sb].is_empty());
        // Shard a is asleep: its message goes at once, and b's still wait.
        parked[sa].store(true, Ordering::Relaxed);
        outbox.send(a, ShardMsg::Sync(marks[2].clone()));
        assert_eq!(mark_of(&receivers[sa].try_recv().unwrap(), &marks), 2);
        assert!(receivers[sb].is_empty());
        // Shard b falls asleep: the next send to anyone delivers its gathering, in order.
        parked[sb].store(true, Ordering::Relaxed);
        outbox.send(a, ShardMsg::Sync(marks[3].clone()));
        assert_eq!(mark_of(&receivers[sa].try_recv().unwrap(), &marks), 3);
        let Ok(ShardMsg::Many(msgs)) = receivers[sb].try_recv() else { panic!("expected b's two messages") };
        assert_eq!(msgs.iter().map(|m| mark_of(m, &marks)).collect::<Vec<_>>(), vec![0, 1]);
        outbox.flush();
        assert!(receivers.iter().all(|rx| rx.is_empty()));
    }
}

//! How a listener thread reaches the shards, in the order it makes its
//! messages. With shard threads, the messages one wake-up makes for one
//! shard travel as one queue message (`ShardMsg::Many`), so a shard wakes
//! once per listener wake-up, not once per batch. With one listener thread
//! and one shard, the listener thread runs the shard itself and handles
//! each message at once.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crossbeam::channel::{Receiver, Sender};

use super::shard::{send_blocking, shard_for, Shard, ShardMsg};
use crate::event::WorkerId;

/// Most messages one wake-up gathers for one shard before sending them.
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
    /// Shard threads, with what this wake-up gathered for each.
    Queues { queues: Vec<Sender<ShardMsg>>, gathered: Vec<Vec<ShardMsg>>, shutdown: Arc<AtomicBool> },
}

impl Outbox {
    pub(crate) fn queues(queues: Vec<Sender<ShardMsg>>, shutdown: Arc<AtomicBool>) -> Outbox {
        let gathered = queues.iter().map(|_| Vec::new()).collect();
        Outbox::Queues { queues, gathered, shutdown }
    }

    /// Hands `msg` to the shard that owns `worker`: handled now when this
    /// thread runs it, else gathered until `flush` (or sent, blocking while
    /// the queue is full, once `GATHERED_MAX` wait). False if the pipeline
    /// shut down first.
    pub(crate) fn send(&mut self, worker: WorkerId, msg: ShardMsg) -> bool {
        match self {
            Outbox::Local { shard, .. } => {
                shard.handle(msg);
                true
            }
            Outbox::Queues { queues, gathered, shutdown } => {
                let i = shard_for(worker, queues.len());
                gathered[i].push(msg);
                gathered[i].len() < GATHERED_MAX || send_gathered(&queues[i], &mut gathered[i], shutdown)
            }
        }
    }

    /// Sends what this wake-up gathered (before the thread sleeps or takes
    /// a control message); handles the API's messages to a shard it runs.
    pub(crate) fn flush(&mut self) {
        match self {
            Outbox::Local { shard, api } => {
                while let Ok(msg) = api.try_recv() {
                    shard.handle(msg);
                }
            }
            Outbox::Queues { queues, gathered, shutdown } => {
                for (queue, msgs) in queues.iter().zip(gathered) {
                    if !msgs.is_empty() {
                        send_gathered(queue, msgs, shutdown);
                    }
                }
            }
        }
    }
}

fn send_gathered(queue: &Sender<ShardMsg>, msgs: &mut Vec<ShardMsg>, shutdown: &AtomicBool) -> bool {
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

    #[test]
    fn a_wake_ups_messages_for_one_shard_travel_together() {
        let (tx, rx) = bounded(queue_len(4 * GATHERED_MAX));
        assert_eq!(queue_len(4 * GATHERED_MAX), 4);
        let mut outbox = Outbox::queues(vec![tx], Arc::new(AtomicBool::new(false)));
        let worker = WorkerId::new(1, 0);
        let (done, acks) = bounded(2 * GATHERED_MAX);
        for _ in 0..3 {
            assert!(outbox.send(worker, ShardMsg::Sync(done.clone())));
        }
        assert!(rx.is_empty(), "nothing leaves before the flush");
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
}

//! Whether a listener's publisher is reachable, and when its workers are to
//! be cleared if it stays away (`IngestConfig::engine_gone_ms`): per
//! listener a `Reach`, per listener thread the `Deadlines` heap its loop
//! waits on. A listener is unreachable from its start until its first ZMQ
//! handshake and from a dropped connection until the next handshake (a host
//! gone without a reset drops the connection once TCP keepalive gives up).
//! Its deadline is queued once; an entry whose listener came back, or whose
//! deadline moved (back and gone again meanwhile), is dropped or queued
//! again when it comes up, so the heap holds at most one entry a listener
//! (a removed listener's goes with it) and a thread whose publishers are
//! all reachable waits without a timeout.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

/// One listener's reachability and `engine_gone_ms` deadline.
#[derive(Debug)]
pub(crate) struct Reach {
    /// As the connection last said.
    up: bool,
    /// When the workers are cleared unless the publisher is back by then;
    /// None while reachable, and once cleared.
    gone_at: Option<Instant>,
    /// `gone_at` has an entry in the thread's `Deadlines`.
    queued: bool,
}

/// What a due entry of `Deadlines` means for its listener.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Due {
    /// Unreachable all along: clear its workers (once for this outage).
    Gone,
    /// Back and lost again since: its later deadline is to be queued.
    Moved,
    /// Reachable now: nothing to do.
    Back,
}

impl Reach {
    /// A new listener, unreachable until its first handshake: with
    /// `gone_after`, a publisher that never answers is gone as much as one
    /// that stopped answering.
    pub(crate) fn new(gone_after: Option<Duration>, now: Instant) -> Reach {
        Reach { up: false, gone_at: gone_after.map(|after| now + after), queued: false }
    }

    /// The connection after a read of its monitor: `up` now, and whether a
    /// handshake succeeded within the read (it may have dropped again since).
    pub(crate) fn note(&mut self, up: bool, came_up: bool, gone_after: Option<Duration>, now: Instant) {
        let went_down = !up && (self.up || came_up);
        self.up = up;
        if up {
            self.gone_at = None;
        } else if went_down {
            self.gone_at = gone_after.map(|after| now + after);
        }
    }

    /// Whether this outage's deadline passed with the publisher still away
    /// (its workers were cleared, and it has not been reachable since).
    #[cfg(test)]
    fn gone(&self) -> bool {
        !self.up && self.gone_at.is_none()
    }

    /// Its entry came up at `now`.
    fn popped(&mut self, now: Instant) -> Due {
        self.queued = false;
        match self.gone_at {
            Some(at) if at <= now => {
                self.gone_at = None;
                Due::Gone
            }
            Some(_) => Due::Moved,
            None => Due::Back,
        }
    }
}

/// One listener thread's deadlines, earliest first, by listener id.
#[derive(Default)]
pub(crate) struct Deadlines(BinaryHeap<Reverse<(Instant, u64)>>);

impl Deadlines {
    /// Queues listener `id`'s deadline, if it has one not queued yet.
    pub(crate) fn arm(&mut self, id: u64, reach: &mut Reach) {
        if let Some(at) = reach.gone_at.filter(|_| !reach.queued) {
            self.0.push(Reverse((at, id)));
            reach.queued = true;
        }
    }

    /// `timeout_ms` as epoll takes it (-1: none, 0: do not wait), shortened
    /// to the earliest deadline, rounded up so a wait never ends short of it.
    pub(crate) fn bound(&self, timeout_ms: i32, now: Instant) -> i32 {
        let Some(Reverse((at, _))) = self.0.peek() else {
            return timeout_ms;
        };
        let micros = at.saturating_duration_since(now).as_micros();
        let until = i32::try_from(micros.div_ceil(1_000)).unwrap_or(i32::MAX);
        if timeout_ms < 0 {
            until
        } else {
            timeout_ms.min(until)
        }
    }

    /// Drops removed listener `id`'s entry: ids are never reused, and an
    /// entry left until due would pile up with register/unregister churn
    /// for as long as `engine_gone_ms`.
    pub(crate) fn remove(&mut self, id: u64) {
        self.0.retain(|&Reverse((_, of))| of != id);
    }

    /// Takes the earliest entry due at `now`, if any: its listener id.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<u64> {
        let Reverse((at, id)) = *self.0.peek()?;
        (at <= now).then(|| {
            self.0.pop();
            id
        })
    }

    /// What the entry `pop_due` gave means for `reach`, its listener's
    /// (queued again if its deadline moved).
    pub(crate) fn settle(&mut self, id: u64, reach: &mut Reach, now: Instant) -> Due {
        let due = reach.popped(now);
        if due == Due::Moved {
            self.arm(id, reach);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Option<Duration> = Some(Duration::from_secs(60));

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// Pops everything due at `now`, settling it; what each entry meant.
    fn expire(d: &mut Deadlines, reach: &mut Reach, now: Instant) -> Vec<Due> {
        let mut out = Vec::new();
        while let Some(id) = d.pop_due(now) {
            out.push(d.settle(id, reach, now));
        }
        out
    }

    #[test]
    fn a_publisher_that_never_answers_is_gone_after_the_deadline_once() {
        let t0 = Instant::now();
        let (mut d, mut r) = (Deadlines::default(), Reach::new(AFTER, t0));
        d.arm(1, &mut r);
        d.arm(1, &mut r);
        assert_eq!(d.0.len(), 1, "queued once");
        assert!(expire(&mut d, &mut r, t0 + secs(59)).is_empty());
        assert_eq!(expire(&mut d, &mut r, t0 + secs(60)), vec![Due::Gone]);
        assert!(r.gone());
        // Still down: nothing more, and no timeout left to wait for.
        r.note(false, false, AFTER, t0 + secs(61));
        d.arm(1, &mut r);
        assert!(d.0.is_empty());
        assert_eq!(d.bound(-1, t0 + secs(61)), -1);
    }

    #[test]
    fn a_publisher_back_before_the_deadline_is_not_gone() {
        let t0 = Instant::now();
        let (mut d, mut r) = (Deadlines::default(), Reach::new(AFTER, t0));
        d.arm(1, &mut r);
        r.note(true, true, AFTER, t0 + secs(1));
        assert!(r.up && !r.gone());
        assert_eq!(expire(&mut d, &mut r, t0 + secs(60)), vec![Due::Back]);
        assert!(d.0.is_empty());
    }

    #[test]
    fn an_outage_after_a_return_counts_from_the_new_drop() {
        let t0 = Instant::now();
        let (mut d, mut r) = (Deadlines::default(), Reach::new(AFTER, t0));
        d.arm(1, &mut r);
        r.note(true, true, AFTER, t0 + secs(1));
        r.note(false, false, AFTER, t0 + secs(30));
        d.arm(1, &mut r);
        assert_eq!(d.0.len(), 1, "the old entry stands for the new deadline");
        assert_eq!(expire(&mut d, &mut r, t0 + secs(60)), vec![Due::Moved]);
        assert_eq!(d.bound(-1, t0 + secs(60)), 30_000);
        assert_eq!(expire(&mut d, &mut r, t0 + secs(90)), vec![Due::Gone]);
    }

    #[test]
    fn a_handshake_that_dropped_within_one_read_restarts_the_clock() {
        let t0 = Instant::now();
        let mut r = Reach::new(AFTER, t0);
        r.note(false, true, AFTER, t0 + secs(50));
        assert_eq!(r.gone_at, Some(t0 + secs(110)));
        // Retries while down move nothing.
        r.note(false, false, AFTER, t0 + secs(55));
        assert_eq!(r.gone_at, Some(t0 + secs(110)));
    }

    #[test]
    fn without_engine_gone_nothing_is_queued() {
        let t0 = Instant::now();
        let (mut d, mut r) = (Deadlines::default(), Reach::new(None, t0));
        d.arm(1, &mut r);
        r.note(true, true, None, t0);
        r.note(false, false, None, t0);
        d.arm(1, &mut r);
        assert!(d.0.is_empty());
        assert_eq!(d.bound(0, t0), 0);
    }

    #[test]
    fn a_removed_listeners_entry_goes_with_it() {
        let t0 = Instant::now();
        let mut d = Deadlines::default();
        for id in 1..=3 {
            d.arm(id, &mut Reach::new(AFTER, t0));
        }
        d.remove(2);
        assert_eq!(d.0.len(), 2);
        d.remove(9);
        assert_eq!(d.0.len(), 2);
        assert_eq!(d.pop_due(t0 + secs(60)), Some(1));
        assert_eq!(d.pop_due(t0 + secs(60)), Some(3));
        assert_eq!(d.pop_due(t0 + secs(60)), None);
    }

    #[test]
    fn the_wait_is_bounded_by_the_earliest_deadline_rounded_up() {
        let t0 = Instant::now();
        let mut d = Deadlines::default();
        for (id, ms) in [(1, 900), (2, 250)] {
            let mut r = Reach::new(Some(Duration::from_micros(ms * 1_000 + 1)), t0);
            d.arm(id, &mut r);
        }
        assert_eq!(d.bound(-1, t0), 251);
        assert_eq!(d.bound(10, t0), 10);
        assert_eq!(d.bound(0, t0), 0);
        assert_eq!(d.pop_due(t0 + secs(1)), Some(2));
        assert_eq!(d.pop_due(t0 + secs(1)), Some(1));
        assert_eq!(d.pop_due(t0 + secs(1)), None);
    }
}

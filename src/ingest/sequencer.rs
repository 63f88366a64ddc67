//! The per-listener sequence watermark: judges each batch's `seq` against
//! the last one accepted and says what to do. Pure state, no sockets, so the
//! rules in the module doc of `ingest` are tested here directly.
//!
//! A publisher numbers its batches from 0, one counter per process. The
//! sequencer keeps `last`, the highest seq whose content has been dealt with
//! (applied, or given up as lost), and whether the socket reconnected since.
//! A ring fill may apply batches before the live stream delivers them: the
//! seqs it applied ahead stay marked (`filled`) until the live stream has
//! delivered or passed them, so their live copies are duplicates, not a
//! restart at seq 0.
//!
//! Beside `last` it keeps a digest of batch `last`'s payload, when known:
//! a ring asked from `last` after a reconnect answers with the same batch
//! only if it is the same process (a new one that published past `last`
//! has a batch `last` too, with other content).

/// A listener key's watermark: the highest seq dealt with, and the digest
/// of that batch's payload (None when it was given up as lost, or saved by
/// a build that kept none).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Watermark {
    pub seq: u64,
    pub digest: Option<u64>,
}

/// What the listener must do with a batch, given its seq.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The next batch in order: apply it, then `accept` it.
    Apply,
    /// Already dealt with: drop it.
    Duplicate,
    /// The publisher restarted: clear its workers, `reset`, then judge the
    /// batch again (it is then the first batch of a new stream).
    Restart,
    /// Batches `from..to` are missing before this one. `fresh` says nothing
    /// was accepted yet on this stream (the listener joined mid-stream), so
    /// the worker holds nothing the missing batches could have changed.
    Gap { from: u64, to: u64, fresh: bool },
    /// Batches are missing before this one and the connection dropped and
    /// came back since the last accepted batch: a new process whose first
    /// batches were lost before we reconnected looks just like the old one
    /// after a lost connection. Clear the workers, `reset`, then judge the
    /// batch again (it then starts a new stream, replayed from 0).
    Rejoin,
}

/// Seq watermark of one listener key.
#[derive(Clone, Debug)]
pub(crate) struct Sequencer {
    last: Option<u64>,
    /// Digest of batch `last`'s payload, if known.
    digest: Option<u64>,
    /// A new connection was made since the last accepted batch. A publisher
    /// never resends delivered messages on a new connection, so a seq at or
    /// below the watermark that arrives on one comes from a new process.
    reconnected: bool,
    /// The live connection dropped and came back since the last accepted
    /// batch (unlike `reconnected`, not set by a kept or seeded watermark:
    /// with a replay endpoint, its first ring fill tells whether the stream
    /// is the same (`confirm`); without one, a gap is a resync either way).
    rejoined: bool,
    /// A drop of at least this many below the watermark is a restart even
    /// without a reconnect, in case the reconnect went unnoticed.
    restart_seq_drop_min: u64,
    /// Seqs `lo..=hi` a ring fill applied on this connection that the live
    /// stream may still deliver (a publisher sends a batch live and keeps it
    /// in its ring): such a copy is a duplicate whatever its seq. The live
    /// stream comes in order, so each copy moves `lo` past it; the window
    /// ends with its last copy, a live batch applied past `hi`, a reconnect
    /// or a reset.
    filled: Option<(u64, u64)>,
}

impl Sequencer {
    /// A sequencer resuming from `last` (kept across unregister/register,
    /// or seeded from a snapshot).
    pub(crate) fn new(last: Option<Watermark>, restart_seq_drop_min: u64) -> Self {
        Self {
            last: last.map(|w| w.seq),
            digest: last.and_then(|w| w.digest),
            // A new listener is a new connection: anything at or below a
            // watermark kept from an earlier registration is a new process.
            reconnected: last.is_some(),
            rejoined: false,
            restart_seq_drop_min: restart_seq_drop_min.max(1),
            filled: None,
        }
    }

    /// The highest seq dealt with, if any.
    pub(crate) fn last(&self) -> Option<u64> {
        self.last
    }

    /// The watermark with its digest, if any.
    pub(crate) fn watermark(&self) -> Option<Watermark> {
        self.last.map(|seq| Watermark { seq, digest: self.digest })
    }

    /// The publisher answered with batch `last` as we applied it: the same
    /// stream, whatever the reconnect suggested.
    pub(crate) fn confirm(&mut self) {
        self.reconnected = false;
        self.rejoined = false;
    }

    /// Judges a live batch.
    pub(crate) fn judge_live(&self, seq: u64) -> Verdict {
        let Some(last) = self.last else {
            return if seq == 0 { Verdict::Apply } else { Verdict::Gap { from: 0, to: seq, fresh: true } };
        };
        if seq <= last {
            let drop = last - seq;
            if seq == 0 || self.reconnected || drop >= self.restart_seq_drop_min {
                return Verdict::Restart;
            }
            return Verdict::Duplicate;
        }
        if seq == last + 1 {
            Verdict::Apply
        } else if self.rejoined {
            Verdict::Rejoin
        } else {
            Verdict::Gap { from: last + 1, to: seq, fresh: false }
        }
    }

    /// Judges a batch replayed from the publisher's buffer. Replies come
    /// from the buffer of the process we are replaying from, so a seq at or
    /// below the watermark is a duplicate, never a restart.
    pub(crate) fn judge_replayed(&self, seq: u64) -> Verdict {
        match self.last {
            Some(last) if seq <= last => Verdict::Duplicate,
            Some(last) if seq > last + 1 => Verdict::Gap { from: last + 1, to: seq, fresh: false },
            _ => self.judge_live(seq),
        }
    }

    /// Marks `seq` as dealt with: applied (`digest` of its payload), or
    /// given up as lost (None).
    pub(crate) fn accept(&mut self, seq: u64, digest: Option<u64>) {
        debug_assert!(self.last.is_none_or(|last| seq > last), "watermark must only move forward");
        self.last = Some(seq);
        self.digest = digest;
        self.reconnected = false;
        self.rejoined = false;
    }

    /// Whether `seq` lies among the live copies a fill left owed.
    pub(crate) fn covers_filled(&self, seq: u64) -> bool {
        self.filled.is_some_and(|(lo, hi)| (lo..=hi).contains(&seq))
    }

    /// Whether live batch `seq` is a copy of one a fill applied (drop it);
    /// the copies still owed are then those after it.
    pub(crate) fn take_filled_copy(&mut self, seq: u64) -> bool {
        let Some((lo, hi)) = self.filled.filter(|&(lo, hi)| (lo..=hi).contains(&seq)) else {
            return false;
        };
        debug_assert!(lo <= seq);
        self.filled = (seq < hi).then_some((seq + 1, hi));
        true
    }

    /// `accept` for a live batch: past what a fill applied ahead, the live
    /// stream owes no more copies.
    pub(crate) fn accept_live(&mut self, seq: u64, digest: u64) {
        if self.filled.is_some_and(|(_, hi)| seq > hi) {
            self.filled = None;
        }
        self.accept(seq, Some(digest));
    }

    /// `accept` for a batch a ring fill asked from `from` applied.
    pub(crate) fn accept_filled(&mut self, from: u64, seq: u64, digest: u64) {
        self.accept(seq, Some(digest));
        let lo = self.filled.map_or(from, |(lo, _)| lo);
        self.filled = Some((lo, seq));
    }

    /// Forgets the watermark: the next batch starts a new stream.
    pub(crate) fn reset(&mut self) {
        self.last = None;
        self.digest = None;
        self.reconnected = false;
        self.rejoined = false;
        self.filled = None;
    }

    /// Notes that the socket (re)connected to the publisher.
    pub(crate) fn note_connected(&mut self) {
        // A new connection owes no copies of what a fill applied on the old one.
        self.filled = None;
        if self.last.is_some() {
            self.reconnected = true;
            self.rejoined = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: u64 = 100;

    fn at(last: u64) -> Sequencer {
        let mut s = Sequencer::new(None, WINDOW);
        s.accept(last, None);
        s
    }

    #[test]
    fn in_order_batches_apply() {
        let mut s = Sequencer::new(None, WINDOW);
        assert_eq!(s.judge_live(0), Verdict::Apply);
        s.accept(0, None);
        assert_eq!(s.judge_live(1), Verdict::Apply);
        s.accept(1, None);
        assert_eq!(s.last(), Some(1));
    }

    #[test]
    fn first_batch_after_zero_is_a_fresh_gap() {
        let s = Sequencer::new(None, WINDOW);
        assert_eq!(s.judge_live(7), Verdict::Gap { from: 0, to: 7, fresh: true });
    }

    #[test]
    fn skipped_seqs_are_a_gap() {
        let s = at(10);
        assert_eq!(s.judge_live(14), Verdict::Gap { from: 11, to: 14, fresh: false });
    }

    #[test]
    fn a_small_step_back_on_the_same_connection_is_a_duplicate() {
        let s = at(10);
        assert_eq!(s.judge_live(10), Verdict::Duplicate);
        assert_eq!(s.judge_live(3), Verdict::Duplicate);
    }

    #[test]
    fn seq_zero_below_the_watermark_is_a_restart() {
        assert_eq!(at(10).judge_live(0), Verdict::Restart);
        assert_eq!(at(0).judge_live(0), Verdict::Restart);
    }

    #[test]
    fn a_large_drop_is_a_restart() {
        let s = at(1000);
        assert_eq!(s.judge_live(1000 - WINDOW), Verdict::Restart);
        assert_eq!(s.judge_live(1000 - WINDOW + 1), Verdict::Duplicate);
    }

    #[test]
    fn any_step_back_after_a_reconnect_is_a_restart() {
        let mut s = at(10);
        s.note_connected();
        assert_eq!(s.judge_live(9), Verdict::Restart);
        // A batch that continues the stream clears the suspicion.
        assert_eq!(s.judge_live(11), Verdict::Apply);
        s.accept(11, None);
        assert_eq!(s.judge_live(9), Verdict::Duplicate);
    }

    #[test]
    fn a_kept_watermark_treats_a_step_back_as_a_restart() {
        let s = Sequencer::new(Some(Watermark { seq: 50, digest: None }), WINDOW);
        assert_eq!(s.judge_live(49), Verdict::Restart);
        assert_eq!(s.judge_live(51), Verdict::Apply);
        // Nothing the old stream wrote is held any more: a gap is replayed.
        assert_eq!(s.judge_live(53), Verdict::Gap { from: 51, to: 53, fresh: false });
    }

    #[test]
    fn a_gap_across_a_reconnect_is_a_rejoin() {
        let mut s = at(10);
        s.note_connected();
        assert_eq!(s.judge_live(14), Verdict::Rejoin);
        // The next batch in order may well be the old process after a blip.
        assert_eq!(s.judge_live(11), Verdict::Apply);
        s.accept(11, None);
        assert_eq!(s.judge_live(14), Verdict::Gap { from: 12, to: 14, fresh: false });
        // Replies come from one process's buffer: a hole in them is a gap.
        s.note_connected();
        assert_eq!(s.judge_replayed(14), Verdict::Gap { from: 12, to: 14, fresh: false });
    }

    #[test]
    fn the_watermark_keeps_the_digest_of_the_batch_applied_last() {
        let mut s = Sequencer::new(Some(Watermark { seq: 3, digest: Some(7) }), WINDOW);
        assert_eq!(s.watermark(), Some(Watermark { seq: 3, digest: Some(7) }));
        s.accept_live(4, 9);
        assert_eq!(s.watermark(), Some(Watermark { seq: 4, digest: Some(9) }));
        // Given up as lost: what batch 6 held is unknown.
        s.accept(6, None);
        assert_eq!(s.watermark(), Some(Watermark { seq: 6, digest: None }));
        s.reset();
        assert_eq!(s.watermark(), None);
    }

    #[test]
    fn a_confirmed_stream_is_judged_as_if_never_reconnected() {
        let mut s = at(10);
        s.note_connected();
        assert_eq!(s.judge_live(14), Verdict::Rejoin);
        s.confirm();
        assert_eq!(s.judge_live(14), Verdict::Gap { from: 11, to: 14, fresh: false });
        assert_eq!(s.judge_live(9), Verdict::Duplicate);
    }

    #[test]
    fn reset_starts_a_new_stream() {
        let mut s = at(10);
        s.reset();
        assert_eq!(s.judge_live(0), Verdict::Apply);
        assert_eq!(s.judge_live(2), Verdict::Gap { from: 0, to: 2, fresh: true });
    }

    #[test]
    fn replayed_step_back_is_never_a_restart() {
        let mut s = at(10);
        s.note_connected();
        assert_eq!(s.judge_replayed(0), Verdict::Duplicate);
        assert_eq!(s.judge_replayed(10), Verdict::Duplicate);
        assert_eq!(s.judge_replayed(11), Verdict::Apply);
    }

    #[test]
    fn live_copies_of_what_a_fill_applied_are_duplicates_even_at_seq_zero() {
        let mut s = Sequencer::new(None, 1);
        for seq in 0..=5 {
            assert_eq!(s.judge_replayed(seq), Verdict::Apply);
            s.accept_filled(0, seq, seq);
        }
        // Every drop is past `restart_seq_drop_min` here, and seq 0 is a
        // restart anywhere else: the fill's window says otherwise.
        assert_eq!(s.judge_live(0), Verdict::Restart);
        for seq in [0, 3] {
            assert!(s.take_filled_copy(seq), "{seq}");
        }
        // The live stream comes in order: after 3, a 0 is no copy.
        assert!(!s.take_filled_copy(0));
        assert_eq!(s.judge_live(6), Verdict::Apply);
        s.accept_live(6, 6);
        // The live stream passed the window: a step back to 5 is a restart again.
        assert!(!s.take_filled_copy(5));
        assert_eq!(s.judge_live(5), Verdict::Restart);
    }

    #[test]
    fn the_last_copy_ends_the_fill_window() {
        let mut s = Sequencer::new(None, WINDOW);
        (0..=2).for_each(|seq| s.accept_filled(0, seq, seq));
        assert!(s.covers_filled(0) && s.covers_filled(2) && !s.covers_filled(3));
        assert!(s.take_filled_copy(2));
        assert!(!s.covers_filled(0));
        // The engine restarted on the same connection: seq 0 again.
        assert!(!s.take_filled_copy(0));
        assert_eq!(s.judge_live(0), Verdict::Restart);
    }

    #[test]
    fn a_fill_from_a_kept_watermark_marks_only_what_it_applied() {
        let mut s = Sequencer::new(Some(Watermark { seq: 9, digest: None }), WINDOW);
        assert_eq!(s.judge_replayed(10), Verdict::Apply);
        s.accept_filled(10, 10, 10);
        s.accept_filled(10, 11, 11);
        // Below the fill: the kept watermark's rules (a new connection).
        assert!(!s.take_filled_copy(9));
        assert_eq!(s.judge_live(9), Verdict::Duplicate);
        assert_eq!(s.judge_live(0), Verdict::Restart);
        assert!(s.take_filled_copy(10));
    }

    #[test]
    fn a_reconnect_or_a_reset_ends_the_fill_window() {
        let mut s = Sequencer::new(None, WINDOW);
        s.accept_filled(0, 0, 0);
        s.accept_filled(0, 1, 1);
        s.note_connected();
        assert!(!s.take_filled_copy(0));
        assert_eq!(s.judge_live(0), Verdict::Restart);
        s.accept_filled(2, 2, 2);
        s.reset();
        assert!(!s.take_filled_copy(2));
        assert_eq!(s.judge_live(0), Verdict::Apply);
    }

    #[test]
    fn seq_near_the_top_does_not_overflow() {
        let s = at(u64::MAX - 1);
        assert_eq!(s.judge_live(u64::MAX), Verdict::Apply);
    }
}

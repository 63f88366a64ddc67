//! The per-listener sequence watermark: judges each batch's `seq` against
//! the last one accepted and says what to do. Pure state, no sockets, so the
//! rules in the module doc of `ingest` are tested here directly.
//!
//! A publisher numbers its batches from 0, one counter per process. The
//! sequencer keeps `last`, the highest seq whose content has been dealt with
//! (applied, or given up as lost). Which process a batch comes from is the
//! stream's business (`stream`): it tells the sequencer whether the batch
//! came on a connection known to reach the process that made `last`
//! ([`Origin::Same`]) or on one not known to ([`Origin::New`]), and the
//! rules differ. A ring fill may apply batches before the live stream
//! delivers them: the seqs it applied ahead stay marked (`filled`, with the
//! connection they are owed on) until the live stream has delivered or
//! passed them, so their live copies are duplicates, not a restart at seq 0.
//!
//! Beside `last` it keeps a digest of batch `last`'s payload, when known:
//! a ring asked from `last` answers with the same batch only if it is the
//! same process (a new one that published past `last` has a batch `last`
//! too, with other content).

use std::collections::VecDeque;

/// A listener key's watermark: the highest seq dealt with, and the digest
/// of that batch's payload (None when it was given up as lost, or saved by
/// a build that kept none).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Watermark {
    pub seq: u64,
    pub digest: Option<u64>,
}

/// Batches dealt with lately whose digests are kept, to tell a duplicate
/// from another process's batch of the same seq.
pub(crate) const RECENT_BATCHES: usize = 64;

/// How a batch's connection relates to the process that made `last`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A connection to the same process: a step back is a duplicate only
    /// if it repeats, byte for byte, one of the `RECENT_BATCHES` batches
    /// dealt with last; any other is a restart (a proxy between us and the
    /// engine can keep our connection up across one). A forward jump is a
    /// gap of that process.
    Same,
    /// A connection not known to reach that process (a reconnect nothing
    /// verified, or a watermark kept from an earlier registration or a
    /// snapshot). A publisher never resends on a new connection what it
    /// delivered on an old one, so any step back is a restart. With
    /// `rejoin`, a forward jump is one too: a new process whose first
    /// batches were lost looks like the old one after a lost connection.
    /// Without it (a kept watermark, which no lost connection preceded),
    /// a jump is a gap.
    New { rejoin: bool },
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
    /// Batches are missing before this one and it came on a connection not
    /// known to reach the process of `last`, after a lost connection (see
    /// `Origin::New`): clear the workers, `reset`, then judge the batch
    /// again (it then starts a new stream, replayed from 0).
    Rejoin,
}

/// Seqs a ring fill applied ahead of the live stream on one connection.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Filled {
    lo: u64,
    hi: u64,
    conn: u32,
    /// Digests of the newest of them (at most `FILLED_DIGESTS_MAX`), up to
    /// `hi`: a live copy among these must match byte for byte.
    digests: VecDeque<u64>,
}

/// Digests a fill window keeps (8 bytes each, only while the window is
/// open): far more than the live batches in flight behind a fill.
const FILLED_DIGESTS_MAX: usize = 1024;

impl Filled {
    /// The digest the fill applied at `seq`, if kept.
    fn digest(&self, seq: u64) -> Option<u64> {
        let first = self.hi.wrapping_add(1).wrapping_sub(self.digests.len() as u64);
        let i = seq.checked_sub(first)?;
        self.digests.get(usize::try_from(i).ok()?).copied()
    }
}

/// Seq watermark of one listener key.
#[derive(Clone, Debug)]
pub(crate) struct Sequencer {
    last: Option<u64>,
    /// Digest of batch `last`'s payload, if known.
    digest: Option<u64>,
    /// The newest batch dealt with whose digest is known (usually `last`;
    /// older when the batches after it were given up as lost): what a ring
    /// is checked against.
    anchor: Option<Watermark>,
    /// (seq + 1, digest) of the batches dealt with lately whose digest is
    /// known, at seq modulo `RECENT_BATCHES` (0: none there).
    recent: Box<[(u64, u64); RECENT_BATCHES]>,
    /// Seqs `lo..=hi` a ring fill applied that the live stream of
    /// connection `conn` may still deliver (a publisher sends a batch live
    /// and keeps it in its ring): such a copy is a duplicate whatever its
    /// seq, if it matches what the fill applied (as far as its digest is
    /// kept). Each copy moves `lo` to `RECENT_BATCHES` below it (the live
    /// rule's reach for a late copy); the window ends with the copy of
    /// `hi`, a live batch applied past `hi`, or a reset. Another connection
    /// owes no copies.
    filled: Option<Filled>,
}

impl Sequencer {
    /// A sequencer resuming from `last` (kept across unregister/register,
    /// or seeded from a snapshot).
    pub(crate) fn new(last: Option<Watermark>) -> Self {
        let mut s = Self {
            last: last.map(|w| w.seq),
            digest: last.and_then(|w| w.digest),
            anchor: last.filter(|w| w.digest.is_some()),
            recent: Box::new([(0, 0); RECENT_BATCHES]),
            filled: None,
        };
        if let Some(Watermark { seq, digest: Some(d) }) = last {
            s.remember(seq, d);
        }
        s
    }

    fn remember(&mut self, seq: u64, digest: u64) {
        self.recent[(seq % RECENT_BATCHES as u64) as usize] = (seq.wrapping_add(1), digest);
    }

    /// Whether batch `seq` with `digest` is one dealt with lately.
    fn dealt_with(&self, seq: u64, digest: u64) -> bool {
        self.recent[(seq % RECENT_BATCHES as u64) as usize] == (seq.wrapping_add(1), digest)
    }

    /// The highest seq dealt with, if any.
    pub(crate) fn last(&self) -> Option<u64> {
        self.last
    }

    /// The watermark with its digest, if any.
    pub(crate) fn watermark(&self) -> Option<Watermark> {
        self.last.map(|seq| Watermark { seq, digest: self.digest })
    }

    /// The newest batch dealt with whose digest is known (its digest is
    /// Some): a ring's answer from there tells whether it is the same
    /// process. None when no batch since the last reset had one.
    pub(crate) fn anchor(&self) -> Option<Watermark> {
        self.anchor
    }

    /// Judges a live batch, with its payload's digest, that came as
    /// `origin` says.
    pub(crate) fn judge_live(&self, seq: u64, origin: Origin, digest: u64) -> Verdict {
        let Some(last) = self.last else {
            return if seq == 0 { Verdict::Apply } else { Verdict::Gap { from: 0, to: seq, fresh: true } };
        };
        if seq <= last {
            if origin == Origin::Same && self.dealt_with(seq, digest) {
                return Verdict::Duplicate;
            }
            return Verdict::Restart;
        }
        if seq == last + 1 {
            Verdict::Apply
        } else if origin == (Origin::New { rejoin: true }) {
            Verdict::Rejoin
        } else {
            Verdict::Gap { from: last + 1, to: seq, fresh: false }
        }
    }

    /// Judges a batch replayed from the publisher's ring, which the stream
    /// has verified to be the process of `last` (or which starts the
    /// stream): a seq at or below the watermark is a duplicate, never a
    /// restart.
    pub(crate) fn judge_replayed(&self, seq: u64) -> Verdict {
        match self.last {
            Some(last) if seq <= last => Verdict::Duplicate,
            _ => self.judge_live(seq, Origin::Same, 0),
        }
    }

    /// Marks `seq` as dealt with: applied (`digest` of its payload), or
    /// given up as lost (None).
    pub(crate) fn accept(&mut self, seq: u64, digest: Option<u64>) {
        debug_assert!(self.last.is_none_or(|last| seq > last), "watermark must only move forward");
        self.last = Some(seq);
        self.digest = digest;
        if let Some(d) = digest {
            self.anchor = Some(Watermark { seq, digest });
            self.remember(seq, d);
        }
    }

    /// Whether live batch `seq` of connection `conn`, with `digest`, is a
    /// copy of one a fill applied (drop it). It must match the fill's copy
    /// byte for byte where that digest is kept (another process's batch of
    /// the same seq is no copy), or the recent one of that seq where only
    /// that is.
    pub(crate) fn take_filled_copy(&mut self, seq: u64, conn: u32, digest: u64) -> bool {
        let Some(f) = self.filled.as_mut().filter(|f| f.conn == conn && (f.lo..=f.hi).contains(&seq)) else {
            return false;
        };
        let slot = self.recent[(seq % RECENT_BATCHES as u64) as usize];
        let known = f.digest(seq).or((slot.0 == seq.wrapping_add(1)).then_some(slot.1));
        if known.is_some_and(|d| d != digest) {
            return false;
        }
        if seq == f.hi {
            // The copies a proxy may still deliver late are recent ones.
            self.filled = None;
            return true;
        }
        f.lo = f.lo.max((seq + 1).saturating_sub(RECENT_BATCHES as u64));
        let first = f.hi.wrapping_add(1).wrapping_sub(f.digests.len() as u64);
        let stale = f.lo.saturating_sub(first).min(f.digests.len() as u64);
        f.digests.drain(..stale as usize);
        true
    }

    /// `accept` for a live batch: past what a fill applied ahead, the live
    /// stream owes no more copies.
    pub(crate) fn accept_live(&mut self, seq: u64, digest: u64) {
        if self.filled.as_ref().is_some_and(|f| seq > f.hi) {
            self.filled = None;
        }
        self.accept(seq, Some(digest));
    }

    /// `accept` for a batch that a ring fill asked from `from` applied,
    /// whose live copy connection `conn` may still deliver.
    pub(crate) fn accept_filled(&mut self, from: u64, seq: u64, digest: u64, conn: u32) {
        self.accept(seq, Some(digest));
        let mut f = match self.filled.take().filter(|f| f.conn == conn) {
            Some(mut f) => {
                if seq != f.hi.wrapping_add(1) {
                    // Seqs given up between: their digests are not known.
                    f.digests.clear();
                }
                f.hi = seq;
                f
            }
            None => Filled { lo: from, hi: seq, conn, digests: VecDeque::new() },
        };
        if f.digests.len() == FILLED_DIGESTS_MAX {
            f.digests.pop_front();
        }
        f.digests.push_back(digest);
        self.filled = Some(f);
    }

    /// Forgets the watermark: the next batch starts a new stream.
    pub(crate) fn reset(&mut self) {
        self.last = None;
        self.digest = None;
        self.anchor = None;
        self.recent.fill((0, 0));
        self.filled = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAME: Origin = Origin::Same;
    const REJOIN: Origin = Origin::New { rejoin: true };
    const KEPT: Origin = Origin::New { rejoin: false };

    /// Batches 0..=last dealt with, batch n's digest being n + 100.
    fn at(last: u64) -> Sequencer {
        let mut s = Sequencer::new(None);
        for seq in 0..=last {
            s.accept(seq, Some(seq + 100));
        }
        s
    }

    #[test]
    fn in_order_batches_apply() {
        let mut s = Sequencer::new(None);
        assert_eq!(s.judge_live(0, SAME, 1), Verdict::Apply);
        s.accept(0, None);
        assert_eq!(s.judge_live(1, SAME, 1), Verdict::Apply);
        s.accept(1, None);
        assert_eq!(s.last(), Some(1));
    }

    #[test]
    fn first_batch_after_zero_is_a_fresh_gap() {
        let s = Sequencer::new(None);
        assert_eq!(s.judge_live(7, SAME, 1), Verdict::Gap { from: 0, to: 7, fresh: true });
        assert_eq!(s.judge_live(7, REJOIN, 1), Verdict::Gap { from: 0, to: 7, fresh: true });
    }

    #[test]
    fn skipped_seqs_are_a_gap() {
        assert_eq!(at(10).judge_live(14, SAME, 1), Verdict::Gap { from: 11, to: 14, fresh: false });
    }

    #[test]
    fn a_step_back_is_a_duplicate_only_if_it_repeats_a_recent_batch_exactly() {
        let s = at(100);
        assert_eq!(s.judge_live(100, SAME, 200), Verdict::Duplicate);
        assert_eq!(s.judge_live(40, SAME, 140), Verdict::Duplicate);
        assert_eq!(s.judge_live(40, SAME, 141), Verdict::Restart, "another batch 40: another process");
        // Older than what is kept: nothing tells it from another process's.
        assert_eq!(s.judge_live(36, SAME, 136), Verdict::Restart);
        assert_eq!(s.judge_live(0, SAME, 100), Verdict::Restart);
        // Batch 0 itself, repeated while it is recent, is a duplicate.
        assert_eq!(at(3).judge_live(0, SAME, 100), Verdict::Duplicate);
    }

    #[test]
    fn a_batch_given_up_as_lost_is_not_known_again() {
        let mut s = at(5);
        s.accept(7, None);
        assert_eq!(s.judge_live(7, SAME, 107), Verdict::Restart);
        assert_eq!(s.judge_live(5, SAME, 105), Verdict::Duplicate);
    }

    #[test]
    fn any_step_back_on_a_new_connection_is_a_restart() {
        let s = at(10);
        for origin in [REJOIN, KEPT] {
            assert_eq!(s.judge_live(9, origin, 109), Verdict::Restart);
            assert_eq!(s.judge_live(10, origin, 110), Verdict::Restart);
            // A batch that continues the stream is taken as the same process.
            assert_eq!(s.judge_live(11, origin, 1), Verdict::Apply);
        }
    }

    #[test]
    fn a_gap_on_a_new_connection_is_a_rejoin_unless_the_watermark_was_kept() {
        let s = at(10);
        assert_eq!(s.judge_live(14, REJOIN, 1), Verdict::Rejoin);
        assert_eq!(s.judge_live(14, KEPT, 1), Verdict::Gap { from: 11, to: 14, fresh: false });
        assert_eq!(s.judge_live(14, SAME, 1), Verdict::Gap { from: 11, to: 14, fresh: false });
    }

    #[test]
    fn the_watermark_keeps_the_digest_of_the_batch_applied_last() {
        let mut s = Sequencer::new(Some(Watermark { seq: 3, digest: Some(7) }));
        assert_eq!(s.watermark(), Some(Watermark { seq: 3, digest: Some(7) }));
        assert_eq!(s.judge_live(3, SAME, 7), Verdict::Duplicate, "a kept watermark's batch is known");
        s.accept_live(4, 9);
        assert_eq!(s.watermark(), Some(Watermark { seq: 4, digest: Some(9) }));
        // Given up as lost: what batch 6 held is unknown; batch 4 is the
        // newest a ring can be checked against.
        s.accept(6, None);
        assert_eq!(s.watermark(), Some(Watermark { seq: 6, digest: None }));
        assert_eq!(s.anchor(), Some(Watermark { seq: 4, digest: Some(9) }));
        s.reset();
        assert_eq!((s.watermark(), s.anchor()), (None, None));
        assert_eq!(s.judge_live(0, SAME, 100), Verdict::Apply, "nothing is recent after a reset");
        let kept = Sequencer::new(Some(Watermark { seq: 3, digest: None }));
        assert_eq!(kept.anchor(), None, "a kept watermark without its digest checks nothing");
    }

    #[test]
    fn a_replayed_step_back_is_never_a_restart() {
        let s = at(10);
        assert_eq!(s.judge_replayed(0), Verdict::Duplicate);
        assert_eq!(s.judge_replayed(10), Verdict::Duplicate);
        assert_eq!(s.judge_replayed(11), Verdict::Apply);
        assert_eq!(s.judge_replayed(14), Verdict::Gap { from: 11, to: 14, fresh: false });
    }

    #[test]
    fn live_copies_of_what_a_fill_applied_are_duplicates_however_far_back() {
        let mut s = Sequencer::new(None);
        for seq in 0..=500 {
            assert_eq!(s.judge_replayed(seq), Verdict::Apply);
            s.accept_filled(0, seq, seq, 1);
        }
        assert_eq!(s.judge_live(0, SAME, 0), Verdict::Restart, "out of the recent ones");
        assert!(!s.take_filled_copy(0, 2, 0), "another connection owes no copies");
        for seq in [0, 3] {
            assert!(s.take_filled_copy(seq, 1, seq), "{seq}");
        }
        // A proxy may deliver a copy late, as far back as the recent ones reach.
        assert!(s.take_filled_copy(0, 1, 0));
        assert!(s.take_filled_copy(200, 1, 200));
        assert!(s.take_filled_copy(200 - RECENT_BATCHES as u64 + 1, 1, 200 - RECENT_BATCHES as u64 + 1));
        assert!(!s.take_filled_copy(200 - RECENT_BATCHES as u64, 1, 200 - RECENT_BATCHES as u64));
        assert_eq!(s.judge_live(501, SAME, 0), Verdict::Apply);
        s.accept_live(501, 501);
        // The live stream passed the window: no more copies are owed.
        assert!(!s.take_filled_copy(500, 1, 500));
    }

    #[test]
    fn late_copies_far_behind_a_fill_are_checked_against_what_it_applied() {
        let mut s = Sequencer::new(None);
        (0..=3_000).for_each(|seq| s.accept_filled(0, seq, seq + 100, 1));
        // Behind a proxy, copies come out of order, far behind the fill.
        for seq in [2_900, 2_899, 2_950, 2_901] {
            assert!(s.take_filled_copy(seq, 1, seq + 100), "{seq}");
        }
        // Another process's batch of a seq the fill applied is no copy.
        assert!(!s.take_filled_copy(2_960, 1, 7));
        assert_eq!(s.judge_live(2_960, SAME, 7), Verdict::Restart);
        // Past the digests kept, only the window bounds what a copy is.
        assert!(!s.take_filled_copy(10, 1, 110), "moved past");
    }

    #[test]
    fn seqs_given_up_inside_a_fill_take_any_copy() {
        let mut s = Sequencer::new(None);
        (0..=3).for_each(|seq| s.accept_filled(0, seq, seq + 100, 1));
        s.accept(6, None);
        s.accept_filled(0, 7, 107, 1);
        assert!(s.take_filled_copy(5, 1, 999), "lost in the ring: its copy cannot be checked");
        assert!(!s.take_filled_copy(7, 1, 999));
        assert!(s.take_filled_copy(7, 1, 107));
    }

    #[test]
    fn another_process_s_batch_of_a_filled_seq_is_no_copy() {
        let mut s = Sequencer::new(None);
        (0..=2).for_each(|seq| s.accept_filled(0, seq, seq + 100, 1));
        // Behind a proxy, a new process's batch 1 on the same connection.
        assert!(!s.take_filled_copy(1, 1, 7));
        assert_eq!(s.judge_live(1, SAME, 7), Verdict::Restart);
        assert!(s.take_filled_copy(1, 1, 101));
    }

    #[test]
    fn the_last_copy_ends_the_fill_window() {
        let mut s = Sequencer::new(None);
        (0..=2).for_each(|seq| s.accept_filled(0, seq, seq, 1));
        assert!(s.take_filled_copy(2, 1, 2));
        assert!(!s.take_filled_copy(0, 1, 0));
    }

    #[test]
    fn a_fill_from_a_kept_watermark_marks_only_what_it_applied() {
        let mut s = Sequencer::new(Some(Watermark { seq: 9, digest: None }));
        assert_eq!(s.judge_replayed(10), Verdict::Apply);
        s.accept_filled(10, 10, 10, 1);
        s.accept_filled(10, 11, 11, 1);
        assert!(!s.take_filled_copy(9, 1, 9));
        assert!(s.take_filled_copy(10, 1, 10));
    }

    #[test]
    fn a_reset_ends_the_fill_window() {
        let mut s = Sequencer::new(None);
        s.accept_filled(0, 0, 0, 1);
        s.reset();
        assert!(!s.take_filled_copy(0, 1, 0));
        assert_eq!(s.judge_live(0, SAME, 0), Verdict::Apply);
    }

    #[test]
    fn a_fill_that_reaches_the_top_seq_does_not_overflow() {
        let mut s = Sequencer::new(Some(Watermark { seq: u64::MAX - 3, digest: Some(1) }));
        for seq in u64::MAX - 2..=u64::MAX {
            s.accept_filled(u64::MAX - 3, seq, seq ^ 7, 1);
        }
        assert!(!s.take_filled_copy(u64::MAX - 1, 1, 5), "another batch of that seq");
        assert!(s.take_filled_copy(u64::MAX - 2, 1, (u64::MAX - 2) ^ 7));
        assert!(s.take_filled_copy(u64::MAX, 1, u64::MAX ^ 7));
    }

    #[test]
    fn seq_near_the_top_does_not_overflow() {
        assert_eq!(at(3).judge_live(u64::MAX, SAME, 1), Verdict::Gap { from: 4, to: u64::MAX, fresh: false });
        let mut s = Sequencer::new(None);
        s.accept(u64::MAX - 1, Some(1));
        assert_eq!(s.judge_live(u64::MAX, SAME, 2), Verdict::Apply);
    }
}

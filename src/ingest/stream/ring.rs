//! Asking the ring, for a stream: starting a fill or a gap's replay,
//! checking the ring's first answer against the watermark (or a gap's
//! trigger when the ring rolled past the watermark), applying what it
//! sends, asking again after holes or silence, and ending the request. The
//! rules are in the module doc of `stream`.

use std::sync::atomic::Ordering;

use super::ask::Ask;
use super::{Conns, Cx, LateRead, Phase, Port, Source, Stream};
use crate::ingest::budget::HELD_SHARE;
use crate::ingest::config::{LATE_JOIN_READS_MS, REPLAY_RETRIES_MAX};
use crate::ingest::decode::Batch;
use crate::ingest::sequencer::Verdict;

impl Stream {
    pub(super) fn ask(&self) -> Option<&Ask> {
        match &self.phase {
            Phase::Filling(ask) | Phase::Replaying(ask) => Some(ask),
            _ => None,
        }
    }

    pub(super) fn ask_mut(&mut self) -> Option<&mut Ask> {
        match &mut self.phase {
            Phase::Filling(ask) | Phase::Replaying(ask) => Some(ask),
            _ => None,
        }
    }

    /// Ends a running ask at once (`Live`), returning its phase.
    pub(super) fn take_ask(&mut self, cx: &Cx, port: &mut dyn Port) -> Phase {
        if !self.asking() {
            return Phase::Live;
        }
        port.stop_asking();
        let mut phase = std::mem::replace(&mut self.phase, Phase::Live);
        if let Phase::Filling(ask) | Phase::Replaying(ask) = &mut phase {
            release(cx, &ask.rolled.take().unwrap_or_default());
        }
        phase
    }

    /// Asks the ring for everything past the watermark (`Filling`); stays
    /// `FillDue` if the request cannot be made (asked again at the next input).
    /// `late_read`: a read after a quiet fill (see `late_read`), which.
    pub(super) fn start_fill(&mut self, cx: &Cx, port: &mut dyn Port, late_read: Option<usize>) {
        let Some(ring) = self.ring.clone() else {
            self.phase = Phase::Live;
            return;
        };
        if self.seq.last().is_some() && self.seq.anchor().is_none() {
            // No batch of the stream has a digest to check the ring by: its
            // process cannot be told, so the stream starts over from the ring.
            cx.bump(&cx.counters.resyncs, 1);
            self.log.warn(|| format!("{ring}: nothing to check its ring by; clearing its workers and filling from 0"));
            self.start_over(cx, port, self.latest);
        }
        let verify = self.seq.anchor();
        let last = self.seq.last();
        // Held live batches past the watermark: the first bounds the fill
        // (the live stream has it and what follows). From 0, only a batch of
        // the connection the ring is taken to be bounds it.
        let to = self
            .held
            .iter()
            .filter(|b| verify.is_some() || b.conn == self.latest)
            .map(|b| b.seq)
            .find(|&seq| last.is_none_or(|last| seq > last));
        if last.is_none() && to == Some(0) && self.held.iter().all(|b| b.conn == self.latest) {
            // The live stream has the ring's whole content.
            self.phase = Phase::Live;
            return self.advance(cx, port);
        }
        let from = verify.map_or(0, |w| w.seq);
        match port.ask(from) {
            Ok(()) => {
                cx.bump(if late_read.is_some() { &cx.counters.late_join_reads } else { &cx.counters.ring_fills }, 1);
                crate::debug!("asked {ring} for its ring from batch {from}");
                if !self.held.is_empty() {
                    self.held.waiting_since.get_or_insert(cx.now);
                }
                let mut ask = Ask::new(self.latest, verify, to, cx.now);
                ask.late_read = late_read;
                self.phase = Phase::Filling(ask);
            }
            Err(e) => {
                cx.shared.set_error(e.clone());
                self.log.warn(|| e);
            }
        }
    }

    /// A fill's connection delivered no live batch by the fill's end: what
    /// the engine sent before our subscription reached its PUB socket was
    /// dropped there, and if it then went quiet nothing live shows it
    /// missing. Reads the ring again after each of `LATE_JOIN_READS_MS`
    /// (from the watermark, checked as a fill's first answer is) until a
    /// live batch of the connection comes.
    pub(super) fn late_join_due(&mut self, cx: &Cx, ask: &Ask) {
        let round = ask.late_read.map_or(0, |r| r + 1);
        let quiet = self.live_conn < ask.conn && ask.conn == self.latest && self.up;
        // A ring that did not answer is not read again for this.
        let answered = ask.replies > 0 && !ask.overflowed;
        self.late = match LATE_JOIN_READS_MS.get(round) {
            Some(&ms) if quiet && answered => {
                Some(LateRead { conn: ask.conn, due: cx.now + std::time::Duration::from_millis(ms), round })
            }
            _ => None,
        };
    }

    /// A read after a quiet fill is due: a fill from the watermark, if the
    /// stream is live on that connection with nothing held, and has a
    /// batch to check the ring's answer by.
    pub(super) fn late_read(&mut self, cx: &Cx, port: &mut dyn Port) {
        let Some(late) = self.late.take() else { return };
        let live = matches!(self.phase, Phase::Live) && self.held.is_empty();
        let checkable = self.seq.last().is_none() || self.seq.anchor().is_some();
        if !(live && self.up && cx.gate_open && late.conn == self.latest && checkable) {
            return;
        }
        self.phase = Phase::FillDue;
        self.start_fill(cx, port, Some(late.round));
    }

    /// Asks the ring for the batches up to `to` (`Replaying`), from the
    /// watermark; false without a ring or when the request cannot be made.
    pub(super) fn start_replay(&mut self, cx: &Cx, port: &mut dyn Port, to: u64) -> bool {
        let Some(ring) = self.ring.as_deref() else { return false };
        let verify = self.seq.anchor();
        if self.seq.last().is_some() && verify.is_none() {
            // Nothing to check the ring by: its answer could be another process's.
            return false;
        }
        let from = verify.map_or(0, |w| w.seq);
        cx.bump(&cx.counters.replays_started, 1);
        match port.ask(from) {
            Ok(()) => {
                crate::debug!("asked {ring} to replay batches {from}..{to}");
                self.held.waiting_since.get_or_insert(cx.now);
                self.phase = Phase::Replaying(Ask::new(self.latest, verify, Some(to), cx.now));
                true
            }
            Err(e) => {
                cx.bump(&cx.counters.replays_failed, 1);
                cx.shared.set_error(e.clone());
                self.log.warn(|| e);
                false
            }
        }
    }

    /// The ring answered a stream with no watermark (so nothing to check
    /// the answer against): it starts the stream, on the connection the ask
    /// was made on (its process is the one that connection reaches), and an
    /// older connection's held batches are not known to be its. A gap's
    /// replay whose trigger was one of them is a fill from 0 now.
    pub(super) fn start_on_ring(&mut self, cx: &Cx) {
        let Some(conn) = self.ask().map(|ask| ask.conn) else { return };
        self.proven = Some(Conns { since: conn, upto: conn });
        // Held batches are not known to be the ring's process's either: a
        // connection that looks up may be a dead host's. The fill now reads
        // the ring to its end, asking once more if that ends before the
        // newest of them (its answer may predate them), and a later live
        // batch bounds it again.
        if let Some(newest) = self.drop_held(cx) {
            self.phase = match std::mem::replace(&mut self.phase, Phase::Live) {
                phase @ (Phase::Filling(_) | Phase::Replaying(_)) => {
                    let from_replay = matches!(phase, Phase::Replaying(_));
                    let (Phase::Filling(mut ask) | Phase::Replaying(mut ask)) = phase else { unreachable!() };
                    ask.from_replay |= from_replay;
                    ask.to = None;
                    ask.reach = Some(newest);
                    Phase::Filling(ask)
                }
                other => other,
            };
        }
    }

    pub(super) fn on_replayed(&mut self, cx: &Cx, port: &mut dyn Port, batch: Batch) {
        let replaying = matches!(self.phase, Phase::Replaying(_));
        let trigger = self.held.iter().next().map(|b| (b.seq, b.digest));
        let Some(ask) = self.ask_mut() else { return };
        if let Some(expect) = ask.verify {
            if batch.seq < expect.seq {
                // A ring that answers from further back than asked.
                return cx.bump(&cx.counters.duplicates_dropped, 1);
            }
            if batch.seq == expect.seq && expect.digest == Some(batch.digest) {
                // Our batch, as we applied it: the engine has been one
                // process since, on every connection up to the ask's.
                ask.verify = None;
                let conn = ask.conn;
                self.proven = Some(Conns { since: self.proven.map_or(1, |c| c.since), upto: conn });
                return;
            }
            let to = ask.to.unwrap_or(0);
            if !(replaying && batch.seq > expect.seq && batch.seq <= to && trigger.is_some_and(|t| t.0 == to)) {
                return self.another_process(cx, port, Some(batch.seq));
            }
            // Rolled past the watermark, or another process: the ring's
            // copy of the gap's trigger, which came on a proven connection,
            // will tell.
            ask.verify = None;
            ask.rolled = Some(Vec::new());
        }
        if ask.rolled.is_some() {
            return self.on_rolled(cx, port, batch, trigger);
        }
        self.apply_replayed(cx, port, batch);
    }

    /// A reply to a gap's replay whose ring started past the watermark:
    /// kept until the ring's copy of the trigger, which says whether the
    /// ring is the live process's (then the part it still holds is
    /// replayed and the rest given up) or not (the gap is given up whole).
    fn on_rolled(&mut self, cx: &Cx, port: &mut dyn Port, batch: Batch, trigger: Option<(u64, u64)>) {
        let Some(ask) = self.ask_mut() else { return };
        let to = ask.to.unwrap_or(0);
        let Some(kept) = ask.rolled.as_mut() else { return };
        if batch.seq < to {
            if kept.last().is_some_and(|b| b.seq >= batch.seq) {
                return cx.bump(&cx.counters.duplicates_dropped, 1);
            }
            let kept_bytes: usize = kept.iter().map(|b| b.charge.bytes()).sum();
            let share = cx.budget.bytes_max() / HELD_SHARE;
            if kept.len() >= cx.cfg.replay_batches_max || kept_bytes + batch.charge.bytes() > share {
                // Too much to keep: the gap is given up whole.
                ask.overflowed = true;
                return;
            }
            cx.held.gauge.fetch_add(1, Ordering::Relaxed);
            kept.push(batch);
            return;
        }
        let kept = ask.rolled.take().unwrap_or_default();
        release(cx, &kept);
        if batch.seq != to || trigger != Some((to, batch.digest)) {
            return self.another_process(cx, port, Some(batch.seq));
        }
        // The ring is the live process's, rolled past the watermark: what
        // it no longer holds is lost, the rest is replayed.
        let first = kept.first().map_or(to, |b| b.seq);
        let next = self.seq.last().map_or(0, |last| last + 1);
        if next < first {
            if let Some(ask) = self.ask_mut() {
                ask.missing += first - next;
            }
            self.give_up(cx, port, (next, first), false, "rolled out of the ring", None);
        }
        for b in kept {
            if !self.asking() {
                break;
            }
            self.apply_replayed(cx, port, b);
        }
        if self.asking() {
            self.finish(cx, port);
        }
    }

    /// Applies a replayed batch that needs no more checking, in order.
    fn apply_replayed(&mut self, cx: &Cx, port: &mut dyn Port, batch: Batch) {
        let Some(ask) = self.ask_mut() else { return };
        if ask.past_end(batch.seq) {
            // Replies come in seq order: everything below `to` has been sent.
            return self.ended(cx, port);
        }
        let (to, conn, from) = (ask.to, ask.conn, ask.from);
        let source = match self.phase {
            Phase::Filling(_) => Source::Fill { from, conn },
            _ => Source::Replay,
        };
        match self.seq.judge_replayed(batch.seq) {
            Verdict::Apply => {}
            Verdict::Gap { from, fresh, .. } => {
                // Lost in transit (asked again), or the ring no longer holds
                // `from..seq`.
                if self.retry(cx, port) {
                    return;
                }
                if let Some(ask) = self.ask_mut() {
                    ask.missing += batch.seq - from;
                }
                self.give_up(cx, port, (from, batch.seq), fresh, "lost", None);
            }
            Verdict::Duplicate | Verdict::Restart | Verdict::Rejoin => {
                return cx.bump(&cx.counters.duplicates_dropped, 1);
            }
        }
        let seq = batch.seq;
        self.apply(cx, port, batch, source);
        if let Some(ask) = self.ask_mut() {
            ask.note_applied(seq);
        }
        if to.is_some_and(|to| self.seq.last() == Some(to - 1)) {
            self.finish(cx, port);
        }
    }

    /// Whether a fill has nothing left to add: the live stream has the
    /// batch after the watermark.
    pub(super) fn fill_reached_live(&self) -> bool {
        let next = self.seq.last().map_or(0, |last| last + 1);
        match &self.phase {
            Phase::Filling(ask) => ask.verify.is_none() && ask.to.is_some_and(|to| next >= to),
            _ => false,
        }
    }

    /// The ring's first answer was not our batch `last` (`found`: the seq
    /// it started with; None: nothing from there). A fill clears the
    /// workers and starts the stream again on the ask's connection, from 0;
    /// a gap's replay gives the gap up.
    pub(super) fn another_process(&mut self, cx: &Cx, port: &mut dyn Port, found: Option<u64>) {
        let phase = self.take_ask(cx, port);
        let (Phase::Filling(ask) | Phase::Replaying(ask)) = &phase else { return };
        let last = ask.verify.map_or(ask.from, |w| w.seq);
        let ring = self.ring.as_deref().unwrap_or("");
        // Another batch `last`, or nothing from there (a ring keeps the
        // newest batches, so the same process's ring holds `last` or later),
        // is another process. A ring that starts past `last` may be the
        // same process's, rolled past the watermark.
        let (what, restart) = match found {
            Some(seq) if seq == last => (format!("another batch {last}"), true),
            Some(seq) => (format!("batch {seq} first"), false),
            None => ("nothing from there".to_string(), true),
        };
        if let Phase::Replaying(ask) = phase {
            cx.bump(&cx.counters.replays_failed, 1);
            let next = self.seq.last().map_or(0, |last| last + 1);
            let to = ask.to.unwrap_or(next);
            self.log
                .warn(|| format!("ring {ring} holds {what}, not our batch {last}: the gap {next}..{to} is not in it"));
            if next < to {
                self.give_up(cx, port, (next, to), false, "unreplayable", None);
            }
            return self.advance(cx, port);
        }
        cx.bump(if restart { &cx.counters.restarts } else { &cx.counters.resyncs }, 1);
        self.log.warn(|| {
            format!(
                "ring {ring} holds {what}, not our batch {last}: a new process (or a ring past our watermark); \
                 clearing its workers and filling from 0"
            )
        });
        self.start_over(cx, port, ask.conn);
        self.phase = Phase::FillDue;
        self.advance(cx, port);
    }

    /// The stream's process is gone or cannot be told: its workers are
    /// cleared, its watermark forgotten, and it starts again on connection
    /// `conn`, whose older connections' held batches are dropped.
    fn start_over(&mut self, cx: &Cx, port: &mut dyn Port, conn: u32) {
        self.clear_workers(port);
        self.seq.reset();
        self.proven = Some(Conns { since: conn, upto: conn });
        // Not one held batch is known to be the new process's: the
        // connection asked on may be a dead host's that still looks up. What
        // the new process sent of them is in its ring, which the fill that
        // follows is asked for after they came.
        self.drop_held(cx);
    }

    /// The replies stopped (end marker, a reply past the range, a pause):
    /// if some of the range is still missing, ask again while that can
    /// help; otherwise finish.
    pub(super) fn ended(&mut self, cx: &Cx, port: &mut dyn Port) {
        let next = self.seq.last().map_or(0, |last| last + 1);
        let short = self.ask().is_some_and(|ask| ask.to.is_none_or(|to| next < to));
        if short && (self.retry(cx, port) || self.reread_due() && self.reask(cx, port)) {
            return;
        }
        self.finish(cx, port);
    }

    /// A fill that reached the ring's end: done, unless it ended before
    /// batches dropped unjudged while it ran (then asked once more).
    pub(super) fn ring_ended(&mut self, cx: &Cx, port: &mut dyn Port) {
        if self.reread_due() && self.reask(cx, port) {
            return;
        }
        self.finish(cx, port);
    }

    /// Whether the ask's answer ended before the batches it must reach
    /// (once: the mark is taken).
    fn reread_due(&mut self) -> bool {
        let next = self.seq.last().map_or(0, |last| last + 1);
        self.ask_mut().and_then(|ask| ask.reach.take()).is_some_and(|reach| next <= reach)
    }

    /// Asks the ring again, from the watermark reached (checked first, as
    /// the first request was), if the current request made progress and
    /// retries are left; false when it did not.
    pub(super) fn retry(&mut self, cx: &Cx, port: &mut dyn Port) -> bool {
        if !self.ask().is_some_and(|ask| ask.progressed()) {
            return false;
        }
        self.reask(cx, port)
    }

    /// Asks the ring again as `retry` does, whatever the current request
    /// delivered, if retries are left.
    pub(super) fn reask(&mut self, cx: &Cx, port: &mut dyn Port) -> bool {
        let (anchor, any) = (self.seq.anchor(), self.seq.last().is_some());
        let Some(ask) = self.ask_mut() else { return false };
        // An unanswered check stays what it was; one passed is made again
        // from where the stream is now.
        let verify = ask.verify.or(anchor);
        if ask.retries >= REPLAY_RETRIES_MAX || (any && verify.is_none()) {
            return false;
        }
        let from = verify.map_or(0, |w| w.seq);
        match port.ask(from) {
            Ok(()) => {
                ask.retried(cx.now);
                ask.verify = verify;
                let kept = ask.rolled.take().unwrap_or_default();
                release(cx, &kept);
                let Some(ask) = self.ask_mut() else { return true };
                let retries = ask.retries;
                crate::debug!("asked {} again, from batch {from} (retry {retries})", self.endpoint);
                true
            }
            Err(e) => {
                self.log.warn(|| e);
                false
            }
        }
    }

    /// Ends the ask: a gap's batches that did not arrive are given up, the
    /// outcome is counted, and held batches are judged.
    pub(super) fn finish(&mut self, cx: &Cx, port: &mut dyn Port) {
        let phase = self.take_ask(cx, port);
        let next = self.seq.last().map_or(0, |last| last + 1);
        match phase {
            Phase::Replaying(ask) => {
                let mut missing = ask.missing;
                if let Some(to) = ask.to.filter(|&to| next < to) {
                    missing += to - next;
                    let fresh = self.seq.last().is_none();
                    self.give_up(cx, port, (next, to), fresh, "lost", None);
                }
                self.replay_done(cx, &ask, missing);
            }
            // What a fill bounded by a live batch did not get is left to the
            // live rules: that batch, judged next, shows a gap like any other.
            Phase::Filling(ask) => {
                if ask.from_replay {
                    // Its batches count as filled (below), its outcome as a replay's.
                    let missing = ask.missing + ask.to.map_or(0, |to| to.saturating_sub(next));
                    count_replay_outcome(cx, &ask, missing);
                }
                self.fill_done(cx, &ask);
                self.late_join_due(cx, &ask);
                // Only a ring that never answered leaves the process untold:
                // a fill ended by overflow or its reply budget judges the
                // held batches by the live rules, as a gap then asks again.
                if ask.replies == 0 && !ask.overflowed && self.proven.is_none_or(|c| c.upto < ask.conn) {
                    self.unproven_fill(cx, port, &ask);
                }
            }
            _ => return,
        }
        self.advance(cx, port);
    }

    /// A fill ended (its ring silent or too slow) without proving its
    /// connection reaches the stream's process: batches of older
    /// connections are never judged after it, and blocks the stream wrote
    /// may be a dead process's, so its workers are cleared and it starts
    /// again from whatever the new connection sends.
    fn unproven_fill(&mut self, cx: &Cx, port: &mut dyn Port, ask: &Ask) {
        let newest = self.held.iter().filter(|b| b.conn < ask.conn).map(|b| b.seq).max();
        let dropped = self.held.drop_unless(cx.held, |b| b.conn >= ask.conn);
        self.drop_dead(cx, dropped);
        if let Some(seq) = newest {
            // Asked for again once the rest is judged (once: a ring still
            // silent then drops nothing more).
            self.held.dropped_unjudged(seq);
        }
        let Some(last) = self.seq.last() else { return };
        cx.bump(&cx.counters.resyncs, 1);
        let ring = self.ring.as_deref().unwrap_or("");
        self.log.warn(|| {
            format!(
                "ring {ring} did not answer in time: its process cannot be told from the one of our batch {last}; \
                 clearing its workers"
            )
        });
        self.clear_workers(port);
        self.seq.reset();
    }

    /// Counts and logs a fill: one line per fill.
    fn fill_done(&self, cx: &Cx, ask: &Ask) {
        cx.bump(&cx.counters.batches_filled, ask.applied);
        let got = match ask.applied_seqs {
            Some((first, last)) => format!("{} batches ({first}..={last})", ask.applied),
            None => "nothing".to_string(),
        };
        let asked = match ask.to {
            Some(to) => format!("{}..{to}", ask.from),
            None => format!("{}..", ask.from),
        };
        let lost =
            if ask.missing > 0 { format!("; {} batches were no longer there", ask.missing) } else { String::new() };
        let late = if ask.silent(cx.now, cx.timeout()) { "; timed out" } else { "" };
        let ring = self.ring.as_deref().unwrap_or("");
        let label = &cx.shared.label;
        match ask.late_read {
            None => crate::info!("listener {label}: filled {got} from its ring {ring}, asked for {asked}{lost}{late}"),
            Some(_) if ask.applied == 0 => {
                crate::debug!("listener {label}: read its ring {ring} again after a quiet fill: nothing new")
            }
            Some(_) => crate::info!(
                "listener {label}: read its ring {ring} again after a quiet fill: filled {got}, sent before our \
                 subscription took{lost}{late}"
            ),
        }
    }

    /// Counts and logs a gap's replay.
    fn replay_done(&mut self, cx: &Cx, ask: &Ask, missing: u64) {
        count_replay(cx, ask, missing);
        let (from, to, applied) = (ask.first, ask.to.unwrap_or(ask.first), ask.applied);
        let (live, ring) = (&self.endpoint, self.ring.as_deref().unwrap_or(""));
        if missing > 0 {
            self.gap_log.warn(|| format!("replay of {from}..{to} from {ring} missed {missing} batches"));
        } else {
            // The stream is whole again: an earlier replay's error is history.
            cx.shared.clear_replay_error();
            self.gap_log.info(|| {
                format!("gap {from}..{to} in the stream of {live} recovered: {applied} batches replayed from {ring}")
            });
        }
    }
}

/// Counts a replay's outcome and the batches it applied.
fn count_replay(cx: &Cx, ask: &Ask, missing: u64) {
    cx.bump(&cx.counters.batches_replayed, ask.applied);
    count_replay_outcome(cx, ask, missing);
}

/// Counts a replay's outcome: ok, partial or failed.
fn count_replay_outcome(cx: &Cx, ask: &Ask, missing: u64) {
    let outcome = if missing == 0 {
        &cx.counters.replays_ok
    } else if ask.applied > 0 {
        &cx.counters.replays_partial
    } else {
        &cx.counters.replays_failed
    };
    cx.bump(outcome, 1);
}

/// Takes batches kept from a ring off the held gauge (their charges go
/// with them).
fn release(cx: &Cx, kept: &[Batch]) {
    cx.held.gauge.fetch_sub(kept.len() as u64, Ordering::Relaxed);
}

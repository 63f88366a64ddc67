//! One listener key's stream, as a state machine with no sockets and no
//! clock of its own: the listener (`listener.rs`) feeds it what its sockets
//! and monitor said, with the time, and carries out what it asks through a
//! [`Port`] (hand a batch to a shard, clear a worker, ask the ring). So
//! every rule below is tested by driving it directly (`tests.rs`,
//! `model_tests.rs`), and the listener only moves bytes.
//!
//! # Connections and provenance
//!
//! The listener opens one SUB socket per connection and never lets ZMQ
//! reconnect it (`listener.rs`): connection `n` is the `n`-th socket, and
//! every live batch carries the number of the connection it came on,
//! exactly. The stream keeps the range of connections known to reach the
//! process whose batches it holds (`proven`: since..=upto). A batch of a
//! connection before `since` is a dead process's: dropped. One within the
//! range is judged by the sequence rules of one process. One past `upto`
//! is *unproven*: a reconnect may have found a new process on the same
//! endpoint. With a ring, a fill asked from the watermark settles it: the
//! ring's first answer must be batch `last` with the digest we keep. Then
//! the engine has been one process since `last`, so every connection up to
//! the newest at the ask is proven (`upto` moves); otherwise its workers
//! are cleared, every held batch of an older connection is dropped, and the
//! stream starts again on the newest connection (`since` moves), filled
//! from 0. Without a ring (or when the ring never answers) the live rules
//! judge an unproven batch as a new connection's: any step back is a
//! restart and a gap a rejoin, both of which clear the workers; only a
//! batch that continues the watermark exactly is taken for the same
//! process, the one case a stream without a ring cannot tell. A batch
//! held from an earlier connection is never applied after a reconnect
//! unless the ring proved the process the same.
//!
//! # States
//!
//! [`Phase`], with what each variant carries; beside it the connection
//! (`latest`, `up`), the watermark (`Sequencer`), `proven`, and the held
//! batches. Live batches are held while the ring is asked, while the ready
//! gate is closed, and while a fill waits for the publisher; otherwise
//! they are judged as they come. The ready gate only ever opens.
//!
//! | from | on | to |
//! |---|---|---|
//! | new stream | | `FillDue` with a ring, else `Live` |
//! | any but `Gone` | connected (with a ring) | `FillDue`; a running ask is dropped (a gap's replay counts as failed) |
//! | `Gone` | connected | `FillDue` with a ring, else `Live` |
//! | `FillDue` | publisher up and gate open | `Filling`, asked from the watermark (or 0) |
//! | `Live` | a gap, with a ring | `Replaying`, asked from the watermark; the batch waits first in line |
//! | `Live` | a gap, no ring; a restart; a rejoin | `Live`, the workers cleared |
//! | `Filling` | the ring proves the process | `Filling`, `upto` = the ask's connection |
//! | `Filling` | the ring is another process's, or rolled past the watermark | `Filling` from 0, workers cleared, older held batches dropped |
//! | `Replaying` | the ring is another process's, or rolled | `Live`, the gap given up (a resync) |
//! | `Filling`, `Replaying` | done, silent, overflowed, or waited out | `Live`, held batches judged in order |
//! | `Live` | a pause of `LATE_JOIN_READS_MS` after a fill its connection sent nothing live since | `Filling` from the watermark |
//! | any | unreachable for `engine_gone_ms` | `Gone`: workers cleared, stream forgotten, held dropped |
//! | any | the gate opens | workers cleared again if `Gone` came while it was closed |
//!
//! # Asking the ring
//!
//! A fill or a gap's replay asks from the watermark itself (from 0 without
//! one) and checks the first answer, as above; a request asked again after
//! holes (ROUTER drops) checks the watermark it has reached by then. A
//! request ends at its end marker or its bound, or when no reply came for
//! `replay_timeout_ms`, or after a `REPLAY_IDLE_MS` pause once replies
//! flowed (then it is asked again from the first missing batch while each
//! request makes progress). A ring that keeps answering is read whole
//! while no live batch waits; while live batches wait (`Held::waiting_since`)
//! it ends at `REPLAY_SPAN_TIMEOUTS` replay timeouts from when the first of
//! them began waiting, but never before one timeout of its own, and at once
//! if the held batches overflowed.
//!
//! # A late subscription
//!
//! A PUB socket drops what it sends before our subscription reaches it,
//! and the listener cannot see when that is. Batches the engine sent in
//! that window after the fill read its ring show up as a gap at the next
//! live batch; an engine that goes quiet first sends none. So while a
//! connection has delivered nothing live since its fill, the ring is read
//! again (a fill from the watermark, checked the same way) after each
//! pause of `LATE_JOIN_READS_MS`; the first live batch of the connection
//! ends that. An engine quiet past the last pause with a subscription
//! still not through is the corner left (docs/limits.md).

mod ask;
mod held;
mod ring;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub(crate) use held::HeldAccount;

use self::ask::Ask;
use self::held::Held;
use super::budget::{Budget, Charge, HELD_SHARE};
use super::config::{IngestConfig, DP_RANKS_PER_LISTENER_MAX, REPLAY_IDLE_MS, REPLAY_SPAN_TIMEOUTS};
use super::counters::Counters;
use super::decode::Batch;
use super::log::LogLimiter;
use super::sequencer::{Origin, Sequencer, Verdict, Watermark};
use super::status::ListenerShared;
use crate::event::WorkerId;
use crate::wire::RawEvent;

/// What the stream asks of the world.
pub(crate) trait Port {
    /// Hands a batch of `worker` to its shard, after its earlier ones, with
    /// its charge to the budget; false once the pipeline shuts down
    /// (nothing was handed).
    fn apply(&mut self, worker: WorkerId, events: Vec<RawEvent>, ts: f64, charge: Charge) -> bool;
    /// Clears `worker` through its shard, after its earlier batches.
    fn clear(&mut self, worker: WorkerId);
    /// Asks the ring for every batch from `from` on, on a new request: a
    /// request in flight is dropped with its late replies. `Err`: why not.
    fn ask(&mut self, from: u64) -> Result<(), String>;
    /// Drops the request in flight, if any.
    fn stop_asking(&mut self);
}

/// What a transition reads besides the stream.
pub(crate) struct Cx<'a> {
    pub cfg: &'a IngestConfig,
    pub counters: &'a Counters,
    pub held: &'a HeldAccount,
    pub budget: &'a Budget,
    pub shared: &'a ListenerShared,
    pub gate_open: bool,
    pub now: Instant,
}

impl Cx<'_> {
    fn bump(&self, counter: &AtomicU64, by: u64) {
        counter.fetch_add(by, Ordering::Relaxed);
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.replay_timeout_ms)
    }
}

/// Where the stream is (see the table in the module doc).
#[derive(Debug)]
pub(crate) enum Phase {
    /// Batches are judged as they come (held while the gate is closed).
    Live,
    /// A ring fill is due once the publisher is up and the gate open;
    /// live batches wait for it.
    FillDue,
    /// A ring fill runs: everything past the watermark, up to the live
    /// stream. Live batches are held.
    Filling(Ask),
    /// A gap's replay runs; the batch that showed the gap waits first in
    /// line. Live batches are held.
    Replaying(Ask),
    /// The publisher stayed unreachable for `engine_gone_ms`: its workers
    /// were cleared and the stream forgotten until it is back.
    Gone,
}

/// A ring read due after a fill that no live batch of its connection
/// followed (see "A late subscription" in the module doc).
#[derive(Copy, Clone, Debug)]
struct LateRead {
    conn: u32,
    due: Instant,
    /// Which of `LATE_JOIN_READS_MS`.
    round: usize,
}

/// A range of connections, by number.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Conns {
    since: u32,
    upto: u32,
}

/// Where an applied batch came from: the sequencer marks each differently.
#[derive(Copy, Clone)]
enum Source {
    Live,
    Replay,
    /// A ring fill that asked from `from`, whose live copies connection
    /// `conn` may still deliver.
    Fill {
        from: u64,
        conn: u32,
    },
}

/// How a batch's connection stands (see "Connections and provenance").
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Provenance {
    /// Before the stream's process: a dead one's.
    Dead,
    /// The stream's process, or nothing yet to tell it from.
    Known,
    /// Not known to reach the stream's process; `rejoin` after a lost connection.
    Unproven { rejoin: bool },
}

/// One listener key's stream.
pub(crate) struct Stream {
    /// The registered (instance, dp rank).
    key: WorkerId,
    /// For log lines.
    endpoint: String,
    /// The engine's replay endpoint, if it has one.
    ring: Option<String>,
    seq: Sequencer,
    /// Connections known to reach the process whose batches the stream
    /// holds; None before any was (a kept or seeded watermark, or nothing).
    proven: Option<Conns>,
    /// The newest connection whose handshake the listener saw (0: none).
    latest: u32,
    /// Whether `latest` is up.
    up: bool,
    /// The newest connection a live batch came on (0: none).
    live_conn: u32,
    late: Option<LateRead>,
    phase: Phase,
    held: Held,
    /// Dp ranks this stream has named (the registered one first): the
    /// workers a restart or resync clears.
    ranks: Vec<u32>,
    /// The workers were cleared for want of the engine while the gate was
    /// closed: startup recovery may have loaded a peer's blocks for them
    /// since, so they are cleared again when it opens.
    clear_at_gate: bool,
    log: LogLimiter,
    /// How gaps ended (replayed, missed, resynced): apart from `log` so the
    /// line saying a gap recovered is not swallowed by the one before.
    gap_log: LogLimiter,
}

impl Stream {
    /// A stream for `key` reading `endpoint` (and its `ring`), resuming
    /// from `kept` (an earlier registration's or a snapshot's watermark,
    /// whose stream also wrote to `ranks_written`).
    pub(crate) fn new(
        key: WorkerId,
        endpoint: String,
        ring: Option<String>,
        kept: Option<Watermark>,
        ranks_written: Vec<u32>,
    ) -> Stream {
        let mut ranks = vec![key.dp_rank];
        // Deduplicated and bounded by `Ingest::seed_watermark`.
        ranks.extend(ranks_written.into_iter().filter(|&r| r != key.dp_rank));
        Stream {
            key,
            endpoint,
            phase: if ring.is_some() { Phase::FillDue } else { Phase::Live },
            ring,
            seq: Sequencer::new(kept),
            proven: None,
            latest: 0,
            up: false,
            live_conn: 0,
            late: None,
            held: Held::default(),
            ranks,
            clear_at_gate: false,
            log: LogLimiter::default(),
            gap_log: LogLimiter::default(),
        }
    }

    /// The watermark, as `/workers` and snapshots show it.
    pub(crate) fn watermark(&self) -> Option<Watermark> {
        self.seq.watermark()
    }

    #[cfg(test)]
    pub(crate) fn phase(&self) -> &Phase {
        &self.phase
    }

    /// Whether the ring is being asked (its replies are to be read).
    pub(crate) fn asking(&self) -> bool {
        self.ask().is_some()
    }

    /// The stream ends (its listener is removed): its watermark, and every
    /// dp rank it named (the workers it fed).
    pub(crate) fn end(mut self, account: &HeldAccount) -> (Option<Watermark>, Vec<u32>) {
        self.held.clear(account);
        if let Some(kept) = self.ask_mut().and_then(|ask| ask.rolled.take()) {
            // Their charges go with them; the gauge counted them too.
            account.gauge.fetch_sub(kept.len() as u64, Ordering::Relaxed);
        }
        (self.seq.watermark(), self.ranks)
    }

    // Inputs.

    /// Connection `conn`, newer than any before, completed its handshake.
    pub(crate) fn connected(&mut self, cx: &Cx, port: &mut dyn Port, conn: u32) {
        debug_assert!(conn > self.latest, "connections are numbered in order");
        self.latest = conn;
        self.up = true;
        self.late = None;
        if self.ring.is_some() {
            // Whatever a running ask gets now may be another process's.
            if let Phase::Replaying(_) = self.take_ask(cx, port) {
                cx.bump(&cx.counters.replays_failed, 1);
            }
            self.phase = Phase::FillDue;
        } else if matches!(self.phase, Phase::Gone) {
            self.phase = Phase::Live;
        }
        self.advance(cx, port);
    }

    /// The connection dropped. A running ask is dropped with it: nothing
    /// an answer says from now on can be told to be this connection's
    /// process's (the ring's port may be taken by the next one first).
    pub(crate) fn disconnected(&mut self, cx: &Cx, port: &mut dyn Port) {
        self.up = false;
        self.late = None;
        if self.ring.is_some() && self.asking() {
            if let Phase::Replaying(_) = self.take_ask(cx, port) {
                cx.bump(&cx.counters.replays_failed, 1);
            }
            self.phase = Phase::FillDue;
        }
    }

    /// The publisher stayed unreachable for `engine_gone_ms`: its workers
    /// may hold blocks it no longer has (a dead engine's, forever), so
    /// they are cleared, and the stream starts over when it is back.
    pub(crate) fn gone(&mut self, cx: &Cx, port: &mut dyn Port) {
        cx.bump(&cx.counters.engine_gone_clears, 1);
        let secs = cx.cfg.engine_gone_ms as f64 / 1_000.0;
        crate::warn!(
            "listener {}: engine unreachable for {secs} s (--engine-gone-s); clearing its workers until it is back",
            cx.shared.label
        );
        cx.shared
            .set_error(format!("{} unreachable for {secs} s: its blocks were cleared; reconnecting", self.endpoint));
        if let Phase::Replaying(_) = self.take_ask(cx, port) {
            cx.bump(&cx.counters.replays_failed, 1);
        }
        self.held.clear(cx.held);
        self.late = None;
        self.clear_workers(port);
        self.seq.reset();
        // Every connection so far reached the engine that is gone.
        self.proven = Some(Conns { since: self.latest + 1, upto: self.latest });
        // The gate opens after recovery has loaded a peer's dump, if any.
        self.clear_at_gate = !cx.gate_open;
        self.phase = Phase::Gone;
    }

    /// The ready gate opened (`cx.gate_open` says so from now on).
    pub(crate) fn gate_opened(&mut self, cx: &Cx, port: &mut dyn Port) {
        self.advance(cx, port);
    }

    /// A live batch, with the connection it came on.
    pub(crate) fn live(&mut self, cx: &Cx, port: &mut dyn Port, batch: Batch) {
        // The connection's subscription took: a batch it missed shows as a gap.
        self.live_conn = self.live_conn.max(batch.conn);
        if self.late.is_some_and(|late| batch.conn >= late.conn) {
            self.late = None;
        }
        // A fill due asks before this batch is judged, so the batch bounds it.
        self.advance(cx, port);
        if self.asking() || !cx.gate_open || !self.held.is_empty() {
            let last = self.seq.last();
            let bound = match &mut self.phase {
                // Only a connection the fill's answer will speak for bounds it.
                Phase::Filling(ask) => batch.conn <= ask.conn && ask.bound_by_live(batch.seq, last),
                _ => false,
            };
            if bound {
                // Kept past the hold limits, as a gap's trigger is: the fill
                // ends here and the stream goes on from this batch.
                self.held.waiting_since.get_or_insert(cx.now);
                self.held.push_unbounded(cx.held, batch, false);
            } else {
                self.hold(cx, batch);
            }
            if self.fill_reached_live() {
                // Everything the ring could add, the live stream has.
                self.finish(cx, port);
            }
            return;
        }
        self.judge(cx, port, batch);
    }

    /// A reply to the ring request in flight: a batch, or the end marker.
    pub(crate) fn reply(&mut self, cx: &Cx, port: &mut dyn Port, reply: Option<Batch>) {
        let budget = cx.cfg.replay_batches_max;
        if !self.asking() {
            return;
        }
        if self.seq.last().is_none() {
            // Nothing to check the answer against: it starts the stream.
            self.start_on_ring(cx);
        }
        let filling = matches!(self.phase, Phase::Filling(_));
        let Some(ask) = self.ask_mut() else { return };
        ask.replies += 1;
        ask.last_reply = cx.now;
        let over_budget = ask.replies >= budget;
        let (verifying, unbounded) = (ask.verify.is_some(), ask.to.is_none());
        match reply {
            // The ring ended before our batch `last`.
            None if verifying => return self.another_process(cx, port, None),
            // A fill no live batch bounded ends with the ring.
            None if filling && unbounded => return self.ring_ended(cx, port),
            None => return self.ended(cx, port),
            Some(batch) => self.on_replayed(cx, port, batch),
        }
        if over_budget && self.asking() {
            self.finish(cx, port);
        }
    }

    /// When a ring read after a quiet fill is due, if one is (`tick` does it).
    pub(crate) fn late_due(&self) -> Option<Instant> {
        self.late.map(|late| late.due)
    }

    /// Time passed: a ring read may be due, a running ask may have run out
    /// (see the module doc).
    pub(crate) fn tick(&mut self, cx: &Cx, port: &mut dyn Port) {
        if self.late.is_some_and(|late| cx.now >= late.due) {
            self.late_read(cx, port);
        }
        let Some(ask) = self.ask() else { return };
        let (now, timeout) = (cx.now, cx.timeout());
        let waited_out = |since: Instant| now >= (since + timeout * REPLAY_SPAN_TIMEOUTS).max(ask.started + timeout);
        let why = if ask.overflowed {
            // Waiting longer only makes the gap the dropped batches leave longer.
            "stopped: the live batches held meanwhile overflowed".to_string()
        } else if self.held.waiting_since.is_some_and(waited_out) {
            let span_ms = cx.cfg.replay_timeout_ms * u64::from(REPLAY_SPAN_TIMEOUTS);
            format!("timed out: live batches waited {span_ms} ms behind it")
        } else if ask.progressed() {
            // Replies flowed; a pause ends them (the rest was dropped), however short the timeout.
            if now - ask.last_reply >= Duration::from_millis(REPLAY_IDLE_MS) {
                self.ended(cx, port);
            }
            return;
        } else if ask.silent(now, timeout) {
            // Nothing at all came: a slow or unreachable ring. While retries
            // are left and no live batch waited out, ask it again: its
            // answer is what tells the process.
            if !ask.answered() && self.reask(cx, port) {
                return;
            }
            format!("timed out: no reply for {} ms", cx.cfg.replay_timeout_ms)
        } else {
            return;
        };
        let what = if matches!(self.phase, Phase::Filling(_)) { "ring fill" } else { "replay" };
        cx.shared.set_error(format!("{what} from {} {why}", self.ring.as_deref().unwrap_or("")));
        self.finish(cx, port);
    }

    // Moving on.

    /// Does what the stream can do now: clear at the gate's opening, start
    /// a due fill, judge held batches.
    fn advance(&mut self, cx: &Cx, port: &mut dyn Port) {
        if !cx.gate_open {
            return;
        }
        if std::mem::take(&mut self.clear_at_gate) {
            crate::info!(
                "listener {}: its engine was gone during startup recovery; clearing its workers again",
                cx.shared.label
            );
            self.clear_workers(port);
        }
        loop {
            match self.phase {
                Phase::FillDue if self.up => {
                    self.start_fill(cx, port, None);
                    return;
                }
                // Bounded by the held queue: each round takes one batch out,
                // and an ask started on the way stops the drain.
                Phase::Live => match self.held.pop(cx.held) {
                    Some(batch) => self.judge(cx, port, batch),
                    None => {
                        self.held.caught_up();
                        // Batches dropped unjudged past what was judged:
                        // the ring has them if they were its process's.
                        let last = self.seq.last();
                        let over = self.held.dropped_newest.take().is_some_and(|s| last.is_none_or(|l| s > l));
                        if !(over && self.ring.is_some()) {
                            return;
                        }
                        self.phase = Phase::FillDue;
                    }
                },
                _ => return,
            }
        }
    }

    /// Judges a batch in line (live, or held and now first) and acts on it.
    fn judge(&mut self, cx: &Cx, port: &mut dyn Port, batch: Batch) {
        if self.seq.take_filled_copy(batch.seq, batch.conn, batch.digest) {
            // A ring fill applied it before the live stream delivered it.
            return cx.bump(&cx.counters.duplicates_dropped, 1);
        }
        let mut origin = match self.provenance(batch.conn) {
            Provenance::Dead => return self.drop_dead(cx, 1),
            // The fill due will tell whether its connection reaches the
            // stream's process: it waits for it.
            Provenance::Unproven { .. } if matches!(self.phase, Phase::FillDue) => return self.hold(cx, batch),
            Provenance::Known => Origin::Same,
            Provenance::Unproven { rejoin } => Origin::New { rejoin },
        };
        // At most two rounds: a restart or rejoin resets the sequencer,
        // after which the batch starts a new stream and is neither.
        for _ in 0..2 {
            match self.seq.judge_live(batch.seq, origin, batch.digest) {
                Verdict::Apply => {
                    if matches!(origin, Origin::New { .. }) && self.seq.last().is_some() {
                        // The one case nothing here can tell from a new process.
                        cx.bump(&cx.counters.unverified_continuations, 1);
                    }
                    self.prove(batch.conn);
                    return self.apply(cx, port, batch, Source::Live);
                }
                Verdict::Duplicate => {
                    cx.bump(&cx.counters.duplicates_dropped, 1);
                    let (endpoint, seq) = (&self.endpoint, batch.seq);
                    return self.log.debug(|| format!("dropped batch {seq} from {endpoint}: already applied"));
                }
                verdict @ (Verdict::Restart | Verdict::Rejoin) => {
                    let (endpoint, seq, last) = (&self.endpoint, batch.seq, seq_text(self.seq.last()));
                    if verdict == Verdict::Restart {
                        cx.bump(&cx.counters.restarts, 1);
                        self.log.warn(|| {
                            format!("publisher {endpoint} restarted (seq {seq} after {last}); clearing its workers")
                        });
                    } else {
                        cx.bump(&cx.counters.gaps_detected, 1);
                        cx.bump(&cx.counters.resyncs, 1);
                        self.log.warn(|| {
                            format!(
                                "reconnected to {endpoint} with batches missing (seq {seq} after {last}); \
                                 it may be a new process: clearing its workers and replaying from 0"
                            )
                        });
                    }
                    self.clear_workers(port);
                    self.seq.reset();
                    // The batch's connection reaches the new process, and no
                    // earlier one is known to.
                    self.proven = Some(Conns { since: batch.conn, upto: batch.conn });
                    origin = Origin::Same;
                }
                Verdict::Gap { from, to, fresh } => {
                    if !fresh {
                        cx.bump(&cx.counters.gaps_detected, 1);
                        self.log
                            .debug(|| format!("gap in the stream of {}: batches {from}..{to} missing", self.endpoint));
                    }
                    if self.ring.is_some() && !self.up {
                        // Read from a connection that has dropped: the ring
                        // is asked on the next one, whose fill covers the gap.
                        self.phase = Phase::FillDue;
                        self.held.push_unbounded(cx.held, batch, true);
                        return;
                    }
                    if self.start_replay(cx, port, to) {
                        // The trigger is older than anything held: it goes first.
                        self.held.push_unbounded(cx.held, batch, true);
                        return;
                    }
                    self.give_up(cx, port, (from, to), fresh, "lost", None);
                    self.prove(batch.conn);
                    return self.apply(cx, port, batch, Source::Live);
                }
            }
        }
    }

    fn provenance(&self, conn: u32) -> Provenance {
        match self.proven {
            Some(c) if conn < c.since => Provenance::Dead,
            Some(c) if conn <= c.upto => Provenance::Known,
            Some(_) => Provenance::Unproven { rejoin: true },
            // A kept or seeded watermark: no connection has shown its process.
            None if self.seq.last().is_some() => Provenance::Unproven { rejoin: false },
            None => Provenance::Known,
        }
    }

    /// A batch of `conn` continued the stream: its connection reaches the
    /// stream's process.
    fn prove(&mut self, conn: u32) {
        self.proven = Some(match self.proven {
            Some(c) => Conns { since: c.since, upto: c.upto.max(conn) },
            None => Conns { since: conn, upto: conn },
        });
    }

    /// Drops every held batch unjudged (their provenance is unknown at a
    /// new start); returns the newest seq dropped, overflowed ones included.
    fn drop_held(&mut self, cx: &Cx) -> Option<u64> {
        let newest = self.held.iter().map(|b| b.seq).chain(self.held.dropped_newest).max();
        let dropped = self.held.clear(cx.held);
        self.drop_dead(cx, dropped);
        newest
    }

    fn drop_dead(&self, cx: &Cx, n: u64) {
        if n > 0 {
            cx.bump(&cx.counters.unproven_dropped, n);
        }
    }

    fn hold(&mut self, cx: &Cx, batch: Batch) {
        let asking = self.asking();
        if asking {
            self.held.waiting_since.get_or_insert(cx.now);
        }
        let limits = (cx.cfg.held_batches_max, cx.budget.bytes_max() / HELD_SHARE);
        let seq = batch.seq;
        if self.held.push(cx.held, batch, limits).is_ok() {
            return;
        }
        // Dropping the newest keeps the held run contiguous; the loss shows
        // up as a gap once the stream catches up.
        cx.bump(&cx.counters.held_dropped, 1);
        self.held.dropped_unjudged(seq);
        if let Some(ask) = self.ask_mut() {
            ask.overflowed = true;
        }
        if !std::mem::replace(&mut self.held.dropping, true) {
            let (n, kib) = (self.held.len(), self.held.bytes() >> 10);
            let why = if asking { "its engine's ring is asked" } else { "startup recovery runs" };
            crate::warn!(
                "{}: holding {n} batches ({kib} KiB) while {why}; newer batches are dropped (at most {} batches \
                 and 1/{HELD_SHARE} of --ingest-budget-mib a listener) and replayed or resynced afterwards",
                self.endpoint,
                cx.cfg.held_batches_max,
            );
        }
    }

    fn apply(&mut self, cx: &Cx, port: &mut dyn Port, batch: Batch, source: Source) {
        let (seq, digest) = (batch.seq, batch.digest);
        let rank = batch.dp_rank.unwrap_or(self.key.dp_rank);
        let events = match batch.events {
            Ok(events) if self.track_rank(cx, rank) => events,
            unusable => {
                // Nothing usable in this batch: it counts as lost.
                let fresh = self.seq.last().is_none();
                let why = if unusable.is_err() { "undecodable" } else { "unusable (dp rank past the limit)" };
                return self.give_up(cx, port, (seq, seq + 1), fresh, why, Some(digest));
            }
        };
        if !port.apply(WorkerId::new(self.key.instance_id, rank), events, batch.ts, batch.charge) {
            return;
        }
        match source {
            Source::Live => self.seq.accept_live(seq, digest),
            Source::Replay => self.seq.accept(seq, Some(digest)),
            Source::Fill { from, conn } => self.seq.accept_filled(from, seq, digest, conn),
        }
    }

    /// Records `rank` as one this stream writes to; false past the limit.
    fn track_rank(&mut self, cx: &Cx, rank: u32) -> bool {
        if self.ranks.contains(&rank) {
            return true;
        }
        if self.ranks.len() >= DP_RANKS_PER_LISTENER_MAX {
            cx.bump(&cx.counters.dp_rank_limit_dropped, 1);
            return false;
        }
        self.ranks.push(rank);
        true
    }

    /// Clears every worker this stream wrote to, through their shards.
    fn clear_workers(&self, port: &mut dyn Port) {
        for &rank in &self.ranks {
            port.clear(WorkerId::new(self.key.instance_id, rank));
        }
    }

    /// Gives up on batches `from..to`, saying why (`lost`, `undecodable`).
    /// Mid-stream the worker may now hold blocks the engine evicted in
    /// them, so it is cleared (a resync) and rebuilt by later events. On a
    /// fresh stream the worker holds nothing those batches could have
    /// changed, so it is left as is.
    /// `digest`: of the batch given up, when it is one batch that arrived
    /// but cannot be used (a ring's copy of it has the same).
    #[allow(clippy::too_many_arguments)]
    fn give_up(
        &mut self,
        cx: &Cx,
        port: &mut dyn Port,
        (from, to): (u64, u64),
        fresh: bool,
        why: &str,
        digest: Option<u64>,
    ) {
        debug_assert!(from < to);
        let missing = to - from;
        if fresh {
            cx.bump(&cx.counters.batches_missed_at_join, missing);
        } else {
            cx.bump(&cx.counters.batches_lost, missing);
            cx.bump(&cx.counters.resyncs, 1);
            let endpoint = &self.endpoint;
            self.gap_log.warn(|| format!("{why} batches {from}..{to} from {endpoint}; clearing its workers to resync"));
            self.clear_workers(port);
        }
        self.seq.accept(to - 1, digest);
    }
}

/// A watermark for a log line: the seq, or "none" before the first.
fn seq_text(seq: Option<u64>) -> String {
    seq.map_or_else(|| "none".to_string(), |s| s.to_string())
}

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod restart_tests;
#[cfg(test)]
mod tests;

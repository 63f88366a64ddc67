//! A listener thread: owns many SUB sockets (one per registered publisher),
//! their monitor sockets and any replay DEALER sockets in flight. It sleeps
//! in one epoll wait (`poller.rs`) until a socket or its doorbell is ready,
//! then reads only the sockets that are, each until it has nothing more or
//! `RECV_BURST_MAX` (then it is looked at again without waiting). Each
//! message is decoded here, judged by the listener's sequencer, and handed
//! to the shard that owns its worker, or applied here when this thread runs
//! the pipeline's one shard (`Shard`). An idle thread costs nothing: no
//! timeout, no scan of its sockets.
//!
//! Nothing here blocks on one publisher: replay sockets are read every
//! round without waiting (while a replay runs, a wait is bounded by
//! `poll_timeout_ms`, for its replies and its deadline), and a listener
//! whose replay runs (or whose ready gate is closed) holds its live batches
//! in a bounded queue. A listener whose publisher is unreachable has a
//! deadline (`engine_gone_ms`) in the thread's heap, which bounds the wait
//! too; a thread whose publishers are all reachable waits without one. The
//! only blocking call is the send to a full shard queue, which is the
//! intended back-pressure. The thread never waits while something is
//! readable: what arrived while it worked is read in its next round at
//! once, so the work itself is the only batching window (see `outbox.rs`
//! for how batches meet a busy shard).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, Sender, TryRecvError};
use rustc_hash::FxHashMap;

use super::config::{
    IngestConfig, DP_RANKS_PER_LISTENER_MAX, RECV_BURST_MAX, REPLAY_IDLE_MS, REPLAY_RETRIES_MAX, REPLAY_SPAN_TIMEOUTS,
};
use super::connection::Connection;
use super::counters::Counters;
use super::decode::{decode_live, decode_reply, Batch, Frames};
use super::gone::{Deadlines, Due, Reach};
use super::log::LogLimiter;
use super::outbox::Outbox;
use super::poller::{Doorbell, Poller, BELL};
use super::replay::ReplayRun;
use super::sequencer::{Sequencer, Verdict, Watermark};
use super::shard::ShardMsg;
use super::status::{ListenerId, ListenerShared, ListenerSpec};
use super::zmq_context::{ZmqContext, ZmqSocket};
use crate::event::WorkerId;

/// A listener ready to be run: sockets created and connected by the API.
pub(crate) struct NewListener {
    pub id: ListenerId,
    pub spec: ListenerSpec,
    pub sub: ZmqSocket,
    /// PAIR socket receiving the SUB socket's monitor events.
    pub monitor: ZmqSocket,
    pub shared: Arc<ListenerShared>,
    /// Watermark kept from an earlier registration of the same key, or
    /// seeded from a snapshot.
    pub last_seq: Option<Watermark>,
    /// Other dp ranks the earlier stream of the key wrote to (a snapshot's):
    /// a restart must clear them too.
    pub ranks_written: Vec<u32>,
}

/// Requests from the API to a listener thread.
pub(crate) enum Control {
    Add(Box<NewListener>),
    /// Close the listener; once acknowledged, nothing more from it reaches
    /// a shard.
    Remove {
        id: ListenerId,
        done: Sender<Removed>,
    },
}

/// What a removed listener leaves behind.
#[derive(Default)]
pub(crate) struct Removed {
    /// Its final watermark.
    pub last_seq: Option<Watermark>,
    /// Every dp rank its stream named (the registered one first): the
    /// workers it fed.
    pub ranks: Vec<u32>,
}

/// What every listener thread shares.
pub(crate) struct ThreadCtx {
    pub ctx: ZmqContext,
    pub cfg: IngestConfig,
    /// The way to the shards (one's state, when this thread runs it).
    pub outbox: RefCell<Outbox>,
    pub counters: Arc<Counters>,
    /// Where this thread receives each message.
    pub frames: RefCell<Frames>,
    pub held_gauge: Arc<AtomicU64>,
    /// Bytes of the batches this thread's listeners hold (`held_bytes_max`).
    pub held_bytes: Cell<usize>,
    pub gate_open: Arc<AtomicBool>,
    pub shutdown: Arc<AtomicBool>,
    /// Rung after a control message is queued, the gate opens, or shutdown.
    pub bell: Arc<Doorbell>,
}

impl ThreadCtx {
    fn bump(&self, counter: &AtomicU64, by: u64) {
        counter.fetch_add(by, Ordering::Relaxed);
    }

    /// Hands `msg` to the shard that owns `worker` (see `Outbox::send`).
    fn to_shard(&self, worker: WorkerId, msg: ShardMsg) -> bool {
        self.outbox.borrow_mut().send(worker, msg)
    }
}

/// One listener's state on its thread.
struct Listener {
    id: ListenerId,
    spec: ListenerSpec,
    sub: ZmqSocket,
    monitor: ZmqSocket,
    shared: Arc<ListenerShared>,
    seq: Sequencer,
    /// The watermark `shared` shows (published when it moves).
    published: Cell<Option<Watermark>>,
    /// Dp ranks this stream has named (the registered one first): the
    /// workers a restart or resync must clear.
    ranks: Vec<u32>,
    /// Live batches waiting for a replay to finish or the gate to open.
    held: VecDeque<Batch>,
    /// Held batches are being dropped (a limit was reached); said once until
    /// the held queue empties.
    held_dropping: bool,
    replay: Option<ReplayRun>,
    /// When the first of the replays run back to back (a fill, then the gap
    /// its bound shows, say) started: together they end at
    /// `REPLAY_SPAN_TIMEOUTS` timeouts from here, so a slow ring holds the
    /// live stream that long at most. None once the held queue empties.
    replaying_since: Option<Instant>,
    /// A ring fill is due once the publisher is reachable and the ready
    /// gate open: set when the listener starts and when its stream was reset
    /// for want of its engine; dropped once a fill, a gap's replay or a live
    /// batch in order has taken the stream on from its watermark.
    fill_pending: bool,
    /// The connection came back while a fill ran: fill again (see `refill`).
    refill: bool,
    /// Its workers were cleared for want of the engine while the ready gate
    /// was closed: startup recovery may load a peer's blocks for them after
    /// that clear, so it is made again when the gate opens (`clear_if_still_gone`).
    gone_while_closed: bool,
    conn: Connection,
    /// Whether the publisher is reachable, and its `engine_gone_ms` deadline.
    reach: Reach,
    /// The monitor was read short of `EAGAIN` (at its burst cap): look again.
    monitor_more: bool,
    log: LogLimiter,
    /// How gaps ended (replayed, missed, resynced): kept apart from `log`
    /// so the line saying a gap recovered is not swallowed by the one before.
    gap_log: LogLimiter,
}

/// Token kinds, the low two bits of a poll token (the listener id above
/// them). Sorted tokens put a listener's monitor before its SUB socket:
/// connection events first, so a restart's reconnect is known before the
/// restarted publisher's first batch is judged.
const MONITOR: u64 = 0;
const SUB: u64 = 1;
const REPLAY: u64 = 2;

fn token(id: ListenerId, kind: u64) -> u64 {
    id.0 << 2 | kind
}

/// A thread's listeners, by id.
type Listeners = FxHashMap<u64, Listener>;

/// What the listener loop keeps from one round to the next, besides its
/// listeners.
#[derive(Default)]
struct Round {
    /// Sockets to read without waiting: read short of EAGAIN, or just added.
    hot: Vec<u64>,
    /// Listeners with a replay running: their sockets, and deadlines.
    replaying: Vec<u64>,
    gone: Deadlines,
    ready: Vec<u64>,
    /// Listeners whose watermark may have moved since the last `flush`.
    touched: Vec<u64>,
}

impl Round {
    /// Arms `l`'s gone deadline and notes a replay it runs (both may have
    /// changed with what it just read or did).
    fn track(&mut self, l: &mut Listener) {
        self.touched.push(l.id.0);
        self.gone.arm(l.id.0, &mut l.reach);
        if l.replay.is_some() && !self.replaying.contains(&l.id.0) {
            self.replaying.push(l.id.0);
        }
    }
}

/// The listener thread's loop: runs until shutdown.
pub(crate) fn run_listener_thread(t: ThreadCtx, control: Receiver<Control>) {
    let mut poller = match Poller::new(&t.bell) {
        Ok(p) => p,
        Err(e) => {
            crate::error!("a listener thread cannot create its epoll set: {e}; its engines are not read");
            return;
        }
    };
    let mut ls = Listeners::default();
    let mut r = Round::default();
    let mut bell_rang = true;
    while !t.shutdown.load(Ordering::Relaxed) {
        // What the last round made reaches the shards before any control
        // message is taken (a removed listener's batches come first).
        flush(&t, &ls, &mut r.touched);
        if std::mem::take(&mut bell_rang)
            && (!take_control(&t, &control, &poller, &mut ls, &mut r) || t.shutdown.load(Ordering::Relaxed))
        {
            return;
        }
        flush(&t, &ls, &mut r.touched);
        r.ready.clear();
        // A running replay bounds the wait, for its deadline and its replies.
        let timeout = match (r.hot.is_empty(), r.replaying.is_empty()) {
            (false, _) => 0,
            (true, true) => -1,
            (true, false) => i32::try_from(t.cfg.poll_timeout_ms).unwrap_or(i32::MAX),
        };
        // An unreachable publisher's deadline bounds it too.
        let timeout = r.gone.bound(timeout, Instant::now());
        if let Err(e) = poller.wait(timeout, &t.bell, &mut r.ready) {
            // Nothing was read. Pause so a lasting error cannot spin the thread.
            crate::error!("waiting on engine sockets failed: {e}");
            std::thread::sleep(Duration::from_millis(t.cfg.poll_timeout_ms));
            continue;
        }
        bell_rang = read_ready(&t, &mut ls, &mut r);
        r.replaying.retain(|id| {
            let Some(l) = ls.get_mut(id) else { return false };
            r.touched.push(*id);
            l.check_replay_deadline(&t);
            r.gone.arm(*id, &mut l.reach);
            l.replay.is_some()
        });
        clear_gone(&t, &mut ls, &mut r.gone, &mut r.touched);
    }
}

/// Takes every control message waiting, then, with the gate open, starts
/// due fills and drains held batches. False when the control side is gone.
fn take_control(
    t: &ThreadCtx,
    control: &Receiver<Control>,
    poller: &Poller,
    ls: &mut Listeners,
    r: &mut Round,
) -> bool {
    loop {
        match control.try_recv() {
            Ok(msg) => handle_control(t, poller, ls, &mut r.hot, &mut r.gone, msg),
            Err(TryRecvError::Empty) => break,
            Err(TryRecvError::Disconnected) => return false,
        }
    }
    if t.gate_open.load(Ordering::Acquire) {
        for l in ls.values_mut() {
            l.clear_if_still_gone(t);
            l.start_fill_if_due(t);
            // Draining may read the monitor.
            l.drain_held(t);
            r.track(l);
        }
    }
    true
}

/// Reads every socket the wait found ready, the hot ones and those of
/// running replays, in token order; whether the bell rang.
fn read_ready(t: &ThreadCtx, ls: &mut Listeners, r: &mut Round) -> bool {
    let mut ready = std::mem::take(&mut r.ready);
    ready.append(&mut r.hot);
    // A replay's socket is not in the epoll set: it is read every round.
    ready.extend(r.replaying.iter().map(|id| id << 2 | REPLAY));
    ready.sort_unstable();
    ready.dedup();
    let mut bell_rang = false;
    for &tok in &ready {
        if tok == BELL {
            bell_rang = true;
            continue;
        }
        let Some(l) = ls.get_mut(&(tok >> 2)) else { continue };
        let more = match tok & 3 {
            MONITOR => l.read_monitor(t),
            SUB => l.read_live(t),
            _ => l.read_replies(t),
        };
        if more {
            r.hot.push(tok);
        }
        if std::mem::take(&mut l.monitor_more) {
            r.hot.push(token(l.id, MONITOR));
        }
        l.after_read(t);
        r.track(l);
    }
    r.ready = ready;
    bell_rang
}

/// Clears the workers of every listener whose deadline passed with its
/// publisher still unreachable. Each round pops only due entries.
fn clear_gone(t: &ThreadCtx, ls: &mut Listeners, gone: &mut Deadlines, touched: &mut Vec<u64>) {
    let now = Instant::now();
    while let Some(id) = gone.pop_due(now) {
        let Some(l) = ls.get_mut(&id) else { continue };
        touched.push(id);
        if gone.settle(id, &mut l.reach, now) == Due::Gone {
            l.engine_gone(t);
        }
    }
}

/// Sends what this round made to the shards, then publishes each
/// listener's watermark: a watermark the API can read never runs ahead of
/// what reached its shard's queue (a snapshot reads the watermarks first,
/// then drains the shards), including the clears of a restart or resync.
fn flush(t: &ThreadCtx, ls: &Listeners, touched: &mut Vec<u64>) {
    t.outbox.borrow_mut().flush();
    for id in touched.drain(..) {
        let Some(l) = ls.get(&id) else { continue };
        let watermark = l.seq.watermark();
        if l.published.replace(watermark) != watermark {
            l.shared.set_watermark(watermark);
        }
    }
}

fn handle_control(
    t: &ThreadCtx,
    poller: &Poller,
    ls: &mut Listeners,
    hot: &mut Vec<u64>,
    gone: &mut Deadlines,
    msg: Control,
) {
    match msg {
        Control::Add(new) => {
            let NewListener { id, spec, sub, monitor, shared, last_seq, ranks_written } = *new;
            for (socket, kind) in [(&monitor, MONITOR), (&sub, SUB)] {
                if let Err(e) = poller.add(socket, token(id, kind)) {
                    crate::error!("listener {id} ({}): cannot watch its socket: {e}", spec.endpoint);
                }
                // Whatever arrived before it was watched is read now.
                hot.push(token(id, kind));
            }
            let seq = Sequencer::new(last_seq, t.cfg.restart_seq_drop_min);
            let mut ranks = vec![spec.worker.dp_rank];
            // Deduplicated and bounded by `seed_watermark`.
            ranks.extend(ranks_written.into_iter().filter(|&r| r != spec.worker.dp_rank));
            let (held, replay, conn, log, gap_log) =
                (VecDeque::new(), None, Connection::new(), LogLimiter::default(), LogLimiter::default());
            let reach = Reach::new(t.cfg.engine_gone(), Instant::now());
            let fill_pending = spec.replay_endpoint.is_some();
            let mut l = Listener {
                id,
                spec,
                sub,
                monitor,
                shared,
                published: Cell::new(seq.watermark()),
                seq,
                ranks,
                held,
                held_dropping: false,
                replaying_since: None,
                replay,
                fill_pending,
                refill: false,
                gone_while_closed: false,
                conn,
                reach,
                monitor_more: false,
                log,
                gap_log,
            };
            gone.arm(id.0, &mut l.reach);
            ls.insert(id.0, l);
        }
        Control::Remove { id, done } => {
            gone.remove(id.0);
            let removed = match ls.remove(&id.0) {
                Some(l) => {
                    // Out of the epoll set before the sockets close.
                    poller.remove(&l.sub);
                    poller.remove(&l.monitor);
                    t.held_gauge.fetch_sub(l.held.len() as u64, Ordering::Relaxed);
                    t.held_bytes.set(t.held_bytes.get() - l.held.iter().map(Batch::bytes).sum::<usize>());
                    Removed { last_seq: l.seq.watermark(), ranks: l.ranks }
                }
                None => Removed::default(),
            };
            let _ = done.send(removed);
        }
    }
}

impl Listener {
    /// Reads the monitor's events; true if it stopped at the burst cap.
    fn read_monitor(&mut self, t: &ThreadCtx) -> bool {
        let read = self.conn.read(&self.monitor, &self.spec.endpoint, &self.shared);
        if read.reconnected {
            self.seq.note_connected();
            // What a fill applied may be of a process that is gone now.
            self.refill |= self.replay.as_ref().is_some_and(|run| run.fill);
            self.fill_after_reconnect(t);
        }
        self.reach.note(self.conn.is_up(), read.came_up, t.cfg.engine_gone(), Instant::now());
        read.more
    }

    /// After a reconnect nothing live need show what was missed (an idle
    /// engine, a restarted one whose first batches went out before we were
    /// back): a fill from the watermark is due, which also tells the same
    /// process from a new one. A gap's replay running is dropped for it (its
    /// replies would be judged as the old stream's); its trigger, held,
    /// bounds the fill.
    fn fill_after_reconnect(&mut self, t: &ThreadCtx) {
        if self.seq.last().is_none() || self.spec.replay_endpoint.is_none() {
            return;
        }
        if self.replay.as_ref().is_some_and(|run| !run.fill) {
            self.replay = None;
            t.bump(&t.counters.replays_failed, 1);
        }
        self.fill_pending = true;
    }

    /// What a round's read may have made due: a refill after a reconnect,
    /// a ring fill now that the publisher is reachable.
    fn after_read(&mut self, t: &ThreadCtx) {
        if std::mem::take(&mut self.refill) && self.replay.as_ref().is_some_and(|run| run.fill) {
            // Replies of the old connection may still come, and the old
            // connection's held batches may be a dead process's: start over.
            crate::info!(
                "listener {}: reconnected during its ring fill; clearing and filling again",
                self.shared.label
            );
            if self.seq.last().is_some() {
                t.bump(&t.counters.resyncs, 1);
            }
            self.forget_stream(t);
        }
        self.start_fill_if_due(t);
    }

    /// Asks the publisher's ring for everything past the watermark, if a
    /// fill is due, the publisher reachable, the gate open and no replay runs.
    fn start_fill_if_due(&mut self, t: &ThreadCtx) {
        if !self.fill_pending || !self.conn.is_up() || self.replay.is_some() || !t.gate_open.load(Ordering::Acquire) {
            return;
        }
        let Some(endpoint) = self.spec.replay_endpoint.as_deref() else {
            self.fill_pending = false;
            return;
        };
        let last = self.seq.last();
        // From the watermark itself: the ring's batch `last` says whether
        // it is still the stream we hold (see `on_replayed`).
        let from = last.unwrap_or(0);
        // Live batches held while the gate was closed: the first past the
        // watermark bounds the fill (the live stream has it and what follows).
        let to = self.held.iter().map(|b| b.seq).find(|&seq| last.is_none_or(|last| seq > last));
        if last.is_none() && to == Some(0) {
            self.fill_pending = false;
            return;
        }
        let (timeout_ms, batches_max) = (t.cfg.replay_timeout_ms, t.cfg.replay_batches_max);
        match ReplayRun::start(&t.ctx, endpoint, true, (from, to), timeout_ms, batches_max) {
            Ok(mut run) => {
                t.bump(&t.counters.ring_fills, 1);
                self.fill_pending = false;
                crate::debug!("asked {endpoint} for its ring from batch {from}");
                run.verify = self.seq.watermark();
                self.replaying_since.get_or_insert(run.started);
                self.replay = Some(run);
            }
            Err(e) => {
                // Still due: asked again at the listener's next read.
                self.shared.set_error(e.clone());
                self.log.warn(|| e);
            }
        }
    }

    /// A fill from the watermark found no batch `last`, or another one: the
    /// publisher is another process (or its ring rolled past the
    /// watermark), so what the workers hold may be stale. They are cleared
    /// and filled from 0; held live batches are the new connection's.
    fn another_stream(&mut self, t: &ThreadCtx, found: Option<u64>) {
        let Some(run) = self.replay.take() else {
            return;
        };
        let last = run.verify.map_or(run.from, |w| w.seq);
        let endpoint = self.spec.replay_endpoint.as_deref().unwrap_or("");
        // Another batch `last`, or nothing from there (a ring keeps the
        // newest batches, so the same process's ring holds some past
        // `last`), is another process: a restart. A ring that starts past
        // `last` may be the same process's, rolled past the watermark:
        // counted as a resync, as a gap across a reconnect is.
        let (found, counter) = match found {
            Some(seq) if seq == last => (format!("another batch {last}"), &t.counters.restarts),
            Some(seq) => (format!("batch {seq} first"), &t.counters.resyncs),
            None => ("nothing from there".to_string(), &t.counters.restarts),
        };
        t.bump(counter, 1);
        self.log.warn(|| {
            format!(
                "ring {endpoint} holds {found}, not our batch {last}: a new process (or a ring past our \
                 watermark); clearing its workers and filling from 0"
            )
        });
        self.clear_workers(t);
        self.seq.reset();
        self.fill_pending = true;
        self.start_fill_if_due(t);
    }

    /// The publisher stayed unreachable for `engine_gone_ms`: its workers
    /// may hold blocks it no longer has (a dead engine's, forever), so they
    /// are cleared. The listener keeps reconnecting; when the publisher is
    /// back, a ring fill and its live stream refill them.
    fn engine_gone(&mut self, t: &ThreadCtx) {
        t.bump(&t.counters.engine_gone_clears, 1);
        let secs = t.cfg.engine_gone_ms as f64 / 1_000.0;
        crate::warn!(
            "listener {}: engine unreachable for {secs} s (--engine-gone-s); clearing its workers until it is back",
            self.shared.label
        );
        self.shared.set_error(format!(
            "{} unreachable for {secs} s: its blocks were cleared; reconnecting",
            self.spec.endpoint
        ));
        // The gate opens after recovery has loaded a peer's dump, if any.
        self.gone_while_closed = !t.gate_open.load(Ordering::Acquire);
        self.forget_stream(t);
    }

    /// Clears the workers again if they were cleared for want of the engine
    /// while the gate was closed and the engine is still away: a peer's dump
    /// applied since may have put its blocks back. Once, at the gate's opening.
    fn clear_if_still_gone(&mut self, t: &ThreadCtx) {
        if std::mem::take(&mut self.gone_while_closed) && self.reach.gone() {
            crate::info!(
                "listener {}: engine still unreachable once recovery is done; clearing its workers again",
                self.shared.label
            );
            self.clear_workers(t);
        }
    }

    /// Clears the workers and starts the stream over: no replay, nothing
    /// held, no watermark, a fill due once the publisher is reachable.
    fn forget_stream(&mut self, t: &ThreadCtx) {
        if self.replay.take().is_some_and(|run| !run.fill) {
            t.bump(&t.counters.replays_failed, 1);
        }
        while self.pop_held(t).is_some() {}
        self.clear_workers(t);
        self.seq.reset();
        self.fill_pending = self.spec.replay_endpoint.is_some();
    }

    /// Reads live batches; true if it stopped at the burst cap.
    fn read_live(&mut self, t: &ThreadCtx) -> bool {
        // One clock read per burst: its batches arrive within microseconds.
        let mut stamped = false;
        for _ in 0..RECV_BURST_MAX {
            let decoded = {
                let mut frames = t.frames.borrow_mut();
                if !frames.recv(&self.sub) {
                    return false;
                }
                decode_live(&frames)
            };
            match decoded {
                Ok(batch) => {
                    t.bump(&t.counters.batches_received, 1);
                    self.shared.batches_received.fetch_add(1, Ordering::Relaxed);
                    if !std::mem::replace(&mut stamped, true) {
                        self.shared.note_batch();
                    }
                    self.note_undecodable(t, &batch);
                    self.on_live(t, batch);
                }
                Err(e) => {
                    t.bump(&t.counters.malformed_messages, 1);
                    self.log.warn(|| format!("dropped a malformed message from {}: {e}", self.spec.endpoint));
                }
            }
        }
        true
    }

    fn note_undecodable(&mut self, t: &ThreadCtx, batch: &Batch) {
        if let Err(e) = &batch.events {
            t.bump(&t.counters.undecodable_batches, 1);
            self.log.warn(|| format!("batch {} from {} does not decode: {e}", batch.seq, self.spec.endpoint));
        }
    }

    fn on_live(&mut self, t: &ThreadCtx, batch: Batch) {
        let gate_open = t.gate_open.load(Ordering::Acquire);
        // A fill due (the gate just opened, say) asks before this batch is
        // judged, so the batch bounds it rather than starting a replay.
        self.start_fill_if_due(t);
        let last = self.seq.last();
        let bound = self.replay.as_mut().is_some_and(|run| run.bound_by_live(batch.seq, last));
        if self.replay.is_some() || !gate_open || !self.held.is_empty() {
            if bound {
                // Kept past the hold limits, as a gap's trigger is: the
                // fill ends here and the stream goes on from this batch.
                self.push_held(t, batch, false);
            } else {
                self.hold(t, batch);
            }
            if self.fill_reached_live() {
                // Everything the ring could add, the live stream has.
                self.finish_replay(t);
            } else if gate_open {
                self.drain_held(t);
            }
            return;
        }
        self.sequence_live(t, batch);
    }

    fn hold(&mut self, t: &ThreadCtx, batch: Batch) {
        let bytes = batch.bytes();
        if self.held.len() >= t.cfg.held_batches_max || t.held_bytes.get() + bytes > t.cfg.held_bytes_max {
            // Dropping the newest keeps the held run contiguous; the loss
            // shows up as a gap once the listener catches up.
            t.bump(&t.counters.held_dropped, 1);
            if let Some(run) = self.replay.as_mut() {
                run.overflowed = true;
            }
            if !std::mem::replace(&mut self.held_dropping, true) {
                let (n, mib) = (self.held.len(), t.held_bytes.get() >> 20);
                let why = if self.replay.is_some() { "a replay runs" } else { "startup recovery runs" };
                crate::warn!(
                    "{}: holding {n} batches ({mib} MiB on this thread) while {why}; newer batches are dropped \
                     (at most {} batches a listener, {} MiB a thread) and replayed or resynced afterwards",
                    self.spec.endpoint,
                    t.cfg.held_batches_max,
                    t.cfg.held_bytes_max >> 20
                );
            }
            return;
        }
        self.push_held(t, batch, false);
    }

    fn push_held(&mut self, t: &ThreadCtx, batch: Batch, front: bool) {
        t.held_bytes.set(t.held_bytes.get() + batch.bytes());
        t.bump(&t.held_gauge, 1);
        if front {
            self.held.push_front(batch);
        } else {
            self.held.push_back(batch);
        }
    }

    fn pop_held(&mut self, t: &ThreadCtx) -> Option<Batch> {
        let Some(batch) = self.held.pop_front() else {
            self.held_dropping = false;
            if self.replay.is_none() {
                self.replaying_since = None;
            }
            return None;
        };
        t.held_bytes.set(t.held_bytes.get() - batch.bytes());
        t.held_gauge.fetch_sub(1, Ordering::Relaxed);
        Some(batch)
    }

    fn drain_held(&mut self, t: &ThreadCtx) {
        // Bounded by the held queue: each round takes one batch out, and a
        // replay started on the way stops the drain.
        while self.replay.is_none() {
            let Some(batch) = self.pop_held(t) else {
                return;
            };
            self.sequence_live(t, batch);
        }
    }

    fn sequence_live(&mut self, t: &ThreadCtx, batch: Batch) {
        if self.seq.covers_filled(batch.seq) {
            // A ring fill applied it before the live stream delivered it,
            // unless the socket reconnected meanwhile (which ends the window).
            self.monitor_more |= self.read_monitor(t);
            if self.seq.take_filled_copy(batch.seq) {
                t.bump(&t.counters.duplicates_dropped, 1);
                return;
            }
        }
        // At most three rounds: a duplicate or a gap is judged again once
        // after a monitor check, and a restart or rejoin resets the
        // sequencer, after which the batch starts a new stream and cannot be
        // a duplicate, restart or rejoin.
        let mut monitor_checked = false;
        for _ in 0..3 {
            match self.seq.judge_live(batch.seq) {
                Verdict::Apply => {
                    // The stream goes on from its watermark: no fill needed.
                    self.fill_pending = false;
                    return self.apply(t, batch, Source::Live);
                }
                Verdict::Duplicate | Verdict::Gap { fresh: false, .. } if !monitor_checked => {
                    // A step back is a restart, and a gap a rejoin, if the socket
                    // reconnected: make sure a reconnect already queued on the
                    // monitor is known.
                    monitor_checked = true;
                    self.monitor_more |= self.read_monitor(t);
                }
                Verdict::Duplicate => {
                    t.bump(&t.counters.duplicates_dropped, 1);
                    let (endpoint, seq) = (&self.spec.endpoint, batch.seq);
                    self.log.debug(|| format!("dropped batch {seq} from {endpoint}: already applied"));
                    return;
                }
                verdict @ (Verdict::Restart | Verdict::Rejoin) => {
                    let (endpoint, seq, last) = (&self.spec.endpoint, batch.seq, seq_text(self.seq.last()));
                    if verdict == Verdict::Restart {
                        t.bump(&t.counters.restarts, 1);
                        self.log.warn(|| {
                            format!("publisher {endpoint} restarted (seq {seq} after {last}); clearing its workers")
                        });
                    } else {
                        t.bump(&t.counters.gaps_detected, 1);
                        t.bump(&t.counters.resyncs, 1);
                        self.log.warn(|| {
                            format!(
                                "reconnected to {endpoint} with batches missing (seq {seq} after {last}); \
                                 it may be a new process: clearing its workers and replaying from 0"
                            )
                        });
                    }
                    self.clear_workers(t);
                    self.seq.reset();
                }
                Verdict::Gap { from, to, fresh } => {
                    if !fresh {
                        t.bump(&t.counters.gaps_detected, 1);
                        self.log.debug(|| {
                            format!("gap in the stream of {}: batches {from}..{to} missing", self.spec.endpoint)
                        });
                    }
                    if self.start_replay(t, from, to) {
                        // The trigger is older than anything held: it goes first.
                        self.push_held(t, batch, true);
                        return;
                    }
                    self.give_up(t, from, to, fresh);
                    return self.apply(t, batch, Source::Live);
                }
            }
        }
    }

    /// Starts a replay of `from..to` if the listener has a replay endpoint.
    fn start_replay(&mut self, t: &ThreadCtx, from: u64, to: u64) -> bool {
        let Some(endpoint) = self.spec.replay_endpoint.as_deref() else {
            return false;
        };
        // A replay from the watermark takes the place of a pending fill.
        self.fill_pending = false;
        let (timeout_ms, batches_max) = (t.cfg.replay_timeout_ms, t.cfg.replay_batches_max);
        match ReplayRun::start(&t.ctx, endpoint, false, (from, Some(to)), timeout_ms, batches_max) {
            Ok(run) => {
                t.bump(&t.counters.replays_started, 1);
                self.replaying_since.get_or_insert(run.started);
                self.replay = Some(run);
                crate::debug!("asked {endpoint} to replay batches {from}..{to}");
                true
            }
            Err(e) => {
                t.bump(&t.counters.replays_started, 1);
                t.bump(&t.counters.replays_failed, 1);
                self.shared.set_error(e.clone());
                self.log.warn(|| e);
                false
            }
        }
    }

    /// Gives up on batches `from..to`. Mid-stream the worker may now hold
    /// blocks the engine evicted in them, so it is cleared (a resync) and
    /// rebuilt by later events. On a fresh stream the worker holds nothing
    /// those batches could have changed, so it is left as is.
    fn give_up(&mut self, t: &ThreadCtx, from: u64, to: u64, fresh: bool) {
        self.give_up_because(t, from, to, fresh, "lost");
    }

    /// `give_up`, saying why the batches are missing (`lost`, `undecodable`).
    fn give_up_because(&mut self, t: &ThreadCtx, from: u64, to: u64, fresh: bool, why: &str) {
        debug_assert!(from < to);
        let missing = to - from;
        if fresh {
            t.bump(&t.counters.batches_missed_at_join, missing);
        } else {
            t.bump(&t.counters.batches_lost, missing);
            t.bump(&t.counters.resyncs, 1);
            self.gap_log.warn(|| {
                format!("{why} batches {from}..{to} from {}; clearing its workers to resync", self.spec.endpoint)
            });
            self.clear_workers(t);
        }
        self.seq.accept(to - 1, None);
    }

    fn apply(&mut self, t: &ThreadCtx, batch: Batch, source: Source) {
        let (seq, digest) = (batch.seq, batch.digest);
        let rank = batch.dp_rank.unwrap_or(self.spec.worker.dp_rank);
        let events = match batch.events {
            Ok(events) if self.track_rank(t, rank) => events,
            unusable => {
                // Nothing usable in this batch: it counts as lost.
                let fresh = self.seq.last().is_none();
                let why = if unusable.is_err() { "undecodable" } else { "unusable (dp rank past the limit)" };
                self.give_up_because(t, seq, seq + 1, fresh, why);
                return;
            }
        };
        let worker = WorkerId::new(self.spec.worker.instance_id, rank);
        let (block_size, sink, ts) = (self.spec.block_size, Arc::clone(&self.spec.sink), batch.ts);
        let msg = ShardMsg::Batch { worker, block_size, sink, events, ts };
        if !t.to_shard(worker, msg) {
            return;
        }
        match source {
            Source::Live => self.seq.accept_live(seq, digest),
            Source::Replay => self.seq.accept(seq, Some(digest)),
            Source::Fill { from } => self.seq.accept_filled(from, seq, digest),
        }
    }

    /// Records `rank` as one this stream writes to; false past the limit.
    fn track_rank(&mut self, t: &ThreadCtx, rank: u32) -> bool {
        if self.ranks.contains(&rank) {
            return true;
        }
        if self.ranks.len() >= DP_RANKS_PER_LISTENER_MAX {
            t.bump(&t.counters.dp_rank_limit_dropped, 1);
            return false;
        }
        self.ranks.push(rank);
        true
    }

    /// Clears every worker this stream wrote to, through their shards, so
    /// the clear lands after their pending batches and before any new one.
    fn clear_workers(&self, t: &ThreadCtx) {
        for &rank in &self.ranks {
            let worker = WorkerId::new(self.spec.worker.instance_id, rank);
            t.to_shard(worker, ShardMsg::Clear { worker, sink: Arc::clone(&self.spec.sink) });
        }
    }

    /// Reads replay replies; true if it stopped at the burst cap.
    fn read_replies(&mut self, t: &ThreadCtx) -> bool {
        for _ in 0..RECV_BURST_MAX {
            let Some(run) = self.replay.as_mut() else {
                return false;
            };
            let decoded = {
                let mut frames = t.frames.borrow_mut();
                if !frames.recv(&run.socket) {
                    return false;
                }
                decode_reply(&frames)
            };
            run.replies += 1;
            run.last_reply = Instant::now();
            let over_budget = run.replies >= t.cfg.replay_batches_max;
            match decoded {
                // The ring ended before our batch `last`.
                Ok(None) if run.verify.is_some() => {
                    self.another_stream(t, None);
                    return false;
                }
                // A fill that no live batch bounded ends with the ring.
                Ok(None) if run.to.is_none() => {
                    self.finish_replay(t);
                    return false;
                }
                Ok(None) => {
                    self.replay_ended(t);
                    return false;
                }
                Ok(Some(batch)) => self.on_replayed(t, batch),
                Err(e) => {
                    t.bump(&t.counters.malformed_messages, 1);
                    let endpoint = self.spec.replay_endpoint.as_deref().unwrap_or("");
                    self.log.warn(|| format!("dropped a malformed replay reply from {endpoint}: {e}"));
                }
            }
            if over_budget && self.replay.is_some() {
                self.finish_replay(t);
                return false;
            }
        }
        true
    }

    fn on_replayed(&mut self, t: &ThreadCtx, batch: Batch) {
        let Some(run) = self.replay.as_mut() else {
            return;
        };
        if let Some(expect) = run.verify {
            if batch.seq < expect.seq {
                return t.bump(&t.counters.duplicates_dropped, 1);
            }
            if batch.seq > expect.seq || expect.digest.is_some_and(|d| d != batch.digest) {
                return self.another_stream(t, Some(batch.seq));
            }
            // Our batch `last`, as we applied it: the same stream goes on.
            run.verify = None;
            self.seq.confirm();
            return;
        }
        if run.past_end(batch.seq) {
            // Replies come in seq order: everything below `to` has been sent.
            return self.replay_ended(t);
        }
        let (to, source) = (run.to, if run.fill { Source::Fill { from: run.from } } else { Source::Replay });
        self.note_undecodable(t, &batch);
        match self.seq.judge_replayed(batch.seq) {
            Verdict::Apply => {}
            Verdict::Gap { from, fresh, .. } => {
                // Lost in transit (asked again), or the buffer no longer
                // holds `from..seq`.
                if self.retry_replay(t, from) {
                    return;
                }
                if let Some(run) = self.replay.as_mut() {
                    run.missing += batch.seq - from;
                }
                self.give_up(t, from, batch.seq, fresh);
            }
            Verdict::Duplicate | Verdict::Restart | Verdict::Rejoin => {
                // The watermark did not move, so the replay cannot have
                // reached its end here.
                return t.bump(&t.counters.duplicates_dropped, 1);
            }
        }
        let seq = batch.seq;
        self.apply(t, batch, source);
        if let Some(run) = self.replay.as_mut() {
            run.note_applied(seq);
        }
        if to.is_some_and(|to| self.seq.last() == Some(to - 1)) {
            self.finish_replay(t);
        }
    }

    /// Whether a fill has nothing left to add: the live stream has the
    /// batch after the watermark.
    fn fill_reached_live(&self) -> bool {
        let next = self.seq.last().map_or(0, |last| last + 1);
        let fill = |run: &ReplayRun| run.fill && run.verify.is_none();
        self.replay.as_ref().is_some_and(|run| fill(run) && run.to.is_some_and(|to| next >= to))
    }

    fn check_replay_deadline(&mut self, t: &ThreadCtx) {
        let Some(run) = self.replay.as_ref() else {
            return;
        };
        let now = Instant::now();
        let why = if run.ran_past(now, self.replaying_since) {
            format!("timed out: still answering after {} ms", t.cfg.replay_timeout_ms * u64::from(REPLAY_SPAN_TIMEOUTS))
        } else if run.overflowed {
            // Waiting longer only makes the gap the dropped batches leave longer.
            "stopped: the live batches held meanwhile overflowed".to_string()
        } else if run.progressed() {
            // Replies flowed; a pause ends them (the rest was dropped), however short the timeout.
            if now - run.last_reply >= Duration::from_millis(REPLAY_IDLE_MS) {
                self.replay_ended(t);
            }
            return;
        } else if run.silent(now) {
            format!("timed out: no reply for {} ms", t.cfg.replay_timeout_ms)
        } else {
            return;
        };
        let endpoint = self.spec.replay_endpoint.as_deref().unwrap_or_default();
        let what = if run.fill { "ring fill" } else { "replay" };
        self.shared.set_error(format!("{what} from {endpoint} {why}"));
        self.finish_replay(t);
    }

    /// The replies stopped (end marker, a reply past the range, silence):
    /// if some of the range is still missing, ask again from there while
    /// that can help; otherwise finish.
    fn replay_ended(&mut self, t: &ThreadCtx) {
        let next = self.seq.last().map_or(0, |last| last + 1);
        // A fill no live batch bounded may have lost its tail: ask once more.
        if self.replay.as_ref().is_some_and(|run| run.to.is_none_or(|to| next < to)) && self.retry_replay(t, next) {
            return;
        }
        self.finish_replay(t);
    }

    /// Asks the replay endpoint again from `from`, if the current request
    /// made progress and retries are left; false when it did not.
    fn retry_replay(&mut self, t: &ThreadCtx, from: u64) -> bool {
        let (Some(endpoint), Some(run)) = (self.spec.replay_endpoint.as_deref(), self.replay.as_mut()) else {
            return false;
        };
        if !run.progressed() || run.retries >= REPLAY_RETRIES_MAX {
            return false;
        }
        match run.retry(&t.ctx, endpoint, from, t.cfg.replay_batches_max) {
            Ok(()) => {
                crate::debug!("asked {endpoint} again, from batch {from} (retry {})", run.retries);
                true
            }
            Err(e) => {
                self.log.warn(|| e);
                false
            }
        }
    }

    /// Ends the replay: whatever of `from..to` did not arrive is given up,
    /// the outcome is counted, and held live batches resume.
    fn finish_replay(&mut self, t: &ThreadCtx) {
        let Some(run) = self.replay.take() else {
            return;
        };
        let mut missing = run.missing;
        let next = self.seq.last().map_or(0, |last| last + 1);
        // A fill that a live batch bounded leaves the rest to the live rules:
        // that batch, judged next, shows a gap like any other, asked for
        // anew (the ring may have answered before the gap was published).
        if let Some(to) = run.to.filter(|&to| next < to && !run.fill) {
            missing += to - next;
            let fresh = self.seq.last().is_none();
            self.give_up(t, next, to, fresh);
        }
        if run.fill {
            self.fill_done(t, &run, missing);
        } else {
            self.replay_done(t, &run, missing);
        }
        if t.gate_open.load(Ordering::Acquire) {
            self.drain_held(t);
        }
    }

    /// Counts and logs a fill: one line per listener and fill.
    fn fill_done(&mut self, t: &ThreadCtx, run: &ReplayRun, missing: u64) {
        t.bump(&t.counters.batches_filled, run.applied);
        let endpoint = self.spec.replay_endpoint.as_deref().unwrap_or("");
        let got = match run.applied_seqs {
            Some((first, last)) => format!("{} batches ({first}..={last})", run.applied),
            None => "nothing".to_string(),
        };
        let asked = match run.to {
            Some(to) => format!("{}..{to}", run.from),
            None => format!("{}..", run.from),
        };
        let lost = if missing > 0 { format!("; {missing} batches were no longer there") } else { String::new() };
        let now = Instant::now();
        let late = if run.silent(now) || run.ran_past(now, self.replaying_since) { "; timed out" } else { "" };
        crate::info!(
            "listener {}: filled {got} from its ring {endpoint}, asked for {asked}{lost}{late}",
            self.shared.label
        );
    }

    /// Counts and logs a gap's replay.
    fn replay_done(&mut self, t: &ThreadCtx, run: &ReplayRun, missing: u64) {
        t.bump(&t.counters.batches_replayed, run.applied);
        let outcome = if missing == 0 {
            &t.counters.replays_ok
        } else if run.applied > 0 {
            &t.counters.replays_partial
        } else {
            &t.counters.replays_failed
        };
        t.bump(outcome, 1);
        let (from, to, applied) = (run.from, run.to.unwrap_or(run.from), run.applied);
        let (live, endpoint) = (&self.spec.endpoint, self.spec.replay_endpoint.as_deref().unwrap_or(""));
        if missing > 0 {
            self.gap_log.warn(|| format!("replay of {from}..{to} from {endpoint} missed {missing} batches"));
        } else {
            // The stream is whole again: an earlier replay's error is history.
            self.shared.clear_replay_error();
            self.gap_log.info(|| {
                format!(
                    "gap {from}..{to} in the stream of {live} recovered: {applied} batches replayed from {endpoint}"
                )
            });
        }
    }
}

/// Where an applied batch came from: the sequencer marks each differently.
#[derive(Copy, Clone)]
enum Source {
    Live,
    Replay,
    /// A ring fill that asked from `from`.
    Fill {
        from: u64,
    },
}

/// A watermark for a log line: the seq, or "none" before the first.
fn seq_text(seq: Option<u64>) -> String {
    seq.map_or_else(|| "none".to_string(), |s| s.to_string())
}

//! A listener thread: owns many listeners, each with its current SUB socket
//! and monitor (`subscriber.rs`: one socket per connection) and any ring
//! request in flight. It sleeps in one epoll wait (`poller.rs`) until a
//! socket or its doorbell is ready, then reads only the sockets that are,
//! each until it has nothing more or `RECV_BURST_MAX` (then it is looked at
//! again without waiting). What a socket says goes to the listener's
//! stream (`stream/`), which decides; its batches reach the shard that owns
//! their worker, or are applied here when this thread runs the pipeline's
//! one shard. An idle thread costs nothing: no timeout, no scan.
//!
//! Connections: a socket's monitor ends its attempt (connect failed,
//! handshake failed, connection dropped). A socket that had a connection
//! is read to the end first (what it holds came before the drop), then
//! closed, and the next socket is opened after a backoff
//! (`reconnect_ivl_ms`, doubled while attempts fail, with jitter); an
//! attempt that has not connected within `CONNECT_ATTEMPT_MS` is given up.
//! The stream learns each connection's number from its socket, so a batch
//! always carries the connection it came on.
//!
//! Nothing here blocks on one publisher: ring replies are read every round
//! without waiting (while a request runs, a wait is bounded by
//! `poll_timeout_ms`, for its deadlines), a listener whose publisher is
//! unreachable has an `engine_gone_ms` deadline in the thread's heap, and
//! one without a connection has its next attempt's time; these bound the
//! wait too. The only blocking call is the send to a full shard queue,
//! which is the intended back-pressure. What arrived while the thread
//! worked is read in its next round at once, so the work itself is the only
//! batching window (see `outbox.rs` for how batches meet a busy shard).

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, Sender, TryRecvError};
use rustc_hash::FxHashMap;

use super::budget::{Budget, Charge};
use super::config::{IngestConfig, CONNECT_ATTEMPT_MS, RECV_BURST_MAX, RING_PIPE_BATCHES};
use super::connection::Connection;
use super::counters::Counters;
use super::decode::{decode_live, decode_reply, Batch, Frames};
use super::gone::{Deadlines, Due, Reach};
use super::log::LogLimiter;
use super::outbox::Outbox;
use super::poller::{Doorbell, Poller, BELL};
use super::replay;
use super::sequencer::Watermark;
use super::shard::ShardMsg;
use super::status::{ListenerId, ListenerShared, ListenerSpec};
use super::stream::{Cx, HeldAccount, Port, Stream};
use super::subscriber::Subscriber;
use super::zmq_context::{ZmqContext, ZmqSocket};
use crate::event::WorkerId;
use crate::wire::RawEvent;

/// A listener ready to be run: its first socket opened by the API.
pub(crate) struct NewListener {
    pub id: ListenerId,
    pub spec: ListenerSpec,
    pub first: Subscriber,
    /// Names its sockets' monitors (`inproc://...`), unique in the process.
    pub monitor_base: String,
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
    /// What this thread's listeners hold.
    pub held: HeldAccount,
    /// The daemon's budget for batches received and not yet applied.
    pub budget: Arc<Budget>,
    /// Listeners running, on every thread (they share the budget).
    pub listeners: Arc<AtomicUsize>,
    /// Drops at the budget: one line per `BUDGET_LOG_INTERVAL_MS`.
    pub budget_log: RefCell<LogLimiter>,
    pub gate_open: Arc<AtomicBool>,
    pub shutdown: Arc<AtomicBool>,
    /// Rung after a control message is queued, the gate opens, or shutdown.
    pub bell: Arc<Doorbell>,
}

impl ThreadCtx {
    /// Hands `msg` to the shard that owns `worker` (see `Outbox::send`).
    fn to_shard(&self, worker: WorkerId, msg: ShardMsg) -> bool {
        self.outbox.borrow_mut().send(worker, msg)
    }
}

/// The stream's way out: shards and the ring.
struct Wire<'a> {
    t: &'a ThreadCtx,
    spec: &'a ListenerSpec,
    replay: &'a mut Option<ZmqSocket>,
}

impl Port for Wire<'_> {
    fn apply(&mut self, worker: WorkerId, events: Vec<RawEvent>, ts: f64, charge: Charge) -> bool {
        let (block_size, sink) = (self.spec.block_size, Arc::clone(&self.spec.sink));
        self.t.to_shard(worker, ShardMsg::Batch { worker, block_size, sink, events, ts, charge })
    }

    fn clear(&mut self, worker: WorkerId) {
        self.t.to_shard(worker, ShardMsg::Clear { worker, sink: Arc::clone(&self.spec.sink) });
    }

    fn ask(&mut self, from: u64) -> Result<(), String> {
        let Some(endpoint) = self.spec.replay_endpoint.as_deref() else {
            return Err(format!("{} has no replay endpoint", self.spec.endpoint));
        };
        let queue = self.t.cfg.replay_batches_max.min(RING_PIPE_BATCHES);
        *self.replay = Some(replay::request(&self.t.ctx, endpoint, from, queue)?);
        Ok(())
    }

    fn stop_asking(&mut self) {
        *self.replay = None;
    }
}

/// One listener's state on its thread.
struct Listener {
    id: ListenerId,
    spec: ListenerSpec,
    shared: Arc<ListenerShared>,
    monitor_base: String,
    /// The current connection attempt; None while the next one waits.
    sock: Option<Subscriber>,
    /// The current socket's handshake succeeded (its monitor said so).
    handshaken: bool,
    /// The current socket's connection dropped: what it received is read
    /// to the end, then it is closed.
    closing: bool,
    /// When the current attempt was made.
    opened_at: Instant,
    /// When the next attempt is due, while there is no socket.
    reopen_at: Option<Instant>,
    /// Connection attempts made (the current one's number).
    conns: u32,
    /// Attempts that did not connect since the last that did (backoff).
    failures: u32,
    /// Jitter for the backoff.
    rng: u64,
    conn: Connection,
    /// Whether the publisher is reachable, and its `engine_gone_ms` deadline.
    reach: Reach,
    /// The ring request in flight.
    replay: Option<ZmqSocket>,
    stream: Stream,
    /// The watermark `shared` shows (published when it moves).
    published: Cell<Option<Watermark>>,
    /// The monitor was read short of `EAGAIN` (at its burst cap): look again.
    monitor_more: bool,
    log: LogLimiter,
}

/// What one read of a SUB socket got.
enum Read {
    Nothing,
    /// A message, dropped because the ingest budget is spent.
    OverBudget,
    /// A message, decoded, and the connection it came on.
    Message(Result<Batch, String>, u32),
}

/// Token kinds, the low two bits of a poll token (the listener id above
/// them). Sorted tokens put a listener's monitor before its SUB socket.
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
    /// Listeners asking their ring: their replies, and deadlines.
    replaying: Vec<u64>,
    /// Listeners with a ring read due after a quiet fill (`Stream::late_due`).
    late: Vec<u64>,
    gone: Deadlines,
    ready: Vec<u64>,
    /// Listeners whose watermark may have moved since the last `flush`.
    touched: Vec<u64>,
    /// Listeners with no connection up: their next attempt, or the
    /// current one's deadline, bounds the wait.
    waiting: Vec<u64>,
}

impl Round {
    /// Arms `l`'s gone deadline and notes what it now waits for (all may
    /// have changed with what it just read or did).
    fn track(&mut self, l: &mut Listener) {
        self.touched.push(l.id.0);
        self.gone.arm(l.id.0, &mut l.reach);
        if l.stream.asking() && !self.replaying.contains(&l.id.0) {
            self.replaying.push(l.id.0);
        }
        if l.stream.late_due().is_some() && !self.late.contains(&l.id.0) {
            self.late.push(l.id.0);
        }
        if l.next_attempt().is_some() && !self.waiting.contains(&l.id.0) {
            self.waiting.push(l.id.0);
        }
        if std::mem::take(&mut l.monitor_more) {
            self.hot.push(token(l.id, MONITOR));
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
        let now = Instant::now();
        // A ring request bounds the wait, for its deadlines and its replies.
        let timeout = match (r.hot.is_empty(), r.replaying.is_empty()) {
            (false, _) => 0,
            (true, true) => -1,
            (true, false) => i32::try_from(t.cfg.poll_timeout_ms).unwrap_or(i32::MAX),
        };
        // So do an unreachable publisher's deadline and the next attempt.
        let timeout = r.gone.bound(timeout, now);
        let timeout = bound(timeout, r.waiting.iter().filter_map(|id| ls.get(id)?.next_attempt()).min(), now);
        let timeout = bound(timeout, r.late.iter().filter_map(|id| ls.get(id)?.stream.late_due()).min(), now);
        if let Err(e) = poller.wait(timeout, &t.bell, &mut r.ready) {
            // Nothing was read. Pause so a lasting error cannot spin the thread.
            crate::error!("waiting on engine sockets failed: {e}");
            std::thread::sleep(Duration::from_millis(t.cfg.poll_timeout_ms));
            continue;
        }
        bell_rang = read_ready(&t, &poller, &mut ls, &mut r);
        let now = Instant::now();
        r.replaying.retain(|id| {
            let Some(l) = ls.get_mut(id) else { return false };
            r.touched.push(*id);
            l.drive(&t, now, |s, cx, p| s.tick(cx, p));
            r.gone.arm(*id, &mut l.reach);
            // A fill that ran out here may have a ring read due after it.
            if l.stream.late_due().is_some() && !r.late.contains(id) {
                r.late.push(*id);
            }
            l.stream.asking()
        });
        for id in std::mem::take(&mut r.late) {
            let Some(l) = ls.get_mut(&id) else { continue };
            if l.stream.late_due().is_some_and(|due| now >= due) {
                l.drive(&t, now, |s, cx, p| s.tick(cx, p));
                // Notes its ask, and the next read if one is due.
                r.track(l);
            } else if l.stream.late_due().is_some() {
                r.late.push(id);
            }
        }
        attempt(&t, &poller, &mut ls, &mut r);
        clear_gone(&t, &mut ls, &mut r.gone, &mut r.touched);
    }
}

/// `timeout_ms` as epoll takes it, shortened to reach `at`, rounded up so a
/// wait never ends short of it.
fn bound(timeout_ms: i32, at: Option<Instant>, now: Instant) -> i32 {
    let Some(at) = at else { return timeout_ms };
    let until = i32::try_from(at.saturating_duration_since(now).as_micros().div_ceil(1_000)).unwrap_or(i32::MAX);
    if timeout_ms < 0 {
        until
    } else {
        timeout_ms.min(until)
    }
}

/// Takes every control message waiting, then, with the gate open, lets
/// each stream go on (a due fill, held batches). False when the control
/// side is gone.
fn take_control(
    t: &ThreadCtx,
    control: &Receiver<Control>,
    poller: &Poller,
    ls: &mut Listeners,
    r: &mut Round,
) -> bool {
    loop {
        match control.try_recv() {
            Ok(msg) => handle_control(t, poller, ls, r, msg),
            Err(TryRecvError::Empty) => break,
            Err(TryRecvError::Disconnected) => return false,
        }
    }
    if t.gate_open.load(Ordering::Acquire) {
        let now = Instant::now();
        for l in ls.values_mut() {
            l.drive(t, now, |s, cx, p| s.gate_opened(cx, p));
            r.track(l);
        }
    }
    true
}

/// Reads every socket the wait found ready, the hot ones and those of
/// running ring requests, in token order; whether the bell rang.
fn read_ready(t: &ThreadCtx, poller: &Poller, ls: &mut Listeners, r: &mut Round) -> bool {
    let mut ready = std::mem::take(&mut r.ready);
    ready.append(&mut r.hot);
    // A ring request's socket is not in the epoll set: it is read every round.
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
            MONITOR => l.read_monitor(t, poller),
            SUB => l.read_live(t, poller),
            _ => l.read_replies(t),
        };
        if more {
            r.hot.push(tok);
        }
        if l.closing {
            // A dropped connection's socket is read to the end at once.
            r.hot.push(token(l.id, SUB));
        }
        r.track(l);
    }
    r.ready = ready;
    bell_rang
}

/// Makes the connection attempts that are due, and gives up those that
/// took too long.
fn attempt(t: &ThreadCtx, poller: &Poller, ls: &mut Listeners, r: &mut Round) {
    let now = Instant::now();
    let mut i = 0;
    while i < r.waiting.len() {
        let Some(l) = ls.get_mut(&r.waiting[i]) else {
            r.waiting.swap_remove(i);
            continue;
        };
        if l.next_attempt().is_some_and(|at| at <= now) {
            if l.reopen_at.is_some() {
                l.reopen(t, poller, now, &mut r.hot);
            } else {
                // No handshake in time (an address that does not resolve,
                // a host that drops the TCP handshake): try again.
                l.conn.abandon();
                l.close_attempt(t, poller, now);
            }
            r.touched.push(l.id.0);
        }
        if l.next_attempt().is_some() {
            i += 1;
        } else {
            r.waiting.swap_remove(i);
        }
    }
}

/// Clears the workers of every listener whose deadline passed with its
/// publisher still unreachable. Each round pops only due entries.
fn clear_gone(t: &ThreadCtx, ls: &mut Listeners, gone: &mut Deadlines, touched: &mut Vec<u64>) {
    let now = Instant::now();
    while let Some(id) = gone.pop_due(now) {
        let Some(l) = ls.get_mut(&id) else { continue };
        touched.push(id);
        if gone.settle(id, &mut l.reach, now) == Due::Gone {
            l.drive(t, now, |s, cx, p| s.gone(cx, p));
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
        let watermark = l.stream.watermark();
        if l.published.replace(watermark) != watermark {
            l.shared.set_watermark(watermark);
        }
    }
}

fn handle_control(t: &ThreadCtx, poller: &Poller, ls: &mut Listeners, r: &mut Round, msg: Control) {
    match msg {
        Control::Add(new) => {
            let NewListener { id, spec, first, monitor_base, shared, last_seq, ranks_written } = *new;
            let stream =
                Stream::new(spec.worker, spec.endpoint.clone(), spec.replay_endpoint.clone(), last_seq, ranks_written);
            let now = Instant::now();
            let mut l = Listener {
                id,
                published: Cell::new(stream.watermark()),
                stream,
                spec,
                shared,
                monitor_base,
                sock: None,
                handshaken: false,
                closing: false,
                opened_at: now,
                reopen_at: None,
                conns: 0,
                failures: 0,
                rng: id.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
                conn: Connection::new(),
                reach: Reach::new(t.cfg.engine_gone(), now),
                replay: None,
                monitor_more: false,
                log: LogLimiter::default(),
            };
            l.watch(poller, first, now, &mut r.hot);
            r.track(&mut l);
            ls.insert(id.0, l);
        }
        Control::Remove { id, done } => {
            r.gone.remove(id.0);
            let removed = match ls.remove(&id.0) {
                Some(mut l) => {
                    // Out of the epoll set before the sockets close.
                    if let Some(sock) = l.sock.take() {
                        poller.remove(&sock.sub);
                        poller.remove(&sock.monitor);
                    }
                    let (last_seq, ranks) = l.stream.end(&t.held);
                    Removed { last_seq, ranks }
                }
                None => Removed::default(),
            };
            let _ = done.send(removed);
        }
    }
}

impl Listener {
    /// Feeds the stream one input, with its context and way out.
    fn drive(&mut self, t: &ThreadCtx, now: Instant, input: impl FnOnce(&mut Stream, &Cx, &mut dyn Port)) {
        let cx = Cx {
            cfg: &t.cfg,
            counters: &t.counters,
            held: &t.held,
            budget: &t.budget,
            shared: &self.shared,
            gate_open: t.gate_open.load(Ordering::Acquire),
            now,
        };
        let mut port = Wire { t, spec: &self.spec, replay: &mut self.replay };
        input(&mut self.stream, &cx, &mut port);
    }

    /// When the next connection attempt is due, or the current one is to be
    /// given up; None while connected.
    fn next_attempt(&self) -> Option<Instant> {
        match (&self.sock, self.reopen_at) {
            (None, at) => at,
            (Some(_), _) if !self.handshaken => Some(self.opened_at + Duration::from_millis(CONNECT_ATTEMPT_MS)),
            _ => None,
        }
    }

    /// Makes `sock` the current attempt and watches it.
    fn watch(&mut self, poller: &Poller, sock: Subscriber, now: Instant, hot: &mut Vec<u64>) {
        for (socket, kind) in [(&sock.monitor, MONITOR), (&sock.sub, SUB)] {
            if let Err(e) = poller.add(socket, token(self.id, kind)) {
                crate::error!("listener {}: cannot watch its socket: {e}", self.shared.label);
            }
            // Whatever arrived before it was watched is read now.
            hot.push(token(self.id, kind));
        }
        self.conns = sock.conn;
        self.sock = Some(sock);
        self.handshaken = false;
        self.closing = false;
        self.opened_at = now;
        self.reopen_at = None;
    }

    /// Shrinks the socket's receive queue to its share now that more
    /// listeners run (`budget::sub_queue_messages`): the sockets opened
    /// first would otherwise keep the large shares of a daemon with few
    /// listeners. Never grows it in place: libzmq restarts a stopped
    /// connection only when the reader has read a multiple of the queue's
    /// low-water mark since it last said so, and a larger mark moves those
    /// multiples past what the queue holds, so the connection would stay
    /// stopped for good; a larger share waits for the next connection.
    /// Not on a socket being read out after its connection dropped.
    fn fit_queue(&mut self, t: &ThreadCtx) {
        if self.closing {
            return;
        }
        let Some(sock) = &mut self.sock else { return };
        let listeners = t.listeners.load(Ordering::Relaxed);
        let want = super::budget::sub_queue_messages(t.cfg.budget_bytes, listeners, t.cfg.sub_rcvhwm_batches);
        if want < sock.queue && sock.sub.set_rcvhwm(want).is_ok() {
            sock.queue = want;
        }
    }

    /// Makes the next connection attempt.
    fn reopen(&mut self, t: &ThreadCtx, poller: &Poller, now: Instant, hot: &mut Vec<u64>) {
        let listeners = t.listeners.load(Ordering::Relaxed);
        match Subscriber::open(&t.ctx, &t.cfg, (&self.monitor_base, self.conns + 1), &self.spec.endpoint, listeners) {
            Ok(sock) => self.watch(poller, sock, now, hot),
            Err(e) => {
                let wait = self.backoff(&t.cfg);
                let label = &self.shared.label;
                self.log.warn(|| format!("listener {label}: cannot open its next connection ({e}); trying again"));
                self.reopen_at = Some(now + wait);
            }
        }
    }

    /// The wait before the next attempt: `reconnect_ivl_ms` doubled for each
    /// attempt that failed since the last connection (up to
    /// `reconnect_ivl_max_ms`), plus up to `reconnect_ivl_ms` at random.
    fn backoff(&mut self, cfg: &IngestConfig) -> Duration {
        let base = u64::from(cfg.reconnect_ivl_ms.max(1) as u32);
        let max = u64::from(cfg.reconnect_ivl_max_ms.max(0) as u32).max(base);
        let doubled = base.saturating_mul(1 << self.failures.min(20)).min(max);
        // xorshift: spreads many listeners that lost their engines at once.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        Duration::from_millis(doubled + self.rng % base)
    }

    /// Ends the current attempt: out of the epoll set, closed, and the next
    /// one due after the backoff.
    fn close_attempt(&mut self, t: &ThreadCtx, poller: &Poller, now: Instant) {
        if let Some(sock) = self.sock.take() {
            poller.remove(&sock.sub);
            poller.remove(&sock.monitor);
        }
        if !std::mem::take(&mut self.handshaken) {
            self.failures = self.failures.saturating_add(1);
        }
        self.closing = false;
        let wait = self.backoff(&t.cfg);
        self.reopen_at = Some(now + wait);
        self.conn.retrying(&self.spec.endpoint, &self.shared, wait.as_millis() as u64);
    }

    /// Reads the monitor's events; true if it stopped at the burst cap.
    fn read_monitor(&mut self, t: &ThreadCtx, poller: &Poller) -> bool {
        let Some(sock) = self.sock.as_ref().filter(|_| !self.closing) else {
            return false;
        };
        let conn = sock.conn;
        let read = self.conn.read(&sock.monitor, &self.spec.endpoint, &self.shared);
        let now = Instant::now();
        if read.came_up {
            self.handshaken = true;
            self.failures = 0;
            self.drive(t, now, |s, cx, p| s.connected(cx, p, conn));
        }
        self.reach.note(self.conn.is_up(), read.came_up, t.cfg.engine_gone(), now);
        if read.over {
            if self.handshaken {
                // Its connection dropped: what it received came before the
                // drop and is read first (`closing`), then it is closed.
                self.drive(t, now, |s, cx, p| s.disconnected(cx, p));
                self.closing = true;
            } else {
                self.close_attempt(t, poller, now);
            }
            return false;
        }
        read.more
    }

    /// Reads live batches; true if it stopped at the burst cap.
    fn read_live(&mut self, t: &ThreadCtx, poller: &Poller) -> bool {
        self.fit_queue(t);
        if self.sock.is_some() && !self.handshaken {
            // Data comes after the handshake: make sure the stream knows of it.
            self.monitor_more |= self.read_monitor(t, poller);
        }
        // One clock read per burst: its batches arrive within microseconds.
        let now = Instant::now();
        let mut stamped = false;
        for _ in 0..RECV_BURST_MAX {
            let read = {
                let Some(sock) = &self.sock else { return false };
                let mut frames = t.frames.borrow_mut();
                if !frames.recv(&sock.sub) {
                    Read::Nothing
                } else if t.budget.full(frames.bytes()) {
                    Read::OverBudget
                } else {
                    Read::Message(decode_live(&frames), sock.conn)
                }
            };
            let (decoded, conn) = match read {
                Read::Message(decoded, conn) => (decoded, conn),
                Read::OverBudget => {
                    // Dropped undecoded: a gap its stream asks the ring
                    // for once there is room again.
                    t.counters.budget_dropped.fetch_add(1, Ordering::Relaxed);
                    let mib = t.budget.bytes_max() >> 20;
                    t.budget_log.borrow_mut().warn(|| {
                        format!(
                            "ingest budget spent ({mib} MiB of batches received and not yet applied): dropping live \
                             batches, to be replayed from the engines' rings; raise --ingest-budget-mib or give the \
                             daemon CPU"
                        )
                    });
                    continue;
                }
                Read::Nothing => {
                    if self.closing {
                        self.close_attempt(t, poller, now);
                    }
                    return false;
                }
            };
            match decoded {
                Ok(mut batch) => {
                    batch.conn = conn;
                    batch.charge = t.budget.charge(batch.bytes());
                    t.counters.batches_received.fetch_add(1, Ordering::Relaxed);
                    self.shared.batches_received.fetch_add(1, Ordering::Relaxed);
                    if !std::mem::replace(&mut stamped, true) {
                        self.shared.note_batch();
                    }
                    self.note_undecodable(t, &batch);
                    self.drive(t, now, |s, cx, p| s.live(cx, p, batch));
                }
                Err(e) => {
                    t.counters.malformed_messages.fetch_add(1, Ordering::Relaxed);
                    self.log.warn(|| format!("dropped a malformed message from {}: {e}", self.spec.endpoint));
                }
            }
        }
        true
    }

    /// Reads ring replies; true if it stopped at the burst cap.
    fn read_replies(&mut self, t: &ThreadCtx) -> bool {
        let now = Instant::now();
        for _ in 0..RECV_BURST_MAX {
            let decoded = {
                let Some(socket) = &self.replay else { return false };
                let mut frames = t.frames.borrow_mut();
                if !frames.recv(socket) {
                    return false;
                }
                decode_reply(&frames)
            };
            match decoded {
                Ok(mut reply) => {
                    if let Some(batch) = &mut reply {
                        batch.charge = t.budget.charge(batch.bytes());
                        self.note_undecodable(t, batch);
                    }
                    self.drive(t, now, |s, cx, p| s.reply(cx, p, reply));
                }
                Err(e) => {
                    t.counters.malformed_messages.fetch_add(1, Ordering::Relaxed);
                    let endpoint = self.spec.replay_endpoint.as_deref().unwrap_or("");
                    self.log.warn(|| format!("dropped a malformed replay reply from {endpoint}: {e}"));
                }
            }
        }
        true
    }

    fn note_undecodable(&mut self, t: &ThreadCtx, batch: &Batch) {
        if let Err(e) = &batch.events {
            t.counters.undecodable_batches.fetch_add(1, Ordering::Relaxed);
            self.log.warn(|| format!("batch {} from {} does not decode: {e}", batch.seq, self.spec.endpoint));
        }
    }
}

//! A loopback ZMQ proxy that injects transport faults between a test engine
//! and the daemon: it drops, duplicates and reorders a configurable share of
//! batches, deterministically (a seeded PRNG decides per message, so the same
//! message order always meets the same faults), and can be paused.
//!
//! Its SUB side connects to a `TestPublisher`'s PUB socket; its PUB side
//! (XPUB, to see subscriptions) binds a free loopback port that the daemon
//! registers as the engine's endpoint. Replay requests do not pass through
//! it: the daemon asks the publisher's ROUTER directly, as it would ask an
//! engine's replay endpoint.
//!
//! - Drop: the batch is not forwarded.
//! - Duplicate: forwarded now, and a copy again after 1..=3 later batches.
//! - Reorder: held back and forwarded after 1..=3 later batches.
//! - Held copies go out when the engine falls silent for `IDLE_FLUSH_MS`, on
//!   `flush`, and when faults are switched off.
//! - Pause: the proxy stops reading, so batches wait in the sockets (none is
//!   lost) and flow again, through the faults, on resume.
//! - Rebind: the PUB side is closed and bound again on the same port, so the
//!   daemon sees a disconnect and a reconnect, as when a new engine process
//!   binds the port. Held copies die with the old connection.
//! - Unbind: the PUB side is closed and stays closed until `rebind`, as when
//!   the engine is killed: the daemon's connection closes and its attempts
//!   to connect are refused. Batches read meanwhile go nowhere.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::rng::Rng;
use super::{wait_until, WAIT_MS};

/// Shares of batches hit by each fault, in percent (their sum at most 100).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    pub drop_pct: u64,
    pub dup_pct: u64,
    pub reorder_pct: u64,
}

impl Faults {
    /// No faults: every batch is forwarded once, in order.
    pub const NONE: Faults = Faults { drop_pct: 0, dup_pct: 0, reorder_pct: 0 };
    /// Every batch is dropped (a link that is down while the engine publishes).
    pub const BLACKOUT: Faults = Faults { drop_pct: 100, dup_pct: 0, reorder_pct: 0 };

    /// `drop`, `dup` and `reorder` percent.
    pub const fn new(drop_pct: u64, dup_pct: u64, reorder_pct: u64) -> Faults {
        Faults { drop_pct, dup_pct, reorder_pct }
    }
}

/// What the proxy did so far (cumulative over rebinds).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Batches read from the engine.
    pub received: u64,
    /// Messages written to the daemon (duplicates count twice).
    pub forwarded: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub reordered: u64,
    /// Held copies lost because the PUB side was rebound.
    pub lost_on_rebind: u64,
}

impl std::ops::AddAssign for FaultStats {
    fn add_assign(&mut self, o: FaultStats) {
        self.received += o.received;
        self.forwarded += o.forwarded;
        self.dropped += o.dropped;
        self.duplicated += o.duplicated;
        self.reordered += o.reordered;
        self.lost_on_rebind += o.lost_on_rebind;
    }
}

/// Most copies held back at once; past it the oldest goes out early.
const HELD_MAX: usize = 64;
/// A held copy goes out after at most this many later batches.
const DELAY_BATCHES_MAX: u64 = 3;
/// Held copies go out when no batch arrived for this long.
const IDLE_FLUSH_MS: u64 = 20;
/// How long one poll waits; also how often commands are looked at.
const POLL_MS: i64 = 5;
/// Most messages read per poll round.
const BURST_MAX: usize = 256;

enum Command {
    Faults(Faults),
    Pause(bool),
    /// Forward the next `n` batches without faults.
    PassNext(u64),
    Flush(mpsc::Sender<()>),
    Rebind(mpsc::Sender<()>),
    Unbind(mpsc::Sender<()>),
}

/// A running fault proxy; stopped when dropped.
pub struct FaultProxy {
    /// The PUB side, for the daemon to register.
    pub endpoint: String,
    commands: mpsc::Sender<Command>,
    stats: Arc<Mutex<FaultStats>>,
    subscriptions: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Connects to `upstream` (an engine's PUB endpoint) and binds a free
    /// loopback port; `seed` fixes which batches meet which fault.
    pub fn start(upstream: &str, faults: Faults, seed: u64) -> FaultProxy {
        assert!(faults.drop_pct + faults.dup_pct + faults.reorder_pct <= 100, "{faults:?}");
        let ctx = zmq::Context::new();
        let sub = ctx.socket(zmq::SUB).unwrap();
        sub.set_linger(0).unwrap();
        sub.set_rcvhwm(1_000_000).unwrap();
        sub.set_subscribe(b"").unwrap();
        sub.connect(upstream).unwrap();
        let xpub = bind_xpub(&ctx, "tcp://127.0.0.1:*");
        let endpoint = xpub.get_last_endpoint().unwrap().unwrap();
        let (commands, rx) = mpsc::channel();
        let stats = Arc::new(Mutex::new(FaultStats::default()));
        let subscriptions = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut run = Run {
            ctx,
            sub,
            xpub,
            endpoint: endpoint.clone(),
            faults,
            paused: false,
            pass_next: 0,
            rng: Rng::new(seed),
            held: VecDeque::new(),
            last_batch: Instant::now(),
            stats: stats.clone(),
            subscriptions: subscriptions.clone(),
        };
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || run.run(&rx, &stop2));
        FaultProxy { endpoint, commands, stats, subscriptions, stop, thread: Some(thread) }
    }

    /// Changes the fault shares; switching them off forwards held copies first.
    pub fn set_faults(&self, faults: Faults) {
        assert!(faults.drop_pct + faults.dup_pct + faults.reorder_pct <= 100, "{faults:?}");
        self.commands.send(Command::Faults(faults)).unwrap();
        if faults == Faults::NONE {
            self.flush();
        }
    }

    /// Stops (or resumes) reading from the engine; nothing is lost meanwhile.
    pub fn pause(&self, paused: bool) {
        self.commands.send(Command::Pause(paused)).unwrap();
    }

    /// The next `n` batches pass without faults.
    pub fn pass_next(&self, n: u64) {
        self.commands.send(Command::PassNext(n)).unwrap();
    }

    /// Forwards every held copy now; returns once done.
    pub fn flush(&self) {
        let (tx, rx) = mpsc::channel();
        self.commands.send(Command::Flush(tx)).unwrap();
        rx.recv_timeout(Duration::from_millis(WAIT_MS)).expect("fault proxy did not flush");
    }

    /// Closes the PUB side and binds it again on the same port; returns once bound.
    pub fn rebind(&self) {
        let (tx, rx) = mpsc::channel();
        self.commands.send(Command::Rebind(tx)).unwrap();
        rx.recv_timeout(Duration::from_millis(WAIT_MS)).expect("fault proxy did not rebind");
    }

    /// Closes the PUB side until `rebind`; returns once closed.
    pub fn unbind(&self) {
        let (tx, rx) = mpsc::channel();
        self.commands.send(Command::Unbind(tx)).unwrap();
        rx.recv_timeout(Duration::from_millis(WAIT_MS)).expect("fault proxy did not unbind");
    }

    pub fn stats(&self) -> FaultStats {
        *self.stats.lock()
    }

    /// Subscriptions that reached the PUB side since it was (re)bound.
    pub fn subscriptions(&self) -> usize {
        self.subscriptions.load(Ordering::Acquire)
    }

    /// Waits until `n` subscriptions reached the PUB side since it was (re)bound.
    pub fn wait_subscribed(&self, n: usize) -> bool {
        wait_until(|| self.subscriptions.load(Ordering::Acquire) >= n)
    }

    /// Waits until the proxy has read `n` batches from the engine in all.
    pub fn wait_received(&self, n: u64) -> bool {
        wait_until(|| self.stats.lock().received >= n)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn bind_xpub(ctx: &zmq::Context, endpoint: &str) -> zmq::Socket {
    let xpub = ctx.socket(zmq::XPUB).unwrap();
    xpub.set_linger(0).unwrap();
    xpub.set_xpub_verbose(true).unwrap();
    xpub.set_sndhwm(1_000_000).unwrap();
    // A just-closed socket may hold the port for a moment: retry, bounded.
    let deadline = Instant::now() + Duration::from_millis(WAIT_MS);
    loop {
        match xpub.bind(endpoint) {
            Ok(()) => return xpub,
            Err(e) if Instant::now() >= deadline => panic!("cannot bind {endpoint}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// A copy waiting to go out after `after` more batches.
struct Held {
    after: u64,
    frames: Vec<Vec<u8>>,
}

/// The proxy thread's state.
struct Run {
    ctx: zmq::Context,
    sub: zmq::Socket,
    xpub: zmq::Socket,
    endpoint: String,
    faults: Faults,
    paused: bool,
    pass_next: u64,
    rng: Rng,
    held: VecDeque<Held>,
    last_batch: Instant,
    stats: Arc<Mutex<FaultStats>>,
    subscriptions: Arc<AtomicUsize>,
}

impl Run {
    fn run(&mut self, commands: &mpsc::Receiver<Command>, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            let (sub_ready, xpub_ready) = {
                let mut items = vec![self.xpub.as_poll_item(zmq::POLLIN)];
                if !self.paused {
                    items.push(self.sub.as_poll_item(zmq::POLLIN));
                }
                if zmq::poll(&mut items, POLL_MS).is_err() {
                    continue;
                }
                (items.get(1).is_some_and(|i| i.is_readable()), items[0].is_readable())
            };
            // Commands after the poll: one sent before a batch was published
            // is then already queued, so it applies to that batch.
            while let Ok(c) = commands.try_recv() {
                self.command(c);
            }
            if xpub_ready {
                self.read_subscriptions();
            }
            if sub_ready && !self.paused {
                for _ in 0..BURST_MAX {
                    let Ok(frames) = self.sub.recv_multipart(zmq::DONTWAIT) else { break };
                    self.on_batch(frames);
                }
            } else if !self.held.is_empty() && self.last_batch.elapsed() >= Duration::from_millis(IDLE_FLUSH_MS) {
                self.release_all();
            }
        }
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Faults(f) => self.faults = f,
            Command::Pause(p) => self.paused = p,
            Command::PassNext(n) => self.pass_next += n,
            Command::Flush(done) => {
                self.release_all();
                let _ = done.send(());
            }
            Command::Rebind(done) => {
                self.close_xpub();
                self.xpub = bind_xpub(&self.ctx, &self.endpoint);
                let _ = done.send(());
            }
            Command::Unbind(done) => {
                self.close_xpub();
                let _ = done.send(());
            }
        }
    }

    /// Closes the PUB side (an unbound socket takes its place) and drops
    /// the copies held for the old connection.
    fn close_xpub(&mut self) {
        self.stats.lock().lost_on_rebind += self.held.len() as u64;
        self.held.clear();
        let unbound = self.ctx.socket(zmq::XPUB).unwrap();
        unbound.set_linger(0).unwrap();
        drop(std::mem::replace(&mut self.xpub, unbound));
        self.subscriptions.store(0, Ordering::Release);
    }

    fn read_subscriptions(&mut self) {
        for _ in 0..BURST_MAX {
            let Ok(msg) = self.xpub.recv_bytes(zmq::DONTWAIT) else { return };
            if msg.first() == Some(&1) {
                self.subscriptions.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    fn send(&self, frames: &[Vec<u8>]) {
        self.xpub.send_multipart(frames, 0).unwrap();
        self.stats.lock().forwarded += 1;
    }

    fn on_batch(&mut self, frames: Vec<Vec<u8>>) {
        self.last_batch = Instant::now();
        self.stats.lock().received += 1;
        // One roll per batch even when faults are off, so a run's fault
        // pattern depends only on the seed and the batch order.
        let roll = self.rng.below(100);
        let delay = 1 + self.rng.below(DELAY_BATCHES_MAX);
        let f = self.faults;
        let mut later = None;
        if self.pass_next > 0 {
            self.pass_next -= 1;
            self.send(&frames);
        } else if roll < f.drop_pct {
            self.stats.lock().dropped += 1;
        } else if roll < f.drop_pct + f.dup_pct {
            self.send(&frames);
            self.stats.lock().duplicated += 1;
            later = Some(Held { after: delay, frames });
        } else if roll < f.drop_pct + f.dup_pct + f.reorder_pct {
            self.stats.lock().reordered += 1;
            later = Some(Held { after: delay, frames });
        } else {
            self.send(&frames);
        }
        // Copies held earlier count this batch, then the due ones go out.
        for h in &mut self.held {
            h.after -= 1;
        }
        while let Some(i) = self.held.iter().position(|h| h.after == 0) {
            let h = self.held.remove(i).unwrap();
            self.send(&h.frames);
        }
        if let Some(h) = later {
            if self.held.len() == HELD_MAX {
                let oldest = self.held.pop_front().unwrap();
                self.send(&oldest.frames);
            }
            self.held.push_back(h);
        }
    }

    fn release_all(&mut self) {
        while let Some(h) = self.held.pop_front() {
            self.send(&h.frames);
        }
    }
}

//! The stream against a scripted engine: every script of a few steps
//! (publish, lose, duplicate, reorder, deliver a live batch or a ring reply,
//! a connection blip, a process restart on the same endpoint, a muted,
//! rolled or holed ring, the ready gate opening, time passing, the engine
//! gone past `engine_gone_ms`), in every order, from a few starting points
//! (with and without a ring, the gate open or closed, a watermark seeded
//! from an earlier run or none). After each script the world settles (the
//! gate opens, the ring answers, the engine is back and publishes once
//! more, time runs past every deadline), and the worker's blocks are
//! checked against the engine's:
//!
//! - never a block of a dead process, nor one the live process no longer
//!   holds;
//! - with a ring that kept every batch and answered, exactly the live
//!   process's blocks;
//! - otherwise, whatever is missing shows in the loss counters.
//!
//! The one case a stream without a ring cannot tell, a new process whose
//! first batch continues the old watermark exactly, is recognized and
//! exempted (see the module doc of `stream`).

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Cx, HeldAccount, Port, Stream};
use crate::event::WorkerId;
use crate::ingest::budget::{Budget, Charge};
use crate::ingest::config::IngestConfig;
use crate::ingest::counters::Counters;
use crate::ingest::decode::Batch;
use crate::ingest::sequencer::Watermark;
use crate::ingest::status::ListenerShared;
use crate::wire::RawEvent;

pub(super) const RING_TIMEOUT_MS: u64 = 100;
const GONE_MS: u64 = 1_000;
const HELD_MAX: usize = 6;
/// A block: (process, seq of the batch that stored it).
type Block = (u32, u64);

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// The engine publishes a batch (delivered live if connected).
    Pub,
    /// Publishes a batch that the network loses.
    Lost,
    /// Publishes a batch whose payload does not decode.
    Bad,
    /// The next live message reaches the listener.
    Live,
    /// The next ring reply reaches the listener.
    Reply,
    /// The connection delivers the last batch again.
    Dup,
    /// The two newest undelivered live messages swap places.
    Swap,
    /// The connection drops and comes back to the same process.
    Blip,
    /// The process dies; a new one binds the same endpoints and the
    /// listener connects to it.
    Restart,
    /// The process dies and nothing answers for a while.
    Die,
    /// The ready gate opens.
    Gate,
    /// A replay timeout passes.
    Wait,
    /// The ring stops answering requests (until the world settles).
    Mute,
    /// The ring forgets its older half.
    Roll,
    /// The ring's next answer loses a reply in the middle (a ROUTER drop).
    Hole,
    /// `engine_gone_ms` passes.
    Gone,
    /// The process restarts behind a proxy that keeps our connection up:
    /// the same connection now carries the new process's batches.
    ProxyRestart,
    /// A muted ring answers again (a stalled ring thread resumes).
    Unmute,
    /// The process dies without the listener seeing it (a host gone
    /// without a reset: the connection looks up until keepalive gives up).
    Vanish,
    /// With no process running, a new one binds the endpoints; the
    /// listener has not reconnected yet (its backoff), but its ring
    /// requests reach the new process.
    Spawn,
}

/// Steps a real deployment can take beyond `STEPS`, for exploration.
pub(super) const EXTRA_STEPS: [Step; 4] = [Step::ProxyRestart, Step::Unmute, Step::Vanish, Step::Spawn];

pub(super) const STEPS: [Step; 16] = [
    Step::Pub,
    Step::Lost,
    Step::Bad,
    Step::Live,
    Step::Reply,
    Step::Dup,
    Step::Swap,
    Step::Blip,
    Step::Restart,
    Step::Die,
    Step::Gate,
    Step::Wait,
    Step::Mute,
    Step::Roll,
    Step::Hole,
    Step::Gone,
];

/// Where a script starts.
#[derive(Copy, Clone, Debug)]
pub(super) struct Start {
    pub ring: bool,
    pub gate_open: bool,
    /// The listener resumes from a watermark an earlier run applied up to
    /// (its blocks loaded, as from a snapshot), and the process that made
    /// it is still the one running.
    pub seeded: bool,
}

/// One engine process: its batches, in order, and its ring.
struct Process {
    pid: u32,
    next_seq: u64,
    /// (seq, decodes) of the batches its ring holds.
    ring: VecDeque<(u64, bool)>,
}

struct World {
    start: Start,
    now_ms: u64,
    pub gate_open: bool,
    process: Option<Process>,
    pids: u32,
    /// What the live process holds.
    truth: BTreeSet<Block>,
    /// What the worker holds, as the shard would apply it.
    sink: BTreeSet<Block>,
    /// The connection's number and the process it reaches; None while down.
    conn: Option<(u32, u32)>,
    conns: u32,
    /// Live messages not yet read, with their connection.
    pipe: VecDeque<Batch>,
    /// The last live message sent on the connection (for `Dup`).
    last_sent: Option<Batch>,
    /// Replies of the request in flight.
    replies: VecDeque<Option<Batch>>,
    muted: bool,
    hole_next: bool,
    /// The ring lost batches it was asked for (muted, rolled, holed).
    ring_lossy: bool,
    /// The process whose batches the worker holds since it was last cleared.
    sink_pid: Option<u32>,
    /// The batch applied last.
    applied: Option<Block>,
    /// Batches applied on top of another process's without a clear between.
    mixes: u32,
    /// Of those, the ones a stream without a ring cannot tell: a newer
    /// connection's batch continuing the watermark exactly.
    blind_mixes: u32,
    down_since: Option<u64>,
    gone_fired: bool,
    /// What happened, for a failure's report.
    trace: Vec<String>,
}

fn digest(pid: u32, seq: u64) -> u64 {
    (u64::from(pid) << 40) ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// A batch as the listener decodes it; `ts` names it (pid, seq) for the
/// sink (exact in an f64 while pid < 256 and seq < 2^45).
fn batch(pid: u32, seq: u64, decodes: bool, conn: u32) -> Batch {
    let events = if decodes { Ok(Vec::new()) } else { Err("bad".to_string()) };
    let ts = (u64::from(pid) << 45 | seq) as f64;
    let digest = digest(pid, seq) ^ u64::from(!decodes);
    Batch { seq, ts, dp_rank: None, events, digest, conn, charge: Default::default() }
}

/// The (pid, seq) a batch's `ts` names.
fn named(ts: f64) -> Block {
    let id = ts as u64;
    ((id >> 45) as u32, id & ((1 << 45) - 1))
}

/// What batch (pid, seq) does: stores its block, and every third removes
/// the block stored two batches before.
fn apply_content(set: &mut BTreeSet<Block>, pid: u32, seq: u64) {
    set.insert((pid, seq));
    if seq % 3 == 2 {
        set.remove(&(pid, seq - 2));
    }
}

impl Port for World {
    fn apply(&mut self, _worker: WorkerId, _events: Vec<RawEvent>, ts: f64, _charge: Charge) -> bool {
        let (pid, seq) = named(ts);
        if self.sink_pid.is_some_and(|p| p != pid) {
            self.mixes += 1;
        }
        self.sink_pid = Some(pid);
        self.applied = Some((pid, seq));
        self.trace.push(format!("    apply {pid}:{seq}"));
        apply_content(&mut self.sink, pid, seq);
        true
    }

    fn clear(&mut self, _worker: WorkerId) {
        self.trace.push("    clear".to_string());
        self.sink.clear();
        self.sink_pid = None;
    }

    fn ask(&mut self, from: u64) -> Result<(), String> {
        self.trace.push(format!("    ask from {from}"));
        self.replies.clear();
        let Some(p) = self.process.as_ref().filter(|_| !self.muted) else {
            // Nobody answers: a muted ring, or a dead process's port.
            return Ok(());
        };
        let mut replies: VecDeque<_> =
            p.ring.iter().filter(|&&(seq, _)| seq >= from).map(|&(seq, ok)| Some(batch(p.pid, seq, ok, 0))).collect();
        if std::mem::take(&mut self.hole_next) && replies.len() >= 3 {
            replies.remove(1);
        }
        replies.push_back(None);
        self.replies = replies;
        Ok(())
    }

    fn stop_asking(&mut self) {
        self.replies.clear();
    }
}

pub(super) struct Run {
    world: World,
    pub(super) stream: Stream,
    pub(super) cfg: IngestConfig,
    counters: Counters,
    held: HeldAccount,
    budget: std::sync::Arc<Budget>,
    shared: ListenerShared,
    t0: Instant,
}

impl Run {
    pub(super) fn new(start: Start) -> Run {
        let mut world = World {
            start,
            now_ms: 0,
            gate_open: start.gate_open,
            process: None,
            pids: 0,
            truth: BTreeSet::new(),
            sink: BTreeSet::new(),
            conn: None,
            conns: 0,
            pipe: VecDeque::new(),
            last_sent: None,
            replies: VecDeque::new(),
            muted: false,
            hole_next: false,
            ring_lossy: false,
            sink_pid: None,
            applied: None,
            mixes: 0,
            blind_mixes: 0,
            down_since: Some(0),
            gone_fired: false,
            trace: Vec::new(),
        };
        world.spawn();
        // Two batches before the listener connects.
        for _ in 0..2 {
            world.publish(true, true);
        }
        let kept = start.seeded.then(|| {
            world.sink = world.truth.clone();
            world.sink_pid = Some(1);
            Watermark { seq: 1, digest: Some(digest(1, 1)) }
        });
        let ring = start.ring.then(|| "ring".to_string());
        let stream = Stream::new(WorkerId::new(1, 0), "pub".into(), ring, kept, Vec::new());
        let cfg = IngestConfig {
            replay_timeout_ms: RING_TIMEOUT_MS,
            engine_gone_ms: GONE_MS,
            held_batches_max: HELD_MAX,
            replay_batches_max: 64,
            ..IngestConfig::default()
        };
        let mut run = Run {
            world,
            stream,
            cfg,
            counters: Counters::default(),
            held: HeldAccount::default(),
            budget: Budget::new(64 << 20),
            shared: ListenerShared::new("model".into(), kept),
            t0: Instant::now(),
        };
        run.connect();
        run
    }

    fn note(&mut self, what: String) {
        self.world.trace.push(format!("  {what}"));
    }

    pub(super) fn counters(&self) -> crate::ingest::IngestCounters {
        self.counters.snapshot()
    }

    /// Feeds the stream one input. A mix it makes is excused only as the
    /// one case nothing can tell, which the stream counts as it makes it.
    fn input(&mut self, f: impl FnOnce(&mut Stream, &Cx, &mut dyn Port)) {
        let mixes = self.world.mixes;
        let unverified = self.counters.unverified_continuations.load(Ordering::Relaxed);
        self.feed(f);
        let counted = self.counters.unverified_continuations.load(Ordering::Relaxed) - unverified;
        self.world.blind_mixes += (self.world.mixes - mixes).min(counted as u32);
    }

    fn feed(&mut self, f: impl FnOnce(&mut Stream, &Cx, &mut dyn Port)) {
        let cx = Cx {
            cfg: &self.cfg,
            counters: &self.counters,
            held: &self.held,
            budget: &self.budget,
            shared: &self.shared,
            gate_open: self.world.gate_open,
            now: self.t0 + Duration::from_millis(self.world.now_ms),
        };
        f(&mut self.stream, &cx, &mut self.world);
    }

    /// The listener connects to whatever process runs now (if one does),
    /// after reading what its last connection received.
    fn connect(&mut self) {
        while !self.world.pipe.is_empty() {
            self.deliver_live();
        }
        let Some(pid) = self.world.process.as_ref().map(|p| p.pid) else { return };
        self.world.conns += 1;
        let conn = self.world.conns;
        self.world.conn = Some((conn, pid));
        self.note(format!("connected {conn} to process {pid}"));
        self.world.last_sent = None;
        self.world.down_since = None;
        self.world.gone_fired = false;
        self.input(|s, cx, p| s.connected(cx, p, conn));
    }

    fn deliver_reply(&mut self) {
        let Some(mut reply) = self.world.replies.pop_front() else { return };
        if let Some(b) = &mut reply {
            b.charge = self.budget.charge(b.bytes());
        }
        let what = reply.as_ref().map_or("end".to_string(), |b| format!("{}:{}", named(b.ts).0, b.seq));
        self.note(format!("reply {what}"));
        self.input(|s, cx, p| s.reply(cx, p, reply));
    }

    fn disconnect(&mut self) {
        if self.world.conn.take().is_some() {
            self.world.down_since = Some(self.world.now_ms);
            self.input(|s, cx, p| s.disconnected(cx, p));
        }
    }

    fn deliver_live(&mut self) {
        let Some(b) = self.world.pipe.pop_front() else { return };
        self.judge_live(b);
    }

    /// A live batch reaches the stream; a mix it makes is excused only as
    /// the one case nothing can tell, which the stream counts.
    fn judge_live(&mut self, mut b: Batch) {
        b.charge = self.budget.charge(b.bytes());
        let (pid, seq) = named(b.ts);
        self.note(format!("live {pid}:{seq} on {} ({})", b.conn, if b.events.is_ok() { "ok" } else { "bad" }));
        self.input(|s, cx, p| s.live(cx, p, b));
    }

    pub(super) fn step(&mut self, step: Step) {
        let pid = self.world.process.as_ref().map(|p| (p.pid, p.next_seq));
        self.world.trace.push(format!("{step:?} (process, next seq {pid:?}; conn {:?})", self.world.conn));
        let w = &mut self.world;
        match step {
            Step::Pub => w.publish(true, false),
            Step::Lost => w.publish(true, true),
            Step::Bad => w.publish(false, false),
            Step::Live => self.deliver_live(),
            Step::Reply => {
                self.deliver_reply();
            }
            Step::Dup => {
                if let (Some(b), Some(_)) = (&w.last_sent, w.conn) {
                    let b = batch(named(b.ts).0, b.seq, b.events.is_ok(), b.conn);
                    w.pipe.push_back(b);
                }
            }
            Step::Swap => {
                let n = w.pipe.len();
                if n >= 2 {
                    w.pipe.swap(n - 1, n - 2);
                }
            }
            Step::Blip => {
                self.disconnect();
                self.connect();
            }
            Step::Restart => {
                self.disconnect();
                self.world.spawn();
                self.connect();
            }
            Step::Die => {
                self.disconnect();
                self.world.process = None;
                self.world.truth.clear();
            }
            Step::Gate => self.open_gate(),
            Step::Wait => self.pass(RING_TIMEOUT_MS + 1),
            Step::Mute => {
                w.muted = true;
                w.ring_lossy = true;
            }
            Step::Roll => {
                if let Some(p) = w.process.as_mut() {
                    let n = p.ring.len() / 2;
                    if n > 0 {
                        p.ring.drain(..n);
                        w.ring_lossy = true;
                    }
                }
            }
            Step::Hole => {
                w.hole_next = true;
                w.ring_lossy = true;
            }
            Step::Gone => self.pass(GONE_MS),
            Step::ProxyRestart => {
                if w.process.is_some() {
                    w.spawn();
                    let pid = w.pids;
                    if let Some((conn, _)) = w.conn {
                        w.conn = Some((conn, pid));
                        w.last_sent = None;
                    }
                }
            }
            Step::Unmute => w.muted = false,
            Step::Vanish => {
                w.process = None;
                w.truth.clear();
            }
            Step::Spawn => {
                if w.process.is_none() {
                    w.spawn();
                }
            }
        }
    }

    fn open_gate(&mut self) {
        if !self.world.gate_open {
            self.world.gate_open = true;
            self.input(|s, cx, p| s.gate_opened(cx, p));
        }
    }

    /// Time passes: the stream's deadlines, and the engine-gone one.
    pub(super) fn pass(&mut self, ms: u64) {
        // Replies still on their way when a deadline passes: a slow ring,
        // which may be given up on.
        self.world.ring_lossy |= !self.world.replies.is_empty();
        self.world.now_ms += ms;
        self.input(|s, cx, p| s.tick(cx, p));
        let down_long = self.world.down_since.is_some_and(|since| self.world.now_ms >= since + GONE_MS);
        if down_long && !std::mem::replace(&mut self.world.gone_fired, true) {
            self.input(|s, cx, p| s.gone(cx, p));
        }
    }

    /// Everything settles: the gate opens, the ring answers, the engine is
    /// back, publishes once more, and time runs past every deadline.
    pub(super) fn settle(&mut self) {
        self.settle_rounds(3);
    }

    /// `settle` with `rounds` rounds, the engine publishing once before
    /// each but the first: with one, nothing new shows a gap.
    pub(super) fn settle_rounds(&mut self, rounds: usize) {
        self.world.trace.push("settle".to_string());
        self.open_gate();
        self.world.muted = false;
        if self.world.process.is_none() {
            self.world.spawn();
        }
        let live_pid = self.world.process.as_ref().map(|p| p.pid);
        if self.world.conn.is_some_and(|(_, pid)| Some(pid) != live_pid) {
            // The connection reaches a process that is gone: keepalive ends it.
            self.disconnect();
        }
        if self.world.conn.is_none() {
            self.connect();
        }
        for round in 0..rounds {
            if round > 0 {
                self.world.publish(true, false);
            }
            for _ in 0..10_000 {
                if !self.world.pipe.is_empty() {
                    self.deliver_live();
                } else if !self.world.replies.is_empty() {
                    self.deliver_reply();
                } else if self.stream.asking() || self.stream.late_due().is_some() {
                    self.world.now_ms += 50;
                    self.input(|s, cx, p| s.tick(cx, p));
                } else {
                    break;
                }
            }
        }
        assert!(!self.stream.asking() && self.world.pipe.is_empty(), "settled");
    }
}

impl World {
    fn spawn(&mut self) {
        self.pids += 1;
        self.process = Some(Process { pid: self.pids, next_seq: 0, ring: VecDeque::new() });
        self.truth.clear();
    }

    /// The process publishes a batch: into its ring, and live unless `lost`.
    fn publish(&mut self, decodes: bool, lost: bool) {
        let Some(p) = self.process.as_mut() else { return };
        let seq = p.next_seq;
        p.next_seq += 1;
        p.ring.push_back((seq, decodes));
        if decodes {
            apply_content(&mut self.truth, p.pid, seq);
        } else {
            // What an undecodable batch did is unknown to anyone reading it.
            self.ring_lossy = true;
        }
        let pid_now = p.pid;
        if let Some((conn, pid)) = self.conn.filter(|&(_, pid)| !lost && pid == pid_now) {
            let b = batch(pid, seq, decodes, conn);
            self.last_sent = Some(batch(pid, seq, decodes, conn));
            self.pipe.push_back(b);
        }
    }
}

impl Run {
    /// The end state against the engine's (see the module doc).
    pub(super) fn check(&self) -> Result<(), String> {
        let w = &self.world;
        let c = self.counters.snapshot();
        self.check_held()?;
        if w.mixes != w.blind_mixes {
            return Err(format!("applied another process's batches over a worker's ({} times)", w.mixes));
        }
        if w.blind_mixes == 0 {
            let extra: Vec<_> = w.sink.difference(&w.truth).collect();
            if !extra.is_empty() {
                return Err(format!("credits blocks the engine does not hold: {extra:?}"));
            }
        }
        let missing: Vec<_> = w.truth.difference(&w.sink).collect();
        if missing.is_empty() || w.blind_mixes > 0 {
            return Ok(());
        }
        let clean = w.start.ring && !w.ring_lossy && c.held_dropped == 0;
        if clean {
            return Err(format!("misses blocks the ring still has: {missing:?}"));
        }
        if c.batches_lost + c.batches_missed_at_join + c.resyncs == 0 {
            return Err(format!("misses blocks with no loss counted: {missing:?}"));
        }
        Ok(())
    }
}

impl Run {
    /// Whether the ring kept and answered every batch asked of it and no
    /// held batch was dropped for want of room.
    pub(super) fn clean(&self) -> bool {
        self.world.start.ring && !self.world.ring_lossy && self.counters.snapshot().held_dropped == 0
    }

    /// The worker holds exactly the live process's blocks.
    pub(super) fn exact(&self) -> Result<(), String> {
        let w = &self.world;
        if w.sink != w.truth {
            return Err(format!("holds {:?}, the engine {:?}", w.sink, w.truth));
        }
        Ok(())
    }
}

impl Run {
    /// The thread's held account against what the stream holds: every
    /// batch added is subtracted when it leaves.
    pub(super) fn check_held(&self) -> Result<(), String> {
        let bytes: usize = self.stream.held.iter().map(|b| b.charge.bytes()).sum();
        let kept = self.stream.ask().and_then(|a| a.rolled.as_ref());
        let kept_bytes: usize = kept.map_or(0, |k| k.iter().map(|b| b.charge.bytes()).sum());
        let kept_n = kept.map_or(0, Vec::len);
        let (acc_bytes, gauge) = (self.budget.used(), self.held.gauge.load(Ordering::Relaxed));
        if acc_bytes != bytes + kept_bytes || gauge != (self.stream.held.len() + kept_n) as u64 {
            return Err(format!(
                "held account {acc_bytes} bytes, gauge {gauge}; the stream holds {} batches ({bytes} bytes) \
                 and keeps {kept_n} ({kept_bytes} bytes)",
                self.stream.held.len()
            ));
        }
        Ok(())
    }

    /// What happened so far, one line each.
    pub(super) fn trace(&self) -> String {
        self.world.trace.join("\n")
    }

    /// The listener is removed (`Stream::end`): what the thread's held
    /// account and gauge still count afterwards.
    pub(super) fn remove(self) -> (usize, u64) {
        let Run { stream, held, budget, .. } = self;
        let _ = stream.end(&held);
        (budget.used(), held.gauge.load(Ordering::Relaxed))
    }
}

/// Runs `script` from `start`; the failure, with what led to it (the
/// whole trace with `MODEL_TRACE` set).
pub(super) fn play(start: Start, script: &[Step]) -> Result<(), String> {
    let mut run = Run::new(start);
    for &step in script {
        run.step(step);
    }
    run.settle();
    run.check().map_err(|e| {
        let (w, c) = (&run.world, run.counters.snapshot());
        let trace = if std::env::var_os("MODEL_TRACE").is_some() { w.trace.join("\n") } else { String::new() };
        format!(
            "{start:?} {script:?}: {e}\n  truth {:?}\n  sink {:?}\n  phase {:?}, watermark {:?}\n  {c:?}\n{trace}",
            w.truth,
            w.sink,
            run.stream.phase(),
            run.stream.watermark()
        )
    })
}

pub(super) fn starts() -> Vec<Start> {
    let mut out = Vec::new();
    for ring in [true, false] {
        for gate_open in [true, false] {
            for seeded in [false, true] {
                out.push(Start { ring, gate_open, seeded });
            }
        }
    }
    out
}

/// Every script of `len` steps.
fn scripts(len: u32) -> impl Iterator<Item = Vec<Step>> {
    let n = STEPS.len();
    (0..n.pow(len)).map(move |mut i| {
        (0..len)
            .map(|_| {
                let step = STEPS[i % n];
                i /= n;
                step
            })
            .collect()
    })
}

#[test]
fn every_script_of_three_steps_ends_where_the_engine_is() {
    let mut failures = Vec::new();
    for start in starts() {
        for script in scripts(3) {
            if let Err(e) = play(start, &script) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{} failures; the first:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn every_script_of_four_steps_ends_where_the_engine_is() {
    let mut failures = Vec::new();
    for start in starts() {
        for script in scripts(4) {
            if let Err(e) = play(start, &script) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{} failures; the first:\n{}", failures.len(), failures.join("\n"));
}

/// Longer scripts than every one can be tried: seeded random ones, with
/// the steps that move the stream along (deliveries, publishes) drawn more
/// often than faults.
fn random_scripts(seed: u64, count: usize, len: usize) -> Vec<Vec<Step>> {
    let mut rng = crate::test_rng::RngStar(seed);
    let common = [Step::Pub, Step::Pub, Step::Live, Step::Live, Step::Reply, Step::Reply, Step::Reply];
    (0..count)
        .map(|_| (0..len).map(|_| if rng.chance(2) { rng.pick(&common) } else { rng.pick(&STEPS) }).collect())
        .collect()
}

#[test]
fn random_scripts_of_sixteen_steps_end_where_the_engine_is() {
    // MODEL_RANDOM=n (and MODEL_SEED) explore further than CI does.
    let count = std::env::var("MODEL_RANDOM").ok().and_then(|n| n.parse().ok()).unwrap_or(4_000);
    let seed: u64 = std::env::var("MODEL_SEED").ok().and_then(|n| n.parse().ok()).unwrap_or(0x5EED);
    let mut failures = Vec::new();
    for (i, start) in starts().into_iter().enumerate() {
        for script in random_scripts(seed + i as u64, count, 16) {
            if let Err(e) = play(start, &script) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{} failures; the first:\n{}", failures.len(), failures.join("\n"));
}

/// Replays one script given as `MODEL_SCRIPT="ring gate seeded: Pub Live ..."`
/// (ring, gate and seeded as 0 or 1), printing its trace.
#[test]
#[ignore = "a tool: replays the script in MODEL_SCRIPT"]
fn replay_one_script() {
    let text = std::env::var("MODEL_SCRIPT").expect("MODEL_SCRIPT");
    let (head, steps) = text.split_once(':').expect("flags: steps");
    let flags: Vec<bool> = head.split_whitespace().map(|f| f == "1").collect();
    let start = Start { ring: flags[0], gate_open: flags[1], seeded: flags[2] };
    let script: Vec<Step> = steps
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|w| !w.is_empty())
        .map(|w| {
            *STEPS
                .iter()
                .chain(EXTRA_STEPS.iter())
                .find(|s| format!("{s:?}") == w)
                .unwrap_or_else(|| panic!("no step {w}"))
        })
        .collect();
    std::env::set_var("MODEL_TRACE", "1");
    if let Err(e) = play(start, &script) {
        panic!("{e}");
    }
}

#[test]
#[ignore = "exploration: every script of five steps, about a minute"]
fn every_script_of_five_steps_ends_where_the_engine_is() {
    let mut failures = Vec::new();
    for start in starts() {
        for script in scripts(5) {
            if let Err(e) = play(start, &script) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{} failures; the first:\n{}", failures.len(), failures.join("\n"));
}

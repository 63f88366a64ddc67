//! A test engine: publishes KV event batches over a real ZMQ socket in the
//! engines' wire format (SPEC section 2), keeps a bounded ring of recent
//! batches behind a ROUTER replay socket, and tracks the ground truth of
//! what its cache holds. It can lose batches in transit (kept in the ring),
//! resend a batch, restart at seq 0 (optionally on a fresh socket) and drop
//! its ring, so tests can drive every sequence rule.
//!
//! It binds XPUB rather than PUB (identical on the wire) so a test can wait
//! for the subscription instead of sleeping through the slow-joiner window.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::model_sink::Tiers;
use super::rng::Rng;
use super::WAIT_MS;
use kv_indexer::hash::{local_hash, seed_for};
use kv_indexer::StorageTier;

/// How events are encoded.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// `{"type": "BlockStored", ...}` maps (vLLM >= 0.24).
    Tagged,
    /// `["BlockStored", ...]` arrays (vLLM <= 0.23).
    Positional,
    /// TensorRT-LLM's streaming publisher: maps with only the fields it
    /// sends (`mm_keys` empty per block), "GPU" only.
    TrtLlm,
}

/// How block hashes are encoded.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum HashForm {
    /// msgpack unsigned ints.
    Uint,
    /// msgpack signed ints (SGLang style; large values become negative).
    Int,
    /// 32-byte digests whose last 8 bytes are the hash (vLLM bytes mode).
    Bytes,
    /// A different form per event.
    Mixed,
}

/// How replay replies are framed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ReplyForm {
    /// `[b"", seq, payload]` (vLLM <= 0.25).
    ThreeFrames,
    /// `[b"", topic, seq, payload]` (vLLM >= 0.26).
    FourFrames,
    /// Four frames, the end marker's topic empty (TensorRT-LLM).
    FourFramesBareEnd,
}

/// Test publisher settings.
#[derive(Clone, Debug)]
pub struct PublisherConfig {
    pub encoding: Encoding,
    pub hash_form: HashForm,
    pub reply_form: ReplyForm,
    pub block_size: u32,
    /// Batches kept for replay; `None` binds no replay socket.
    pub ring_capacity: Option<usize>,
    /// Rank written inside each batch (overrides the registered one).
    pub batch_dp_rank: Option<u32>,
    pub topic: Vec<u8>,
    /// Seed of the event generator.
    pub seed: u64,
    /// Where to bind the PUB socket; `None`: a free loopback port.
    pub endpoint: Option<String>,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        Self {
            encoding: Encoding::Tagged,
            hash_form: HashForm::Mixed,
            reply_form: ReplyForm::FourFrames,
            block_size: 4,
            ring_capacity: Some(1_000),
            batch_dp_rank: None,
            topic: b"kv".to_vec(),
            seed: 1,
            endpoint: None,
        }
    }
}

/// One engine event, as the test builds it.
#[derive(Clone, Debug)]
pub enum TestEvent {
    Stored { tier: StorageTier, parent: Option<u64>, hashes: Vec<u64> },
    Removed { tier: StorageTier, hashes: Vec<u64> },
    Cleared,
}

/// What the publisher remembers of a stored block.
#[derive(Clone, Debug)]
struct BlockInfo {
    parent: Option<u64>,
    local: u64,
    tokens: Vec<u32>,
}

/// Messages kept for `resend`.
const HISTORY_MAX: usize = 1_024;

/// Ring of recent batches served by the replay thread.
#[derive(Default)]
struct Ring {
    batches: VecDeque<(u64, Vec<u8>)>,
    capacity: usize,
    requests: Vec<u64>,
    mute: bool,
    /// Each request gets this many replies at once; the rest of its answer
    /// (as the ring was then) and the end marker wait until released, as
    /// replies still in flight do (a slow engine, or a dying one).
    hold_after: Option<usize>,
    /// A pause after each reply sent (a slow engine answering a long ring).
    pace: Option<Duration>,
}

/// A test engine's publishing side.
pub struct TestPublisher {
    cfg: PublisherConfig,
    ctx: zmq::Context,
    xpub: zmq::Socket,
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    ring: Arc<Mutex<Ring>>,
    stop: Arc<AtomicBool>,
    replay_thread: Option<JoinHandle<()>>,
    next_seq: u64,
    /// Recent messages by seq, for `resend` (bounded by `HISTORY_MAX`).
    history: VecDeque<(u64, Vec<Vec<u8>>)>,
    /// Batches still to be lost in transit (kept in the ring).
    lose_next: usize,
    subscriptions: usize,
    truth: Tiers,
    /// Parent and local hash of every block ever stored.
    blocks: HashMap<u64, BlockInfo>,
    next_hash: u64,
    rng: Rng,
    /// The `ts` each batch carries, Unix seconds; `None`: the wall clock
    /// when the batch is encoded, as an engine stamps it.
    ts: Option<f64>,
}

fn bind_xpub(ctx: &zmq::Context, endpoint: &str) -> zmq::Socket {
    let xpub = ctx.socket(zmq::XPUB).expect("xpub socket");
    xpub.set_linger(0).unwrap();
    xpub.set_xpub_verbose(true).unwrap();
    xpub.set_sndhwm(1_000_000).unwrap();
    // A just-closed socket may hold the port for a moment: retry, bounded.
    let deadline = Instant::now() + Duration::from_millis(WAIT_MS);
    loop {
        match xpub.bind(endpoint) {
            Ok(()) => return xpub,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("cannot bind {endpoint}: {e}"),
        }
    }
}

fn last_endpoint(socket: &zmq::Socket) -> String {
    socket.get_last_endpoint().unwrap().unwrap()
}

impl TestPublisher {
    pub fn new(cfg: PublisherConfig) -> Self {
        let ctx = zmq::Context::new();
        let xpub = bind_xpub(&ctx, cfg.endpoint.as_deref().unwrap_or("tcp://127.0.0.1:*"));
        let endpoint = last_endpoint(&xpub);
        let ring = Arc::new(Mutex::new(Ring { capacity: cfg.ring_capacity.unwrap_or(0), ..Ring::default() }));
        let stop = Arc::new(AtomicBool::new(false));
        let (replay_endpoint, replay_thread) = match cfg.ring_capacity {
            Some(_) => {
                let router = ctx.socket(zmq::ROUTER).unwrap();
                router.set_linger(0).unwrap();
                router.bind("tcp://127.0.0.1:*").unwrap();
                let ep = last_endpoint(&router);
                let (ring, stop) = (ring.clone(), stop.clone());
                let (topic, form) = (cfg.topic.clone(), cfg.reply_form);
                let handle = std::thread::spawn(move || serve_replay(router, ring, stop, topic, form));
                (Some(ep), Some(handle))
            }
            None => (None, None),
        };
        let rng = Rng::new(cfg.seed);
        TestPublisher {
            next_hash: 1 + cfg.seed.wrapping_mul(1 << 40),
            cfg,
            ctx,
            xpub,
            endpoint,
            replay_endpoint,
            ring,
            stop,
            replay_thread,
            next_seq: 0,
            history: VecDeque::new(),
            lose_next: 0,
            subscriptions: 0,
            truth: Tiers::default(),
            blocks: HashMap::new(),
            rng,
            ts: Some(1_700_000_000.5),
        }
    }

    /// Sets the `ts` of later batches (`None`: the wall clock at encoding).
    pub fn set_timestamp(&mut self, ts: Option<f64>) {
        self.ts = ts;
    }

    /// Waits until `n` subscriptions in total reached this publisher since it
    /// (re)bound; returns whether they did within the wait bound.
    pub fn wait_subscribed(&mut self, n: usize) -> bool {
        let deadline = Instant::now() + Duration::from_millis(WAIT_MS);
        while self.subscriptions < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            if self.xpub.poll(zmq::POLLIN, left.as_millis() as i64).unwrap_or(0) > 0 {
                if let Ok(msg) = self.xpub.recv_bytes(zmq::DONTWAIT) {
                    if msg.first() == Some(&1) {
                        self.subscriptions += 1;
                    }
                }
            }
        }
        true
    }

    /// The seq the next batch will carry.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// What the engine holds, per tier.
    pub fn truth(&self) -> &Tiers {
        &self.truth
    }

    /// Start seqs of every replay request received.
    pub fn replay_requests(&self) -> Vec<u64> {
        self.ring.lock().requests.clone()
    }

    /// The next `n` batches are lost in transit but kept for replay.
    pub fn lose_next(&mut self, n: usize) {
        self.lose_next += n;
    }

    /// Cancels losses still pending from `lose_next`.
    pub fn lose_none(&mut self) {
        self.lose_next = 0;
    }

    /// Forgets one buffered batch (a hole in what a replay returns).
    pub fn forget(&mut self, seq: u64) {
        self.ring.lock().batches.retain(|(s, _)| *s != seq);
    }

    /// Forgets every buffered batch (as if the buffer rolled over).
    pub fn drop_buffer(&mut self) {
        self.ring.lock().batches.clear();
    }

    /// Stops answering replay requests.
    pub fn mute_replay(&mut self, mute: bool) {
        self.ring.lock().mute = mute;
    }

    /// From now on each replay request gets the first `after` of its
    /// replies at once and the rest (as the ring is now) only on release
    /// (`None`), which also sends what earlier requests still owe.
    pub fn hold_replay(&mut self, after: Option<usize>) {
        self.ring.lock().hold_after = after;
    }

    /// From now on replies go out one at a time, `pace` apart; a newer
    /// request cuts an answer short.
    pub fn pace_replay(&mut self, pace: Option<Duration>) {
        self.ring.lock().pace = pace;
    }

    /// Sends the message with `seq` again, same payload.
    pub fn resend(&mut self, seq: u64) {
        let msg = self
            .history
            .iter()
            .find(|(s, _)| *s == seq)
            .map(|(_, m)| m.clone())
            .expect("seq not in the resend history");
        self.xpub.send_multipart(msg, 0).unwrap();
    }

    fn remember(&mut self, seq: u64, msg: Vec<Vec<u8>>) {
        if self.history.len() == HISTORY_MAX {
            self.history.pop_front();
        }
        self.history.push_back((seq, msg));
    }

    /// Sends a raw message, outside the seq counter (for malformed input).
    pub fn send_raw(&mut self, frames: Vec<Vec<u8>>) {
        self.xpub.send_multipart(frames, 0).unwrap();
    }

    /// Sends a message with a given seq and an arbitrary payload, consuming it.
    pub fn send_payload(&mut self, payload: Vec<u8>) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.push_ring(seq, &payload);
        let msg = vec![self.cfg.topic.clone(), seq.to_be_bytes().to_vec(), payload];
        self.xpub.send_multipart(msg.clone(), 0).unwrap();
        self.remember(seq, msg);
        seq
    }

    /// The engine restarts: empty cache, seq back to 0, empty ring. With
    /// `rebind`, the socket is closed and bound again on the same port, so
    /// subscribers see a disconnect and reconnect like with a new process.
    pub fn restart(&mut self, rebind: bool) {
        self.truth = Tiers::default();
        self.next_seq = 0;
        self.history.clear();
        self.ring.lock().batches.clear();
        if rebind {
            let endpoint = self.endpoint.clone();
            let old = std::mem::replace(&mut self.xpub, self.ctx.socket(zmq::XPUB).unwrap());
            drop(old);
            self.xpub = bind_xpub(&self.ctx, &endpoint);
            self.subscriptions = 0;
        }
    }

    /// The connection drops and the same process binds again (a network
    /// blip, or the socket closed and reopened): seq, ring and cache stay.
    pub fn blip(&mut self) {
        let endpoint = self.endpoint.clone();
        let old = std::mem::replace(&mut self.xpub, self.ctx.socket(zmq::XPUB).unwrap());
        drop(old);
        self.xpub = bind_xpub(&self.ctx, &endpoint);
        self.subscriptions = 0;
    }

    /// Publishes one batch of events; returns its seq.
    pub fn publish(&mut self, events: Vec<TestEvent>) -> u64 {
        for e in &events {
            self.apply_truth(e);
        }
        let payload = self.encode_batch(&events);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.push_ring(seq, &payload);
        let msg = vec![self.cfg.topic.clone(), seq.to_be_bytes().to_vec(), payload];
        if self.lose_next > 0 {
            self.lose_next -= 1;
        } else {
            self.xpub.send_multipart(msg.clone(), 0).unwrap();
        }
        self.remember(seq, msg);
        seq
    }

    /// Publishes `n` batches of random events.
    pub fn publish_random(&mut self, n: usize) {
        for _ in 0..n {
            let events = self.random_batch();
            self.publish(events);
        }
    }

    /// Publishes `n` batches that only store (two fresh root blocks each),
    /// so every block ever stored is still held; returns their hashes.
    pub fn publish_stores_only(&mut self, n: usize) -> Vec<u64> {
        let mut hashes = Vec::new();
        for _ in 0..n {
            let store = self.new_store(StorageTier::Device, None, 2);
            if let TestEvent::Stored { hashes: h, .. } = &store {
                hashes.extend(h);
            }
            self.publish(vec![store]);
        }
        hashes
    }

    /// A store of `n` fresh blocks in `tier`, chained to `parent`.
    pub fn new_store(&mut self, tier: StorageTier, parent: Option<u64>, n: usize) -> TestEvent {
        let hashes = (0..n).map(|_| self.fresh_hash()).collect();
        TestEvent::Stored { tier, parent, hashes }
    }

    /// A random batch of 1..=3 events over the device and host tiers.
    pub fn random_batch(&mut self) -> Vec<TestEvent> {
        // Later events of the batch see the state the earlier ones leave.
        let mut scratch = self.truth.clone();
        let count = 1 + self.rng.below(3) as usize;
        let mut events = Vec::with_capacity(count);
        for _ in 0..count {
            let device_only = self.cfg.encoding == Encoding::TrtLlm;
            let tier = if device_only || self.rng.chance(70) { StorageTier::Device } else { StorageTier::HostPinned };
            let held: Vec<u64> = scratch[tier.index()].iter().copied().collect();
            let roll = self.rng.below(100);
            let event = if roll < 2 {
                TestEvent::Cleared
            } else if roll < 35 && !held.is_empty() {
                let n = 1 + self.rng.below(3) as usize;
                let hashes = (0..n).map(|_| held[self.rng.below(held.len() as u64) as usize]).collect();
                TestEvent::Removed { tier, hashes }
            } else {
                let parent =
                    (!held.is_empty() && self.rng.chance(60)).then(|| held[self.rng.below(held.len() as u64) as usize]);
                let n = 1 + self.rng.below(4) as usize;
                self.new_store(tier, parent, n)
            };
            apply_to(&mut scratch, &event);
            events.push(event);
        }
        events
    }

    fn fresh_hash(&mut self) -> u64 {
        self.next_hash += 1;
        // Spread hashes over the whole u64 range (half at or above 2^63) while
        // staying unique: an odd multiplier is a bijection.
        self.next_hash.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    fn apply_truth(&mut self, event: &TestEvent) {
        apply_to(&mut self.truth, event);
    }

    fn push_ring(&mut self, seq: u64, payload: &[u8]) {
        let mut ring = self.ring.lock();
        if ring.capacity == 0 {
            return;
        }
        if ring.batches.len() == ring.capacity {
            ring.batches.pop_front();
        }
        ring.batches.push_back((seq, payload.to_vec()));
    }

    /// Encodes `[ts, events, dp_rank]` in the configured encoding.
    pub fn encode_batch(&mut self, events: &[TestEvent]) -> Vec<u8> {
        use rmp::encode::*;
        let mut buf = Vec::new();
        write_array_len(&mut buf, 3).unwrap();
        let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        write_f64(&mut buf, self.ts.unwrap_or_else(now)).unwrap();
        write_array_len(&mut buf, events.len() as u32).unwrap();
        for e in events {
            let form = match self.cfg.hash_form {
                HashForm::Mixed => [HashForm::Uint, HashForm::Int, HashForm::Bytes][self.rng.below(3) as usize],
                f => f,
            };
            match self.cfg.encoding {
                Encoding::Tagged => self.encode_tagged(&mut buf, e, form),
                Encoding::Positional => self.encode_positional(&mut buf, e, form),
                Encoding::TrtLlm => self.encode_trtllm(&mut buf, e, form),
            }
        }
        match self.cfg.batch_dp_rank {
            Some(rank) => {
                write_uint(&mut buf, u64::from(rank)).unwrap();
            }
            None => write_nil(&mut buf).unwrap(),
        }
        buf
    }

    fn encode_tagged(&mut self, buf: &mut Vec<u8>, event: &TestEvent, form: HashForm) {
        use rmp::encode::*;
        match event {
            TestEvent::Stored { tier, parent, hashes } => {
                // The seven always-present keys, plus optional and unknown ones.
                write_map_len(buf, 11).unwrap();
                write_str(buf, "type").unwrap();
                write_str(buf, "BlockStored").unwrap();
                write_str(buf, "block_hashes").unwrap();
                write_hashes(buf, hashes, form);
                write_str(buf, "parent_block_hash").unwrap();
                write_opt_hash(buf, *parent, form);
                write_str(buf, "token_ids").unwrap();
                self.write_tokens(buf, *parent, hashes);
                write_str(buf, "block_size").unwrap();
                write_uint(buf, u64::from(self.cfg.block_size)).unwrap();
                write_str(buf, "lora_id").unwrap();
                write_nil(buf).unwrap();
                write_str(buf, "medium").unwrap();
                write_medium(buf, *tier);
                write_str(buf, "lora_name").unwrap();
                write_nil(buf).unwrap();
                write_str(buf, "extra_keys").unwrap();
                write_nil(buf).unwrap();
                write_str(buf, "group_idx").unwrap();
                write_uint(buf, 0).unwrap();
                write_str(buf, "a_field_from_the_future").unwrap();
                write_array_len(buf, 1).unwrap();
                write_str(buf, "ignored").unwrap();
            }
            TestEvent::Removed { tier, hashes } => {
                write_map_len(buf, 3).unwrap();
                write_str(buf, "type").unwrap();
                write_str(buf, "BlockRemoved").unwrap();
                write_str(buf, "block_hashes").unwrap();
                write_hashes(buf, hashes, form);
                write_str(buf, "medium").unwrap();
                write_medium(buf, *tier);
            }
            TestEvent::Cleared => {
                write_map_len(buf, 1).unwrap();
                write_str(buf, "type").unwrap();
                write_str(buf, "AllBlocksCleared").unwrap();
            }
        }
    }

    fn encode_trtllm(&mut self, buf: &mut Vec<u8>, event: &TestEvent, form: HashForm) {
        use rmp::encode::*;
        match event {
            TestEvent::Stored { tier, parent, hashes } => {
                write_map_len(buf, 9).unwrap();
                write_str(buf, "type").unwrap();
                write_str(buf, "BlockStored").unwrap();
                write_str(buf, "block_hashes").unwrap();
                write_hashes(buf, hashes, form);
                write_str(buf, "parent_block_hash").unwrap();
                write_opt_hash(buf, *parent, form);
                write_str(buf, "token_ids").unwrap();
                self.write_tokens(buf, *parent, hashes);
                write_str(buf, "block_size").unwrap();
                write_uint(buf, u64::from(self.cfg.block_size)).unwrap();
                write_str(buf, "lora_id").unwrap();
                write_nil(buf).unwrap();
                write_str(buf, "medium").unwrap();
                write_medium(buf, *tier);
                write_str(buf, "lora_name").unwrap();
                write_nil(buf).unwrap();
                write_str(buf, "mm_keys").unwrap();
                write_array_len(buf, hashes.len() as u32).unwrap();
                for _ in hashes {
                    write_array_len(buf, 0).unwrap();
                }
            }
            TestEvent::Removed { .. } | TestEvent::Cleared => self.encode_tagged(buf, event, form),
        }
    }

    fn encode_positional(&mut self, buf: &mut Vec<u8>, event: &TestEvent, form: HashForm) {
        use rmp::encode::*;
        match event {
            TestEvent::Stored { tier, parent, hashes } => {
                // msgspec keeps trailing nils.
                write_array_len(buf, 10).unwrap();
                write_str(buf, "BlockStored").unwrap();
                write_hashes(buf, hashes, form);
                write_opt_hash(buf, *parent, form);
                self.write_tokens(buf, *parent, hashes);
                write_uint(buf, u64::from(self.cfg.block_size)).unwrap();
                write_nil(buf).unwrap(); // lora_id
                write_medium(buf, *tier);
                write_nil(buf).unwrap(); // lora_name
                write_nil(buf).unwrap(); // extra_keys
                write_nil(buf).unwrap(); // a later field
            }
            TestEvent::Removed { tier, hashes } => {
                write_array_len(buf, 3).unwrap();
                write_str(buf, "BlockRemoved").unwrap();
                write_hashes(buf, hashes, form);
                write_medium(buf, *tier);
            }
            TestEvent::Cleared => {
                write_array_len(buf, 1).unwrap();
                write_str(buf, "AllBlocksCleared").unwrap();
            }
        }
    }

    /// Writes random tokens for the stored `hashes` and remembers each
    /// block's parent and local hash, for queries and visibility.
    fn write_tokens(&mut self, buf: &mut Vec<u8>, parent: Option<u64>, hashes: &[u64]) {
        let block_size = self.cfg.block_size as usize;
        // A block announced again (an engine re-storing what it holds) keeps its tokens.
        let known: Option<Vec<Vec<u32>>> = hashes
            .iter()
            .map(|h| self.blocks.get(h).filter(|b| b.parent == parent).map(|b| b.tokens.clone()))
            .collect();
        let tokens: Vec<u32> = match known {
            Some(known) if !hashes.is_empty() => known.concat(),
            _ => (0..hashes.len() * block_size).map(|_| self.rng.below(50_000) as u32).collect(),
        };
        rmp::encode::write_array_len(buf, tokens.len() as u32).unwrap();
        for &t in &tokens {
            rmp::encode::write_uint(buf, u64::from(t)).unwrap();
        }
        let seed = seed_for(None, None);
        let mut parent = parent;
        for (&hash, chunk) in hashes.iter().zip(tokens.chunks_exact(block_size)) {
            self.blocks.insert(hash, BlockInfo { parent, local: local_hash(chunk, seed), tokens: chunk.to_vec() });
            parent = Some(hash);
        }
    }

    /// What a query can see of the truth: held blocks whose every ancestor
    /// is held too (in any tier).
    pub fn visible_truth(&self) -> Tiers {
        let held = |h: u64| self.truth.iter().any(|t| t.contains(&h));
        let mut visible = Tiers::default();
        for (tier, set) in self.truth.iter().enumerate() {
            for &h in set {
                let mut ok = true;
                let mut cursor = self.blocks.get(&h).and_then(|b| b.parent);
                // Bounded by the number of blocks ever stored (chains are acyclic).
                for _ in 0..=self.blocks.len() {
                    let Some(p) = cursor else { break };
                    if !held(p) {
                        ok = false;
                        break;
                    }
                    cursor = self.blocks.get(&p).and_then(|b| b.parent);
                }
                if ok {
                    visible[tier].insert(h);
                }
            }
        }
        visible
    }

    /// Token ids of the chain from its root down to `leaf`.
    pub fn chain_tokens(&self, leaf: u64) -> Vec<u32> {
        let mut blocks = Vec::new();
        let mut cursor = Some(leaf);
        while let Some(h) = cursor {
            let info = self.blocks.get(&h).expect("unknown block");
            blocks.push(info.tokens.clone());
            cursor = info.parent;
            assert!(blocks.len() <= self.blocks.len(), "cycle in chain");
        }
        blocks.reverse();
        blocks.concat()
    }

    /// Engine hashes of the chain from its root down to `leaf`.
    pub fn chain_hashes(&self, leaf: u64) -> Vec<u64> {
        let mut chain = Vec::new();
        let mut cursor = Some(leaf);
        while let Some(h) = cursor {
            chain.push(h);
            cursor = self.blocks.get(&h).expect("unknown block").parent;
            assert!(chain.len() <= self.blocks.len(), "cycle in chain");
        }
        chain.reverse();
        chain
    }

    /// Announces every visible block again, parents first, with the tokens
    /// first sent (as an engine re-storing what it holds), `per_batch`
    /// blocks a batch; returns the number of batches published. Blocks held
    /// without their prefix cannot be announced to a receiver that lost
    /// their parents, so they are evicted first.
    pub fn republish_visible(&mut self, per_batch: usize) -> usize {
        let visible = self.visible_truth();
        let mut evictions = Vec::new();
        for (tier, (held, seen)) in self.truth.iter().zip(visible.iter()).enumerate() {
            let hidden: Vec<u64> = held.difference(seen).copied().collect();
            if !hidden.is_empty() {
                evictions.push(TestEvent::Removed { tier: StorageTier::ALL[tier], hashes: hidden });
            }
        }
        let mut batches = 0;
        if !evictions.is_empty() {
            self.publish(evictions);
            batches += 1;
        }
        let mut blocks: Vec<(usize, usize, u64)> = Vec::new();
        for (tier, set) in visible.iter().enumerate() {
            for &h in set {
                blocks.push((self.chain_hashes(h).len(), tier, h));
            }
        }
        blocks.sort_unstable();
        let events: Vec<TestEvent> = blocks
            .iter()
            .map(|&(_, tier, h)| TestEvent::Stored {
                tier: StorageTier::ALL[tier],
                parent: self.blocks[&h].parent,
                hashes: vec![h],
            })
            .collect();
        for chunk in events.chunks(per_batch.max(1)) {
            self.publish(chunk.to_vec());
            batches += 1;
        }
        batches
    }

    /// Local hashes of the chain from its root down to `leaf`.
    pub fn chain_locals(&self, leaf: u64) -> Vec<u64> {
        let mut chain = Vec::new();
        let mut cursor = Some(leaf);
        while let Some(h) = cursor {
            let info = self.blocks.get(&h).expect("unknown block");
            chain.push(info.local);
            cursor = info.parent;
            assert!(chain.len() <= self.blocks.len(), "cycle in chain");
        }
        chain.reverse();
        chain
    }
}

/// Applies one event to a cache state.
pub fn apply_to(truth: &mut Tiers, event: &TestEvent) {
    match event {
        TestEvent::Stored { tier, hashes, .. } => {
            truth[tier.index()].extend(hashes.iter().copied());
        }
        TestEvent::Removed { tier, hashes } => {
            for h in hashes {
                truth[tier.index()].remove(h);
            }
        }
        TestEvent::Cleared => truth.iter_mut().for_each(BTreeSet::clear),
    }
}

fn write_medium(buf: &mut Vec<u8>, tier: StorageTier) {
    let name = match tier {
        StorageTier::Device => "GPU",
        StorageTier::HostPinned => "cpu",
        StorageTier::Disk => "DISK",
        StorageTier::External => "EXTERNAL",
    };
    rmp::encode::write_str(buf, name).unwrap();
}

fn write_hash(buf: &mut Vec<u8>, hash: u64, form: HashForm) {
    match form {
        HashForm::Uint | HashForm::Mixed => {
            rmp::encode::write_uint(buf, hash).unwrap();
        }
        HashForm::Int => {
            rmp::encode::write_sint(buf, hash as i64).unwrap();
        }
        HashForm::Bytes => {
            let mut digest = [0xA5u8; 32];
            digest[24..].copy_from_slice(&hash.to_be_bytes());
            rmp::encode::write_bin(buf, &digest).unwrap();
        }
    }
}

fn write_hashes(buf: &mut Vec<u8>, hashes: &[u64], form: HashForm) {
    rmp::encode::write_array_len(buf, hashes.len() as u32).unwrap();
    for &h in hashes {
        write_hash(buf, h, form);
    }
}

fn write_opt_hash(buf: &mut Vec<u8>, hash: Option<u64>, form: HashForm) {
    match hash {
        Some(h) => write_hash(buf, h, form),
        None => rmp::encode::write_nil(buf).unwrap(),
    }
}

/// The replay thread: answers `[id, b"", start]` with every buffered batch
/// from `start` on, then the end marker.
fn serve_replay(router: zmq::Socket, ring: Arc<Mutex<Ring>>, stop: Arc<AtomicBool>, topic: Vec<u8>, form: ReplyForm) {
    // Replies held back (`hold_replay`), in order: sent once released.
    let mut held: Vec<Vec<Vec<u8>>> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        if !held.is_empty() && ring.lock().hold_after.is_none() {
            for reply in held.drain(..) {
                let _ = router.send_multipart(reply, 0);
            }
        }
        if router.poll(zmq::POLLIN, 20).unwrap_or(0) == 0 {
            continue;
        }
        let Ok(frames) = router.recv_multipart(zmq::DONTWAIT) else {
            continue;
        };
        // Anything but [id, "", 8-byte start] gets no reply, like the engines.
        let [id, empty, start] = frames.as_slice() else {
            continue;
        };
        let (true, Ok(start)) = (empty.is_empty(), <[u8; 8]>::try_from(start.as_slice())) else {
            continue;
        };
        let start = u64::from_be_bytes(start);
        let (batches, hold_after, pace) = {
            let mut ring = ring.lock();
            ring.requests.push(start);
            if ring.mute {
                continue;
            }
            let batches: Vec<(u64, Vec<u8>)> = ring.batches.iter().filter(|(seq, _)| *seq >= start).cloned().collect();
            (batches, ring.hold_after, ring.pace)
        };
        let reply = |seq: u64, payload: Vec<u8>| -> Vec<Vec<u8>> {
            match form {
                ReplyForm::ThreeFrames => vec![id.clone(), Vec::new(), seq.to_be_bytes().to_vec(), payload],
                ReplyForm::FourFramesBareEnd if seq == u64::MAX => {
                    vec![id.clone(), Vec::new(), Vec::new(), seq.to_be_bytes().to_vec(), payload]
                }
                ReplyForm::FourFrames | ReplyForm::FourFramesBareEnd => {
                    vec![id.clone(), Vec::new(), topic.clone(), seq.to_be_bytes().to_vec(), payload]
                }
            }
        };
        let replies = batches.into_iter().map(|(seq, payload)| reply(seq, payload));
        let mut replies: Vec<Vec<Vec<u8>>> = replies.chain([reply(u64::MAX, Vec::new())]).collect();
        let now = replies.len().min(hold_after.unwrap_or(usize::MAX));
        held.extend(replies.split_off(now));
        for r in replies {
            let _ = router.send_multipart(r, 0);
            // A paced answer is abandoned for a newer request, as one whose
            // requester is gone costs a real engine nothing.
            let Some(pace) = pace else { continue };
            if router.poll(zmq::POLLIN, pace.as_millis() as i64).unwrap_or(0) > 0 {
                break;
            }
        }
    }
}

impl Drop for TestPublisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.replay_thread.take() {
            let _ = h.join();
        }
    }
}

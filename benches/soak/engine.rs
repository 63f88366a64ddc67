//! A soak engine: binds a ZMQ publisher like vLLM, serves a paced stream of
//! requests against its own LRU block cache, and publishes what changes as
//! tagged msgpack batches (stores of the blocks a request adds, removes of
//! the blocks evicted for them, now and then a clear). Its cache is the
//! ground truth the final check compares answers with. Memory is bounded by
//! the cache capacity.

use super::workload::{Rng, Workload};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest wait for the daemon's subscription.
const SUBSCRIBE_WAIT_MS: u64 = 20_000;

/// How one engine runs.
#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    pub instance: u64,
    pub capacity_blocks: usize,
    pub requests_per_s: f64,
    /// A clear every this many batches; 0: never.
    pub clear_every: u64,
}

/// An engine's cache and socket.
pub struct Engine {
    pub cfg: EngineConfig,
    pub workload: Workload,
    _ctx: zmq::Context,
    xpub: zmq::Socket,
    pub endpoint: String,
    /// Block id -> last use tick.
    cached: HashMap<u64, u64>,
    /// Last use tick -> block id (the LRU order).
    lru: BTreeMap<u64, u64>,
    tick: u64,
    seq: u64,
    rng: Rng,
    /// Batches published, read by the reporter.
    pub published: Arc<AtomicU64>,
}

impl Engine {
    /// Binds a publisher on a free loopback port.
    pub fn bind(cfg: EngineConfig, workload: Workload) -> Engine {
        let ctx = zmq::Context::new();
        let xpub = ctx.socket(zmq::XPUB).expect("xpub socket");
        xpub.set_linger(0).unwrap();
        xpub.set_xpub_verbose(true).unwrap();
        xpub.set_sndhwm(1_000_000).unwrap();
        xpub.bind("tcp://127.0.0.1:*").expect("bind a loopback port");
        let endpoint = xpub.get_last_endpoint().unwrap().unwrap();
        Engine {
            cfg,
            workload,
            _ctx: ctx,
            xpub,
            endpoint,
            cached: HashMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
            seq: 0,
            rng: Rng::new(cfg.instance),
            published: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Waits for the daemon's subscription; false if it did not come.
    pub fn wait_subscribed(&self) -> bool {
        let deadline = Instant::now() + Duration::from_millis(SUBSCRIBE_WAIT_MS);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if self.xpub.poll(zmq::POLLIN, left.as_millis() as i64).unwrap_or(0) > 0 {
                if let Ok(msg) = self.xpub.recv_bytes(zmq::DONTWAIT) {
                    if msg.first() == Some(&1) {
                        return true;
                    }
                }
            }
        }
        false
    }

    /// Serves paced requests until `stop` is set.
    pub fn run(&mut self, stop: &AtomicBool) {
        let period = Duration::from_secs_f64(1.0 / self.cfg.requests_per_s);
        let mut next = Instant::now();
        let mut payload = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else if now - next > Duration::from_secs(1) {
                next = now; // far behind: do not burst to catch up
            }
            next += period;
            self.step(&mut payload);
        }
    }

    fn touch(&mut self, id: u64) {
        self.tick += 1;
        if let Some(old) = self.cached.insert(id, self.tick) {
            self.lru.remove(&old);
        }
        self.lru.insert(self.tick, id);
    }

    /// One request: store what it adds, evict what no longer fits, publish.
    fn step(&mut self, payload: &mut Vec<u8>) {
        let w = self.workload;
        let doc = w.pick_doc(&mut self.rng);
        let len = 1 + self.rng.below(w.doc_len(doc) as u64) as u32;
        let ids: Vec<u64> = (0..len).map(|p| w.block_id(doc, p)).collect();
        let clear = self.cfg.clear_every > 0 && self.seq % self.cfg.clear_every == self.cfg.clear_every - 1;
        if clear {
            self.cached.clear();
            self.lru.clear();
        }
        let first_missing = ids.iter().position(|id| !self.cached.contains_key(id));
        for &id in &ids {
            self.touch(id);
        }
        let mut evicted = Vec::new();
        while self.cached.len() > self.cfg.capacity_blocks {
            let (_, id) = self.lru.pop_first().expect("lru holds every cached block");
            self.cached.remove(&id);
            evicted.push(id);
        }
        let store = first_missing.map(|k| (k.checked_sub(1).map(|p| ids[p]), &ids[k..]));
        payload.clear();
        encode(payload, &w, clear, store, &evicted);
        let frames: [&[u8]; 3] = [b"kv", &self.seq.to_be_bytes(), payload];
        self.xpub.send_multipart(frames, 0).expect("publish");
        self.seq += 1;
        self.published.fetch_add(1, Ordering::Relaxed);
    }

    /// How many leading blocks of the first `blocks` of `doc` the cache holds.
    pub fn cached_prefix(&self, doc: u64, blocks: u32) -> u32 {
        (0..blocks).take_while(|&p| self.cached.contains_key(&self.workload.block_id(doc, p))).count() as u32
    }
}

/// `[ts, [events], nil]` with tagged events, as vLLM >= 0.24 sends them.
fn encode(buf: &mut Vec<u8>, w: &Workload, clear: bool, store: Option<(Option<u64>, &[u64])>, evicted: &[u64]) {
    use rmp::encode::*;
    let events = clear as u32 + store.is_some() as u32 + !evicted.is_empty() as u32;
    write_array_len(buf, 3).unwrap();
    write_f64(buf, 1_700_000_000.0).unwrap();
    write_array_len(buf, events).unwrap();
    if clear {
        write_map_len(buf, 1).unwrap();
        write_str(buf, "type").unwrap();
        write_str(buf, "AllBlocksCleared").unwrap();
    }
    if let Some((parent, hashes)) = store {
        write_map_len(buf, 8).unwrap();
        write_str(buf, "type").unwrap();
        write_str(buf, "BlockStored").unwrap();
        write_str(buf, "block_hashes").unwrap();
        write_array_len(buf, hashes.len() as u32).unwrap();
        for &h in hashes {
            write_uint(buf, h).unwrap();
        }
        write_str(buf, "parent_block_hash").unwrap();
        match parent {
            Some(p) => drop(write_uint(buf, p).unwrap()),
            None => write_nil(buf).unwrap(),
        }
        write_str(buf, "token_ids").unwrap();
        let mut tokens = Vec::with_capacity(hashes.len() * w.block_size as usize);
        for &h in hashes {
            w.tokens_into(h, &mut tokens);
        }
        write_array_len(buf, tokens.len() as u32).unwrap();
        for t in tokens {
            write_uint(buf, u64::from(t)).unwrap();
        }
        write_str(buf, "block_size").unwrap();
        write_uint(buf, u64::from(w.block_size)).unwrap();
        write_str(buf, "lora_id").unwrap();
        write_nil(buf).unwrap();
        write_str(buf, "medium").unwrap();
        write_str(buf, "GPU").unwrap();
        write_str(buf, "lora_name").unwrap();
        write_nil(buf).unwrap();
    }
    if !evicted.is_empty() {
        write_map_len(buf, 3).unwrap();
        write_str(buf, "type").unwrap();
        write_str(buf, "BlockRemoved").unwrap();
        write_str(buf, "block_hashes").unwrap();
        write_array_len(buf, evicted.len() as u32).unwrap();
        for &h in evicted {
            write_uint(buf, h).unwrap();
        }
        write_str(buf, "medium").unwrap();
        write_str(buf, "GPU").unwrap();
    }
    write_nil(buf).unwrap();
}

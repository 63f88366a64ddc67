//! The two query workloads and the engine state behind them, all
//! deterministic so every server gets the same events and the same queries.
//!
//! - `trace`: Mooncake conversation-trace prompts (hundreds of blocks each).
//!   Every hash id becomes 512 fixed pseudo-random tokens; a request's
//!   prompt is its ids' tokens cut to `input_length`. The first
//!   `TRACE_POPULATE` requests are stored on the worker that owns their
//!   conversation (chosen by the request's second hash id, so later turns
//!   land where the earlier ones are cached); queries are every second
//!   request of the first `2 * TRACE_QUERIES`, so about three quarters hit
//!   stored prompts and the rest only share a conversation prefix.
//! - `synthetic`: 128-block prompts from a pool of `POOL_PROMPTS`; each has
//!   a 32-block prefix shared by its group of 16 and 96 own blocks. Every
//!   worker stores `PROMPTS_PER_WORKER` random pool prompts, about a million
//!   (block, worker) pairs over 64 workers. Queries: 70% pool prompts, 20%
//!   pool prompts that diverge at a random block, 10% a group prefix
//!   followed by blocks nobody holds.

use std::io::BufRead;

use super::engines::dynamo_hash::chain_hash;
use super::engines::{stored_events, Engine, WireEvent};
use kv_indexer::hash::{local_hash, BASE_SEED};

pub const BLOCK_SIZE: usize = 16;
pub const WORKERS: usize = 64;
pub const TRACE_TOKENS_PER_ID: usize = 512;
/// Trace requests stored on the workers (about 0.96M (block, worker) pairs).
pub const TRACE_POPULATE: usize = 1_500;
pub const TRACE_QUERIES: usize = 1_024;
/// Longest trace prompt accepted, in tokens (the trace's longest is ~126k).
pub const TRACE_TOKENS_MAX: usize = 1 << 20;
pub const PROMPT_BLOCKS: usize = 128;
pub const SHARED_PREFIX_BLOCKS: usize = 32;
pub const GROUPS: u64 = 16;
pub const POOL_PROMPTS: u64 = 2_048;
pub const PROMPTS_PER_WORKER: usize = 160;
pub const SYNTH_QUERIES: usize = 2_048;
/// Vocabulary the fake tokens are drawn from.
const VOCAB: u64 = 50_000;

/// A stateless 64-bit mixer (splitmix64's finaliser).
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A small deterministic generator.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        mix(self.0.wrapping_mul(0xD134_2543_DE82_EF95))
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Appends `count` tokens derived from `id` (namespaced by `space`).
pub fn tokens_of(space: u64, id: u64, count: usize, out: &mut Vec<u32>) {
    let base = mix(space.wrapping_mul(0x1000_0000_01B3) ^ mix(id));
    out.extend((0..count as u64).map(|j| (mix(base ^ j) % VOCAB) as u32));
}

/// Namespaces of generated tokens, so blocks of different kinds never collide.
pub mod space {
    pub const TRACE: u64 = 1;
    pub const SYNTH: u64 = 2;
    pub const FRESH: u64 = 3;
    pub const SENTINEL: u64 = 4;
}

/// A workload: its model, workers, how to populate them, and its queries.
pub struct Workload {
    pub name: &'static str,
    pub model: String,
    /// Instance ids of its workers (`WORKERS` of them).
    pub first_instance: u64,
    /// Query prompts (token ids).
    pub queries: Vec<Vec<u32>>,
    /// Prompts to store, as (worker index, tokens).
    populate: Vec<(usize, Vec<u32>)>,
}

/// One trace line's fields that matter here.
struct TraceRequest {
    input_length: usize,
    hash_ids: Vec<u64>,
}

fn read_trace(path: &str, count: usize) -> Result<Vec<TraceRequest>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open trace {path}: {e}"))?;
    let mut out = Vec::with_capacity(count);
    for line in std::io::BufReader::new(file).lines().take(count) {
        let line = line.map_err(|e| format!("{path}: {e}"))?;
        let v: serde_json::Value = serde_json::from_str(&line).map_err(|e| format!("{path}: {e}"))?;
        let input_length = v["input_length"].as_u64().ok_or("trace line without input_length")? as usize;
        let hash_ids = v["hash_ids"]
            .as_array()
            .ok_or("trace line without hash_ids")?
            .iter()
            .map(|h| h.as_u64().ok_or("hash id is not an unsigned integer"))
            .collect::<Result<Vec<_>, _>>()?;
        out.push(TraceRequest { input_length: input_length.min(TRACE_TOKENS_MAX), hash_ids });
    }
    Ok(out)
}

fn trace_prompt(r: &TraceRequest) -> Vec<u32> {
    let mut tokens = Vec::with_capacity(r.hash_ids.len() * TRACE_TOKENS_PER_ID);
    for &id in &r.hash_ids {
        tokens_of(space::TRACE, id, TRACE_TOKENS_PER_ID, &mut tokens);
    }
    let full_blocks = r.input_length.min(tokens.len()) / BLOCK_SIZE;
    tokens.truncate(full_blocks * BLOCK_SIZE);
    tokens
}

/// The conversation-trace workload.
pub fn trace(path: &str, first_instance: u64) -> Result<Workload, String> {
    let requests = read_trace(path, (2 * TRACE_QUERIES).max(TRACE_POPULATE))?;
    if requests.len() < TRACE_POPULATE {
        return Err(format!("{path} has {} requests, the bench needs {TRACE_POPULATE}", requests.len()));
    }
    let populate = requests[..TRACE_POPULATE]
        .iter()
        .map(|r| {
            let key = r.hash_ids.get(1).or(r.hash_ids.first()).copied().unwrap_or(0);
            ((mix(key) % WORKERS as u64) as usize, trace_prompt(r))
        })
        .collect();
    let queries = requests.iter().step_by(2).take(TRACE_QUERIES).map(trace_prompt).collect();
    Ok(Workload { name: "trace", model: "trace".into(), first_instance, queries, populate })
}

fn pool_block(prompt: u64, block: usize, out: &mut Vec<u32>) {
    if block < SHARED_PREFIX_BLOCKS {
        tokens_of(space::SYNTH, (prompt % GROUPS) << 32 | block as u64, BLOCK_SIZE, out);
    } else {
        tokens_of(space::SYNTH, (GROUPS + prompt) << 32 | block as u64, BLOCK_SIZE, out);
    }
}

fn pool_prompt(prompt: u64) -> Vec<u32> {
    let mut tokens = Vec::with_capacity(PROMPT_BLOCKS * BLOCK_SIZE);
    for b in 0..PROMPT_BLOCKS {
        pool_block(prompt, b, &mut tokens);
    }
    tokens
}

/// The synthetic 128-block workload.
pub fn synthetic(first_instance: u64) -> Workload {
    let mut rng = Rng(7);
    let mut populate = Vec::with_capacity(WORKERS * PROMPTS_PER_WORKER);
    for w in 0..WORKERS {
        for _ in 0..PROMPTS_PER_WORKER {
            populate.push((w, pool_prompt(rng.below(POOL_PROMPTS))));
        }
    }
    let mut queries = Vec::with_capacity(SYNTH_QUERIES);
    let mut fresh = 0u64;
    for _ in 0..SYNTH_QUERIES {
        let prompt = rng.below(POOL_PROMPTS);
        let roll = rng.below(100);
        let keep = if roll < 70 {
            PROMPT_BLOCKS
        } else if roll < 90 {
            rng.below(PROMPT_BLOCKS as u64) as usize
        } else {
            SHARED_PREFIX_BLOCKS
        };
        let mut tokens = Vec::with_capacity(PROMPT_BLOCKS * BLOCK_SIZE);
        for b in 0..PROMPT_BLOCKS {
            if b < keep {
                pool_block(prompt, b, &mut tokens);
            } else {
                fresh += 1;
                tokens_of(space::FRESH, fresh, BLOCK_SIZE, &mut tokens);
            }
        }
        queries.push(tokens);
    }
    Workload { name: "synthetic", model: "synthetic".into(), first_instance, queries, populate }
}

impl Workload {
    /// Engines for this workload's workers.
    pub fn engines(&self, ctx: &zmq::Context) -> Result<Vec<Engine>, String> {
        (0..WORKERS).map(|w| Engine::new(ctx, self.first_instance + w as u64, BLOCK_SIZE)).collect()
    }

    /// The body of a `/register` for engine `e`.
    pub fn register_body(&self, e: &Engine) -> String {
        serde_json::json!({
            "instance_id": e.instance_id,
            "endpoint": e.endpoint,
            "model_name": self.model,
            "block_size": BLOCK_SIZE,
        })
        .to_string()
    }

    /// Stores every populate prompt on its worker; returns blocks published.
    pub fn populate(&self, engines: &mut [Engine]) -> Result<u64, String> {
        let mut blocks = 0;
        for (w, tokens) in &self.populate {
            blocks += engines[*w].store_prompt(tokens)? as u64;
        }
        Ok(blocks)
    }

    /// The JSON body of a `/query` for query `i`.
    pub fn query_body(&self, i: usize) -> String {
        query_body(&self.model, &self.queries[i])
    }
}

/// A `/query` body.
pub fn query_body(model: &str, tokens: &[u32]) -> String {
    let mut body = String::with_capacity(tokens.len() * 6 + 64);
    body.push_str("{\"model_name\":\"");
    body.push_str(model);
    body.push_str("\",\"token_ids\":[");
    for (i, t) in tokens.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&t.to_string());
    }
    body.push_str("]}");
    body
}

/// Tokens of sentinel generation `generation` (one block).
pub fn sentinel_tokens(generation: u64) -> Vec<u32> {
    let mut tokens = Vec::with_capacity(BLOCK_SIZE);
    tokens_of(space::SENTINEL, generation, BLOCK_SIZE, &mut tokens);
    tokens
}

/// Every worker drops sentinel `generation - 1` and stores `generation`, a
/// one-block root prompt. Per-worker order means a server that shows it on
/// every worker has applied all that came before.
pub fn publish_sentinel(engines: &mut [Engine], generation: u64) -> Result<(), String> {
    let hash = local_hash(&sentinel_tokens(generation), BASE_SEED);
    let old = generation.checked_sub(1).map(|g| local_hash(&sentinel_tokens(g), BASE_SEED));
    for e in engines.iter_mut() {
        let mut events = Vec::new();
        if let Some(old) = old.filter(|h| e.held.remove(h)) {
            events.push(WireEvent::Removed { hashes: vec![old], medium: super::engines::Medium::Gpu });
        }
        events.extend(stored_events(None, &[hash], &sentinel_tokens(generation), BLOCK_SIZE));
        e.publish(&events)?;
        e.held.insert(hash);
    }
    Ok(())
}

/// Ingest load: stores fresh 16-block chains under prompts the workers hold
/// and removes each one `CHURN_LIVE` steps later, so the state stays the
/// same size while the server applies events.
pub struct Churn {
    rng: Rng,
    step: u64,
    fresh: u64,
    /// Chains stored and not yet removed, oldest first: (worker, hashes).
    live: std::collections::VecDeque<(usize, Vec<u64>)>,
    pub blocks_published: u64,
}

/// Blocks per churn store (and per remove).
pub const CHURN_BLOCKS: usize = 16;
/// Chains alive at once.
pub const CHURN_LIVE: usize = 256;

impl Churn {
    pub fn new(seed: u64) -> Churn {
        Churn { rng: Rng(seed), step: 0, fresh: seed << 40, live: Default::default(), blocks_published: 0 }
    }

    /// One batch on the next worker: a fresh chain stored and, once
    /// `CHURN_LIVE` are alive, the oldest removed (on its own worker).
    pub fn step(&mut self, engines: &mut [Engine]) -> Result<(), String> {
        let w = (self.step % engines.len() as u64) as usize;
        self.step += 1;
        let e = &mut engines[w];
        let parent = match e.tips.len() {
            0 => None,
            n => Some(e.tips[self.rng.below(n as u64) as usize]),
        };
        let mut tokens = Vec::with_capacity(CHURN_BLOCKS * BLOCK_SIZE);
        for _ in 0..CHURN_BLOCKS {
            self.fresh += 1;
            tokens_of(space::FRESH, self.fresh, BLOCK_SIZE, &mut tokens);
        }
        let mut hashes = Vec::with_capacity(CHURN_BLOCKS);
        let mut prev = parent;
        for block in tokens.chunks_exact(BLOCK_SIZE) {
            let local = local_hash(block, BASE_SEED);
            let h = prev.map_or(local, |p| chain_hash(p, local));
            hashes.push(h);
            prev = Some(h);
        }
        e.publish(&stored_events(parent, &hashes, &tokens, BLOCK_SIZE))?;
        self.blocks_published += CHURN_BLOCKS as u64;
        self.live.push_back((w, hashes));
        if self.live.len() > CHURN_LIVE {
            self.remove_oldest(engines)?;
        }
        Ok(())
    }

    fn remove_oldest(&mut self, engines: &mut [Engine]) -> Result<(), String> {
        let Some((w, hashes)) = self.live.pop_front() else { return Ok(()) };
        self.blocks_published += hashes.len() as u64;
        engines[w].publish(&[WireEvent::Removed { hashes, medium: super::engines::Medium::Gpu }])
    }

    /// Removes every chain still alive.
    pub fn finish(&mut self, engines: &mut [Engine]) -> Result<(), String> {
        while !self.live.is_empty() {
            self.remove_oldest(engines)?;
        }
        Ok(())
    }
}

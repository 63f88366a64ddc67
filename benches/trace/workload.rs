//! Turns a trace into the op stream a router-side index sees: one query per
//! request followed by the KV events of the engine that serves it.
//!
//! Requests are spread over `workers` mock engines (round robin by default).
//! A request's prompt tokens are derived from its hash ids, cut into blocks
//! of `block_size`, and hashed with `kv_indexer::hash`. At its arrival time
//! the router queries the index with the prompt's local hashes, then the
//! engine admits the prompt (Removed for evictions, Stored for new blocks).
//! The request then decodes for `output_tokens * decode_us_per_token` and at
//! completion the engine stores the full blocks its output completed and
//! releases everything. With `decode_events` the engine instead stores each
//! output block as it completes, one block per Stored event whose parent is
//! the block before, as an engine decoding does (the block's last token is
//! generated `decode_us_per_token` after the one before it); at completion it
//! only releases. The stream is generated once, in trace time, and
//! replayed at any speed; it records for each op the worker and a range in
//! one of three slabs, so no per-op allocation is kept.
//!
//! At the end the engines' true caches give, for sampled queries, the exact
//! prefix depth each worker holds: the oracle the index is checked against.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use kv_indexer::hash::{local_hashes_into, BASE_SEED};
use rustc_hash::FxHashMap;

use super::dynamo_hash::sequence_hashes_into;
use super::engine::{Admission, MockEngine, RemovedRec, StoredRec};
use super::mooncake::TraceRequest;
use super::tokens::{mix64, output_tokens, prompt_tokens};

/// Most workers a workload may spread requests over.
pub const WORKERS_MAX: u32 = 65_536;
/// Most sampled queries checked against the engines at the end.
pub const VERIFY_SAMPLES_MAX: usize = 100_000;

/// How requests are spread over workers.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Assign {
    /// Request `i` goes to worker `i % workers`.
    RoundRobin,
    /// A hash of the request's first hash id picks the worker (prefix affinity).
    FirstBlock,
    /// A seeded hash of the request number picks the worker.
    Random,
}

impl Assign {
    /// Parses `round-robin`, `first-block` or `random`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "round-robin" => Some(Self::RoundRobin),
            "first-block" => Some(Self::FirstBlock),
            "random" => Some(Self::Random),
            _ => None,
        }
    }

    /// The name `parse` accepts.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RoundRobin => "round-robin",
            Self::FirstBlock => "first-block",
            Self::Random => "random",
        }
    }
}

/// Parameters of the generated workload.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    pub block_size: usize,
    pub workers: u32,
    pub gpu_blocks: usize,
    pub assign: Assign,
    pub decode_us_per_token: u64,
    /// Store output blocks one per event while decoding, not all at completion.
    pub decode_events: bool,
    /// Seeds the engines' hash seeds and the random assignment.
    pub seed: u64,
    pub verify_samples: usize,
}

/// What an op is; its payload is `start..start+len` in the matching slab.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Local hashes of a request's prompt blocks (`Workload::query_locals`).
    Query,
    /// A chain of stored blocks (`Workload::stored`); `parent` is the
    /// engine hash and prefix key of the block before it.
    Stored { parent: Option<(u64, u64)> },
    /// Evicted blocks (`Workload::removed`).
    Removed,
}

/// One op of the stream, at trace time `t_us`.
#[derive(Copy, Clone, Debug)]
pub struct Op {
    pub t_us: u64,
    /// The engine that emits the event, or serves the query.
    pub worker: u32,
    pub kind: OpKind,
    pub start: usize,
    pub len: u32,
}

impl Op {
    /// Whether this op is a KV event (not a query).
    pub fn is_event(&self) -> bool {
        !matches!(self.kind, OpKind::Query)
    }
}

/// A query checked at the end, with the exact depth every worker holds.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Range in `Workload::query_locals`.
    pub start: usize,
    pub len: u32,
    /// (worker, depth in blocks) for each worker with depth > 0, by worker.
    pub expected: Vec<(u32, u32)>,
}

/// Counts that describe the workload.
#[derive(Clone, Debug, Default)]
pub struct WorkloadStats {
    pub requests: u64,
    pub query_blocks: u64,
    pub stored_blocks: u64,
    pub removed_blocks: u64,
    pub stored_events: u64,
    pub removed_events: u64,
    /// Prompt blocks the engines already had cached when the request arrived.
    pub engine_hit_blocks: u64,
    /// Stored blocks completed by output tokens.
    pub output_blocks: u64,
    /// Blocks not cached because the engine had no unreferenced block to evict.
    pub shortfall_blocks: u64,
    /// Live (block, worker) pairs when the trace ends.
    pub live_pairs_end: u64,
    pub live_pairs_max: u64,
    /// Trace time from first to last op.
    pub span_us: u64,
}

impl WorkloadStats {
    /// Block ops as Dynamo counts them: stored + removed + query blocks.
    pub fn block_ops(&self) -> u64 {
        self.stored_blocks + self.removed_blocks + self.query_blocks
    }
}

/// The generated op stream and everything needed to replay and check it.
pub struct Workload {
    pub config: WorkloadConfig,
    pub ops: Vec<Op>,
    pub query_locals: Vec<u64>,
    pub stored: Vec<StoredRec>,
    pub removed: Vec<RemovedRec>,
    pub samples: Vec<Sample>,
    pub stats: WorkloadStats,
}

impl Workload {
    /// Block ops of one op (what it adds to the block-op count).
    pub fn op_blocks(op: &Op) -> u64 {
        op.len as u64
    }
}

/// Step number of a request's completion in the schedule (after every output block).
const COMPLETION: u32 = u32::MAX;

struct Running {
    worker: u32,
    /// Prefix keys of the held blocks: the prompt's, then output blocks stored while decoding.
    held: Vec<u64>,
    out_locals: Vec<u64>,
    out_seqs: Vec<u64>,
    /// Output blocks before this one were stored while decoding (or dropped).
    out_next: usize,
    t_start_us: u64,
    t_end_us: u64,
    /// Output tokens that complete the first output block.
    first_out_tokens: u64,
}

impl Running {
    /// Trace time at which output block `j` is complete.
    fn block_done_us(&self, j: usize, block_size: usize, decode_us_per_token: u64) -> u64 {
        let tokens = self.first_out_tokens + (j * block_size) as u64;
        (self.t_start_us + tokens * decode_us_per_token).min(self.t_end_us)
    }
}

struct Builder {
    cfg: WorkloadConfig,
    engines: Vec<MockEngine>,
    wl: Workload,
    live_pairs: u64,
}

impl Builder {
    fn push_admission(&mut self, t_us: u64, worker: u32, adm: &Admission) {
        let st = &mut self.wl.stats;
        if !adm.removed.is_empty() {
            self.wl.ops.push(Op {
                t_us,
                worker,
                kind: OpKind::Removed,
                start: self.wl.removed.len(),
                len: adm.removed.len() as u32,
            });
            self.wl.removed.extend_from_slice(&adm.removed);
            st.removed_events += 1;
            st.removed_blocks += adm.removed.len() as u64;
            self.live_pairs -= adm.removed.len() as u64;
        }
        for run in &adm.stored {
            self.wl.ops.push(Op {
                t_us,
                worker,
                kind: OpKind::Stored { parent: run.parent },
                start: self.wl.stored.len(),
                len: run.blocks.len() as u32,
            });
            self.wl.stored.extend_from_slice(&run.blocks);
            st.stored_events += 1;
            st.stored_blocks += run.blocks.len() as u64;
            self.live_pairs += run.blocks.len() as u64;
        }
        st.shortfall_blocks += adm.shortfall_blocks as u64;
        st.live_pairs_max = st.live_pairs_max.max(self.live_pairs);
    }

    /// Stores output block `j` of a decoding request, continuing its held blocks.
    fn decode_block(&mut self, t_us: u64, r: &mut Running, j: usize) {
        let engine = &mut self.engines[r.worker as usize];
        let adm = engine.admit(r.held.last().copied(), &r.out_locals[j..=j], &r.out_seqs[j..=j]);
        if adm.held_blocks == 1 {
            r.held.push(r.out_seqs[j]);
            r.out_next = j + 1;
        } else {
            // No block to evict: the rest of the output is not cached either.
            r.out_next = r.out_locals.len();
        }
        self.wl.stats.output_blocks += adm.stored.iter().map(|s| s.blocks.len() as u64).sum::<u64>();
        self.push_admission(t_us, r.worker, &adm);
    }

    fn complete(&mut self, t_us: u64, r: Running) {
        let engine = &mut self.engines[r.worker as usize];
        let rest = r.out_next..r.out_locals.len();
        let adm = engine.admit(r.held.last().copied(), &r.out_locals[rest.clone()], &r.out_seqs[rest.clone()]);
        let out_held = &r.out_seqs[rest.start..rest.start + adm.held_blocks];
        // Release tail first: output blocks, then the prompt.
        engine.release(out_held);
        engine.release(&r.held);
        let stored_new: u64 = adm.stored.iter().map(|s| s.blocks.len() as u64).sum();
        self.wl.stats.output_blocks += stored_new;
        self.push_admission(t_us, r.worker, &adm);
    }

    /// Runs step `step` (an output block, or `COMPLETION`) of request `key`
    /// and schedules its next one.
    fn advance(
        &mut self,
        t_us: u64,
        key: u64,
        step: u32,
        running: &mut FxHashMap<u64, Running>,
        pending: &mut Pending,
    ) {
        if step == COMPLETION {
            let r = running.remove(&key).expect("running request");
            self.complete(t_us, r);
            return;
        }
        let r = running.get_mut(&key).expect("running request");
        self.decode_block(t_us, r, step as usize);
        let (bs, us) = (self.cfg.block_size, self.cfg.decode_us_per_token);
        let next = if r.out_next < r.out_locals.len() {
            (r.block_done_us(r.out_next, bs, us), r.out_next as u32)
        } else {
            (r.t_end_us, COMPLETION)
        };
        pending.push(Reverse((next.0, key, next.1)));
    }
}

/// Steps to come, by (trace time, request, step): ties keep arrival order,
/// and a request's output blocks come before its completion.
type Pending = BinaryHeap<Reverse<(u64, u64, u32)>>;

fn pick_worker(cfg: &WorkloadConfig, i: usize, req: &TraceRequest) -> u32 {
    let w = cfg.workers as u64;
    match cfg.assign {
        Assign::RoundRobin => (i as u64 % w) as u32,
        Assign::FirstBlock => (mix64(req.hash_ids[0] ^ cfg.seed) % w) as u32,
        Assign::Random => (mix64(i as u64 ^ mix64(cfg.seed)) % w) as u32,
    }
}

/// Generates the op stream for `requests` (already duplicated if wanted).
pub fn generate(requests: &[TraceRequest], cfg: &WorkloadConfig) -> Result<Workload, String> {
    if cfg.block_size == 0 || cfg.block_size > 1 << 16 {
        return Err("block size must be in 1..=65536".into());
    }
    if cfg.workers == 0 || cfg.workers > WORKERS_MAX {
        return Err(format!("workers must be in 1..={WORKERS_MAX}"));
    }
    if cfg.gpu_blocks == 0 {
        return Err("gpu blocks must be at least 1".into());
    }
    let engines =
        (0..cfg.workers).map(|w| MockEngine::new(cfg.gpu_blocks, mix64(cfg.seed ^ mix64(w as u64 + 1)))).collect();
    let mut b = Builder {
        cfg: cfg.clone(),
        engines,
        wl: Workload {
            config: cfg.clone(),
            ops: Vec::new(),
            query_locals: Vec::new(),
            stored: Vec::new(),
            removed: Vec::new(),
            samples: Vec::new(),
            stats: WorkloadStats::default(),
        },
        live_pairs: 0,
    };
    let bs = cfg.block_size;
    let samples = cfg.verify_samples.min(VERIFY_SAMPLES_MAX).min(requests.len());
    let sample_every = requests.len().div_ceil(samples.max(1));
    let mut sample_ranges = Vec::with_capacity(samples);

    let mut pending = Pending::new();
    let mut running: FxHashMap<u64, Running> = Default::default();
    let (mut tokens, mut locals, mut seqs) = (Vec::new(), Vec::new(), Vec::new());
    let mut first_t = None;
    let mut last_t = 0;

    for (i, req) in requests.iter().enumerate() {
        let t_us = req.timestamp_ms.saturating_mul(1000);
        while let Some(&Reverse((t, key, step))) = pending.peek() {
            if t > t_us {
                break;
            }
            pending.pop();
            b.advance(t, key, step, &mut running, &mut pending);
        }
        first_t.get_or_insert(t_us);
        let worker = pick_worker(cfg, i, req);

        tokens.clear();
        prompt_tokens(&req.hash_ids, req.input_tokens as usize, &mut tokens);
        let prompt_blocks = tokens.len() / bs;
        output_tokens(i as u64, req.output_tokens as usize, &mut tokens);
        locals.clear();
        local_hashes_into(&tokens, bs, BASE_SEED, &mut locals);
        sequence_hashes_into(&locals, &mut seqs);

        // The router's query comes first, then the engine's events.
        let q_start = b.wl.query_locals.len();
        b.wl.query_locals.extend_from_slice(&locals[..prompt_blocks]);
        b.wl.ops.push(Op { t_us, worker, kind: OpKind::Query, start: q_start, len: prompt_blocks as u32 });
        b.wl.stats.requests += 1;
        b.wl.stats.query_blocks += prompt_blocks as u64;
        if i % sample_every == 0 && prompt_blocks > 0 && sample_ranges.len() < samples {
            sample_ranges.push((q_start, prompt_blocks as u32));
        }

        let engine = &mut b.engines[worker as usize];
        let adm = engine.admit(None, &locals[..prompt_blocks], &seqs[..prompt_blocks]);
        b.wl.stats.engine_hit_blocks += adm.hit_blocks as u64;
        let held = seqs[..adm.held_blocks].to_vec();
        // Output blocks are cached only after a prompt cached in full.
        let (out_locals, out_seqs) = if adm.shortfall_blocks == 0 {
            (locals[prompt_blocks..].to_vec(), seqs[prompt_blocks..].to_vec())
        } else {
            (Vec::new(), Vec::new())
        };
        b.push_admission(t_us, worker, &adm);
        let t_end = t_us + req.output_tokens as u64 * cfg.decode_us_per_token;
        let first_out_tokens = ((prompt_blocks + 1) * bs - req.input_tokens as usize) as u64;
        let r = Running {
            worker,
            held,
            out_locals,
            out_seqs,
            out_next: 0,
            t_start_us: t_us,
            t_end_us: t_end,
            first_out_tokens,
        };
        let first = if cfg.decode_events && !r.out_locals.is_empty() {
            (r.block_done_us(0, bs, cfg.decode_us_per_token), 0)
        } else {
            (t_end, COMPLETION)
        };
        pending.push(Reverse((first.0, i as u64, first.1)));
        running.insert(i as u64, r);
        last_t = last_t.max(t_us);
    }
    while let Some(Reverse((t, key, step))) = pending.pop() {
        b.advance(t, key, step, &mut running, &mut pending);
        last_t = last_t.max(t);
    }

    // The oracle: exact depths from the engines' final caches.
    for (start, len) in sample_ranges {
        let q = &b.wl.query_locals[start..start + len as usize];
        sequence_hashes_into(q, &mut seqs);
        let expected = b
            .engines
            .iter()
            .enumerate()
            .filter_map(|(w, e)| {
                let d = e.cached_prefix(&seqs);
                (d > 0).then_some((w as u32, d as u32))
            })
            .collect();
        b.wl.samples.push(Sample { start, len, expected });
    }
    b.wl.stats.live_pairs_end = b.engines.iter().map(|e| e.cached_blocks() as u64).sum();
    assert_eq!(b.wl.stats.live_pairs_end, b.live_pairs, "event accounting");
    b.wl.stats.span_us = last_t - first_t.unwrap_or(0);
    Ok(b.wl)
}

//! Predicted placements in a routing loop: what a router gains by booking
//! each decision (`/routed`) before the engine's events arrive, and what
//! the bookings cost the query path.
//!
//! `cargo bench --bench predict -- [--trace PATH] [--delays 0,50,500]
//! [--ttl-ms 2000] [--speedup 1] [--burst 1 --burst-gap-ms 10] [--repeat 1]`
//! plus the workload options
//! of `trace_replay` (`--workers`, `--gpu-blocks`, `--block-size`,
//! `--decode-ms`, `--dup`, `--seed`).
//!
//! `--burst K` turns each trace request into K requests `--burst-gap-ms`
//! apart that share its prompt but its last block (one document, K
//! questions): the case predictions are for, which the Mooncake traces
//! hold little of.
//!
//! A closed loop in trace time, one thread: requests arrive at their trace
//! timestamps (divided by `--speedup`); a router asks kv-indexer's index
//! (and the predictions beside it) for each worker's prefix and sends the
//! request to the worker of least cost, Dynamo's default shape: blocks to
//! prefill (prompt minus the prefix it credits the worker with) plus the
//! blocks the worker's running requests hold; ties go to a hash of the
//! request. The chosen mock engine admits it at once (prefix caching, LRU
//! eviction, as in `trace_replay`) and its Stored and Removed events reach
//! the index `delay` ms of trace time later (queueing, prefill,
//! publishing). A request runs for `output_tokens * decode-ms`, then
//! releases its blocks.
//!
//! Two routers per delay: `gpu` credits what the index says the worker
//! holds; `booked` credits `max(gpu, predicted)` and books every decision
//! for the TTL. Hits are the engines' own: the prompt blocks the chosen
//! engine really had cached. "Seen stale" counts requests whose engine hit
//! passed the index's gpu for that worker (its events were in flight);
//! "covered" those of them whose predicted depth reached the engine's hit.

mod trace;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use trace::dynamo_hash::sequence_hashes_into;

use kv_indexer::hash::{local_hashes_into, BASE_SEED};
use kv_indexer::index::{Index, IndexConfig};
use kv_indexer::predict::{PredictLimits, Predictions};
use kv_indexer::{Event, EventKind, StorageTier, StoredBlock, WorkerId};
use trace::args::{parse, CommonArgs, OPTIONS_HELP};
use trace::engine::{Admission, MockEngine};
use trace::mooncake::TraceRequest;
use trace::replay::Percentiles;
use trace::tokens::{mix64, prompt_tokens};

const SAMPLE_TRACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/data/sample_trace.jsonl");
const REPEAT_MAX: usize = 100;

/// One request, hashed once for every run.
struct Request {
    t_us: u64,
    run_us: u64,
    locals: Vec<u64>,
    seqs: Vec<u64>,
}

struct Opts {
    delays_ms: Vec<u64>,
    ttl_ms: u64,
    speedup: f64,
    burst: usize,
    burst_gap_ms: u64,
    repeat: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Router {
    Gpu,
    Booked,
}

impl Router {
    fn name(self) -> &'static str {
        match self {
            Router::Gpu => "gpu",
            Router::Booked => "booked",
        }
    }
}

#[derive(Default)]
struct RunResult {
    prompt_blocks: u64,
    hit_blocks: u64,
    stale: u64,
    covered: u64,
    /// Requests whose chosen worker was predicted past its gpu.
    chose_predicted: u64,
    refused: u64,
    query_ns: Vec<u64>,
    lookup_ns: Vec<u64>,
    peak_predicted_blocks: u64,
}

fn main() {
    let help = format!(
        "predict: a booking router against a gpu-only one, in trace time\n\n  \
         --delays LIST         event delays in ms of trace time [0,50,500]\n  \
         --ttl-ms N            booking TTL [2000]\n  \
         --speedup X           divide trace timestamps by X [1]\n  \
         --burst K             K requests per trace request, sharing all but its last block [1]\n  \
         --burst-gap-ms N      between the requests of a burst [10]\n  \
         --repeat N            runs of each cell, interleaved (latency figures) [1]\n{OPTIONS_HELP}"
    );
    let mut opts =
        Opts { delays_ms: vec![0, 50, 500], ttl_ms: 2000, speedup: 1.0, burst: 1, burst_gap_ms: 10, repeat: 1 };
    let args = match parse(SAMPLE_TRACE, &help, &mut |name, v| {
        match name {
            "delays" => {
                opts.delays_ms = v
                    .split(',')
                    .map(|d| d.trim().parse::<u64>().ok().filter(|d| *d <= 600_000))
                    .collect::<Option<Vec<_>>>()
                    .ok_or(format!("--delays wants ms in 0..=600000, comma separated, got {v:?}"))?
            }
            "ttl-ms" => {
                opts.ttl_ms = v
                    .parse()
                    .ok()
                    .filter(|t| (1..=kv_indexer::predict::TTL_MS_MAX).contains(t))
                    .ok_or(format!("--ttl-ms wants 1..={}", kv_indexer::predict::TTL_MS_MAX))?
            }
            "speedup" => {
                opts.speedup =
                    v.parse().ok().filter(|s: &f64| (0.01..=1000.0).contains(s)).ok_or("--speedup wants 0.01..=1000")?
            }
            "burst" => opts.burst = v.parse().ok().filter(|k| (1..=64).contains(k)).ok_or("--burst wants 1..=64")?,
            "burst-gap-ms" => {
                opts.burst_gap_ms = v.parse().ok().filter(|g| *g <= 60_000).ok_or("--burst-gap-ms wants 0..=60000")?
            }
            "repeat" => {
                opts.repeat = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=REPEAT_MAX).contains(n))
                    .ok_or(format!("--repeat wants 1..={REPEAT_MAX}"))?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("predict: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args, &opts) {
        eprintln!("predict: {e}");
        std::process::exit(1);
    }
}

/// Each request as `burst` requests `gap_ms` apart, the copies' last hash
/// id replaced by one of their own.
fn bursts(trace: Vec<TraceRequest>, burst: usize, gap_ms: u64) -> Vec<TraceRequest> {
    let mut next_id = trace.iter().flat_map(|r| r.hash_ids.iter()).max().map_or(0, |m| m + 1);
    let mut out = Vec::with_capacity(trace.len() * burst);
    for r in trace {
        for c in 0..burst as u64 {
            let mut copy = r.clone();
            copy.timestamp_ms += c * gap_ms;
            if c > 0 {
                *copy.hash_ids.last_mut().expect("a request has hash ids") = next_id;
                next_id += 1;
            }
            out.push(copy);
        }
    }
    out.sort_by_key(|r| r.timestamp_ms);
    out
}

fn requests(args: &CommonArgs, opts: &Opts) -> Result<Vec<Request>, String> {
    let trace = trace::mooncake::load(&args.trace)?;
    let trace = trace::mooncake::duplicate(&trace, args.dup)?;
    let trace = bursts(trace, opts.burst, opts.burst_gap_ms);
    let speedup = opts.speedup;
    let mut tokens = Vec::new();
    let mut out = Vec::with_capacity(trace.len());
    for r in &trace {
        tokens.clear();
        prompt_tokens(&r.hash_ids, r.input_tokens as usize, &mut tokens);
        let mut locals = Vec::new();
        local_hashes_into(&tokens, args.cfg.block_size, BASE_SEED, &mut locals);
        let mut seqs = Vec::new();
        sequence_hashes_into(&locals, &mut seqs);
        out.push(Request {
            t_us: (r.timestamp_ms as f64 * 1000.0 / speedup) as u64,
            run_us: r.output_tokens as u64 * args.cfg.decode_us_per_token,
            locals,
            seqs,
        });
    }
    Ok(out)
}

fn run(args: &CommonArgs, opts: &Opts) -> Result<(), String> {
    let reqs = requests(args, opts)?;
    let span_s = reqs.last().map_or(0.0, |r| r.t_us as f64 / 1e6);
    let blocks: usize = reqs.iter().map(|r| r.locals.len()).sum();
    println!(
        "trace {}: {} requests over {span_s:.0} s of trace time (speedup {}, bursts of {} every {} ms), \
         {blocks} prompt blocks of {}; {} workers x {} blocks, decode {} ms/token, TTL {} ms",
        args.trace,
        reqs.len(),
        opts.speedup,
        opts.burst,
        opts.burst_gap_ms,
        args.cfg.block_size,
        args.cfg.workers,
        args.cfg.gpu_blocks,
        args.cfg.decode_us_per_token as f64 / 1000.0,
        opts.ttl_ms
    );
    println!(
        "\n| delay | router | engine prefix hits | gain | seen stale | covered by a booking | chose a booked worker | \
         query p50 / p99 | predictions' part p50 / p99 |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for &delay_ms in &opts.delays_ms {
        let mut gpu_runs = Vec::new();
        let mut booked_runs = Vec::new();
        for _ in 0..opts.repeat {
            gpu_runs.push(simulate(args, opts, &reqs, delay_ms, Router::Gpu));
            booked_runs.push(simulate(args, opts, &reqs, delay_ms, Router::Booked));
        }
        let base = gpu_runs[0].hit_blocks as f64;
        for (router, runs) in [(Router::Gpu, &mut gpu_runs), (Router::Booked, &mut booked_runs)] {
            let r = &runs[0];
            let mut q: Vec<u64> = runs.iter().flat_map(|r| r.query_ns.iter().copied()).collect();
            let mut l: Vec<u64> = runs.iter().flat_map(|r| r.lookup_ns.iter().copied()).collect();
            let (q, l) = (Percentiles::of(&mut q), Percentiles::of(&mut l));
            let n = reqs.len() as f64;
            println!(
                "| {delay_ms} ms | {} | {:.2}% | {:+.2}% | {:.1}% | {} | {} | {:.2} / {:.2} µs | {:.2} / {:.2} µs |",
                router.name(),
                100.0 * r.hit_blocks as f64 / r.prompt_blocks.max(1) as f64,
                100.0 * (r.hit_blocks as f64 / base.max(1.0) - 1.0),
                100.0 * r.stale as f64 / n,
                if router == Router::Booked {
                    format!("{:.1}%", 100.0 * r.covered as f64 / r.stale.max(1) as f64)
                } else {
                    "-".into()
                },
                if router == Router::Booked {
                    format!("{:.1}%", 100.0 * r.chose_predicted as f64 / n)
                } else {
                    "-".into()
                },
                q.p50 as f64 / 1e3,
                q.p99 as f64 / 1e3,
                l.p50 as f64 / 1e3,
                l.p99 as f64 / 1e3,
            );
            if router == Router::Booked && (r.refused > 0 || r.peak_predicted_blocks > 0) {
                eprintln!(
                    "  {delay_ms} ms: peak live predicted blocks {}, bookings refused {}",
                    r.peak_predicted_blocks, r.refused
                );
            }
        }
    }
    Ok(())
}

/// What happens next in trace time: an event reaching the index, or a request ending.
enum Due {
    Deliver(u64, Event),
    Finish { worker: usize, req: usize, held: usize },
}

fn simulate(args: &CommonArgs, opts: &Opts, reqs: &[Request], delay_ms: u64, router: Router) -> RunResult {
    let workers = args.cfg.workers as usize;
    let mut engines: Vec<MockEngine> =
        (0..workers).map(|w| MockEngine::new(args.cfg.gpu_blocks, mix64(w as u64 ^ args.cfg.seed))).collect();
    let index = Index::new(IndexConfig::new(args.cfg.block_size as u32));
    let predictions = Predictions::new(Arc::new(PredictLimits::new(1 << 30, opts.ttl_ms)));
    let mut deliveries: VecDeque<(u64, Event)> = VecDeque::new();
    let mut finishes: BinaryHeap<Reverse<(u64, usize, usize, usize)>> = BinaryHeap::new();
    let mut active_blocks = vec![0u64; workers];
    let mut res = RunResult::default();
    let delay_us = delay_ms * 1000;
    for (i, req) in reqs.iter().enumerate() {
        // Everything due by this arrival, in time order.
        loop {
            let next_delivery = deliveries.front().map(|(t, _)| *t);
            let next_finish = finishes.peek().map(|Reverse((t, ..))| *t);
            let due = match (next_delivery, next_finish) {
                (Some(d), f) if d <= req.t_us && f.is_none_or(|f| d <= f) => {
                    let (at, e) = deliveries.pop_front().unwrap();
                    Due::Deliver(at, e)
                }
                (_, Some(f)) if f <= req.t_us => {
                    let Reverse((_, worker, req, held)) = finishes.pop().unwrap();
                    Due::Finish { worker, req, held }
                }
                _ => break,
            };
            match due {
                Due::Deliver(at_us, e) => {
                    let o = index.apply(&e);
                    predictions.on_event(&e, &o, at_us / 1000);
                }
                Due::Finish { worker, req: r, held } => {
                    engines[worker].release(&reqs[r].seqs[..held]);
                    active_blocks[worker] -= held as u64;
                }
            }
        }
        let now_ms = req.t_us / 1000;
        let t = Instant::now();
        let matches = index.find_matches(&req.locals);
        let t_index = t.elapsed();
        let predicted = predictions.lookup(&matches, &req.locals, now_ms);
        let total = t.elapsed();
        res.query_ns.push(total.as_nanos() as u64);
        res.lookup_ns.push((total - t_index).as_nanos() as u64);

        let n = req.locals.len() as u64;
        let gpu = |w: usize| {
            let id = WorkerId::new(w as u64, 0);
            matches.workers.iter().find(|m| m.worker == id).map_or(0, |m| m.device as u64)
        };
        let pred = |w: usize| {
            let id = WorkerId::new(w as u64, 0);
            predicted.iter().find(|p| p.worker == id).map_or(0, |p| p.blocks as u64)
        };
        let credit = |w: usize| match router {
            Router::Gpu => gpu(w),
            Router::Booked => gpu(w).max(pred(w)),
        };
        let chosen = (0..workers)
            .min_by_key(|&w| ((n - credit(w).min(n)) + active_blocks[w], mix64(i as u64 ^ mix64(w as u64))))
            .expect("at least one worker");

        let adm = engines[chosen].admit(None, &req.locals, &req.seqs);
        res.prompt_blocks += n;
        res.hit_blocks += adm.hit_blocks as u64;
        let indexed = gpu(chosen);
        if adm.hit_blocks as u64 > indexed {
            res.stale += 1;
            if pred(chosen) >= adm.hit_blocks as u64 {
                res.covered += 1;
            }
        }
        if pred(chosen) > indexed {
            res.chose_predicted += 1;
        }
        schedule(&mut deliveries, req.t_us + delay_us, chosen, &adm);
        if router == Router::Booked {
            let worker = WorkerId::new(chosen as u64, 0);
            if predictions.book(worker, &req.locals, indexed as usize, opts.ttl_ms, now_ms).is_err() {
                res.refused += 1;
            }
            res.peak_predicted_blocks = res.peak_predicted_blocks.max(predictions.blocks());
        }
        active_blocks[chosen] += adm.held_blocks as u64;
        finishes.push(Reverse((req.t_us + req.run_us, chosen, i, adm.held_blocks)));
    }
    res
}

/// The admission's events (evictions first, then the stored runs), due at `at_us`.
fn schedule(deliveries: &mut VecDeque<(u64, Event)>, at_us: u64, worker: usize, adm: &Admission) {
    let worker = WorkerId::new(worker as u64, 0);
    if !adm.removed.is_empty() {
        let engine_hashes = adm.removed.iter().map(|r| r.engine_hash).collect();
        deliveries.push_back((
            at_us,
            Event { worker, tier: StorageTier::Device, kind: EventKind::Removed { engine_hashes } },
        ));
    }
    for run in &adm.stored {
        let blocks =
            run.blocks.iter().map(|b| StoredBlock { engine_hash: b.engine_hash, local_hash: b.local_hash }).collect();
        let kind = EventKind::Stored { parent: run.parent.map(|(engine, _)| engine), blocks };
        deliveries.push_back((at_us, Event { worker, tier: StorageTier::Device, kind }));
    }
}

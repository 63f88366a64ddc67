//! An engine process: hosts engines `FIRST..END` of the fleet, each a vLLM
//! publisher (an XPUB socket sending `[topic, seq BE, msgpack batch]` with
//! tagged-map events, and a ROUTER replay socket answering `[b"", start]`
//! with `[b"", topic, seq, payload]` for every kept batch from `start`
//! on, then the end marker `seq = u64::MAX` with an empty payload), and a
//! ring of its last `--ring-steps` batches (at most `--ring-mib` MiB).
//! Publishers block rather than drop past `--sndhwm` queued batches
//! (`set_nodrop`).
//!
//! Engine `e` serves requests `e, e + E, e + 2E, ...` of the trace laid
//! out as `--copies` hash-disjoint copies (request `i` of copy `d` is
//! number `i * copies + d`; copy `d` adds `d * (max id + 1)` to every hash
//! id). Each request's prompt and output tokens are cut into blocks of
//! [`BLOCK_SIZE`]; blocks already cached are hits, missing ones are stored
//! in batches of at most `--chunk-blocks` (a prefill chunk) after a
//! Removed event for what made room, and engine hashes are opaque: a chain
//! under a per-engine seed, as vLLM's per-process random root makes them.
//!
//! It talks to the parent by lines: it prints `engine ID ENDPOINT REPLAY`
//! for each engine, then `ready`; `subs N` waits until every publisher has
//! N subscriptions (`subs ok`); `publish HOLD` runs every engine's requests
//! but its last HOLD, round robin over the engines, at full speed (a later
//! `publish 0` runs the rest), then prints `done ID
//! LAST_SEQ CACHED_BLOCKS` per engine and a `published ...` summary;
//! `stats` prints `replays N`; end of input ends the process. The replay
//! sockets are served by a thread of their own the whole time.

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kv_indexer::hash::{local_hash, BASE_SEED};
use parking_lot::Mutex;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::args::Args;
use super::cache::LruCache;
use crate::engines::{encode_batch, Medium, WireEvent};
use crate::mooncake::{self, TraceRequest, TRACE_BLOCK_TOKENS};

pub const BLOCK_SIZE: usize = 16;
/// vLLM's default topic.
const TOPIC: &[u8] = b"";
/// Token ids are drawn below this (a large tokenizer's vocabulary), so
/// batches have the size real ones have.
const VOCAB: u64 = 151_936;
const OUTPUT_DOMAIN: u64 = 0xA5A5_0000_0000_0000;
/// Longest wait for subscriptions.
const SUBSCRIBE_WAIT: Duration = Duration::from_secs(180);

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// One kept batch.
struct Kept {
    seq: u64,
    ops: u32,
    payload: Arc<Vec<u8>>,
}

#[derive(Default)]
struct Ring {
    batches: VecDeque<Kept>,
    bytes: usize,
    ops: u64,
}

impl Ring {
    fn push(&mut self, k: Kept, steps: usize, bytes_max: usize) {
        self.bytes += k.payload.len();
        self.ops += k.ops as u64;
        self.batches.push_back(k);
        while self.batches.len() > steps || (self.bytes > bytes_max && self.batches.len() > 1) {
            let old = self.batches.pop_front().expect("non-empty");
            self.bytes -= old.payload.len();
            self.ops -= old.ops as u64;
        }
    }
}

struct Engine {
    instance: u64,
    index: u64,
    seed: u64,
    xpub: zmq::Socket,
    ring: Arc<Mutex<Ring>>,
    cache: LruCache,
    next_seq: u64,
    next_request: u64,
    subs: usize,
}

#[derive(Default)]
struct Totals {
    stored: u64,
    removed: u64,
    batches: u64,
    bytes: u64,
}

/// The trace as every engine process sees it.
struct Trace {
    requests: Vec<TraceRequest>,
    copies: u64,
    stride: u64,
}

impl Trace {
    fn total(&self) -> u64 {
        self.requests.len() as u64 * self.copies
    }

    /// Tokens of request `g` of the copied trace, appended to `out`.
    fn tokens(&self, g: u64, out: &mut Vec<u32>) {
        let (i, d) = (g / self.copies, g % self.copies);
        let r = &self.requests[i as usize];
        for &id in &r.hash_ids {
            let base = splitmix64(id + d * self.stride);
            out.extend((0..TRACE_BLOCK_TOKENS as u64).map(|j| (splitmix64(base ^ j) % VOCAB) as u32));
        }
        out.truncate(r.input_tokens as usize);
        let base = splitmix64(g ^ OUTPUT_DOMAIN);
        out.extend(
            (0..r.output_tokens as u64).map(|j| (splitmix64(base.wrapping_add(j) ^ OUTPUT_DOMAIN) % VOCAB) as u32),
        );
    }
}

fn opaque_hash(seed: u64, parent: Option<u64>, local: u64) -> u64 {
    let mut bytes = [0u8; 17];
    if let Some(p) = parent {
        bytes[0] = 1;
        bytes[1..9].copy_from_slice(&p.to_le_bytes());
    }
    bytes[9..].copy_from_slice(&local.to_le_bytes());
    xxh3_64_with_seed(&bytes, seed)
}

/// A full subscriber queue blocks the publisher instead of dropping: the
/// engines go at the pace of the slowest server, and no batch at the end
/// of a stream is lost unseen (vLLM drops past its queue, and a lost last
/// batch shows only at the engine's next one, which a bench never sends).
fn set_nodrop(socket: &mut zmq::Socket) -> Result<(), String> {
    let on: i32 = 1;
    // SAFETY: a live socket, an int option, its size.
    let rc = unsafe {
        zmq_sys::zmq_setsockopt(
            socket.as_mut_ptr(),
            zmq_sys::ZMQ_XPUB_NODROP as i32,
            (&on as *const i32).cast(),
            std::mem::size_of::<i32>(),
        )
    };
    if rc != 0 {
        return Err(format!("ZMQ_XPUB_NODROP: {}", zmq::Error::from_raw(unsafe { zmq_sys::zmq_errno() })));
    }
    Ok(())
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

pub fn run(a: &Args, first: u32, end: u32) -> Result<(), String> {
    let requests = mooncake::load(&a.trace)?;
    let max_id = requests.iter().flat_map(|r| r.hash_ids.iter().copied()).max().unwrap_or(0);
    let trace = Trace { requests, copies: a.copies as u64, stride: max_id + 1 };
    let ctx = zmq::Context::new();
    let mut engines = Vec::new();
    let mut routers = Vec::new();
    for e in first..end.min(a.engines) {
        let mut xpub = ctx.socket(zmq::XPUB).map_err(|e| format!("xpub: {e}"))?;
        xpub.set_linger(0).map_err(|e| e.to_string())?;
        xpub.set_xpub_verbose(true).map_err(|e| e.to_string())?;
        xpub.set_sndhwm(a.sndhwm).map_err(|e| e.to_string())?;
        set_nodrop(&mut xpub)?;
        xpub.bind("tcp://127.0.0.1:*").map_err(|e| format!("bind: {e}"))?;
        let router = ctx.socket(zmq::ROUTER).map_err(|e| format!("router: {e}"))?;
        router.set_linger(0).map_err(|e| e.to_string())?;
        // A whole ring (and its end marker) fits the queue, so no reply is dropped.
        router.set_sndhwm(a.ring_steps as i32 + 16).map_err(|e| e.to_string())?;
        router.bind("tcp://127.0.0.1:*").map_err(|e| format!("bind: {e}"))?;
        let endpoint = |s: &zmq::Socket| s.get_last_endpoint().ok().and_then(|r| r.ok()).unwrap_or_default();
        let instance = e as u64 + 1;
        say(&format!("engine {instance} {} {}", endpoint(&xpub), endpoint(&router)));
        let ring = Arc::new(Mutex::new(Ring::default()));
        routers.push((router, ring.clone()));
        engines.push(Engine {
            instance,
            index: e as u64,
            seed: splitmix64(a.seed ^ splitmix64(e as u64 + 1)),
            xpub,
            ring,
            cache: LruCache::new(a.gpu_blocks),
            next_seq: 0,
            next_request: 0,
            subs: 0,
        });
    }
    let replays = Arc::new(AtomicU64::new(0));
    let served = replays.clone();
    std::thread::Builder::new()
        .name("replay".into())
        .spawn(move || serve_replays(routers, &served))
        .map_err(|e| e.to_string())?;
    say("ready");
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let mut words = line.split_whitespace();
        match words.next() {
            Some("subs") => {
                let n: usize = words.next().and_then(|w| w.parse().ok()).unwrap_or(1);
                match wait_subscribed(&mut engines, n) {
                    Ok(()) => say("subs ok"),
                    Err(e) => say(&format!("subs failed {e}")),
                }
            }
            Some("publish") => {
                let hold: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
                let t = publish_all(a, &trace, &mut engines, hold)?;
                for e in &engines {
                    let last = e.next_seq as i64 - 1;
                    say(&format!("done {} {last} {}", e.instance, e.cache.len()));
                }
                let (mut ring_ops, mut ring_bytes, mut ring_batches) = (0u64, 0u64, 0u64);
                for e in &engines {
                    let r = e.ring.lock();
                    ring_ops += r.ops;
                    ring_bytes += r.bytes as u64;
                    ring_batches += r.batches.len() as u64;
                }
                say(&format!(
                    "published {} {} {} {} {ring_ops} {ring_bytes} {ring_batches}",
                    t.stored, t.removed, t.batches, t.bytes
                ));
            }
            Some("stats") => say(&format!("replays {}", replays.load(Ordering::Relaxed))),
            _ => {}
        }
    }
    Ok(())
}

fn wait_subscribed(engines: &mut [Engine], n: usize) -> Result<(), String> {
    let deadline = Instant::now() + SUBSCRIBE_WAIT;
    for e in engines.iter_mut() {
        while e.subs < n {
            if Instant::now() > deadline {
                return Err(format!("engine {} has {} of {n} subscriptions", e.instance, e.subs));
            }
            if e.xpub.poll(zmq::POLLIN, 100).unwrap_or(0) > 0 {
                if let Ok(msg) = e.xpub.recv_bytes(zmq::DONTWAIT) {
                    match msg.first() {
                        Some(1) => e.subs += 1,
                        Some(0) => e.subs = e.subs.saturating_sub(1),
                        _ => {}
                    }
                }
            }
        }
    }
    Ok(())
}

/// Runs every engine's requests but its last `hold`, one request of each
/// engine in turn.
fn publish_all(a: &Args, trace: &Trace, engines: &mut [Engine], hold: u64) -> Result<Totals, String> {
    let mut t = Totals::default();
    let stride = a.engines as u64;
    let total = trace.total();
    let (mut tokens, mut hashes) = (Vec::new(), Vec::new());
    loop {
        let mut any = false;
        for e in engines.iter_mut() {
            let g = e.index + e.next_request * stride;
            let mine = total.saturating_sub(e.index).div_ceil(stride);
            if g >= total || mine - e.next_request <= hold {
                continue;
            }
            any = true;
            e.next_request += 1;
            tokens.clear();
            trace.tokens(g, &mut tokens);
            run_request(a, e, &tokens, &mut hashes, &mut t)?;
        }
        if !any {
            return Ok(t);
        }
    }
}

/// One request on one engine: hits, evictions and stores, published in
/// batches of at most `--chunk-blocks` stored blocks.
fn run_request(a: &Args, e: &mut Engine, tokens: &[u32], hashes: &mut Vec<u64>, t: &mut Totals) -> Result<(), String> {
    // A request longer than half the cache keeps only its head, so its own
    // blocks are never what it evicts.
    let blocks = (tokens.len() / BLOCK_SIZE).min(a.gpu_blocks as usize / 2);
    hashes.clear();
    let mut parent = None;
    let mut removed = Vec::new();
    let mut run: Option<(Option<u64>, Vec<u64>, Vec<u32>)> = None;
    for b in 0..blocks {
        let toks = &tokens[b * BLOCK_SIZE..(b + 1) * BLOCK_SIZE];
        let h = opaque_hash(e.seed, parent, local_hash(toks, BASE_SEED));
        let (hit, evicted) = e.cache.touch_or_store(h);
        removed.extend(evicted);
        if hit {
            if let Some(r) = run.take() {
                flush(a, e, &mut removed, Some(r), t)?;
            }
        } else {
            let r = run.get_or_insert_with(|| (parent, Vec::new(), Vec::new()));
            r.1.push(h);
            r.2.extend_from_slice(toks);
            if r.1.len() >= a.chunk_blocks as usize {
                flush(a, e, &mut removed, run.take(), t)?;
            }
        }
        hashes.push(h);
        parent = Some(h);
    }
    if run.is_some() || !removed.is_empty() {
        flush(a, e, &mut removed, run.take(), t)?;
    }
    e.cache.release_tail_first(hashes);
    Ok(())
}

fn flush(
    a: &Args,
    e: &mut Engine,
    removed: &mut Vec<u64>,
    run: Option<(Option<u64>, Vec<u64>, Vec<u32>)>,
    t: &mut Totals,
) -> Result<(), String> {
    let mut events = Vec::with_capacity(2);
    let mut ops = removed.len();
    t.removed += removed.len() as u64;
    if !removed.is_empty() {
        events.push(WireEvent::Removed { hashes: std::mem::take(removed), medium: Medium::Gpu });
    }
    if let Some((parent, hashes, tokens)) = run {
        ops += hashes.len();
        t.stored += hashes.len() as u64;
        events.push(WireEvent::Stored { parent, hashes, tokens, medium: Medium::Gpu });
    }
    let payload = encode_batch(&events, BLOCK_SIZE);
    let seq = e.next_seq;
    e.next_seq += 1;
    t.batches += 1;
    t.bytes += payload.len() as u64;
    e.xpub.send_multipart([TOPIC, &seq.to_be_bytes()[..], &payload[..]], 0).map_err(|err| format!("publish: {err}"))?;
    let kept = Kept { seq, ops: ops as u32, payload: Arc::new(payload) };
    e.ring.lock().push(kept, a.ring_steps as usize, (a.ring_mib as usize) << 20);
    Ok(())
}

/// Answers ring requests on every engine's ROUTER socket.
fn serve_replays(routers: Vec<(zmq::Socket, Arc<Mutex<Ring>>)>, served: &AtomicU64) {
    loop {
        let mut items: Vec<zmq::PollItem> = routers.iter().map(|(s, _)| s.as_poll_item(zmq::POLLIN)).collect();
        if zmq::poll(&mut items, 200).unwrap_or(0) <= 0 {
            continue;
        }
        let ready: Vec<usize> = items.iter().enumerate().filter(|(_, i)| i.is_readable()).map(|(n, _)| n).collect();
        drop(items);
        for n in ready {
            let (router, ring) = &routers[n];
            while let Ok(frames) = router.recv_multipart(zmq::DONTWAIT) {
                // Anything but [id, "", 8-byte start] gets no reply, as from vLLM.
                let [id, empty, start] = frames.as_slice() else { continue };
                let (true, Ok(start)) = (empty.is_empty(), <[u8; 8]>::try_from(start.as_slice())) else {
                    continue;
                };
                let start = u64::from_be_bytes(start);
                let batches: Vec<(u64, Arc<Vec<u8>>)> =
                    ring.lock().batches.iter().filter(|k| k.seq >= start).map(|k| (k.seq, k.payload.clone())).collect();
                for (seq, payload) in batches {
                    let _ = router.send_multipart([&id[..], b"", TOPIC, &seq.to_be_bytes()[..], &payload[..]], 0);
                }
                let _ = router.send_multipart([&id[..], b"", TOPIC, &u64::MAX.to_be_bytes()[..], b""], 0);
                served.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

//! Peer recovery between our daemon and Dynamo's standalone indexer, both
//! ways, on the same engines, checked against what the engines hold.
//!
//! 1. Four test engines (instances 11, 12, 13 rank 0 and 13 rank 1) publish
//!    over ZMQ; a Dynamo service `A` and our daemon `B` both subscribe.
//! 2. The engines store branching prompts, then leave blocks whose parent
//!    they no longer hold (orphans) in every tier they use: leaves and a
//!    middle block go from the device (device blocks after a hole), a
//!    prompt's tail moves to the CPU and the device block it hangs under
//!    goes (host blocks whose device parent was evicted), and another
//!    prompt's tail moves to the CPU, part of that to disk, and the CPU
//!    evicts the blocks above the disk ones (host and disk orphans).
//! 3. Our daemon `C` starts with `--peers A` and Dynamo `D` with
//!    `--peers B`, on the same engines.
//! 4. Checks, against what the engines hold (their ground truth):
//!    - every service's `/dump`, read as what the format means (a list of
//!      held blocks: the (worker, rank, tier, engine hash) of every block
//!      of a Stored event), lists no block the engines do not hold. The
//!      recovered services (C from Dynamo's dump, D from ours) and ours (B)
//!      must not; ours must list every held block too, each once, with
//!      exactly the orphans marked. Missing blocks are counted: a block
//!      whose parent the worker does not hold cannot be placed by a
//!      receiver that does not know where it hangs (Dynamo refuses such a
//!      device block and keeps such a lower-tier one out of every query's
//!      reach; we drop it from Dynamo's dump, whose parent hash names a
//!      block the worker does not hold);
//!    - every answer of every service, for every prefix of every prompt,
//!      is at most what the engines hold (no over-claim), ours exactly;
//!      C answers like A and D like B.
//! 5. Live events after recovery (new stores, removes): all four converge,
//!    and the checks of 4 hold again.
//!
//! Run: `cargo run --release --bin interop -- --ours PATH/kv-indexer`
//! (Dynamo's service is taken from this binary's directory); with
//! `INTEROP_DUMP_DIR=dir` the raw dumps are saved there. Exit code 0 when
//! every check holds, 1 otherwise; failures are printed.

#[path = "../../../http_query/client.rs"]
#[allow(dead_code)] // shared with the benchmark, which uses more of it
mod client;
#[path = "../../../http_query/engines.rs"]
#[allow(dead_code)]
mod engines;
#[path = "../../../http_query/server.rs"]
#[allow(dead_code)]
mod server;
#[path = "../../../http_query/workloads.rs"]
#[allow(dead_code)]
mod workloads;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use engines::{sequence_hashes, Engine, Medium, WireEvent};
use kv_indexer::hash::{local_hash, BASE_SEED};
use server::Server;
use workloads::{tokens_of, Rng};

const MODEL: &str = "interop";
const BLOCK_SIZE: usize = 16;
/// Engines as (instance, dp_rank).
const WORKERS: [(u64, u32); 4] = [(11, 0), (12, 0), (13, 0), (13, 1)];
const PROMPT_BLOCKS: usize = 24;
const GROUP_PREFIX_BLOCKS: usize = 8;
const POOL: u64 = 8;
const PROMPTS_PER_ENGINE: usize = 5;
/// How long services may take to apply what was published.
const SYNC_WAIT_MS: u64 = 60_000;
const TOKEN_SPACE: u64 = 9;
/// Tiers the engines use, in query order.
const TIERS: [(&str, Medium); 3] = [("device", Medium::Gpu), ("host_pinned", Medium::Cpu), ("disk", Medium::Disk)];

fn pool_prompt(p: u64) -> Vec<u32> {
    let mut tokens = Vec::with_capacity(PROMPT_BLOCKS * BLOCK_SIZE);
    for b in 0..PROMPT_BLOCKS as u64 {
        let id = if b < GROUP_PREFIX_BLOCKS as u64 { (p % 2) << 32 | b } else { (10 + p) << 32 | b };
        tokens_of(TOKEN_SPACE, id, BLOCK_SIZE, &mut tokens);
    }
    tokens
}

fn engine_hashes(tokens: &[u32]) -> Vec<u64> {
    sequence_hashes(None, tokens, BLOCK_SIZE)
}

fn tier_of(medium: Medium) -> usize {
    TIERS.iter().position(|t| t.1 == medium).expect("a tier the engines use")
}

/// The engines and what each holds, per tier: the ground truth.
struct Engines {
    engines: Vec<Engine>,
    /// Per engine, per tier (`TIERS`), the engine hashes it holds.
    held: Vec<[BTreeSet<u64>; 3]>,
    /// Every prompt stored, for building queries.
    prompts: Vec<Vec<u32>>,
}

impl Engines {
    fn store_prompt(&mut self, e: usize, tokens: &[u32]) -> Result<(), String> {
        self.engines[e].store_prompt(tokens)?;
        self.held[e][0].extend(engine_hashes(tokens));
        self.prompts.push(tokens.to_vec());
        Ok(())
    }

    fn remove(&mut self, e: usize, medium: Medium, hashes: &[u64]) -> Result<(), String> {
        let hashes: Vec<u64> = hashes.iter().copied().filter(|h| self.held[e][tier_of(medium)].contains(h)).collect();
        if hashes.is_empty() {
            return Ok(());
        }
        for h in &hashes {
            self.held[e][tier_of(medium)].remove(h);
            if medium == Medium::Gpu {
                self.engines[e].held.remove(h);
            }
        }
        self.engines[e].publish(&[WireEvent::Removed { hashes, medium }])
    }

    /// Stores blocks `from..to` of `prompt` in a lower tier, under the block before them.
    fn copy_down(&mut self, e: usize, medium: Medium, prompt: &[u32], from: usize, to: usize) -> Result<(), String> {
        let hashes = engine_hashes(prompt);
        self.engines[e].publish(&[WireEvent::Stored {
            parent: Some(hashes[from - 1]),
            hashes: hashes[from..to].to_vec(),
            tokens: prompt[from * BLOCK_SIZE..to * BLOCK_SIZE].to_vec(),
            medium,
        }])?;
        self.held[e][tier_of(medium)].extend(&hashes[from..to]);
        Ok(())
    }

    /// The held blocks as dump facts: (instance, rank, tier, engine hash).
    fn facts(&self) -> BTreeSet<Fact> {
        let mut out = BTreeSet::new();
        for (e, tiers) in self.held.iter().enumerate() {
            let (instance, rank) = WORKERS[e];
            for (tier, set) in tiers.iter().enumerate() {
                out.extend(set.iter().map(|&h| (instance, rank, TIERS[tier].0.to_string(), h)));
            }
        }
        out
    }

    /// Held blocks whose parent the engine does not hold where a receiver
    /// looks (a device block's on the device, a lower-tier one's anywhere).
    fn orphans(&self) -> BTreeSet<Fact> {
        let mut parent_of = BTreeMap::new();
        for p in &self.prompts {
            let hashes = engine_hashes(p);
            for w in hashes.windows(2) {
                parent_of.insert(w[1], w[0]);
            }
        }
        let mut out = BTreeSet::new();
        for (e, tiers) in self.held.iter().enumerate() {
            let (instance, rank) = WORKERS[e];
            for (tier, set) in tiers.iter().enumerate() {
                for &h in set {
                    let Some(p) = parent_of.get(&h) else { continue };
                    let held = if tier == 0 { tiers[0].contains(p) } else { tiers.iter().any(|t| t.contains(p)) };
                    if !held {
                        out.insert((instance, rank, TIERS[tier].0.to_string(), h));
                    }
                }
            }
        }
        out
    }

    /// What a query of `tokens` must answer, normalised: each engine's
    /// device prefix, then on through host and disk blocks.
    fn answer(&self, tokens: &[u32]) -> Answer {
        let hashes = engine_hashes(tokens);
        let mut per_instance: BTreeMap<u64, Vec<(u32, [usize; 3])>> = BTreeMap::new();
        for (e, tiers) in self.held.iter().enumerate() {
            let mut depth = 0;
            let mut reached = [0; 3];
            for (tier, set) in tiers.iter().enumerate() {
                while depth < hashes.len() && set.contains(&hashes[depth]) {
                    depth += 1;
                }
                reached[tier] = depth;
            }
            per_instance.entry(WORKERS[e].0).or_default().push((WORKERS[e].1, reached));
        }
        let mut out = BTreeMap::new();
        let tokens = |blocks: usize| (blocks * BLOCK_SIZE) as u64;
        for (instance, ranks) in per_instance {
            let max = |t: usize| ranks.iter().map(|r| r.1[t]).max().unwrap_or(0);
            if max(2) == 0 {
                continue;
            }
            for (rank, reached) in &ranks {
                if reached[0] > 0 {
                    out.insert(format!("score {instance}/{rank}"), tokens(reached[0]));
                    out.insert(format!("{instance}.dp.{rank}"), tokens(reached[0]));
                }
            }
            for (field, t) in [("longest_matched", 2), ("gpu", 0), ("cpu", 1), ("disk", 2)] {
                out.insert(format!("{instance}.{field}"), tokens(max(t)));
            }
        }
        out
    }
}

/// The first round: stores, then orphans in every tier.
fn round_one(x: &mut Engines, rng: &mut Rng) -> Result<(), String> {
    for e in 0..x.engines.len() {
        for _ in 0..PROMPTS_PER_ENGINE {
            let p = pool_prompt(rng.below(POOL));
            x.store_prompt(e, &p)?;
        }
    }
    let first = |x: &Engines, e: usize| x.prompts[e * PROMPTS_PER_ENGINE].clone();
    // Engine 0 drops the last 4 blocks of its first prompt.
    let hashes = engine_hashes(&first(x, 0));
    x.remove(0, Medium::Gpu, &hashes[PROMPT_BLOCKS - 4..])?;
    // Engine 1 drops a middle block of its first prompt: its descendants
    // stay held but no longer form a prefix.
    let hashes = engine_hashes(&first(x, 1));
    x.remove(1, Medium::Gpu, &hashes[GROUP_PREFIX_BLOCKS + 4..GROUP_PREFIX_BLOCKS + 5])?;
    // Engine 2 offloads the last 8 blocks of its first prompt to the CPU,
    // then evicts the device block they hang under.
    let prompt = first(x, 2);
    let hashes = engine_hashes(&prompt);
    let tail = PROMPT_BLOCKS - 8;
    if hashes[tail - 1..].iter().all(|h| x.held[2][0].contains(h)) {
        x.remove(2, Medium::Gpu, &hashes[tail..])?;
        x.copy_down(2, Medium::Cpu, &prompt, tail, PROMPT_BLOCKS)?;
        x.remove(2, Medium::Gpu, &hashes[tail - 1..tail])?;
    }
    // Engine 3 offloads the last 12 blocks of its first prompt to the CPU
    // and copies the last 4 on to disk; the CPU then evicts 6 blocks above
    // the disk ones.
    let prompt = first(x, 3);
    let hashes = engine_hashes(&prompt);
    let tail = PROMPT_BLOCKS - 12;
    if hashes[tail - 1..].iter().all(|h| x.held[3][0].contains(h)) {
        x.copy_down(3, Medium::Cpu, &prompt, tail, PROMPT_BLOCKS)?;
        x.remove(3, Medium::Gpu, &hashes[tail..])?;
        x.copy_down(3, Medium::Disk, &prompt, PROMPT_BLOCKS - 4, PROMPT_BLOCKS)?;
        x.remove(3, Medium::Cpu, &hashes[PROMPT_BLOCKS - 10..PROMPT_BLOCKS - 4])?;
    }
    Ok(())
}

/// The live round after recovery: new prompts everywhere, some leaves gone.
fn round_two(x: &mut Engines, rng: &mut Rng) -> Result<(), String> {
    for e in 0..x.engines.len() {
        let mut tokens = pool_prompt(rng.below(POOL));
        tokens.truncate(GROUP_PREFIX_BLOCKS * BLOCK_SIZE);
        for b in 0..6 {
            tokens_of(TOKEN_SPACE, (100 + x.engines[e].instance_id) << 32 | b, BLOCK_SIZE, &mut tokens);
        }
        x.store_prompt(e, &tokens)?;
    }
    let last = x.prompts[3 * PROMPTS_PER_ENGINE + 1].clone();
    let leaf = *engine_hashes(&last).last().unwrap();
    x.remove(3, Medium::Gpu, &[leaf])
}

/// One-block root prompt every engine stores last: seen on every worker
/// means everything before it was applied. Not part of the truth's prompts.
fn sentinel(x: &mut Engines, generation: u64) -> Result<Vec<u32>, String> {
    let mut tokens = Vec::new();
    tokens_of(TOKEN_SPACE + 1, generation, BLOCK_SIZE, &mut tokens);
    for e in 0..x.engines.len() {
        x.engines[e].store_prompt(&tokens)?;
        x.held[e][0].extend(engine_hashes(&tokens));
    }
    Ok(tokens)
}

fn query_body(tokens: &[u32]) -> String {
    workloads::query_body(MODEL, tokens)
}

fn wait_synced(s: &Server, sentinel: &[u32]) -> Result<(), String> {
    let started = Instant::now();
    let body = query_body(sentinel);
    let mut last = String::new();
    while started.elapsed() < Duration::from_millis(SYNC_WAIT_MS) {
        match client::call_json(s.addr, "POST", "/query", &body, 200) {
            Ok(v) => {
                let seen = WORKERS
                    .iter()
                    .filter(|(i, r)| v["scores"][i.to_string()][r.to_string()].as_u64() == Some(BLOCK_SIZE as u64))
                    .count();
                if seen == WORKERS.len() {
                    return Ok(());
                }
                last = format!("{seen} of {} workers", WORKERS.len());
            }
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("{}: sentinel not applied in time ({last})", s.name))
}

/// Every distinct prefix of every prompt, in order.
fn prefixes(x: &Engines) -> Vec<Vec<u32>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for prompt in &x.prompts {
        for blocks in 1..=prompt.len() / BLOCK_SIZE {
            let tokens = prompt[..blocks * BLOCK_SIZE].to_vec();
            if seen.insert(tokens.clone()) {
                out.push(tokens);
            }
        }
    }
    out
}

/// An answer to a query, normalised: `scores` and `instances` with zero
/// entries dropped, keys sorted.
type Answer = BTreeMap<String, u64>;

/// A service's answers to every prefix, normalised.
fn answers(s: &Server, prefixes: &[Vec<u32>]) -> Result<Vec<Answer>, String> {
    let mut out = Vec::new();
    for tokens in prefixes {
        let locals: Vec<i64> = tokens.chunks_exact(BLOCK_SIZE).map(|b| local_hash(b, BASE_SEED) as i64).collect();
        let by_hash = serde_json::json!({"model_name": MODEL, "block_hashes": locals}).to_string();
        let a = normalise(&client::call_json(s.addr, "POST", "/query_by_hash", &by_hash, 200)?);
        let b = normalise(&client::call_json(s.addr, "POST", "/query", &query_body(tokens), 200)?);
        if a != b {
            return Err(format!("{}: /query and /query_by_hash disagree: {a:?} vs {b:?}", s.name));
        }
        out.push(a);
    }
    Ok(out)
}

fn normalise(v: &serde_json::Value) -> Answer {
    let mut out = BTreeMap::new();
    for (instance, ranks) in v["scores"].as_object().into_iter().flatten() {
        for (rank, score) in ranks.as_object().into_iter().flatten() {
            if score.as_u64().unwrap_or(0) > 0 {
                out.insert(format!("score {instance}/{rank}"), score.as_u64().unwrap_or(0));
            }
        }
    }
    for (instance, summary) in v["instances"].as_object().into_iter().flatten() {
        if summary["longest_matched"].as_u64().unwrap_or(0) == 0 {
            continue;
        }
        for field in ["longest_matched", "gpu", "cpu", "disk"] {
            out.insert(format!("{instance}.{field}"), summary[field].as_u64().unwrap_or(u64::MAX));
        }
        for (rank, n) in summary["dp"].as_object().into_iter().flatten() {
            if n.as_u64().unwrap_or(0) > 0 {
                out.insert(format!("{instance}.dp.{rank}"), n.as_u64().unwrap_or(0));
            }
        }
    }
    out
}

/// (instance, rank, tier, engine hash) of one listed block.
type Fact = (u64, u32, String, u64);

/// A `/dump` read as a list of held blocks.
struct Listed {
    events: usize,
    facts: BTreeSet<Fact>,
    /// First blocks of events marked as orphans.
    orphans: BTreeSet<Fact>,
    /// Events that are not stores, blocks listed twice, malformed entries.
    problems: Vec<String>,
}

fn dump_list(s: &Server) -> Result<Listed, String> {
    let reply = client::call(s.addr, "GET", "/dump", b"")?;
    if reply.status != 200 {
        return Err(format!("{}: /dump answered {}", s.name, reply.status));
    }
    if let Ok(dir) = std::env::var("INTEROP_DUMP_DIR") {
        let path = format!("{dir}/{}.json", s.name);
        std::fs::write(&path, &reply.body).map_err(|e| format!("cannot write {path}: {e}"))?;
    }
    let v: serde_json::Value =
        serde_json::from_slice(&reply.body).map_err(|e| format!("{}: /dump is not JSON: {e}", s.name))?;
    let mut out = Listed { events: 0, facts: BTreeSet::new(), orphans: BTreeSet::new(), problems: Vec::new() };
    for (key, entry) in v.as_object().ok_or("dump is not an object")? {
        if key != &format!("{MODEL}:default") {
            out.problems.push(format!("an index nobody registered: {key}"));
        }
        if entry["block_size"].as_u64() != Some(BLOCK_SIZE as u64) {
            out.problems.push(format!("{key}: block_size {}", entry["block_size"]));
        }
        for ev in entry["events"].as_array().into_iter().flatten() {
            out.events += 1;
            let worker = ev["worker_id"].as_u64().unwrap_or(u64::MAX);
            let rank = ev["event"]["dp_rank"].as_u64().unwrap_or(0) as u32;
            let tier = ev["storage_tier"].as_str().unwrap_or("device").to_string();
            let Some(stored) = ev["event"]["data"]["stored"].as_object() else {
                out.problems.push(format!("an event that is not a store: {}", ev["event"]["data"]));
                continue;
            };
            for (i, block) in stored.get("blocks").and_then(|b| b.as_array()).into_iter().flatten().enumerate() {
                let Some(hash) = block["block_hash"].as_u64() else {
                    out.problems.push(format!("a block without a u64 hash: {block}"));
                    continue;
                };
                let fact = (worker, rank, tier.clone(), hash);
                if i == 0 && stored.get("kv_indexer_orphan").is_some_and(|o| !o.is_null()) {
                    out.orphans.insert(fact.clone());
                }
                if !out.facts.insert(fact.clone()) {
                    out.problems.push(format!("listed twice: {fact:?}"));
                }
            }
        }
    }
    Ok(out)
}

/// Reads every dump and compares it with the truth; returns the failures.
fn check_dumps(x: &Engines, services: &[(&Server, Role)], failures: &mut Vec<String>) -> Result<(), String> {
    let truth = x.facts();
    let orphans = x.orphans();
    let by_tier = |facts: &BTreeSet<Fact>| {
        TIERS.iter().map(|(t, _)| format!("{} {t}", facts.iter().filter(|f| f.2 == *t).count())).collect::<Vec<_>>()
    };
    println!(
        "  the engines hold {} blocks ({}), {} of them orphans ({})",
        truth.len(),
        by_tier(&truth).join(", "),
        orphans.len(),
        by_tier(&orphans).join(", ")
    );
    for (s, role) in services {
        let l = dump_list(s)?;
        let not_held: Vec<&Fact> = l.facts.difference(&truth).collect();
        let missing: Vec<&Fact> = truth.difference(&l.facts).collect();
        let missing_orphans = missing.iter().filter(|f| orphans.contains(**f)).count();
        println!(
            "  /dump of {}: {} events, {} blocks listed: {} not held, {} held but missing ({} of them orphans); \
             {} orphans marked",
            s.name,
            l.events,
            l.facts.len(),
            not_held.len(),
            missing.len(),
            missing_orphans,
            l.orphans.len()
        );
        for f in not_held.iter().take(4) {
            println!("    not held: {f:?}");
        }
        for p in l.problems.iter().take(4) {
            println!("    problem: {p}");
        }
        let strict = *role != Role::Reference;
        if strict && !not_held.is_empty() {
            failures.push(format!("/dump of {} lists {} blocks the engines do not hold", s.name, not_held.len()));
        }
        if strict && !l.problems.is_empty() {
            failures.push(format!("/dump of {}: {} problems", s.name, l.problems.len()));
        }
        if *role == Role::Exact && (!missing.is_empty() || l.orphans != orphans) {
            failures.push(format!(
                "/dump of {} misses {} held blocks; marks {} orphans of {}",
                s.name,
                missing.len(),
                l.orphans.len(),
                orphans.len()
            ));
        }
    }
    Ok(())
}

/// What a service must get right.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Dynamo following the engines live: reported, not judged.
    Reference,
    /// A recovered service: never a block the engines do not hold.
    Recovered,
    /// Ours, live: exactly the held blocks.
    Exact,
}

/// Checks that no answer of `s` passes what the engines hold (and, for
/// ours live, equals it); returns the answers.
fn check_answers(
    x: &Engines,
    prefixes: &[Vec<u32>],
    s: &Server,
    role: Role,
    failures: &mut Vec<String>,
) -> Result<Vec<Answer>, String> {
    let got = answers(s, prefixes)?;
    let (mut over, mut short, mut first) = (0, 0, None);
    for (tokens, answer) in prefixes.iter().zip(&got) {
        let truth = x.answer(tokens);
        let above = answer.iter().any(|(k, v)| v > truth.get(k).unwrap_or(&0));
        if above {
            over += 1;
            first.get_or_insert(format!(
                "{} blocks: truth {truth:?}, {} {answer:?}",
                tokens.len() / BLOCK_SIZE,
                s.name
            ));
        } else if *answer != truth {
            short += 1;
        }
    }
    println!(
        "  queries of {}: {} prefixes, {} above what the engines hold, {} below, {} exact",
        s.name,
        prefixes.len(),
        over,
        short,
        prefixes.len() - over - short
    );
    if let Some(f) = &first {
        println!("    first above: {f}");
    }
    if role != Role::Reference && over > 0 {
        failures.push(format!("{} claims more than the engines hold on {over} prefixes", s.name));
    }
    if role == Role::Exact && short > 0 {
        failures.push(format!("{} answers less than the engines hold on {short} prefixes", s.name));
    }
    Ok(got)
}

fn compare(what: &str, a: &str, x: &[Answer], b: &str, y: &[Answer], failures: &mut Vec<String>) {
    let differ = x.iter().zip(y).filter(|(p, q)| p != q).count();
    let nonempty = x.iter().filter(|p| !p.is_empty()).count();
    if differ == 0 && x.len() == y.len() {
        println!("  {what}: {a} and {b} agree on {} prefixes ({nonempty} with a match)", x.len());
    } else {
        println!("  {what}: {a} and {b} DIFFER on {differ} of {} prefixes", x.len());
        for (p, q) in x.iter().zip(y).filter(|(p, q)| p != q).take(5) {
            println!("    {a} {p:?}\n    {b} {q:?}");
        }
        failures.push(format!("{what}: {a} vs {b}"));
    }
}

struct Paths {
    ours: String,
    dynamo: String,
}

fn parse_args() -> Result<Paths, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = exe.parent().ok_or("no executable directory")?;
    let mut paths = Paths {
        ours: concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/release/kv-indexer").into(),
        dynamo: dir.join("dynamo-indexer").to_string_lossy().into_owned(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--ours" => paths.ours = value,
            "--dynamo" => paths.dynamo = value,
            _ => return Err(format!("unknown flag {flag}; usage: interop [--ours PATH] [--dynamo PATH]")),
        }
    }
    Ok(paths)
}

fn run() -> Result<Vec<String>, String> {
    let paths = parse_args()?;
    let ctx = zmq::Context::new();
    let engines: Vec<Engine> =
        WORKERS.iter().map(|(i, _)| Engine::new(&ctx, *i, BLOCK_SIZE)).collect::<Result<_, _>>()?;
    let workers_arg =
        WORKERS.iter().zip(&engines).map(|((i, r), e)| format!("{i}:{r}={}", e.endpoint)).collect::<Vec<_>>().join(",");
    let mut x = Engines { held: vec![Default::default(); engines.len()], engines, prompts: Vec::new() };
    let args = |peer: Option<&Server>, ours: bool| -> Vec<String> {
        let mut a: Vec<String> = vec!["--port".into(), "0".into()];
        if ours {
            a.extend(["--host".into(), "127.0.0.1".into(), "--no-pin".into()]);
        }
        a.extend(["--block-size".into(), BLOCK_SIZE.to_string(), "--model-name".into(), MODEL.into()]);
        a.extend(["--workers".into(), workers_arg.clone()]);
        if let Some(p) = peer {
            a.extend(["--peers".into(), format!("http://{}", p.addr)]);
        }
        a
    };
    let a = Server::spawn("dynamo-A", &paths.dynamo, &args(None, false), None)?;
    let b = Server::spawn("ours-B", &paths.ours, &args(None, true), None)?;
    for e in &mut x.engines {
        e.wait_subscribed(2)?;
    }
    let mut rng = Rng(3);
    round_one(&mut x, &mut rng)?;
    let s0 = sentinel(&mut x, 0)?;
    for s in [&a, &b] {
        wait_synced(s, &s0)?;
    }
    let mut failures = Vec::new();
    println!("round 1: both services live on the engines");
    let p = prefixes(&x);
    let ans_a = check_answers(&x, &p, &a, Role::Reference, &mut failures)?;
    let ans_b = check_answers(&x, &p, &b, Role::Exact, &mut failures)?;
    compare("queries", &a.name, &ans_a, &b.name, &ans_b, &mut failures);
    check_dumps(&x, &[(&a, Role::Reference), (&b, Role::Exact)], &mut failures)?;

    // Recovery both ways: C (ours) from A (Dynamo), D (Dynamo) from B (ours).
    let c = Server::spawn("ours-C", &paths.ours, &args(Some(&a), true), None)?;
    let d = Server::spawn("dynamo-D", &paths.dynamo, &args(Some(&b), false), None)?;
    for e in &mut x.engines {
        e.wait_subscribed(4)?;
    }
    println!("round 1: after recovery (C <- A, D <- B)");
    let ans_c = check_answers(&x, &p, &c, Role::Recovered, &mut failures)?;
    let ans_d = check_answers(&x, &p, &d, Role::Recovered, &mut failures)?;
    compare("queries", &c.name, &ans_c, &a.name, &ans_a, &mut failures);
    compare("queries", &d.name, &ans_d, &b.name, &ans_b, &mut failures);
    check_dumps(&x, &[(&c, Role::Recovered), (&d, Role::Recovered)], &mut failures)?;

    println!("round 2: live events after recovery");
    round_two(&mut x, &mut rng)?;
    let s1 = sentinel(&mut x, 1)?;
    for s in [&a, &b, &c, &d] {
        wait_synced(s, &s1)?;
    }
    let p = prefixes(&x);
    let roles = [(&a, Role::Reference), (&b, Role::Exact), (&c, Role::Recovered), (&d, Role::Recovered)];
    let mut all = Vec::new();
    for (s, role) in roles {
        all.push((s.name.clone(), check_answers(&x, &p, s, role, &mut failures)?));
    }
    for (name, answers) in &all[1..] {
        compare("queries", &all[0].0, &all[0].1, name, answers, &mut failures);
    }
    check_dumps(&x, &roles, &mut failures)?;
    Ok(failures)
}

fn main() {
    match run() {
        Ok(failures) if failures.is_empty() => println!("interop: every check holds"),
        Ok(failures) => {
            println!("interop: {} checks fail: {}", failures.len(), failures.join("; "));
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("interop: {e}");
            std::process::exit(2);
        }
    }
}

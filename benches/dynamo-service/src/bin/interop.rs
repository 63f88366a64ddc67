//! Peer recovery between our daemon and Dynamo's standalone indexer, both
//! ways, on the same engines.
//!
//! 1. Four test engines (instances 11, 12, 13 rank 0 and 13 rank 1) publish
//!    over ZMQ; a Dynamo service `A` and our daemon `B` both subscribe.
//! 2. The engines store branching prompts, remove leaves and one middle
//!    block, and move a prompt's tail to the CPU tier. A and B must answer
//!    every prefix of every prompt alike (`/query_by_hash` and `/query`).
//! 3. Our daemon `C` starts with `--peers A` and Dynamo `D` with
//!    `--peers B`, on the same engines. C must answer like A, D like B.
//! 4. `/dump` facts: each dump's stored blocks, as (worker, rank, tier,
//!    prefix path of local hashes), compared between the four services.
//! 5. Live events after recovery (new stores, removes): all four converge.
//!
//! Run: `cargo run --release --bin interop -- --ours PATH/kv-indexer`
//! (Dynamo's service is taken from this binary's directory); with
//! `INTEROP_DUMP_DIR=dir` the four raw dumps are saved there. Exit code 0
//! when every comparison agrees, 1 otherwise; mismatches are printed.

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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use engines::{sequence_hashes, Engine, Medium, WireEvent};
use kv_indexer::hash::{chain_hash, local_hash, BASE_SEED};
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

fn pool_prompt(p: u64) -> Vec<u32> {
    let mut tokens = Vec::with_capacity(PROMPT_BLOCKS * BLOCK_SIZE);
    for b in 0..PROMPT_BLOCKS as u64 {
        let id = if b < GROUP_PREFIX_BLOCKS as u64 { (p % 2) << 32 | b } else { (10 + p) << 32 | b };
        tokens_of(TOKEN_SPACE, id, BLOCK_SIZE, &mut tokens);
    }
    tokens
}

/// What the engines did, for building queries.
struct Published {
    prompts: Vec<Vec<u32>>,
}

fn engine_hashes(tokens: &[u32]) -> Vec<u64> {
    sequence_hashes(None, tokens, BLOCK_SIZE)
}

/// The first round: stores, leaf and middle removes, a move to CPU.
fn round_one(engines: &mut [Engine], rng: &mut Rng, published: &mut Published) -> Result<(), String> {
    for e in engines.iter_mut() {
        for _ in 0..PROMPTS_PER_ENGINE {
            let p = pool_prompt(rng.below(POOL));
            e.store_prompt(&p)?;
            published.prompts.push(p);
        }
    }
    // Engine 0 drops the last 4 blocks of its first prompt.
    let first = &published.prompts[0];
    let hashes = engine_hashes(first);
    let leaf: Vec<u64> = hashes[PROMPT_BLOCKS - 4..].iter().copied().filter(|h| engines[0].held.contains(h)).collect();
    remove(&mut engines[0], leaf)?;
    // Engine 1 drops a middle block of its first prompt: its descendants stay
    // held by the engine but no longer form a prefix.
    let second = &published.prompts[PROMPTS_PER_ENGINE];
    let middle = engine_hashes(second)[GROUP_PREFIX_BLOCKS + 4];
    if engines[1].held.contains(&middle) {
        remove(&mut engines[1], vec![middle])?;
    }
    // Engine 2 offloads the last 8 blocks of its first prompt to CPU.
    let third = published.prompts[2 * PROMPTS_PER_ENGINE].clone();
    let hashes = engine_hashes(&third);
    let tail = PROMPT_BLOCKS - 8;
    if hashes[tail..].iter().all(|h| engines[2].held.contains(h)) {
        let moved = hashes[tail..].to_vec();
        remove(&mut engines[2], moved.clone())?;
        engines[2].publish(&[WireEvent::Stored {
            parent: Some(hashes[tail - 1]),
            hashes: moved,
            tokens: third[tail * BLOCK_SIZE..].to_vec(),
            medium: Medium::Cpu,
        }])?;
    }
    Ok(())
}

/// The live round after recovery: new prompts everywhere, some leaves gone.
fn round_two(engines: &mut [Engine], rng: &mut Rng, published: &mut Published) -> Result<(), String> {
    for e in engines.iter_mut() {
        let mut tokens = pool_prompt(rng.below(POOL));
        tokens.truncate(GROUP_PREFIX_BLOCKS * BLOCK_SIZE);
        for b in 0..6 {
            tokens_of(TOKEN_SPACE, (100 + e.instance_id) << 32 | b, BLOCK_SIZE, &mut tokens);
        }
        e.store_prompt(&tokens)?;
        published.prompts.push(tokens);
    }
    let last = published.prompts[3 * PROMPTS_PER_ENGINE + 1].clone();
    let leaf = *engine_hashes(&last).last().unwrap();
    if engines[3].held.contains(&leaf) {
        remove(&mut engines[3], vec![leaf])?;
    }
    Ok(())
}

fn remove(e: &mut Engine, hashes: Vec<u64>) -> Result<(), String> {
    if hashes.is_empty() {
        return Ok(());
    }
    for h in &hashes {
        e.held.remove(h);
    }
    e.publish(&[WireEvent::Removed { hashes, medium: Medium::Gpu }])
}

/// One-block root prompt every engine stores last: seen on every worker
/// means everything before it was applied.
fn sentinel(engines: &mut [Engine], generation: u64) -> Result<Vec<u32>, String> {
    let mut tokens = Vec::new();
    tokens_of(TOKEN_SPACE + 1, generation, BLOCK_SIZE, &mut tokens);
    for e in engines.iter_mut() {
        e.store_prompt(&tokens)?;
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

/// A service's answers to every prefix of every prompt, normalised.
fn answers(s: &Server, published: &Published) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for prompt in &published.prompts {
        for blocks in 1..=prompt.len() / BLOCK_SIZE {
            let tokens = &prompt[..blocks * BLOCK_SIZE];
            if !seen.insert(tokens.to_vec()) {
                continue;
            }
            let locals: Vec<i64> = tokens.chunks_exact(BLOCK_SIZE).map(|b| local_hash(b, BASE_SEED) as i64).collect();
            let by_hash = serde_json::json!({"model_name": MODEL, "block_hashes": locals}).to_string();
            let a = normalise(&client::call_json(s.addr, "POST", "/query_by_hash", &by_hash, 200)?);
            let b = normalise(&client::call_json(s.addr, "POST", "/query", &query_body(tokens), 200)?);
            if a != b {
                return Err(format!("{}: /query and /query_by_hash disagree: {a} vs {b}", s.name));
            }
            out.push((format!("prompt {} blocks {blocks}", out.len()), a));
        }
    }
    Ok(out)
}

/// `scores` and `instances` with zero entries dropped, keys sorted.
fn normalise(v: &serde_json::Value) -> String {
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
    format!("{out:?}")
}

/// The stored facts of a `/dump`: (key, worker, rank, tier, prefix hash of
/// the block's local-hash path), plus the raw event count and problems.
struct DumpFacts {
    events: usize,
    facts: BTreeSet<String>,
    problems: Vec<String>,
}

fn dump_facts(s: &Server) -> Result<DumpFacts, String> {
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
    let mut out = DumpFacts { events: 0, facts: BTreeSet::new(), problems: Vec::new() };
    for (key, entry) in v.as_object().ok_or("dump is not an object")? {
        if entry["block_size"].as_u64() != Some(BLOCK_SIZE as u64) {
            out.problems.push(format!("{key}: block_size {}", entry["block_size"]));
        }
        // (worker, rank, engine hash) -> (parent engine hash, local hash).
        let mut links: HashMap<(u64, u64, u64), (Option<u64>, u64)> = HashMap::new();
        let mut stored = Vec::new();
        for ev in entry["events"].as_array().into_iter().flatten() {
            out.events += 1;
            let worker = ev["worker_id"].as_u64().unwrap_or(u64::MAX);
            let rank = ev["event"]["dp_rank"].as_u64().unwrap_or(0);
            let tier = ev["storage_tier"].as_str().unwrap_or("device").to_string();
            let Some(data) = ev["event"]["data"]["stored"].as_object() else {
                out.problems.push(format!("{key}: a non-stored event in the dump: {}", ev["event"]["data"]));
                continue;
            };
            let mut parent = data.get("parent_hash").and_then(|p| p.as_u64());
            for block in data.get("blocks").and_then(|b| b.as_array()).into_iter().flatten() {
                let (Some(hash), Some(local)) = (block["block_hash"].as_u64(), block["tokens_hash"].as_u64()) else {
                    out.problems.push(format!("{key}: block without u64 hashes: {block}"));
                    continue;
                };
                links.insert((worker, rank, hash), (parent, local));
                stored.push((worker, rank, tier.clone(), hash));
                parent = Some(hash);
            }
        }
        for (worker, rank, tier, hash) in stored {
            // Walk to the root, bounded by the number of links (chains are acyclic).
            let mut path = Vec::new();
            let mut cursor = Some(hash);
            while let Some(h) = cursor {
                let Some(&(parent, local)) = links.get(&(worker, rank, h)) else {
                    out.problems.push(format!("{key}: worker {worker}/{rank} block {h} has no stored parent"));
                    break;
                };
                path.push(local);
                cursor = parent;
                if path.len() > links.len() {
                    out.problems.push(format!("{key}: cycle at block {hash}"));
                    break;
                }
            }
            path.reverse();
            let prefix = path.iter().skip(1).fold(path[0], |acc, &l| chain_hash(acc, l));
            out.facts.insert(format!("{key} w{worker}/{rank} {tier} depth {} prefix {prefix:016x}", path.len()));
        }
    }
    Ok(out)
}

fn compare(what: &str, a: &str, x: &[(String, String)], b: &str, y: &[(String, String)], failures: &mut Vec<String>) {
    let differ: Vec<_> = x.iter().zip(y).filter(|(p, q)| p.1 != q.1).collect();
    let nonempty = x.iter().filter(|p| p.1 != "{}").count();
    if differ.is_empty() && x.len() == y.len() {
        println!("  {what}: {a} and {b} agree on {} prefixes ({nonempty} with a match)", x.len());
    } else {
        println!("  {what}: {a} and {b} DIFFER on {} of {} prefixes", differ.len(), x.len());
        for (p, q) in differ.iter().take(5) {
            println!("    {}: {a} {}\n    {:>w$}  {b} {}", p.0, p.1, "", q.1, w = p.0.len());
        }
        failures.push(format!("{what}: {a} vs {b}"));
    }
}

fn compare_dumps(a: (&str, &DumpFacts), b: (&str, &DumpFacts), failures: &mut Vec<String>) {
    let (only_a, only_b): (Vec<_>, Vec<_>) =
        (a.1.facts.difference(&b.1.facts).collect(), b.1.facts.difference(&a.1.facts).collect());
    if only_a.is_empty() && only_b.is_empty() {
        println!("  /dump: {} and {} hold the same {} stored blocks", a.0, b.0, a.1.facts.len());
    } else {
        println!(
            "  /dump: {} has {} blocks {} lacks; {} has {} blocks {} lacks",
            a.0,
            only_a.len(),
            b.0,
            b.0,
            only_b.len(),
            a.0
        );
        for f in only_a.iter().take(4) {
            println!("    only {}: {f}", a.0);
        }
        for f in only_b.iter().take(4) {
            println!("    only {}: {f}", b.0);
        }
        failures.push(format!("/dump facts: {} vs {}", a.0, b.0));
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
    let mut engines: Vec<Engine> =
        WORKERS.iter().map(|(i, _)| Engine::new(&ctx, *i, BLOCK_SIZE)).collect::<Result<_, _>>()?;
    let workers_arg =
        WORKERS.iter().zip(&engines).map(|((i, r), e)| format!("{i}:{r}={}", e.endpoint)).collect::<Vec<_>>().join(",");
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
    for e in &mut engines {
        e.wait_subscribed(2)?;
    }
    let mut rng = Rng(3);
    let mut published = Published { prompts: Vec::new() };
    round_one(&mut engines, &mut rng, &mut published)?;
    let s0 = sentinel(&mut engines, 0)?;
    for s in [&a, &b] {
        wait_synced(s, &s0)?;
    }
    let mut failures = Vec::new();
    println!("round 1: both services live on the engines");
    let (ans_a, ans_b) = (answers(&a, &published)?, answers(&b, &published)?);
    compare("queries", &a.name, &ans_a, &b.name, &ans_b, &mut failures);

    // Recovery both ways: C (ours) from A (Dynamo), D (Dynamo) from B (ours).
    let c = Server::spawn("ours-C", &paths.ours, &args(Some(&a), true), None)?;
    let d = Server::spawn("dynamo-D", &paths.dynamo, &args(Some(&b), false), None)?;
    for e in &mut engines {
        e.wait_subscribed(4)?;
    }
    println!("round 1: after recovery (C <- A, D <- B)");
    let (ans_c, ans_d) = (answers(&c, &published)?, answers(&d, &published)?);
    compare("queries", &c.name, &ans_c, &a.name, &ans_a, &mut failures);
    compare("queries", &d.name, &ans_d, &b.name, &ans_b, &mut failures);
    let dumps: Vec<(String, DumpFacts)> =
        [&a, &b, &c, &d].iter().map(|s| dump_facts(s).map(|f| (s.name.clone(), f))).collect::<Result<_, _>>()?;
    for (name, f) in &dumps {
        println!("  /dump of {name}: {} events, {} stored blocks", f.events, f.facts.len());
        for p in f.problems.iter().take(4) {
            println!("    problem: {p}");
        }
        if !f.problems.is_empty() {
            failures.push(format!("/dump of {name}: {} problems", f.problems.len()));
        }
    }
    let by = |n: &str| &dumps.iter().find(|(m, _)| m == n).unwrap().1;
    compare_dumps((&a.name, by(&a.name)), (&c.name, by(&c.name)), &mut failures);
    compare_dumps((&b.name, by(&b.name)), (&d.name, by(&d.name)), &mut failures);
    compare_dumps((&a.name, by(&a.name)), (&b.name, by(&b.name)), &mut failures);

    println!("round 2: live events after recovery");
    round_two(&mut engines, &mut rng, &mut published)?;
    let s1 = sentinel(&mut engines, 1)?;
    for s in [&a, &b, &c, &d] {
        wait_synced(s, &s1)?;
    }
    let all: Vec<(String, Vec<(String, String)>)> = [&a, &b, &c, &d]
        .iter()
        .map(|s| answers(s, &published).map(|x| (s.name.clone(), x)))
        .collect::<Result<_, _>>()?;
    for (name, x) in &all[1..] {
        compare("queries", &all[0].0, &all[0].1, name, x, &mut failures);
    }
    Ok(failures)
}

fn main() {
    match run() {
        Ok(failures) if failures.is_empty() => println!("interop: every comparison agrees"),
        Ok(failures) => {
            println!("interop: {} comparisons differ: {}", failures.len(), failures.join("; "));
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("interop: {e}");
            std::process::exit(2);
        }
    }
}

//! The daemon next to released engine publishers: vLLM's and SGLang's own
//! `kv_events` modules, run by `scripts/real_engine.py`, publish a history
//! (chains, evictions, a clear) and go idle. A daemon started afterwards,
//! with no peer and no snapshot, answers from their replay rings alone,
//! block for block, in `/dump` and in `/query`. An engine killed outright
//! loses its blocks after `--engine-gone-s`, and the new process that takes
//! its place refills them from its ring.
//!
//! The modules and a venv holding msgspec and pyzmq come from
//! `scripts/install-test-tools.sh` (into `target/test-tools/engines/`, which
//! `.ci/run` calls); where they could not be had, the test says so and skips.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use kv_indexer::hash::{local_hash, seed_for};
use serde_json::{json, Value};
use support::daemon::Daemon;
use support::truth_check::{dump_facts, metric, Fact};
use support::wait_until;

/// (engine, module path inside its wheel), as the install script unpacks them.
const ENGINES: [(&str, &str); 2] =
    [("vllm", "vllm/distributed/kv_events.py"), ("sglang", "sglang/srt/disaggregation/kv_events.py")];
const MODEL: &str = "m";

/// The unpacked modules and their venv, if the install script could make them.
fn tools() -> Result<PathBuf, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-tools/engines");
    let python = dir.join("venv/bin/python");
    if !python.exists() {
        return Err(format!("{} is missing", python.display()));
    }
    for (engine, module) in ENGINES {
        let path = dir.join(engine).join(module);
        if !path.exists() {
            return Err(format!("{} is missing", path.display()));
        }
    }
    Ok(dir)
}

/// One released publisher, publishing and then idle until dropped.
struct RealEngine {
    instance: u64,
    child: Child,
    stdin: Option<ChildStdin>,
    endpoint: String,
    replay_endpoint: String,
    batches: u64,
    block_size: u32,
    /// Held blocks: engine hash -> (parent, tokens).
    held: BTreeMap<u64, (Option<u64>, Vec<u32>)>,
}

impl RealEngine {
    /// Starts the engine and returns once its history is published; `first`
    /// picks the history's hashes and tokens.
    fn start(tools: &Path, scratch: &Path, instance: u64, (engine, module): (&str, &str), first: u64) -> RealEngine {
        let endpoint = format!("ipc://{}/{engine}.pub", scratch.display());
        let replay_endpoint = format!("ipc://{}/{engine}.replay", scratch.display());
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/real_engine.py");
        let mut child = Command::new(tools.join("venv/bin/python"))
            .arg(script)
            .args(["--engine", engine, "--module", module, "--endpoint", &endpoint])
            .args(["--replay-endpoint", &replay_endpoint])
            .args(["--first", &first.to_string()])
            .arg("--module-root")
            .arg(tools.join(engine))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting scripts/real_engine.py");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let out: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{engine}: {e}: {line:?}"));
        let held = out["held"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                let tokens = b[2].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
                (b[0].as_u64().unwrap(), (b[1].as_u64(), tokens))
            })
            .collect();
        RealEngine {
            instance,
            stdin: child.stdin.take(),
            child,
            endpoint,
            replay_endpoint,
            batches: out["batches"].as_u64().unwrap(),
            block_size: out["block_size"].as_u64().unwrap() as u32,
            held,
        }
    }

    /// Blocks from the root down to `leaf`.
    fn chain(&self, leaf: u64) -> Vec<u64> {
        let mut chain = vec![leaf];
        while let Some(parent) = self.held[chain.last().unwrap()].0 {
            chain.push(parent);
            assert!(chain.len() <= self.held.len(), "a cycle");
        }
        chain.reverse();
        chain
    }

    /// Registers the engine with the daemon.
    fn register(&self, d: &Daemon) {
        let (status, v) = d.post_json(
            "/register",
            json!({"instance_id": self.instance, "endpoint": self.endpoint, "replay_endpoint": self.replay_endpoint,
                   "model_name": MODEL, "block_size": self.block_size}),
        );
        assert_eq!(status, 201, "{v}");
    }

    /// Checks that `/query` credits every held chain in full.
    fn assert_answered(&self, d: &Daemon) {
        for &leaf in self.held.keys() {
            let chain = self.chain(leaf);
            let tokens: Vec<u32> = chain.iter().flat_map(|h| self.held[h].1.iter().copied()).collect();
            let (status, v) = d.post_json("/query", json!({"token_ids": tokens, "model_name": MODEL}));
            assert_eq!(status, 200, "{v}");
            let gpu = (chain.len() as u32 * self.block_size) as u64;
            assert_eq!(v["instances"][self.instance.to_string()]["gpu"].as_u64(), Some(gpu), "{v}");
        }
    }

    /// What `/dump` must list for this engine.
    fn facts(&self) -> BTreeSet<Fact> {
        let seed = seed_for(None, None);
        self.held.iter().map(|(&h, (_, tokens))| (self.instance, 0, 0, h, local_hash(tokens, seed))).collect()
    }
}

impl Drop for RealEngine {
    /// Killed, not shut down: its sockets close without a word.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        drop(self.stdin.take());
    }
}

/// The engines' tools and a scratch directory, or None (said why) to skip.
fn setup(name: &str) -> Option<(PathBuf, PathBuf)> {
    let tools = match tools() {
        Ok(dir) => dir,
        Err(why) => {
            eprintln!("SKIP: no released engine publishers ({why}); scripts/install-test-tools.sh fetches them");
            return None;
        }
    };
    // A short path: ipc:// addresses are Unix socket paths (108 bytes).
    let scratch = std::env::temp_dir().join(format!("kvi-real-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    Some((tools, scratch))
}

/// Waits until the daemon's `/dump` lists exactly what `engines` hold.
fn assert_dump_is(d: &Daemon, engines: &[RealEngine]) {
    let want: BTreeSet<Fact> = engines.iter().flat_map(RealEngine::facts).collect();
    let mut got = BTreeSet::new();
    let exact = wait_until(|| {
        got = dump_facts(d);
        got == want
    });
    assert!(exact, "the daemon's dump {got:?} is not what the engines hold {want:?}");
}

#[test]
fn a_daemon_started_after_real_engines_went_idle_answers_from_their_rings() {
    let Some((tools, scratch)) = setup("fill") else { return };
    let engines: Vec<RealEngine> = ENGINES
        .iter()
        .enumerate()
        .map(|(i, &engine)| RealEngine::start(&tools, &scratch, 1 + i as u64, engine, 1_000))
        .collect();

    // Both engines published and went idle; only now does the daemon start.
    let d = Daemon::start(&[]);
    engines.iter().for_each(|e| e.register(&d));
    assert_dump_is(&d, &engines);
    engines.iter().for_each(|e| e.assert_answered(&d));
    let batches: u64 = engines.iter().map(|e| e.batches).sum();
    assert_eq!(metric(&d, "kv_indexer_batches_filled_total"), batches);
    let blocks: usize = engines.iter().map(|e| e.held.len()).sum();
    eprintln!(
        "real engines: {batches} batches published before the daemon started, {blocks} blocks held, all answered"
    );
    drop(engines);
    let _ = std::fs::remove_dir_all(&scratch);
}

#[test]
fn a_killed_real_engine_is_dropped_and_its_successor_refills_it() {
    let Some((tools, scratch)) = setup("gone") else { return };
    let d = Daemon::start(&["--engine-gone-s", "1", "--heartbeat-ms", "200"]);
    let mut engines: Vec<RealEngine> = ENGINES
        .iter()
        .enumerate()
        .map(|(i, &engine)| RealEngine::start(&tools, &scratch, 1 + i as u64, engine, 1_000))
        .collect();
    engines.iter().for_each(|e| e.register(&d));
    assert_dump_is(&d, &engines);

    // Each engine in turn is killed (no shutdown: its sockets just close),
    // dropped after --engine-gone-s while the other keeps its blocks, and
    // replaced by a new process on the same endpoints holding other blocks.
    for (round, dead) in [0, 1, 0].into_iter().enumerate() {
        let clears = round as u64 + 1;
        let (instance, engine) = (engines[dead].instance, ENGINES[dead]);
        drop(engines.remove(dead));
        let dropped = wait_until(|| metric(&d, "kv_indexer_engine_gone_clears_total") == clears);
        assert!(dropped, "engine {instance} was never dropped");
        assert_dump_is(&d, &engines);
        let first = 100_000 * (round as u64 + 1);
        engines.insert(dead, RealEngine::start(&tools, &scratch, instance, engine, first));
        assert_dump_is(&d, &engines);
        engines.iter().for_each(|e| e.assert_answered(&d));
    }
    assert_eq!(metric(&d, "kv_indexer_engine_gone_clears_total"), 3);
    drop(engines);
    let _ = std::fs::remove_dir_all(&scratch);
}

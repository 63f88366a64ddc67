//! The daemon next to released engine publishers: vLLM's and SGLang's own
//! `kv_events` modules, run by `scripts/real_engine.py`, publish a history
//! (chains, evictions, a clear) and go idle. A daemon started afterwards,
//! with no peer and no snapshot, answers from their replay rings alone,
//! block for block, in `/dump` and in `/query`.
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
    fn start(tools: &Path, scratch: &Path, instance: u64, engine: &str, module: &str) -> RealEngine {
        let endpoint = format!("ipc://{}/{engine}.pub", scratch.display());
        let replay_endpoint = format!("ipc://{}/{engine}.replay", scratch.display());
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/real_engine.py");
        let mut child = Command::new(tools.join("venv/bin/python"))
            .arg(script)
            .args(["--engine", engine, "--module", module, "--endpoint", &endpoint])
            .args(["--replay-endpoint", &replay_endpoint])
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

    /// What `/dump` must list for this engine.
    fn facts(&self) -> BTreeSet<Fact> {
        let seed = seed_for(None, None);
        self.held.iter().map(|(&h, (_, tokens))| (self.instance, 0, 0, h, local_hash(tokens, seed))).collect()
    }
}

impl Drop for RealEngine {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_daemon_started_after_real_engines_went_idle_answers_from_their_rings() {
    let tools = match tools() {
        Ok(dir) => dir,
        Err(why) => {
            eprintln!("SKIP: no released engine publishers ({why}); scripts/install-test-tools.sh fetches them");
            return;
        }
    };
    // A short path: ipc:// addresses are Unix socket paths (108 bytes).
    let scratch = std::env::temp_dir().join(format!("kvi-real-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let engines: Vec<RealEngine> = ENGINES
        .iter()
        .enumerate()
        .map(|(i, (engine, module))| RealEngine::start(&tools, &scratch, 1 + i as u64, engine, module))
        .collect();

    // Both engines published and went idle; only now does the daemon start.
    let d = Daemon::start(&[]);
    for e in &engines {
        let (status, v) = d.post_json(
            "/register",
            json!({"instance_id": e.instance, "endpoint": e.endpoint, "replay_endpoint": e.replay_endpoint,
                   "model_name": MODEL, "block_size": e.block_size}),
        );
        assert_eq!(status, 201, "{v}");
    }
    let want: BTreeSet<Fact> = engines.iter().flat_map(RealEngine::facts).collect();
    let mut got = BTreeSet::new();
    let exact = wait_until(|| {
        got = dump_facts(&d);
        got == want
    });
    assert!(exact, "the daemon's dump {got:?} is not what the engines hold {want:?}");
    for e in &engines {
        for &leaf in e.held.keys() {
            let chain = e.chain(leaf);
            let tokens: Vec<u32> = chain.iter().flat_map(|h| e.held[h].1.iter().copied()).collect();
            let (status, v) = d.post_json("/query", json!({"token_ids": tokens, "model_name": MODEL}));
            assert_eq!(status, 200, "{v}");
            let gpu = (chain.len() as u32 * e.block_size) as u64;
            assert_eq!(v["instances"][e.instance.to_string()]["gpu"].as_u64(), Some(gpu), "{v}");
        }
    }
    let batches: u64 = engines.iter().map(|e| e.batches).sum();
    assert_eq!(metric(&d, "kv_indexer_batches_filled_total"), batches);
    let blocks: usize = engines.iter().map(|e| e.held.len()).sum();
    eprintln!(
        "real engines: {batches} batches published before the daemon started, {blocks} blocks held, all answered"
    );
    drop(engines);
    let _ = std::fs::remove_dir_all(&scratch);
}

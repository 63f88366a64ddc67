//! The fleet bench's options. The parent passes its own command line on to
//! each engine process with `--child FIRST:END` added, so both read one set.

/// Most engines one run follows (the daemon's documented cap).
pub const ENGINES_MAX: u32 = 4096;
/// Most hash-disjoint copies of the trace.
pub const COPIES_MAX: u32 = 256;
/// Most engines one engine process hosts: two sockets each stay under
/// libzmq's default cap of 1,023 sockets a context.
pub const PER_CHILD_MAX: u32 = 500;

pub const USAGE: &str = "\
fleet: many engines over ZMQ in vLLM's wire format with replay rings, one
daemon (and optionally Dynamo's service) following all of them.

  --engines N         engines [1024], at most 4096
  --copies K          hash-disjoint copies of the trace spread over them [16]
  --gpu-blocks N      each engine's cache in blocks (LRU) [16384]
  --trace PATH        Mooncake trace [benches/data/sample_trace.jsonl]
  --chunk-blocks N    most new blocks in one batch (a prefill chunk) [128]
  --ring-steps N      batches each engine's replay ring keeps [10000]
  --ring-mib N        ...and at most this many MiB of them [3]
  --sndhwm N          batches a publisher queues per subscriber before it blocks [100]
  --per-child N       engines per engine process [256]
  --bin PATH          our daemon [target/release/kv-indexer]
  --dynamo PATH       also run Dynamo's service on the same engines (settle, /dump)
  --scenarios LIST    of settle,dump,replica,snapshot,flood,flood-empty [all]
  --flood-requests N  requests each engine keeps back for the flood [24]
  --idle-s N          seconds idle CPU is measured over [10]
  --settle-timeout-s N  longest wait for a phase to settle [900]
  --daemon-args \"...\" extra arguments for our daemon
  --replica-args \"...\" extra arguments for the replica [--peer-timeout-ms 300000]
  --seed N            engine hash seeds [1]
  --json PATH         also write the figures as JSON
";

#[derive(Clone, Debug)]
pub struct Args {
    pub engines: u32,
    pub copies: u32,
    pub gpu_blocks: u32,
    pub trace: String,
    pub chunk_blocks: u32,
    pub ring_steps: u32,
    pub ring_mib: u32,
    pub sndhwm: i32,
    pub per_child: u32,
    pub bin: String,
    pub dynamo: Option<String>,
    pub scenarios: Vec<String>,
    pub idle_s: u64,
    pub flood_requests: u32,
    pub settle_timeout_s: u64,
    pub daemon_args: Vec<String>,
    pub replica_args: Vec<String>,
    pub seed: u64,
    pub json: Option<String>,
    /// Set in an engine process: the engines it hosts.
    pub child: Option<(u32, u32)>,
}

pub const SCENARIOS: [&str; 6] = ["settle", "dump", "replica", "snapshot", "flood", "flood-empty"];

impl Args {
    pub fn wants(&self, scenario: &str) -> bool {
        self.scenarios.iter().any(|s| s == scenario)
    }
}

pub fn parse() -> Result<Args, String> {
    use lexopt::prelude::*;
    let manifest = env!("CARGO_MANIFEST_DIR");
    let mut a = Args {
        engines: 1024,
        copies: 16,
        gpu_blocks: 16_384,
        trace: format!("{manifest}/benches/data/sample_trace.jsonl"),
        chunk_blocks: 128,
        ring_steps: 10_000,
        ring_mib: 3,
        sndhwm: 100,
        per_child: 256,
        bin: format!("{manifest}/target/release/kv-indexer"),
        dynamo: None,
        scenarios: SCENARIOS.iter().map(|s| s.to_string()).collect(),
        idle_s: 10,
        flood_requests: 24,
        settle_timeout_s: 900,
        daemon_args: Vec::new(),
        // The default (10 s) is shorter than a 16.8 M-pair dump takes here.
        replica_args: vec!["--peer-timeout-ms".into(), "300000".into()],
        seed: 1,
        json: None,
        child: None,
    };
    let mut p = lexopt::Parser::from_env();
    while let Some(arg) = p.next().map_err(|e| e.to_string())? {
        let name = match arg {
            Long("help") | Short('h') => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            Long(l) => l.to_string(),
            other => return Err(format!("unexpected argument {other:?}; see --help")),
        };
        if name == "bench" {
            continue; // cargo bench passes it
        }
        let v = p.value().map_err(|e| e.to_string())?.into_string().map_err(|_| format!("--{name}: not UTF-8"))?;
        let num = |lo: u64, hi: u64| {
            v.parse::<u64>()
                .ok()
                .filter(|n| (lo..=hi).contains(n))
                .ok_or(format!("--{name}: expected a whole number in {lo}..={hi}, got {v:?}"))
        };
        match name.as_str() {
            "engines" => a.engines = num(1, ENGINES_MAX as u64)? as u32,
            "copies" => a.copies = num(1, COPIES_MAX as u64)? as u32,
            "gpu-blocks" => a.gpu_blocks = num(1024, 1 << 22)? as u32,
            "trace" => a.trace = v,
            "chunk-blocks" => a.chunk_blocks = num(1, 4096)? as u32,
            "ring-steps" => a.ring_steps = num(1, 1_000_000)? as u32,
            "ring-mib" => a.ring_mib = num(1, 1024)? as u32,
            "sndhwm" => a.sndhwm = num(0, 1_000_000)? as i32,
            "per-child" => a.per_child = num(1, PER_CHILD_MAX as u64)? as u32,
            "bin" => a.bin = v,
            "dynamo" => a.dynamo = Some(v),
            "scenarios" => {
                a.scenarios = v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
                if let Some(bad) = a.scenarios.iter().find(|s| !SCENARIOS.contains(&s.as_str())) {
                    return Err(format!("--scenarios: unknown {bad:?}; known: {}", SCENARIOS.join(",")));
                }
            }
            "idle-s" => a.idle_s = num(1, 600)?,
            "flood-requests" => a.flood_requests = num(0, 100_000)? as u32,
            "settle-timeout-s" => a.settle_timeout_s = num(10, 7200)?,
            "daemon-args" => a.daemon_args = v.split_whitespace().map(str::to_string).collect(),
            "replica-args" => a.replica_args = v.split_whitespace().map(str::to_string).collect(),
            "seed" => a.seed = num(0, u64::MAX)?,
            "json" => a.json = Some(v),
            "child" => {
                let (lo, hi) = v.split_once(':').ok_or("--child wants FIRST:END")?;
                let lo = lo.parse::<u32>().map_err(|_| "--child: bad FIRST")?;
                let hi = hi.parse::<u32>().map_err(|_| "--child: bad END")?;
                if lo >= hi || hi - lo > PER_CHILD_MAX {
                    return Err(format!("--child {v}: wants FIRST < END, at most {PER_CHILD_MAX} engines"));
                }
                a.child = Some((lo, hi));
            }
            _ => return Err(format!("unknown option --{name}; see --help")),
        }
    }
    Ok(a)
}

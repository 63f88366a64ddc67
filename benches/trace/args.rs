//! Command-line options shared by the trace-replay benchmark and the
//! Dynamo comparison; each binary can accept a few more through `extra`.

use super::hashes::EngineHashes;
use super::replay::DriverConfig;
use super::sweep::{parse_rates, Rates};
use super::workload::{Assign, WorkloadConfig};

/// Most copies of the trace's hash space `--dup` may ask for.
pub const DUP_MAX: usize = 64;
/// Most reader or writer threads.
pub const THREADS_MAX: usize = 256;

/// Options text for `--help`.
pub const OPTIONS_HELP: &str = "\
options (defaults in brackets):
  --trace PATH          Mooncake JSONL trace [the committed sample]
  --block-size N        tokens per block [16]
  --workers N           mock engines [64]
  --gpu-blocks N        cache blocks per engine [16384]
  --dup K               copies of the trace's hash space [1]
  --assign HOW          round-robin | first-block | random [round-robin]
  --decode-ms MS        decode time per output token, trace time [20]
  --decode-events 0|1   store output blocks one per event while decoding, not at completion [0]
  --our-hashes H        engine | shared: the hashes kv-indexer is fed [engine]
  --rates LIST          block ops/s, e.g. 500K,1M,2M [auto: double from an 8 s window]
  --writers N           sticky writer threads [2]
  --readers N           query threads [2]
  --max-lag N           unapplied preceding events per worker a query tolerates [64]
  --verify-samples N    queries checked against the engines [2000]
  --seed N              engine hash seeds and random assignment [1]
  --json PATH           write results as JSON
  --svg PATH            draw achieved vs offered
";

/// Parsed common options.
pub struct CommonArgs {
    pub trace: String,
    pub cfg: WorkloadConfig,
    pub dup: usize,
    pub rates: Rates,
    pub driver: DriverConfig,
    pub writers: usize,
    /// The hashes kv-indexer's events carry.
    pub our_hashes: EngineHashes,
    pub json: Option<String>,
    pub svg: Option<String>,
    /// Every option as given, to pass on to a child process.
    pub raw: Vec<String>,
}

fn num(v: &str, name: &str, max: u64) -> Result<u64, String> {
    v.parse::<u64>()
        .ok()
        .filter(|n| *n >= 1 && *n <= max)
        .ok_or_else(|| format!("{name} wants an integer in 1..={max}, got {v:?}"))
}

/// Parses the process arguments. `extra(name, value)` handles an option the
/// common set does not know (all options take a value) and returns whether it did.
pub fn parse(
    default_trace: &str,
    help: &str,
    extra: &mut dyn FnMut(&str, &str) -> Result<bool, String>,
) -> Result<CommonArgs, String> {
    use lexopt::prelude::*;
    let mut a = CommonArgs {
        trace: default_trace.to_string(),
        cfg: WorkloadConfig {
            block_size: 16,
            workers: 64,
            gpu_blocks: 16384,
            assign: Assign::RoundRobin,
            decode_us_per_token: 20_000,
            decode_events: false,
            seed: 1,
            verify_samples: 2000,
        },
        dup: 1,
        rates: Rates::Auto,
        driver: DriverConfig { readers: 2, max_lag_events: 64 },
        writers: 2,
        our_hashes: EngineHashes::Engine,
        json: None,
        svg: None,
        raw: Vec::new(),
    };
    let mut p = lexopt::Parser::from_env();
    while let Some(arg) = p.next().map_err(|e| e.to_string())? {
        let name = match arg {
            Long("bench") => continue, // `cargo bench` passes it to every bench binary
            Short('h') | Long("help") => {
                print!("{help}");
                std::process::exit(0);
            }
            Long(name) => name.to_string(),
            _ => return Err(format!("{}\n\n{help}", arg.unexpected())),
        };
        let v = p.value().map_err(|e| e.to_string())?.to_string_lossy().into_owned();
        match name.as_str() {
            "trace" => a.trace = v.clone(),
            "block-size" => a.cfg.block_size = num(&v, "--block-size", 65536)? as usize,
            "workers" => a.cfg.workers = num(&v, "--workers", 65536)? as u32,
            "gpu-blocks" => a.cfg.gpu_blocks = num(&v, "--gpu-blocks", 1 << 26)? as usize,
            "dup" => a.dup = num(&v, "--dup", DUP_MAX as u64)? as usize,
            "assign" => {
                a.cfg.assign = Assign::parse(&v)
                    .ok_or_else(|| format!("--assign wants round-robin, first-block or random, got {v:?}"))?
            }
            "decode-ms" => {
                let ms: f64 = v
                    .parse()
                    .ok()
                    .filter(|ms| (0.0..=10_000.0).contains(ms))
                    .ok_or_else(|| format!("--decode-ms wants 0..=10000, got {v:?}"))?;
                a.cfg.decode_us_per_token = (ms * 1000.0) as u64;
            }
            "decode-events" => {
                a.cfg.decode_events = match v.as_str() {
                    "0" => false,
                    "1" => true,
                    _ => return Err(format!("--decode-events wants 0 or 1, got {v:?}")),
                }
            }
            "our-hashes" => {
                a.our_hashes =
                    EngineHashes::parse(&v).ok_or_else(|| format!("--our-hashes wants engine or shared, got {v:?}"))?
            }
            "rates" => a.rates = Rates::Fixed(parse_rates(&v)?),
            "writers" => a.writers = num(&v, "--writers", THREADS_MAX as u64)? as usize,
            "readers" => a.driver.readers = num(&v, "--readers", THREADS_MAX as u64)? as usize,
            "max-lag" => a.driver.max_lag_events = num(&v, "--max-lag", 1 << 30)?,
            "verify-samples" => a.cfg.verify_samples = num(&v, "--verify-samples", 100_000)? as usize,
            "seed" => a.cfg.seed = num(&v, "--seed", u64::MAX)?,
            "json" => a.json = Some(v.clone()),
            "svg" => a.svg = Some(v.clone()),
            other => {
                if !extra(other, &v)? {
                    return Err(format!("unknown option --{other}\n\n{help}"));
                }
                continue;
            }
        }
        if !matches!(name.as_str(), "json" | "svg") {
            a.raw.push(format!("--{name}"));
            a.raw.push(v);
        }
    }
    Ok(a)
}

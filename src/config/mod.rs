//! Command line and environment to a validated configuration.
//!
//! Dynamo's standalone indexer flags work unchanged (`--port`, `--threads`,
//! `--block-size`, `--workers`, `--model-name`, `--routing-group` (alias
//! `--tenant-id`), `--peers`, `--access-log`, `--trace-id-header`,
//! `--access-log-local-time`); the rest are this daemon's knobs. Every value is checked here, once; a bad
//! one is a single line on stderr and exit code 2 (see `main`).

mod flags;
#[cfg(test)]
mod readme_tests;

use crate::registry::RegisterArgs;
use flags::{Parsed, FLAGS};
use std::path::PathBuf;

/// Default cap of live (block, worker) pairs over all indexes (see docs/limits.md).
pub const MAX_PAIRS_DEFAULT: u64 = 1 << 27;

/// Everything the daemon runs with.
#[derive(Clone, Debug)]
pub struct Config {
    pub host: String,
    pub port: u16,
    pub unix_socket: Option<PathBuf>,
    /// Writer shards (Dynamo's `--threads`). 0: from the core count.
    pub writer_threads: usize,
    /// Listener threads. 0: from the core count.
    pub listener_threads: usize,
    /// Connections, body size and request deadlines of the HTTP front.
    pub http: crate::http::server::HttpLimits,
    pub block_size: Option<u32>,
    pub model_name: String,
    pub tenant_id: String,
    /// `--workers`, each to register on the index of `model_name`, `tenant_id`, `block_size`.
    pub workers: Vec<RegisterArgs>,
    /// `/register` bodies, one a line, read at start and on SIGHUP.
    pub workers_file: Option<PathBuf>,
    pub peers: Vec<String>,
    pub replay_timeout_ms: u64,
    /// `--ingest-coalesce-us`, if given: accepted for old command lines and
    /// ignored (listeners no longer wait between reads).
    pub ingest_coalesce_us: Option<u64>,
    /// TCP keepalive towards engines: silence before probes and between them, ms; 0: none.
    pub heartbeat_ms: i32,
    /// Seconds an engine may stay unreachable before its workers are cleared; 0: never.
    pub engine_gone_s: u64,
    /// MiB of engine batches received and not yet applied, daemon-wide.
    pub ingest_budget_mib: usize,
    /// Positions per jump of the index search.
    pub jump: usize,
    /// Readiness waits until this many workers are registered.
    pub min_initial_workers: usize,
    /// How long listeners connect and buffer before the peer dump is fetched.
    pub slow_joiner_ms: u64,
    /// Per-request timeout when fetching a peer's dump.
    pub peer_timeout_ms: u64,
    pub log_level: crate::log::Level,
    pub log_format: crate::log::Format,
    /// Pin listener and shard threads to cores.
    pub pin_threads: bool,
    /// Live (block, worker) pairs all indexes may hold; 0: no cap.
    pub max_pairs: u64,
    /// Cap on live predicted blocks over all indexes (`/routed`).
    pub predict_max_blocks: u64,
    /// Lifetime of a booking that names no `ttl_ms`.
    pub predict_ttl_ms: u64,
    /// Bearer token the mutating endpoints require, if set.
    pub admin_token: Option<crate::http::auth::AdminToken>,
    /// Where snapshots are written and read at startup; None: no snapshots.
    pub snapshot_dir: Option<PathBuf>,
    /// Seconds between periodic snapshots; 0: only on stop.
    pub snapshot_interval_s: u64,
    /// The access log: where, which header is the trace id, which clock.
    pub access_log: crate::http::access_log::AccessLogConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            host: "0.0.0.0".into(),
            port: 8090,
            unix_socket: None,
            writer_threads: 0,
            listener_threads: 0,
            http: crate::http::server::HttpLimits::default(),
            block_size: None,
            model_name: "default".into(),
            tenant_id: "default".into(),
            workers: Vec::new(),
            workers_file: None,
            peers: Vec::new(),
            replay_timeout_ms: 2_000,
            ingest_coalesce_us: None,
            heartbeat_ms: crate::ingest::HEARTBEAT_MS_DEFAULT,
            engine_gone_s: crate::ingest::ENGINE_GONE_S_DEFAULT,
            ingest_budget_mib: crate::ingest::BUDGET_MIB_DEFAULT,
            jump: crate::index::JUMP_DEFAULT,
            min_initial_workers: 0,
            slow_joiner_ms: 1_000,
            peer_timeout_ms: 10_000,
            log_level: crate::log::Level::Info,
            log_format: crate::log::Format::Text,
            pin_threads: true,
            max_pairs: MAX_PAIRS_DEFAULT,
            predict_max_blocks: crate::predict::MAX_BLOCKS_DEFAULT,
            predict_ttl_ms: crate::predict::TTL_MS_DEFAULT,
            admin_token: None,
            snapshot_dir: None,
            snapshot_interval_s: 60,
            access_log: Default::default(),
        }
    }
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    Run(Box<Config>),
    Help,
    Version,
}

/// `--help`.
pub fn usage() -> String {
    flags::usage()
}

/// Parses `instance[:dp_rank]=endpoint,...` into registrations on the
/// index of `cfg`'s model, tenant and block size.
pub fn parse_workers(list: &str, cfg: &Config) -> Result<Vec<RegisterArgs>, String> {
    let mut out: Vec<RegisterArgs> = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let bad = || format!("--workers: {item:?} is not instance[:dp_rank]=endpoint");
        let (id, endpoint) = item.split_once('=').ok_or_else(bad)?;
        let (instance, rank) = id.split_once(':').unwrap_or((id, "0"));
        let instance_id = instance.trim().parse::<u64>().map_err(|_| bad())?;
        let dp_rank = rank.trim().parse::<u32>().map_err(|_| bad())?;
        let endpoint = endpoint.trim();
        crate::endpoint::validate_zmq_endpoint(endpoint).map_err(|why| format!("--workers: {why}"))?;
        if out.iter().any(|a| (a.instance_id, a.dp_rank) == (instance_id, dp_rank)) {
            return Err(format!("--workers: instance {instance_id} dp_rank {dp_rank} is listed twice"));
        }
        out.push(RegisterArgs {
            instance_id,
            dp_rank,
            endpoint: endpoint.to_string(),
            replay_endpoint: None,
            model_name: cfg.model_name.clone(),
            tenant_id: cfg.tenant_id.clone(),
            block_size: cfg.block_size.unwrap_or(16),
        });
    }
    Ok(out)
}

/// Parses `--peers`.
pub fn parse_peers(list: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for p in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let url = crate::endpoint::validate_peer_url(p).map_err(|e| format!("--peers: {e}"))?;
        if !out.contains(&url) {
            out.push(url);
        }
        if out.len() > crate::peers::PEERS_MAX {
            return Err(format!("--peers: at most {} peers", crate::peers::PEERS_MAX));
        }
    }
    Ok(out)
}

/// Reads the command line (without the program name) and the environment;
/// an error is one line, for stderr.
pub fn parse<I>(args: I, env: impl Fn(&str) -> Option<String>) -> Result<Command, String>
where
    I: IntoIterator<Item = std::ffi::OsString>,
{
    use lexopt::prelude::*;
    let mut p = Parsed { cfg: Config::default(), workers: None };
    // The environment first, so a flag wins; each variable reads like its flag.
    for flag in FLAGS {
        for var in flag.env {
            // A blank variable is unset, but a token is taken as written.
            let set_to = |v: &String| if flag.name == "--admin-token" { !v.is_empty() } else { !v.trim().is_empty() };
            if let Some(v) = env(var).filter(set_to) {
                flag.set(&mut p, var, v)?;
            }
        }
    }
    let mut parser = lexopt::Parser::from_args(args);
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        let spelled = match &arg {
            Short('h') | Long("help") => return Ok(Command::Help),
            Short('V') | Long("version") => return Ok(Command::Version),
            Long(l) => format!("--{l}"),
            Short(c) => format!("-{c}"),
            Value(v) => return Err(format!("unexpected argument {v:?}; see --help")),
        };
        let flag = flags::find(&spelled).ok_or_else(|| format!("unknown option {spelled}; see --help"))?;
        let value = if flag.takes_value() {
            let value = parser.value().map_err(|_| format!("{spelled} needs a value"))?;
            value.into_string().map_err(|_| format!("{spelled}: value is not valid UTF-8"))?
        } else {
            String::new()
        };
        flag.set(&mut p, &spelled, value)?;
    }
    let mut cfg = p.cfg;
    if let Some(w) = p.workers {
        cfg.workers = parse_workers(&w, &cfg)?;
        if !cfg.workers.is_empty() && cfg.block_size.is_none() {
            return Err("--workers needs --block-size".into());
        }
    }
    Ok(Command::Run(Box::new(cfg)))
}

/// `v`, unless it is blank: then "`flag`: empty `what`".
fn non_blank<'a>(flag: &str, v: &'a str, what: &str) -> Result<&'a str, String> {
    if v.trim().is_empty() {
        return Err(format!("{flag}: empty {what}"));
    }
    Ok(v)
}

fn non_empty(flag: &str, v: String) -> Result<String, String> {
    let max = crate::registry::NAME_BYTES_MAX;
    if v.is_empty() {
        Err(format!("{flag}: empty name"))
    } else if v.len() > max {
        Err(format!("{flag}: longer than {max} bytes"))
    } else {
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Config, String> {
        match parse(args.iter().map(Into::into), |_| None)? {
            Command::Run(c) => Ok(*c),
            other => panic!("expected a run, got {other:?}"),
        }
    }

    #[test]
    fn the_flag_table_defaults_are_the_config_defaults() {
        let base = format!("{:?}", Config::default());
        for f in FLAGS {
            // What the docs show as none or "from cores" is the unset value.
            let value = match f.default {
                "" | "from cores" => continue,
                d => d.to_string(),
            };
            let mut p = Parsed { cfg: Config::default(), workers: None };
            f.set(&mut p, f.name, value).unwrap();
            assert_eq!(format!("{:?}", p.cfg), base, "{}'s documented default is not Config's", f.name);
        }
    }

    #[test]
    fn help_shows_every_flag_alias_and_variable() {
        let help = usage();
        for f in FLAGS {
            for word in std::iter::once(&f.name).chain(f.aliases).chain(f.env) {
                assert!(help.contains(word), "--help does not show {word}");
            }
            assert!(f.default.is_empty() || help.contains(&format!("default {}", f.default)), "{}", f.name);
        }
        assert!(help.lines().all(|l| l.len() <= 100), "{help}");
    }

    #[test]
    fn dynamo_flags_parse() {
        let c = run(&[
            "--port",
            "9000",
            "--threads",
            "4",
            "--block-size",
            "16",
            "--model-name",
            "m",
            "--tenant-id",
            "t",
            "--workers",
            "1=tcp://h:5557,2:1=tcp://h:5558",
            "--peers",
            "http://a:8090,http://b:8091/",
        ])
        .unwrap();
        assert_eq!((c.port, c.writer_threads, c.block_size), (9000, 4, Some(16)));
        let w = &c.workers[1];
        assert_eq!((w.instance_id, w.dp_rank, w.endpoint.as_str()), (2, 1, "tcp://h:5558"));
        assert_eq!((w.model_name.as_str(), w.tenant_id.as_str(), w.block_size), ("m", "t", 16));
        assert_eq!(c.peers, vec!["http://a:8090", "http://b:8091"]);
    }

    #[test]
    fn heartbeat_interval_parses() {
        assert_eq!(run(&[]).unwrap().heartbeat_ms, crate::ingest::HEARTBEAT_MS_DEFAULT);
        assert_eq!(run(&["--heartbeat-ms", "0"]).unwrap().heartbeat_ms, 0);
        assert_eq!(run(&["--heartbeat-ms", "5000"]).unwrap().heartbeat_ms, 5_000);
        for bad in ["-1", "600001", "x"] {
            assert!(run(&["--heartbeat-ms", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_ignored_coalescing_flag_is_still_accepted_in_its_old_range() {
        assert_eq!(run(&[]).unwrap().ingest_coalesce_us, None);
        assert_eq!(run(&["--ingest-coalesce-us", "5000"]).unwrap().ingest_coalesce_us, Some(5_000));
        assert_eq!(run(&["--ingest-coalesce-us", "0"]).unwrap().ingest_coalesce_us, Some(0));
        for bad in ["-1", "100001", "x"] {
            assert!(run(&["--ingest-coalesce-us", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn engine_gone_parses_from_the_flag_or_the_environment() {
        assert_eq!(run(&[]).unwrap().engine_gone_s, crate::ingest::ENGINE_GONE_S_DEFAULT);
        assert_eq!(run(&["--engine-gone-s", "0"]).unwrap().engine_gone_s, 0);
        assert_eq!(run(&["--engine-gone-s", "86400"]).unwrap().engine_gone_s, 86_400);
        for bad in ["-1", "86401", "1.5", "x"] {
            let e = run(&["--engine-gone-s", bad]).unwrap_err();
            assert!(e.starts_with("--engine-gone-s: expected a number from 0 to 86400"), "{bad}: {e}");
        }
        let env = |k: &str| (k == "KV_INDEXER_ENGINE_GONE_S").then(|| "5".to_string());
        let Command::Run(c) = parse(Vec::<std::ffi::OsString>::new(), env).unwrap() else { panic!() };
        assert_eq!(c.engine_gone_s, 5);
        let Command::Run(c) = parse(["--engine-gone-s".into(), "7".into()], env).unwrap() else { panic!() };
        assert_eq!(c.engine_gone_s, 7, "the flag wins");
        let bad_env = |k: &str| (k == "KV_INDEXER_ENGINE_GONE_S").then(|| "soon".to_string());
        let e = parse(Vec::<std::ffi::OsString>::new(), bad_env).unwrap_err();
        assert!(e.starts_with("KV_INDEXER_ENGINE_GONE_S: "), "{e}");
    }

    #[test]
    fn log_format_parses() {
        assert_eq!(run(&[]).unwrap().log_format, crate::log::Format::Text);
        assert_eq!(run(&["--log-format", "json"]).unwrap().log_format, crate::log::Format::Json);
        assert!(run(&["--log-format", "xml"]).is_err());
    }

    #[test]
    fn dynamo_service_flags_parse() {
        let c = run(&[
            "--routing-group",
            "acme",
            "--access-log",
            "/var/log/kv/access.log",
            "--trace-id-header",
            "X-Request-Id",
            "--access-log-local-time",
        ])
        .unwrap();
        assert_eq!(c.tenant_id, "acme");
        assert_eq!(c.access_log.path, Some(PathBuf::from("/var/log/kv/access.log")));
        assert_eq!(c.access_log.trace_id_header, "x-request-id");
        assert!(c.access_log.local_time);
        let c = run(&[]).unwrap();
        assert_eq!((c.access_log.path, c.access_log.trace_id_header.as_str()), (None, "x-trace-id"));
        assert!(!c.access_log.local_time);
        for args in [&["--trace-id-header", "bad header"][..], &["--trace-id-header", ""], &["--access-log", ""]] {
            let e = run(args).unwrap_err();
            assert!(!e.contains('\n') && e.starts_with(args[0]), "{args:?}: {e}");
        }
    }

    #[test]
    fn workers_file_from_flag_or_env() {
        assert_eq!(run(&[]).unwrap().workers_file, None);
        let c = run(&["--workers-file", "/etc/kv-indexer/workers.jsonl"]).unwrap();
        assert_eq!(c.workers_file, Some(PathBuf::from("/etc/kv-indexer/workers.jsonl")));
        let env = |k: &str| (k == "KV_INDEXER_WORKERS_FILE").then(|| "/from/env".to_string());
        let Command::Run(c) = parse(Vec::<std::ffi::OsString>::new(), env).unwrap() else { panic!() };
        assert_eq!(c.workers_file, Some(PathBuf::from("/from/env")));
        let Command::Run(c) = parse(["--workers-file".into(), "/from/flag".into()], env).unwrap() else { panic!() };
        assert_eq!(c.workers_file, Some(PathBuf::from("/from/flag")), "the flag wins");
        assert!(run(&["--workers-file", " "]).unwrap_err().starts_with("--workers-file"));
    }

    #[test]
    fn snapshot_flags_parse() {
        let c = run(&[]).unwrap();
        assert_eq!((c.snapshot_dir, c.snapshot_interval_s), (None, 60));
        let c = run(&["--snapshot-dir", "/var/lib/kv-indexer", "--snapshot-interval-s", "0"]).unwrap();
        assert_eq!(c.snapshot_dir, Some(PathBuf::from("/var/lib/kv-indexer")));
        assert_eq!(c.snapshot_interval_s, 0);
    }

    #[test]
    fn http_flags_parse() {
        assert_eq!(run(&[]).unwrap().http, crate::http::server::HttpLimits::default());
        let c = run(&[
            "--http-connections-max",
            "4",
            "--body-limit-bytes",
            "4096",
            "--http-head-timeout-s",
            "2",
            "--http-body-timeout-s",
            "3",
        ])
        .unwrap();
        let want = crate::http::server::HttpLimits {
            connections_max: 4,
            body_limit_bytes: 4096,
            head_timeout_s: 2,
            body_timeout_s: 3,
        };
        assert_eq!(c.http, want);
        for args in [&["--http-head-timeout-s", "0"][..], &["--http-body-timeout-s", "3601"]] {
            assert!(run(args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn bad_values_are_one_clear_error() {
        for args in [
            &["--port", "x"][..],
            &["--port", "70000"],
            &["--block-size", "0"],
            &["--workers", "1=tcp://h:5557"],
            &["--block-size", "16", "--workers", "1=udp://h:1"],
            &["--block-size", "16", "--workers", "1=tcp://h:1,1=tcp://h:2"],
            &["--peers", "ftp://x"],
            &["--bogus"],
            &["stray"],
            &["--port"],
            &["--snapshot-dir", ""],
            &["--snapshot-interval-s", "-1"],
            &["--model-name", &"m".repeat(crate::registry::NAME_BYTES_MAX + 1)],
        ] {
            let e = run(args).unwrap_err();
            assert!(!e.contains('\n') && !e.is_empty(), "{args:?}: {e}");
        }
    }

    #[test]
    fn env_sets_readiness_and_help_version_short_circuit() {
        let env = |k: &str| (k == "DYN_ROUTER_MIN_INITIAL_WORKERS").then(|| "3".to_string());
        match parse(Vec::<std::ffi::OsString>::new(), env).unwrap() {
            Command::Run(c) => assert_eq!(c.min_initial_workers, 3),
            _ => panic!(),
        }
        assert!(matches!(parse(["--help".into()], |_| None).unwrap(), Command::Help));
        assert!(matches!(parse(["-V".into()], |_| None).unwrap(), Command::Version));
    }

    #[test]
    fn limits_and_admin_token() {
        let c = run(&[]).unwrap();
        assert_eq!((c.max_pairs, c.admin_token.is_none()), (MAX_PAIRS_DEFAULT, true));
        assert_eq!(run(&["--max-pairs", "0"]).unwrap().max_pairs, 0);
        let p = run(&["--predict-max-blocks", "64", "--predict-ttl-ms", "60000"]).unwrap();
        assert_eq!((p.predict_max_blocks, p.predict_ttl_ms), (64, crate::predict::TTL_MS_MAX));
        assert_eq!((c.predict_max_blocks, c.predict_ttl_ms), (1 << 20, 2_000));
        for args in [&["--predict-ttl-ms", "0"][..], &["--predict-ttl-ms", "60001"], &["--predict-max-blocks", "0"]] {
            assert!(run(args).is_err(), "{args:?}");
        }
        let env = |k: &str| (k == "KV_INDEXER_ADMIN_TOKEN").then(|| "from-env".to_string());
        let Command::Run(c) = parse(Vec::<std::ffi::OsString>::new(), env).unwrap() else { panic!() };
        assert_eq!(c.admin_token, Some(crate::http::auth::AdminToken::new("from-env").unwrap()));
        let Command::Run(c) = parse(["--admin-token".into(), "from-flag".into()], env).unwrap() else { panic!() };
        assert_eq!(c.admin_token, Some(crate::http::auth::AdminToken::new("from-flag").unwrap()), "the flag wins");
        for args in [&["--max-pairs", "-1"][..], &["--admin-token", ""], &["--admin-token", "two words"]] {
            let e = run(args).unwrap_err();
            assert!(!e.contains("two words"), "the error does not echo the token: {e}");
        }
        assert!(!format!("{c:?}").contains("from-flag"), "Debug of the config hides the token");
    }
}

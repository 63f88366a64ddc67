//! The one definition of every flag: its name, aliases, value, default,
//! range, environment variables and help text. Parsing (`set`), `--help`
//! (`usage`) and the check of README's configuration table all read
//! `FLAGS`; a new flag is one row here.

use super::{non_blank, non_empty, parse_peers, Config};
use crate::http::access_log::header_name;
use crate::http::auth::AdminToken;
use crate::log::{Format, Level};
use std::path::PathBuf;

/// Largest `--ingest-coalesce-us` accepted: the range it documented when it
/// still did something, so old command lines start as before.
const COALESCE_US_MAX: u64 = 100_000;

/// What the command line has set so far.
pub(crate) struct Parsed {
    pub cfg: Config,
    /// `--workers` as given, read once every flag is (it needs `--block-size`).
    pub workers: Option<String>,
}

/// How a flag takes its value.
pub(crate) enum Kind {
    /// No value.
    Switch(fn(&mut Parsed)),
    /// A whole number in `min..=max`.
    Number { min: u64, max: u64, set: fn(&mut Parsed, u64) },
    /// Any other value, checked by `set`, whose error names the flag (or
    /// the environment variable) it is given.
    Text(fn(&mut Parsed, &str, String) -> Result<(), String>),
}

/// One flag.
pub(crate) struct Flag {
    pub name: &'static str,
    /// Other spellings accepted (Dynamo's).
    pub aliases: &'static [&'static str],
    /// The value's placeholder in `--help` and README (`N`, `PATH`); empty for a switch.
    pub value: &'static str,
    /// The default as the docs show it; empty: none. `config`'s tests hold
    /// `Config::default()` to it.
    pub default: &'static str,
    /// Environment variables read when the flag is not given (the last one set wins).
    pub env: &'static [&'static str],
    pub help: &'static str,
    pub kind: Kind,
}

const fn num(min: u64, max: u64, set: fn(&mut Parsed, u64)) -> Kind {
    Kind::Number { min, max, set }
}

fn path(name: &str, v: &str) -> Result<PathBuf, String> {
    non_blank(name, v, "path").map(PathBuf::from)
}

/// Every flag, in `--help`'s order. Numbers are cast to their field's
/// type only after their range, which fits it, is checked.
#[rustfmt::skip]
pub(crate) const FLAGS: &[Flag] = &[
    Flag { name: "--port", aliases: &[], value: "N", default: "8090", env: &[],
        help: "HTTP port",
        kind: num(0, u16::MAX as u64, |p, n| p.cfg.port = n as u16) },
    Flag { name: "--host", aliases: &[], value: "ADDR", default: "0.0.0.0", env: &[],
        help: "HTTP bind address",
        kind: Kind::Text(|p, name, v| {
            p.cfg.host = non_blank(name, &v, "address")?.trim().to_string();
            Ok(())
        }) },
    Flag { name: "--unix-socket", aliases: &[], value: "PATH", default: "", env: &[],
        help: "also serve the API on this Unix socket (mode 0660: the daemon's group)",
        kind: Kind::Text(|p, _, v| {
            p.cfg.unix_socket = Some(PathBuf::from(v));
            Ok(())
        }) },
    Flag { name: "--threads", aliases: &[], value: "N", default: "from cores", env: &[],
        help: "writer shards applying events",
        kind: num(1, 1024, |p, n| p.cfg.writer_threads = n as usize) },
    Flag { name: "--listener-threads", aliases: &[], value: "N", default: "from cores", env: &[],
        help: "threads owning the ZMQ sockets",
        kind: num(1, 1024, |p, n| p.cfg.listener_threads = n as usize) },
    Flag { name: "--http-connections-max", aliases: &[], value: "N", default: "1024", env: &[],
        help: "most open HTTP connections, one thread each; more get 503",
        kind: num(1, 65_536, |p, n| p.cfg.http.connections_max = n as usize) },
    Flag { name: "--http-head-timeout-s", aliases: &[], value: "N", default: "10", env: &[],
        help: "a request head must arrive within N s of its first byte, a new connection's first \
               within N s of connecting; else 408",
        kind: num(1, 3_600, |p, n| p.cfg.http.head_timeout_s = n) },
    Flag { name: "--http-body-timeout-s", aliases: &[], value: "N", default: "60", env: &[],
        help: "a request body must arrive within N s of its head; else 408",
        kind: num(1, 3_600, |p, n| p.cfg.http.body_timeout_s = n) },
    Flag { name: "--block-size", aliases: &[], value: "N", default: "", env: &[],
        help: "block size of the --workers index (required with --workers)",
        kind: num(1, 1 << 20, |p, n| p.cfg.block_size = Some(n as u32)) },
    Flag { name: "--model-name", aliases: &[], value: "NAME", default: "default", env: &[],
        help: "model of the --workers index",
        kind: Kind::Text(|p, name, v| {
            p.cfg.model_name = non_empty(name, v)?;
            Ok(())
        }) },
    Flag { name: "--routing-group", aliases: &["--tenant-id"], value: "NAME", default: "default", env: &[],
        help: "tenant of the --workers index",
        kind: Kind::Text(|p, name, v| {
            p.cfg.tenant_id = non_empty(name, v)?;
            Ok(())
        }) },
    Flag { name: "--workers", aliases: &[], value: "LIST", default: "", env: &[],
        help: "instance[:dp_rank]=zmq_endpoint, comma separated",
        kind: Kind::Text(|p, _, v| {
            p.workers = Some(v);
            Ok(())
        }) },
    Flag { name: "--workers-file", aliases: &[], value: "PATH", default: "", env: &["KV_INDEXER_WORKERS_FILE"],
        help: "one /register JSON body a line (# comments allowed), registered at start and \
               reconciled on SIGHUP (systemctl reload): new lines are registered, removed ones \
               unregistered, changed ones registered anew; a bad file changes nothing",
        kind: Kind::Text(|p, name, v| {
            p.cfg.workers_file = Some(path(name, &v)?);
            Ok(())
        }) },
    Flag { name: "--peers", aliases: &[], value: "LIST", default: "", env: &[],
        help: "peer indexer URLs to recover state from at startup",
        kind: Kind::Text(|p, _, v| {
            p.cfg.peers = parse_peers(&v)?;
            Ok(())
        }) },
    Flag { name: "--replay-timeout-ms", aliases: &[], value: "N", default: "2000", env: &[],
        help: "deadline of one gap replay",
        kind: num(1, 600_000, |p, n| p.cfg.replay_timeout_ms = n) },
    Flag { name: "--ingest-coalesce-us", aliases: &[], value: "N", default: "", env: &[],
        help: "ignored (0..=100000 still accepted): listeners no longer wait between reads; an \
               event is applied as soon as it is read",
        kind: num(0, COALESCE_US_MAX, |p, n| p.cfg.ingest_coalesce_us = Some(n)) },
    Flag { name: "--heartbeat-ms", aliases: &[], value: "N", default: "2500", env: &[],
        help: "ZMTP heartbeat towards each engine every N ms; an engine silent for 3 intervals is \
               dropped and reconnected; 0: none",
        kind: num(0, crate::ingest::HEARTBEAT_MS_MAX as u64, |p, n| p.cfg.heartbeat_ms = n as i32) },
    Flag { name: "--engine-gone-s", aliases: &[], value: "N", default: "60", env: &["KV_INDEXER_ENGINE_GONE_S"],
        help: "clear the blocks of an engine unreachable for N s; they refill from its ring when \
               it is back; 0: never",
        kind: num(0, crate::ingest::ENGINE_GONE_S_MAX, |p, n| p.cfg.engine_gone_s = n) },
    Flag { name: "--body-limit-bytes", aliases: &[], value: "N", default: "16 MiB", env: &[],
        help: "largest request body",
        kind: num(1024, 1 << 30, |p, n| p.cfg.http.body_limit_bytes = n as usize) },
    Flag { name: "--jump", aliases: &[], value: "N", default: "64", env: &[],
        help: "positions per jump of the index search",
        kind: num(1, 4096, |p, n| p.cfg.jump = n as usize) },
    Flag { name: "--min-initial-workers", aliases: &[], value: "N", default: "0",
        env: &["DYN_ROUTER_MIN_INITIAL_WORKERS", "KV_INDEXER_MIN_INITIAL_WORKERS"],
        help: "/health answers 503 until N workers are registered",
        kind: num(0, 1_000_000, |p, n| p.cfg.min_initial_workers = n as usize) },
    Flag { name: "--slow-joiner-ms", aliases: &[], value: "N", default: "1000", env: &[],
        help: "wait before fetching a peer dump at startup",
        kind: num(0, 600_000, |p, n| p.cfg.slow_joiner_ms = n) },
    Flag { name: "--peer-timeout-ms", aliases: &[], value: "N", default: "10000", env: &[],
        help: "timeout of a whole peer dump request",
        kind: num(1, 600_000, |p, n| p.cfg.peer_timeout_ms = n) },
    Flag { name: "--max-pairs", aliases: &[], value: "N", default: "134217728", env: &[],
        help: "cap on live (block, worker) pairs over all indexes; past it new blocks are refused \
               and counted, never guessed; 0: no cap",
        kind: num(0, u64::MAX, |p, n| p.cfg.max_pairs = n) },
    Flag { name: "--predict-max-blocks", aliases: &[], value: "N", default: "1048576", env: &[],
        help: "cap on live predicted blocks booked through /routed, over all indexes; a booking \
               past it is refused",
        kind: num(1, 1 << 30, |p, n| p.cfg.predict_max_blocks = n) },
    Flag { name: "--predict-ttl-ms", aliases: &[], value: "N", default: "2000", env: &[],
        help: "lifetime of a /routed booking that names no ttl_ms, at most 60000",
        kind: num(1, crate::predict::TTL_MS_MAX, |p, n| p.cfg.predict_ttl_ms = n) },
    Flag { name: "--admin-token", aliases: &[], value: "TOKEN", default: "", env: &["KV_INDEXER_ADMIN_TOKEN"],
        help: "require \"Authorization: Bearer TOKEN\" on /register, /unregister, /register_peer, \
               /deregister_peer, /routed; the variable keeps it out of the process list",
        kind: Kind::Text(|p, name, v| {
            p.cfg.admin_token = Some(AdminToken::new(&v).map_err(|e| format!("{name}: {e}"))?);
            Ok(())
        }) },
    Flag { name: "--snapshot-dir", aliases: &[], value: "DIR", default: "", env: &[],
        help: "write snapshots to DIR/snapshot.bin and restart warm from it",
        kind: Kind::Text(|p, name, v| {
            p.cfg.snapshot_dir = Some(path(name, &v)?);
            Ok(())
        }) },
    Flag { name: "--snapshot-interval-s", aliases: &[], value: "N", default: "60", env: &[],
        help: "seconds between snapshots; 0: only on stop",
        kind: num(0, 86_400, |p, n| p.cfg.snapshot_interval_s = n) },
    Flag { name: "--access-log", aliases: &[], value: "PATH", default: "", env: &[],
        help: "append one JSON line per HTTP request to PATH; reopened by POST /reopen_logs and \
               SIGHUP (for logrotate)",
        kind: Kind::Text(|p, name, v| {
            p.cfg.access_log.path = Some(path(name, &v)?);
            Ok(())
        }) },
    Flag { name: "--trace-id-header", aliases: &[], value: "NAME", default: "x-trace-id", env: &[],
        help: "request header copied into the access log's trace_id",
        kind: Kind::Text(|p, name, v| {
            p.cfg.access_log.trace_id_header = header_name(&v).map_err(|e| format!("{name}: {e}"))?;
            Ok(())
        }) },
    Flag { name: "--access-log-local-time", aliases: &[], value: "", default: "", env: &[],
        help: "local time in the access log instead of UTC",
        kind: Kind::Switch(|p| p.cfg.access_log.local_time = true) },
    Flag { name: "--no-pin", aliases: &[], value: "", default: "", env: &[],
        help: "do not pin listener and shard threads to cores",
        kind: Kind::Switch(|p| p.cfg.pin_threads = false) },
    Flag { name: "--log-level", aliases: &[], value: "LEVEL", default: "info", env: &["KV_INDEXER_LOG"],
        help: "error, warn, info or debug",
        kind: Kind::Text(|p, name, v| {
            p.cfg.log_level = Level::parse(&v).ok_or_else(|| format!("{name}: unknown level {v:?}"))?;
            Ok(())
        }) },
    Flag { name: "--log-format", aliases: &[], value: "F", default: "text", env: &["KV_INDEXER_LOG_FORMAT"],
        help: "text or json lines",
        kind: Kind::Text(|p, name, v| {
            p.cfg.log_format = Format::parse(&v).ok_or_else(|| format!("{name}: {v:?} is not text or json"))?;
            Ok(())
        }) },
];

/// The flag spelled `spelling`, by its name or an alias.
pub(crate) fn find(spelling: &str) -> Option<&'static Flag> {
    FLAGS.iter().find(|f| f.name == spelling || f.aliases.contains(&spelling))
}

impl Flag {
    /// Sets what the flag configures to `value`; `name` (the flag as
    /// given, or its environment variable) starts any error.
    pub(crate) fn set(&self, p: &mut Parsed, name: &str, value: String) -> Result<(), String> {
        match self.kind {
            Kind::Switch(set) => set(p),
            Kind::Number { min, max, set } => match value.trim().parse::<u64>() {
                Ok(n) if (min..=max).contains(&n) => set(p, n),
                _ => return Err(format!("{name}: expected a number from {min} to {max}, got {value:?}")),
            },
            Kind::Text(set) => set(p, name, value)?,
        }
        Ok(())
    }

    /// Whether the flag takes a value.
    pub(crate) fn takes_value(&self) -> bool {
        !matches!(self.kind, Kind::Switch(_))
    }
}

const USAGE_HEAD: &str = "\
kv-indexer: tracks which KV-cache blocks every inference worker holds and
answers which worker holds the longest cached prefix of a request.

USAGE:
  kv-indexer [--port 8090] [--host 0.0.0.0] [--threads N]
             [--block-size 16 --model-name m --tenant-id t
              --workers \"1=tcp://h:5557,2:1=tcp://h:5558\"]
             [--peers \"http://a:8090,http://b:8091\"] [OPTIONS]

OPTIONS:
";

/// Column where the help texts start, and the width they wrap at.
const HELP_COLUMN: usize = 27;
const HELP_WIDTH: usize = 100;

/// `--help`: every flag with its value, help, default and environment variables.
pub(crate) fn usage() -> String {
    let mut out = USAGE_HEAD.to_string();
    for f in FLAGS {
        let mut spelled = std::iter::once(f.name).chain(f.aliases.iter().copied()).collect::<Vec<_>>().join(", ");
        if !f.value.is_empty() {
            spelled = format!("{spelled} {}", f.value);
        }
        let mut notes = Vec::new();
        if !f.default.is_empty() {
            notes.push(format!("default {}", f.default));
        }
        if !f.env.is_empty() {
            notes.push(format!("env {}", f.env.join(" or ")));
        }
        let mut help = f.help.to_string();
        if !notes.is_empty() {
            help = format!("{help} ({})", notes.join("; "));
        }
        push_entry(&mut out, &spelled, &help);
    }
    push_entry(&mut out, "-h, --help", "this text");
    push_entry(&mut out, "-V, --version", "the version");
    out
}

/// One `  spelled   help` entry, the help wrapped at `HELP_WIDTH`.
fn push_entry(out: &mut String, spelled: &str, help: &str) {
    let mut line = format!("  {spelled}");
    if line.len() + 1 >= HELP_COLUMN {
        out.push_str(&line);
        out.push('\n');
        line.clear();
    }
    for word in help.split(' ') {
        let at_start = line.len() <= HELP_COLUMN;
        if !at_start && line.len() + 1 + word.len() > HELP_WIDTH {
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if line.len() < HELP_COLUMN {
            line.push_str(&" ".repeat(HELP_COLUMN - line.len()));
        } else {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
}

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

/// A flag of no alias and no environment variable.
const fn flag(name: &'static str, value: &'static str, default: &'static str, help: &'static str, kind: Kind) -> Flag {
    Flag { name, aliases: &[], value, default, env: &[], help, kind }
}

impl Flag {
    /// The flag, also spelled `aliases`.
    const fn aliases(self, aliases: &'static [&'static str]) -> Flag {
        Flag { aliases, ..self }
    }

    /// The flag, also read from `env` when not given.
    const fn env(self, env: &'static [&'static str]) -> Flag {
        Flag { env, ..self }
    }
}

fn path(name: &str, v: &str) -> Result<PathBuf, String> {
    non_blank(name, v, "path").map(PathBuf::from)
}

/// Every flag, in `--help`'s order. Numbers are cast to their field's
/// type only after their range, which fits it, is checked.
#[rustfmt::skip]
pub(crate) const FLAGS: &[Flag] = &[
    flag("--port", "N", "8090", "HTTP port",
        num(0, u16::MAX as u64, |p, n| p.cfg.port = n as u16)),
    flag("--host", "ADDR", "0.0.0.0", "HTTP bind address",
        Kind::Text(|p, name, v| { p.cfg.host = non_blank(name, &v, "address")?.trim().to_string(); Ok(()) })),
    flag("--unix-socket", "PATH", "", "also serve the API on this Unix socket (mode 0660: the daemon's group)",
        Kind::Text(|p, _, v| { p.cfg.unix_socket = Some(PathBuf::from(v)); Ok(()) })),
    flag("--threads", "N", "from cores", "writer shards applying events",
        num(1, 1024, |p, n| p.cfg.writer_threads = n as usize)),
    flag("--listener-threads", "N", "from cores", "threads owning the ZMQ sockets",
        num(1, 1024, |p, n| p.cfg.listener_threads = n as usize)),
    flag("--http-connections-max", "N", "1024", "most open HTTP connections, one thread each; more get 503",
        num(1, 65_536, |p, n| p.cfg.http.connections_max = n as usize)),
    flag("--http-head-timeout-s", "N", "10",
        "a request head must arrive within N s of its first byte, a new connection's first within N s of \
         connecting; else 408",
        num(1, 3_600, |p, n| p.cfg.http.head_timeout_s = n)),
    flag("--http-body-timeout-s", "N", "60", "a request body must arrive within N s of its head; else 408",
        num(1, 3_600, |p, n| p.cfg.http.body_timeout_s = n)),
    flag("--block-size", "N", "", "block size of the --workers index (required with --workers)",
        num(1, 1 << 20, |p, n| p.cfg.block_size = Some(n as u32))),
    flag("--model-name", "NAME", "default", "model of the --workers index",
        Kind::Text(|p, name, v| { p.cfg.model_name = non_empty(name, v)?; Ok(()) })),
    flag("--routing-group", "NAME", "default", "tenant of the --workers index",
        Kind::Text(|p, name, v| { p.cfg.tenant_id = non_empty(name, v)?; Ok(()) }))
        .aliases(&["--tenant-id"]),
    flag("--workers", "LIST", "", "instance[:dp_rank]=zmq_endpoint, comma separated",
        Kind::Text(|p, _, v| { p.workers = Some(v); Ok(()) })),
    flag("--workers-file", "PATH", "",
        "one /register JSON body a line (# comments allowed), registered at start and reconciled on SIGHUP \
         (systemctl reload): new lines are registered, removed ones unregistered, changed ones registered \
         anew; a bad file changes nothing",
        Kind::Text(|p, name, v| { p.cfg.workers_file = Some(path(name, &v)?); Ok(()) }))
        .env(&["KV_INDEXER_WORKERS_FILE"]),
    flag("--peers", "LIST", "", "peer indexer URLs to recover state from at startup",
        Kind::Text(|p, _, v| { p.cfg.peers = parse_peers(&v)?; Ok(()) })),
    flag("--replay-timeout-ms", "N", "2000",
        "a ring request (gap replay or ring fill) unanswered this long is asked again; while live batches \
         wait behind it, it ends at 8 times this from when they began waiting",
        num(1, 600_000, |p, n| p.cfg.replay_timeout_ms = n)),
    flag("--ingest-coalesce-us", "N", "",
        "ignored (0..=100000 still accepted): listeners no longer wait between reads; an event is applied as \
         soon as it is read",
        num(0, COALESCE_US_MAX, |p, n| p.cfg.ingest_coalesce_us = Some(n))),
    flag("--heartbeat-ms", "N", "2500",
        "TCP keepalive towards each tcp:// engine: probes after N ms of silence, N ms apart (whole seconds); \
         3 unanswered drop the connection, which is reconnected; 0: none",
        num(0, crate::ingest::HEARTBEAT_MS_MAX as u64, |p, n| p.cfg.heartbeat_ms = n as i32)),
    flag("--engine-gone-s", "N", "60",
        "clear the blocks of an engine unreachable for N s; they refill from its ring when it is back; 0: \
         never",
        num(0, crate::ingest::ENGINE_GONE_S_MAX, |p, n| p.cfg.engine_gone_s = n))
        .env(&["KV_INDEXER_ENGINE_GONE_S"]),
    flag("--ingest-budget-mib", "N", "128",
        "MiB of engine batches received and not yet applied, all engines together; past it live batches \
         are dropped and replayed from the engines' rings",
        num(1, crate::ingest::BUDGET_MIB_MAX as u64, |p, n| p.cfg.ingest_budget_mib = n as usize)),
    flag("--body-limit-bytes", "N", "16777216", "largest request body",
        num(1024, 1 << 30, |p, n| p.cfg.http.body_limit_bytes = n as usize)),
    flag("--jump", "N", "64", "positions per jump of the index search",
        num(1, 4096, |p, n| p.cfg.jump = n as usize)),
    flag("--min-initial-workers", "N", "0", "/health answers 503 until N workers are registered",
        num(0, 1_000_000, |p, n| p.cfg.min_initial_workers = n as usize))
        .env(&["DYN_ROUTER_MIN_INITIAL_WORKERS", "KV_INDEXER_MIN_INITIAL_WORKERS"]),
    flag("--slow-joiner-ms", "N", "1000", "wait before fetching a peer dump at startup",
        num(0, 600_000, |p, n| p.cfg.slow_joiner_ms = n)),
    flag("--peer-timeout-ms", "N", "10000",
        "longest wait for a peer's connection and each next bytes of its dump (not the whole dump); \
         past the first window, 64 KiB a window on average",
        num(1, 600_000, |p, n| p.cfg.peer_timeout_ms = n)),
    flag("--max-pairs", "N", "134217728",
        "cap on live (block, worker) pairs over all indexes; past it new blocks are refused and counted, \
         never guessed; 0: no cap",
        num(0, u64::MAX, |p, n| p.cfg.max_pairs = n)),
    flag("--predict-max-blocks", "N", "1048576",
        "cap on live predicted blocks booked through /routed, over all indexes; a booking past it is refused",
        num(1, 1 << 30, |p, n| p.cfg.predict_max_blocks = n)),
    flag("--predict-ttl-ms", "N", "2000", "lifetime of a /routed booking that names no ttl_ms, at most 60000",
        num(1, crate::predict::TTL_MS_MAX, |p, n| p.cfg.predict_ttl_ms = n)),
    flag("--admin-token", "TOKEN", "",
        "require \"Authorization: Bearer TOKEN\" on /register, /unregister, /register_peer, /deregister_peer, \
         /routed; the variable keeps it out of the process list",
        Kind::Text(|p, name, v| {
            p.cfg.admin_token = Some(AdminToken::new(&v).map_err(|e| format!("{name}: {e}"))?);
            Ok(())
        }))
        .env(&["KV_INDEXER_ADMIN_TOKEN"]),
    flag("--snapshot-dir", "DIR", "", "write snapshots to DIR/snapshot.bin and restart warm from it",
        Kind::Text(|p, name, v| { p.cfg.snapshot_dir = Some(path(name, &v)?); Ok(()) })),
    flag("--snapshot-interval-s", "N", "60", "seconds between snapshots; 0: only on stop",
        num(0, 86_400, |p, n| p.cfg.snapshot_interval_s = n)),
    flag("--access-log", "PATH", "",
        "append one JSON line per HTTP request to PATH; reopened by POST /reopen_logs and SIGHUP (for \
         logrotate)",
        Kind::Text(|p, name, v| { p.cfg.access_log.path = Some(path(name, &v)?); Ok(()) })),
    flag("--trace-id-header", "NAME", "x-trace-id", "request header copied into the access log's trace_id",
        Kind::Text(|p, name, v| {
            p.cfg.access_log.trace_id_header = header_name(&v).map_err(|e| format!("{name}: {e}"))?;
            Ok(())
        })),
    flag("--access-log-local-time", "", "", "local time in the access log instead of UTC",
        Kind::Switch(|p| p.cfg.access_log.local_time = true)),
    flag("--no-pin", "", "", "do not pin listener and shard threads to cores",
        Kind::Switch(|p| p.cfg.pin_threads = false)),
    flag("--log-level", "LEVEL", "info", "error, warn, info or debug",
        Kind::Text(|p, name, v| {
            p.cfg.log_level = Level::parse(&v).ok_or_else(|| format!("{name}: unknown level {v:?}"))?;
            Ok(())
        }))
        .env(&["KV_INDEXER_LOG"]),
    flag("--log-format", "F", "text", "text or json lines",
        Kind::Text(|p, name, v| {
            p.cfg.log_format = Format::parse(&v).ok_or_else(|| format!("{name}: {v:?} is not text or json"))?;
            Ok(())
        }))
        .env(&["KV_INDEXER_LOG_FORMAT"]),
];

/// What `parse` answers instead of running: short and long spelling, help.
pub(crate) const COMMANDS: [(&str, &str, &str); 2] =
    [("-h", "--help", "this text"), ("-V", "--version", "the version")];

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
    for (short, long, help) in COMMANDS {
        push_entry(&mut out, &format!("{short}, {long}"), help);
    }
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

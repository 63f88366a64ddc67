//! kv-indexer: knows which KV-cache blocks every inference worker holds and
//! answers which worker holds the longest cached prefix of a request.
//!
//! The daemon (`kv-indexer`, see README) follows engines' ZMQ KV-event
//! streams and answers over HTTP. A router in Rust can embed the same
//! index in-process instead; these modules are what it needs:
//!
//! - [`index`]: the positional index of one (model, tenant): apply events,
//!   find each worker's cached prefix of a request's blocks.
//! - [`hash`]: token ids to the local block hashes the index is keyed by.
//! - [`wire`]: an engine's ZMQ messages (vLLM, SGLang) to [`Event`]s.
//! - [`ingest`]: listener threads and writer shards that subscribe to
//!   engines and feed their events to an [`ingest::EventSink`], such as an index.
//! - [`predict`]: predicted placements a router books for its routed requests.
//! - [`http`]: the API's request and reply bodies (its [`http::codec`]), for
//!   a router serving the daemon's `/query` itself.
//!
//! The event vocabulary ([`Event`], [`WorkerId`], [`StorageTier`]) is at the
//! crate root. Everything else (registry, snapshots, the HTTP server, the
//! daemon's plumbing) is the binary's.
//!
//! ```
//! use kv_indexer::hash::{local_hashes_into, BASE_SEED};
//! use kv_indexer::index::{Index, IndexConfig};
//! use kv_indexer::{Event, StorageTier, StoredBlock, WorkerId};
//!
//! let block_size = 4;
//! let index = Index::new(IndexConfig::new(block_size as u32));
//! let tokens: Vec<u32> = (0..12).collect();
//! let mut locals = Vec::new();
//! local_hashes_into(&tokens, block_size, BASE_SEED, &mut locals);
//!
//! // Worker 7 stored the first two blocks (engine hashes are its own ids).
//! let blocks = locals[..2].iter().zip([101, 102]).map(|(&local_hash, engine_hash)| StoredBlock { engine_hash, local_hash });
//! index.apply(&Event::stored(WorkerId::new(7, 0), StorageTier::Device, None, blocks.collect()));
//!
//! let found = index.find_matches(&locals);
//! let best = found.workers.iter().find(|m| m.worker == WorkerId::new(7, 0)).unwrap();
//! assert_eq!(best.device, 2);
//! ```

mod config;
mod daemon;
mod dump;
mod endpoint;
mod event;
pub mod hash;
pub mod http;
pub mod index;
pub mod ingest;
mod json;
mod log;
mod metrics;
mod peers;
pub mod predict;
mod registry;
mod snapshot;
#[cfg(test)]
mod test_rng;
pub mod wire;
mod workers_file;

pub use event::{Event, EventKind, StorageTier, StoredBlock, WorkerId};
use log::{debug, error, info, warn};

/// The crate version, as printed by `kv-indexer --version`.
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// The `kv-indexer` command: reads the command line and the environment,
/// then prints the help or the version, or runs the daemon until a stop
/// signal. `prepare` runs before the daemon starts any thread (the binary
/// sets up its allocator there), with the signals the daemon waits for
/// already blocked. Exits 0, 1 when the daemon could not start, or 2 on a
/// bad command line (one line on stderr).
pub fn command_line(prepare: fn()) -> std::process::ExitCode {
    use std::process::ExitCode;
    let env = |k: &str| std::env::var(k).ok();
    match config::parse(std::env::args_os().skip(1), env) {
        Ok(config::Command::Help) => {
            print!("{}", config::usage());
            ExitCode::SUCCESS
        }
        Ok(config::Command::Version) => {
            println!("kv-indexer {}", version());
            ExitCode::SUCCESS
        }
        Ok(config::Command::Run(cfg)) => {
            daemon::signals::block();
            prepare();
            match daemon::run(*cfg) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("kv-indexer: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            eprintln!("kv-indexer: {e}");
            ExitCode::from(2)
        }
    }
}

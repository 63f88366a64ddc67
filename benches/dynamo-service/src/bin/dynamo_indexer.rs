//! Runs Dynamo's standalone KV indexer (dynamo-kv-router 1.6.1) bound to
//! 127.0.0.1, for benchmarks and interop checks on this machine only.
//!
//! The crate's own `run_server` always listens on 0.0.0.0, so this wrapper
//! assembles the same service from the crate's public parts in the same
//! order: register the `--workers` engines (their ZMQ listeners start
//! buffering), recover from the first reachable `--peers` dump, remember the
//! peers, open the readiness gate, then serve the crate's router on a
//! loopback socket. Flags follow `python -m dynamo.indexer`.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::{bail, Context};
use dynamo_kv_router::services::indexer::server::{create_router, AppState};
use dynamo_kv_router::services::indexer::{parse_workers, recovery};

/// Flags of `python -m dynamo.indexer` that this wrapper honours.
struct Flags {
    port: u16,
    threads: usize,
    block_size: Option<u32>,
    workers: Option<String>,
    model_name: String,
    tenant_id: String,
    peers: Vec<String>,
}

const USAGE: &str = "usage: dynamo-indexer [--port 8090] [--threads 4] [--block-size N] \
[--workers 'id[:rank]=tcp://127.0.0.1:P,...'] [--model-name default] [--tenant-id default] \
[--peers 'http://127.0.0.1:P,...']";

fn parse_flags() -> anyhow::Result<Flags> {
    let mut flags = Flags {
        port: 8090,
        threads: 4,
        block_size: None,
        workers: None,
        model_name: "default".into(),
        tenant_id: "default".into(),
        peers: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let value = args.next().with_context(|| format!("{flag} needs a value; {USAGE}"))?;
        match flag.as_str() {
            "--port" => flags.port = value.parse().context("--port")?,
            "--threads" => flags.threads = value.parse().context("--threads")?,
            "--block-size" => flags.block_size = Some(value.parse().context("--block-size")?),
            "--workers" => flags.workers = Some(value),
            "--model-name" => flags.model_name = value,
            "--tenant-id" => flags.tenant_id = value,
            "--peers" => {
                flags.peers = value.split(',').map(str::trim).filter(|p| !p.is_empty()).map(String::from).collect()
            }
            _ => bail!("unknown flag {flag}; {USAGE}"),
        }
    }
    Ok(flags)
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let flags = parse_flags()?;
    // Worker threads follow the CPUs this process may use (one under taskset).
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(serve(flags))
}

async fn serve(flags: Flags) -> anyhow::Result<()> {
    let state = Arc::new(AppState::new(flags.threads)?);
    let registry = &state.registry;
    if let Some(workers) = &flags.workers {
        let block_size = flags.block_size.context("--block-size is required with --workers")?;
        for (instance_id, dp_rank, endpoint) in parse_workers(workers)? {
            registry
                .register(
                    instance_id,
                    endpoint,
                    dp_rank,
                    flags.model_name.clone(),
                    flags.tenant_id.clone(),
                    block_size,
                    None,
                )
                .await?;
        }
    }
    if !flags.peers.is_empty() {
        match recovery::recover_from_peers(&flags.peers, registry).await {
            Ok(true) => eprintln!("dynamo-indexer: recovered from a peer"),
            Ok(false) => eprintln!("dynamo-indexer: no reachable peer, starting empty"),
            Err(e) => eprintln!("dynamo-indexer: recovery failed ({e:#}), starting empty"),
        }
        for peer in &flags.peers {
            registry.register_peer(peer.clone());
        }
    }
    registry.signal_ready();

    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, flags.port));
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot bind {addr}"))?;
    eprintln!("dynamo-indexer: listening on http://{}", listener.local_addr()?);
    axum::serve(listener, create_router(state))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

//! A replica recovered from a kv-indexer peer resumes each engine from the
//! peer's watermark, not from the ring's start: its ring fill asks from
//! there, checks the ring's batch there and applies only what is newer;
//! the live batches it held meanwhile up to the watermark are copies of
//! what the peer's dump holds; its state then equals the peer's and the
//! engines'. And the negotiation both ways: a replica's request gets the
//! watermarks (format 2), an older replica's request today's format 1.

mod snapshot_support;
mod support;

use serde_json::{json, Value};
use snapshot_support::TempDir;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use support::daemon::Daemon;
use support::fault_engine::{Engine, BLOCK_SIZE, MODEL};
use support::fault_proxy::Faults;
use support::publisher::{Encoding, PublisherConfig};
use support::tcp_relay::TcpRelay;
use support::truth_check::{assert_exact, dump_facts, metric};
use support::wait_until;

/// Batches each engine publishes before the replica starts.
const BEFORE: usize = 40;
/// Batches each engine publishes while the replica cannot read them.
const AWAY: usize = 12;

fn engines(seed: u64) -> Vec<Engine> {
    (0..2u64)
        .map(|i| {
            let cfg = PublisherConfig {
                encoding: if i == 0 { Encoding::Tagged } else { Encoding::Positional },
                ring_capacity: Some(10_000),
                seed: seed + i,
                ..PublisherConfig::default()
            };
            // Both daemons read the engine at one endpoint, as in a
            // deployment: a watermark is adopted only for the same one.
            Engine::new(900 + seed + i, cfg, Faults::NONE, 1)
        })
        .collect()
}

/// Random batches from every engine, then a marker batch each that every
/// daemon in `seen_by` shows.
fn publish(engines: &mut [Engine], batches: usize, seen_by: &[&Daemon]) {
    for _ in 0..batches {
        engines.iter_mut().for_each(|e| e.workload(1));
    }
    engines.iter_mut().for_each(|e| e.settle(seen_by));
}

/// A workers file registering each engine with the replica at `endpoint(engine)`.
fn workers_file(dir: &TempDir, engines: &[Engine], endpoint: impl Fn(usize) -> String) -> PathBuf {
    let lines: Vec<String> = engines
        .iter()
        .enumerate()
        .map(|(i, e)| {
            json!({"instance_id": e.instance, "endpoint": endpoint(i),
                   "replay_endpoint": e.publisher.replay_endpoint, "model_name": MODEL, "block_size": BLOCK_SIZE})
            .to_string()
        })
        .collect();
    let path = dir.0.join("workers.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// Per instance: (last seq dealt with, batches received) of its listener.
fn listeners(d: &Daemon) -> BTreeMap<u64, (Option<u64>, u64)> {
    let (status, v) = d.get_json("/workers");
    assert_eq!(status, 200, "{v}");
    let mut out = BTreeMap::new();
    for w in v.as_array().unwrap() {
        let l = &w["listeners"]["0"];
        out.insert(
            w["instance_id"].as_u64().unwrap(),
            (l["last_seq"].as_u64(), l["batches_received"].as_u64().unwrap()),
        );
    }
    out
}

fn last_seqs(d: &Daemon) -> BTreeMap<u64, Option<u64>> {
    listeners(d).into_iter().map(|(i, (seq, _))| (i, seq)).collect()
}

fn counter(d: &Daemon, name: &str) -> u64 {
    metric(d, &format!("kv_indexer_{name}_total"))
}

/// Starts the replica, recovering from `peer`, its engines read as the
/// workers file says.
fn start_replica(peer: &str, file: &Path) -> Daemon {
    Daemon::start(&[
        "--peers",
        peer,
        "--workers-file",
        file.to_str().unwrap(),
        "--slow-joiner-ms",
        "10",
        "--peer-timeout-ms",
        "60000",
        "--replay-timeout-ms",
        "10000",
    ])
}

#[test]
fn a_replica_s_fill_applies_only_the_batches_newer_than_its_peer_s_watermark() {
    let mut engines = engines(10);
    // Each engine's endpoint is a relay, which can hold every connection
    // to it back (the peer's too: it has a ring to fill from).
    let relays: Vec<TcpRelay> = engines.iter().map(|e| TcpRelay::start(&e.proxies[0].endpoint)).collect();
    let a = Daemon::start(&["--replay-timeout-ms", "10000"]);
    engines.iter().zip(&relays).for_each(|(e, r)| e.register_at(&a, 0, &r.endpoint));
    publish(&mut engines, BEFORE, &[&a]);
    assert_exact(&a, &engines);
    let peer_marks = last_seqs(&a);
    assert!(peer_marks.values().all(|s| *s == Some(BEFORE as u64)), "{peer_marks:?}");

    // The replica reads nothing live until the relays pass bytes again.
    relays.iter().for_each(|r| r.blackhole(true));
    let dir = TempDir::new("peer-watermarks");
    let file = workers_file(&dir, &engines, |i| relays[i].endpoint.clone());
    let mut b = start_replica(&a.base, &file);
    assert!(wait_until(|| b.get("/health").0 == 200), "never ready after recovery");
    assert!(b.wait_logged("2 of its 2 watermark(s) adopted"), "{:?}", b.log());
    assert_eq!(last_seqs(&b), peer_marks, "each listener resumes from the peer's watermark");
    assert_eq!(dump_facts(&b), dump_facts(&a), "the recovered state is the peer's");

    // Batches only the rings will have for the replica.
    for _ in 0..AWAY {
        engines.iter_mut().for_each(|e| e.workload(1));
    }
    engines.iter().for_each(Engine::quiesce);
    relays.iter().for_each(|r| r.blackhole(false));
    for e in &engines {
        // The peer's subscription and now the replica's: what is published
        // from here reaches both live.
        assert!(e.proxies[0].wait_subscribed(2), "the replica never subscribed to engine {}", e.instance);
    }
    let last = Some((BEFORE + AWAY) as u64);
    let caught_up = || last_seqs(&b).values().all(|&s| s == last);
    assert!(wait_until(caught_up), "the replica never caught up: {:?}", last_seqs(&b));
    // One fill per engine, from the watermark: the ring's batch there
    // proves the process, and only what is newer is applied.
    let newer = AWAY as u64 * engines.len() as u64;
    assert_eq!(counter(&b, "ring_fills"), engines.len() as u64);
    assert_eq!(counter(&b, "batches_filled"), newer, "only the batches newer than the peer's watermark");
    assert_eq!((counter(&b, "restarts"), counter(&b, "resyncs")), (0, 0));

    publish(&mut engines, 20, &[&a, &b]);
    assert_exact(&a, &engines);
    assert_exact(&b, &engines);
    assert_eq!(dump_facts(&b), dump_facts(&a), "peers agree");
}

#[test]
fn live_batches_a_replica_held_up_to_its_peer_s_watermark_are_copies_not_a_restart() {
    let mut engines = engines(20);
    let a = Daemon::start(&["--replay-timeout-ms", "10000"]);
    engines.iter().for_each(|e| e.register(&a, 0));
    publish(&mut engines, BEFORE, &[&a]);

    // The replica's engines connect at once; its peer's dump is held back
    // until the replica has received the batches below, which the peer has
    // then applied too.
    let to_peer = TcpRelay::start(&format!("tcp://127.0.0.1:{}", a.port));
    to_peer.blackhole(true);
    let dir = TempDir::new("peer-watermarks-held");
    let file = workers_file(&dir, &engines, |i| engines[i].proxies[0].endpoint.clone());
    let peer_url = to_peer.endpoint.replace("tcp://", "http://");
    let mut b = start_replica(&peer_url, &file);
    for e in &engines {
        assert!(e.proxies[0].wait_subscribed(2), "the replica never subscribed to engine {}", e.instance);
    }
    publish(&mut engines, AWAY, &[&a]);
    let held = AWAY as u64 + 1;
    assert!(
        wait_until(|| listeners(&b).values().all(|&(seq, received)| seq.is_none() && received == held)),
        "the replica holds what it received: {:?}",
        listeners(&b)
    );
    assert_eq!(b.get("/health").0, 503, "still recovering");
    let peer_marks = last_seqs(&a);
    to_peer.blackhole(false);
    assert!(wait_until(|| b.get("/health").0 == 200), "never ready after recovery");
    assert!(b.wait_logged("2 of its 2 watermark(s) adopted"), "{:?}", b.log());
    assert!(wait_until(|| counter(&b, "ring_fills") == engines.len() as u64), "one fill per engine");
    assert!(wait_until(|| counter(&b, "duplicates_dropped") == held * engines.len() as u64), "held batches dropped");
    assert_eq!(last_seqs(&b), peer_marks);
    // The ring has nothing newer than the watermark; what was held is the
    // peer's already.
    assert_eq!(counter(&b, "batches_filled"), 0);
    assert_eq!((counter(&b, "restarts"), counter(&b, "resyncs")), (0, 0));
    assert_eq!(dump_facts(&b), dump_facts(&a));

    publish(&mut engines, 20, &[&a, &b]);
    assert_exact(&a, &engines);
    assert_exact(&b, &engines);
    assert_eq!(dump_facts(&b), dump_facts(&a), "peers agree");
}

/// `/dump` of `d` asked with `accept`: its Content-Type and body.
fn dump_as(d: &Daemon, accept: &str) -> (String, Vec<u8>) {
    let resp = ureq::get(&format!("{}/dump", d.base)).set("Accept", accept).call().unwrap();
    let content_type = resp.header("Content-Type").unwrap_or("").to_string();
    let mut body = Vec::new();
    std::io::Read::read_to_end(&mut resp.into_reader(), &mut body).unwrap();
    (content_type, body)
}

#[test]
fn an_older_replica_s_request_gets_format_1_and_this_build_s_gets_the_watermarks() {
    let mut engines = engines(30);
    let a = Daemon::start(&[]);
    engines.iter().for_each(|e| e.register(&a, 0));
    publish(&mut engines, BEFORE, &[&a]);
    let media = "application/vnd.kv-indexer.dump";
    // As every earlier kv-indexer asks.
    let (old_type, old) = dump_as(&a, &format!("{media}, application/json;q=0.5"));
    assert_eq!(old_type, media);
    assert_eq!(old[..12], *b"KVIXDUMP\x01\x00\x00\x00", "format 1");
    // As this build asks.
    let (new_type, new) = dump_as(&a, &format!("{media};watermarks=1, application/json;q=0.5"));
    assert_eq!(new_type, format!("{media};watermarks=1"));
    assert_eq!(new[..12], *b"KVIXDUMP\x02\x00\x00\x00", "format 2");
    // The same records, then the watermarks: one listener each engine.
    let records = &old[12..old.len() - 17];
    assert_eq!(&new[12..12 + records.len()], records, "format 1 is format 2 without its watermarks");
    assert_eq!(new[12 + records.len()], 4, "the watermarks record");
    assert_eq!(new[13 + records.len()..17 + records.len()], 2u32.to_le_bytes());
    // JSON, as Dynamo's service and `curl` ask, is unchanged.
    let (json_type, body) = dump_as(&a, "application/json");
    assert_eq!(json_type, "application/json");
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert!(v.get(format!("{MODEL}:default")).is_some(), "{v}");
}

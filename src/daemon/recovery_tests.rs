//! Recovery against peers on loopback that answer as told: whole dumps in
//! either format, dumps cut short, truncated, corrupted or slow, and
//! JSON-only peers. Nothing of a failed dump is ever applied, and the next
//! peer is tried.

use super::*;
use crate::dump::binary;
use crate::dump::stream::{DumpStream, Format, Source};
use crate::event::{Event, EventKind, StorageTier, StoredBlock, WorkerId};
use crate::index::{Budget, Index, IndexConfig};
use crate::ingest::{Ingest, IngestConfig};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::thread::JoinHandle;

const SECOND: Duration = Duration::from_secs(1);

fn registry(budget: Budget) -> (Arc<Ingest>, Registry) {
    let cfg = IngestConfig { listener_threads: 1, shard_threads: 1, pin_threads: false, ..IngestConfig::default() };
    let ingest = Arc::new(Ingest::start(cfg).unwrap());
    let r = Registry::new(ingest.clone(), 0, Arc::new(budget));
    (ingest, r)
}

fn chain(worker: u64, first: u64, n: u64) -> Event {
    let blocks = (first..first + n).map(|h| StoredBlock { engine_hash: h, local_hash: h * 7 }).collect();
    Event::stored(WorkerId::new(worker, 0), StorageTier::Device, None, blocks)
}

/// An index of model "m" holding these chains (worker, first hash, blocks).
fn index_of(chains: &[(u64, u64, u64)]) -> Arc<Index> {
    let ix = Arc::new(Index::new(IndexConfig::new(4)));
    for &(w, first, n) in chains {
        ix.apply(&chain(w, first, n));
    }
    ix
}

fn dump_of(format: Format, ix: &Arc<Index>) -> Vec<u8> {
    let source = Source { model_name: "m".into(), tenant_id: "default".into(), index: ix.clone() };
    let mut s = DumpStream::new(format, vec![source]);
    let mut out = Vec::new();
    while s.fill(&mut out) {}
    out
}

/// (worker, engine hash) of every block the registry's "m" index holds.
fn held(r: &Registry) -> BTreeSet<(u64, u64)> {
    let Some(h) = r.index("m", "default") else { return BTreeSet::new() };
    let mut out = BTreeSet::new();
    for d in h.index().dump_events() {
        let EventKind::Stored { blocks, .. } = &d.event.kind else { panic!("{d:?}") };
        out.extend(blocks.iter().map(|b| (d.event.worker.instance_id, b.engine_hash)));
    }
    out
}

fn pairs_of(chains: &[(u64, u64, u64)]) -> BTreeSet<(u64, u64)> {
    chains.iter().flat_map(|&(w, first, n)| (first..first + n).map(move |h| (w, h))).collect()
}

/// How a fake peer answers its one request.
struct Answer {
    content_type: &'static str,
    body: Vec<u8>,
    /// Chunked, in pieces of this many bytes (else by Content-Length).
    chunk: Option<usize>,
    /// Closes the connection once this many body bytes went out.
    cut: Option<usize>,
    /// Waits this long before each piece.
    pause: Duration,
}

impl Answer {
    fn new(content_type: &'static str, body: Vec<u8>) -> Answer {
        Answer { content_type, body, chunk: None, cut: None, pause: Duration::ZERO }
    }
}

/// A peer on loopback answering one request; its URL, and its thread,
/// which returns the request's head.
fn peer(a: Answer) -> (String, JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let t = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        let framing = match a.chunk {
            Some(_) => "Transfer-Encoding: chunked".to_string(),
            None => format!("Content-Length: {}", a.body.len()),
        };
        let reply = format!("HTTP/1.1 200 OK\r\nContent-Type: {}\r\n{framing}\r\n\r\n", a.content_type);
        let _ = s.write_all(reply.as_bytes());
        let end = a.cut.unwrap_or(a.body.len()).min(a.body.len());
        let piece = a.chunk.unwrap_or(end.max(1));
        for part in a.body[..end].chunks(piece) {
            std::thread::sleep(a.pause);
            let sent = match a.chunk {
                Some(_) => s.write_all(format!("{:x}\r\n", part.len()).as_bytes()).and_then(|()| {
                    s.write_all(part)?;
                    s.write_all(b"\r\n")
                }),
                None => s.write_all(part),
            };
            if sent.is_err() {
                break;
            }
        }
        if a.cut.is_none() && a.chunk.is_some() {
            let _ = s.write_all(b"0\r\n\r\n");
        }
        drop(s);
        String::from_utf8_lossy(&head).into_owned()
    });
    (url, t)
}

const GOOD: &[(u64, u64, u64)] = &[(3, 300, 5), (4, 400, 2)];
const BAD: &[(u64, u64, u64)] = &[(1, 100, 40), (2, 200, 40), (9, 900, 40)];

#[test]
fn a_peer_that_drops_mid_dump_leaves_nothing_and_the_next_is_tried() {
    for format in [Format::Json, Format::Compact] {
        let (ingest, r) = registry(Budget::unlimited());
        let bad = dump_of(format, &index_of(BAD));
        let kind = if format == Format::Json { "application/json" } else { binary::MEDIA_TYPE };
        let cut = Answer { chunk: Some(64), cut: Some(bad.len() / 2), ..Answer::new(kind, bad) };
        let (first, t1) = peer(cut);
        let (second, t2) = peer(Answer::new("application/json", dump_of(Format::Json, &index_of(GOOD))));
        let got = recover(&r, &[first, second.clone()], SECOND * 5, false);
        assert_eq!(got.peer.as_deref(), Some(second.as_str()), "{format:?}");
        assert_eq!(held(&r), pairs_of(GOOD), "{format:?}: nothing of the first dump");
        assert_eq!(got.blocks_stored, 7);
        t1.join().unwrap();
        t2.join().unwrap();
        ingest.shutdown();
    }
}

#[test]
fn over_a_snapshot_a_failed_dump_changes_nothing_and_a_whole_one_replaces_the_workers_it_names() {
    let (ingest, r) = registry(Budget::unlimited());
    // The snapshot's state: workers 9 and 4, in place before recovery.
    let h = r.index_or_create("m", "default", 4).unwrap();
    h.apply(&chain(9, 9000, 3));
    h.apply(&chain(4, 4000, 3));
    let before = held(&r);
    // A first peer names worker 9 and dies mid-dump.
    let bad = dump_of(Format::Compact, &index_of(BAD));
    let (first, t1) =
        peer(Answer { chunk: Some(100), cut: Some(bad.len() - 20), ..Answer::new(binary::MEDIA_TYPE, bad) });
    let got = recover(&r, &[first], SECOND * 5, true);
    assert_eq!(got.peer, None);
    assert_eq!(held(&r), before, "a failed dump leaves the snapshot's state whole");
    // A second names workers 3 and 4: 4's snapshot blocks give way to the peer's, 9 keeps its own.
    let (second, t2) = peer(Answer::new(binary::MEDIA_TYPE, dump_of(Format::Compact, &index_of(GOOD))));
    let got = recover(&r, std::slice::from_ref(&second), SECOND * 5, true);
    assert_eq!(got.peer.as_deref(), Some(second.as_str()));
    let mut expected = pairs_of(GOOD);
    expected.extend(pairs_of(&[(9, 9000, 3)]));
    assert_eq!(held(&r), expected);
    assert_eq!(h.index().stats().pairs, expected.len() as u64, "the handle the listeners feed sees the new index");
    r.index("m", "default").unwrap().index().check_consistency();
    t1.join().unwrap();
    t2.join().unwrap();
    ingest.shutdown();
}

#[test]
fn truncated_and_corrupted_compact_dumps_are_refused_by_reason_and_the_next_peer_tried() {
    let whole = dump_of(Format::Compact, &index_of(BAD));
    let mut corrupt = whole.clone();
    let middle = corrupt.len() / 2;
    corrupt[middle] ^= 0x10;
    let truncated = whole[..whole.len() - 9].to_vec();
    for (body, why) in [(truncated, "truncated"), (corrupt, "malformed dump: compact dump at byte")] {
        let (ingest, r) = registry(Budget::unlimited());
        // The fetch alone says why.
        let (url, t) = peer(Answer::new(binary::MEDIA_TYPE, body.clone()));
        let mut staging = Staging::new(&r, "recovery");
        let err = fetch_dump(&url, SECOND * 5, &mut staging).expect_err(why);
        assert!(err.contains(why), "{err}");
        drop(staging);
        t.join().unwrap();
        assert!(held(&r).is_empty());
        // Recovery moves on to the next peer.
        let (first, t1) = peer(Answer::new(binary::MEDIA_TYPE, body));
        let (second, t2) = peer(Answer::new(binary::MEDIA_TYPE, dump_of(Format::Compact, &index_of(GOOD))));
        let got = recover(&r, &[first, second.clone()], SECOND * 5, false);
        assert_eq!(got.peer.as_deref(), Some(second.as_str()));
        assert_eq!(held(&r), pairs_of(GOOD));
        t1.join().unwrap();
        t2.join().unwrap();
        ingest.shutdown();
    }
}

#[test]
fn a_json_only_peer_is_read_as_json() {
    let (ingest, r) = registry(Budget::unlimited());
    let (url, t) =
        peer(Answer { chunk: Some(50), ..Answer::new("application/json", dump_of(Format::Json, &index_of(GOOD))) });
    let got = recover(&r, std::slice::from_ref(&url), SECOND * 5, false);
    assert_eq!(got.peer.as_deref(), Some(url.as_str()));
    assert_eq!(held(&r), pairs_of(GOOD));
    let head = t.join().unwrap().to_ascii_lowercase();
    assert!(head.contains(&format!("accept: {}", binary::MEDIA_TYPE)), "asked for the compact format: {head}");
    ingest.shutdown();
}

#[test]
fn a_dump_that_keeps_arriving_outlasts_the_timeout_and_a_silent_or_trickling_one_does_not() {
    let (ingest, r) = registry(Budget::unlimited());
    let large = [(5, 1 << 20, 60_000)];
    let body = dump_of(Format::Compact, &index_of(&large));
    // Thirty pieces, each well within the timeout, together three times
    // past it, any three of them more than the least pace.
    assert!(body.len() as u64 / 30 * 3 > PACE_BYTES_MIN, "{} bytes", body.len());
    let pause = Duration::from_millis(100);
    let slow = Answer { chunk: Some(body.len().div_ceil(30)), pause, ..Answer::new(binary::MEDIA_TYPE, body) };
    let (url, t) = peer(slow);
    let got = recover(&r, std::slice::from_ref(&url), SECOND, false);
    assert_eq!(got.peer.as_deref(), Some(url.as_str()));
    assert_eq!(held(&r), pairs_of(&large));
    t.join().unwrap();
    // A peer that announces a dump and then sends nothing.
    let (ingest2, r2) = registry(Budget::unlimited());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let silent = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf);
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{").unwrap();
        // Held open until the reader gives up.
        let _ = s.read(&mut buf);
    });
    let mut staging = Staging::new(&r2, "recovery");
    let err = fetch_dump(&url, Duration::from_millis(300), &mut staging).unwrap_err();
    assert!(err.contains("timed out") || err.contains("WouldBlock") || err.contains("temporarily"), "{err}");
    drop(staging);
    silent.join().unwrap();
    // A peer that sends a few bytes at a time, each wait within the timeout.
    let body = dump_of(Format::Json, &index_of(GOOD));
    let trickle = Answer { chunk: Some(8), pause: Duration::from_millis(50), ..Answer::new("application/json", body) };
    let (url, t) = peer(trickle);
    let mut staging = Staging::new(&r2, "recovery");
    let err = fetch_dump(&url, Duration::from_millis(300), &mut staging).unwrap_err();
    assert!(err.contains("per --peer-timeout-ms"), "{err}");
    drop(staging);
    t.join().unwrap();
    assert!(held(&r2).is_empty());
    ingest.shutdown();
    ingest2.shutdown();
}

#[test]
fn stores_waiting_for_parents_past_max_pairs_refuse_the_dump() {
    // As Dynamo lists a lower tier: children first, one block an event.
    let event = |parent: Option<u64>, hash: u64| {
        let parent = parent.map_or("null".to_string(), |p| p.to_string());
        format!(
            r#"{{"worker_id":1,"storage_tier":"host_pinned","event":{{"event_id":0,"data":{{"stored":{{"parent_hash":{parent},"blocks":[{{"block_hash":{hash},"tokens_hash":{hash}}}]}}}}}}}}"#
        )
    };
    let events = [event(Some(3), 4), event(Some(2), 3), event(Some(1), 2), event(None, 1)].join(",");
    let body = format!(r#"{{"m:default":{{"block_size":4,"events":[{events}]}}}}"#).into_bytes();
    let (ingest, r) = registry(Budget::new(2));
    let (url, t) = peer(Answer::new("application/json", body.clone()));
    let got = recover(&r, &[url], SECOND * 5, false);
    assert_eq!(got.peer, None, "three stores wait, past --max-pairs 2");
    assert!(held(&r).is_empty());
    t.join().unwrap();
    // Within the cap, the same order loads whole.
    let (ingest2, r2) = registry(Budget::new(4));
    let (url, t) = peer(Answer::new("application/json", body));
    let got = recover(&r2, &[url], SECOND * 5, false);
    assert_eq!(got.blocks_stored, 4);
    t.join().unwrap();
    ingest.shutdown();
    ingest2.shutdown();
}

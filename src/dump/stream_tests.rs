//! A dump streamed in pieces says what the whole dump says, in both
//! formats; and one taken while writers change every worker lists, for
//! each worker, exactly one state it went through.

use super::*;
use crate::dump::{parse_dump_counted, Collect, DumpEntry};
use crate::event::{Event, EventKind, StorageTier, StoredBlock, WorkerId};
use crate::index::{DumpEvent, IndexConfig};

fn source(model: &str, index: &Arc<Index>) -> Source {
    Source { model_name: model.into(), tenant_id: "t".into(), index: index.clone() }
}

/// Every piece of the stream, joined; and how many pieces there were.
fn drain(mut s: DumpStream) -> (Vec<u8>, usize) {
    let (mut all, mut pieces) = (Vec::new(), 0);
    loop {
        let mut piece = Vec::new();
        let more = s.fill(&mut piece);
        all.extend_from_slice(&piece);
        pieces += 1;
        if !more {
            return (all, pieces);
        }
    }
}

fn chain(worker: WorkerId, first: u64, n: u64) -> Event {
    let blocks = (first..first + n).map(|h| StoredBlock { engine_hash: h, local_hash: h * 3 }).collect();
    Event::stored(worker, StorageTier::Device, None, blocks)
}

fn canonical(entries: Vec<DumpEntry>) -> Vec<(String, Vec<String>)> {
    entries
        .into_iter()
        .map(|e| {
            let mut ev: Vec<String> = e.events.iter().map(|d| format!("{d:?}")).collect();
            ev.sort();
            (format!("{}:{}:{}", e.model_name, e.tenant_id, e.block_size), ev)
        })
        .collect()
}

#[test]
fn a_streamed_dump_says_what_the_whole_dump_says_in_both_formats() {
    let a = Arc::new(Index::new(IndexConfig::new(4)));
    let b = Arc::new(Index::new(IndexConfig::new(8)));
    for i in 0..40u64 {
        a.apply(&chain(WorkerId::new(i, (i % 3) as u32), i * 1000, 1 + i % 7));
    }
    // A hole: worker 5's second block goes, so its third is an orphan.
    a.apply(&Event::removed(WorkerId::new(5, 2), StorageTier::Device, vec![5001]));
    let expected = vec![
        DumpEntry { model_name: "a".into(), tenant_id: "t".into(), block_size: 4, events: a.dump_events() },
        DumpEntry { model_name: "b".into(), tenant_id: "t".into(), block_size: 8, events: b.dump_events() },
    ];
    assert!(expected[0].events.iter().any(|e| e.orphan.is_some()));
    let sources = || vec![source("a", &a), source("b", &b)];
    let (json, pieces) = drain(DumpStream::new(Format::Json, sources()).with_piece_bytes(256));
    assert!(pieces > 5, "{pieces} pieces");
    let parsed = parse_dump_counted(&json).expect("valid JSON");
    assert_eq!(canonical(parsed.entries), canonical(expected.clone()));
    let (compact, _) = drain(DumpStream::new(Format::Compact, sources()).with_piece_bytes(64));
    let mut sink = Collect::default();
    binary::read_compact(&compact[..], &mut sink).expect("valid compact dump");
    assert_eq!(canonical(sink.0), canonical(expected));
    assert!(compact.len() * 3 < json.len(), "compact {} bytes, JSON {}", compact.len(), json.len());
    let (empty, _) = drain(DumpStream::new(Format::Json, vec![]));
    assert_eq!(empty, b"{}");
}

/// Writers move each worker through states 0, 1, 2, ... (state k holds
/// blocks k*STEP .. k*STEP+len(k); between two states the worker is
/// cleared, holding nothing), while dumps are taken: every worker a dump
/// lists holds exactly one state, whole, never a mix or a part.
#[test]
fn a_dump_taken_while_events_land_lists_each_worker_at_one_instant() {
    const WORKERS: u64 = 8;
    const STEP: u64 = 100;
    const STATES: u64 = 300;
    let index = Arc::new(Index::new(IndexConfig::new(4)));
    fn state(k: u64) -> Vec<u64> {
        (k * STEP..k * STEP + 1 + k % 5).collect()
    }
    fn set(w: WorkerId, k: u64) -> Event {
        let blocks = state(k).iter().map(|&h| StoredBlock { engine_hash: h, local_hash: h }).collect();
        Event::stored(w, StorageTier::Device, None, blocks)
    }
    for i in 0..WORKERS {
        index.apply(&set(WorkerId::new(i, 0), 0));
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|t| {
            let (index, stop) = (index.clone(), stop.clone());
            std::thread::spawn(move || {
                // Each worker is written by one thread only, in order.
                for k in 1..STATES {
                    for i in (t..WORKERS).step_by(2) {
                        let w = WorkerId::new(i, 0);
                        index.apply(&Event::cleared(w));
                        index.apply(&set(w, k));
                    }
                }
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            })
        })
        .collect();
    let mut dumps = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) || dumps < 3 {
        let (compact, _) = drain(DumpStream::new(Format::Compact, vec![source("m", &index)]).with_piece_bytes(16));
        let mut sink = Collect::default();
        binary::read_compact(&compact[..], &mut sink).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for d in &sink.0[0].events {
            let DumpEvent { event, .. } = d;
            let EventKind::Stored { blocks, .. } = &event.kind else { panic!("{d:?}") };
            assert!(seen.insert(event.worker), "{} listed in two events: {d:?}", event.worker);
            let hashes: Vec<u64> = blocks.iter().map(|b| b.engine_hash).collect();
            let k = hashes[0] / STEP;
            assert_eq!(hashes, state(k), "{}: a mix of states", event.worker);
        }
        dumps += 1;
    }
    for t in writers {
        t.join().unwrap();
    }
    index.check_consistency();
}

//! Behaviour of the trace-replay benchmark's mock engine, workload generator
//! and trace reader (the parts whose mistakes would silently skew figures).

#[path = "../benches/trace/mod.rs"]
mod trace;

use trace::backend::Backend;
use trace::engine::MockEngine;
use trace::hashes::EngineHashes;
use trace::mooncake::{duplicate, load, TraceRequest};
use trace::workload::{generate, Assign, OpKind, WorkloadConfig};

fn seqs(n: u64, base: u64) -> (Vec<u64>, Vec<u64>) {
    let locals: Vec<u64> = (0..n).map(|i| base + i).collect();
    let mut s = Vec::new();
    trace::dynamo_hash::sequence_hashes_into(&locals, &mut s);
    (locals, s)
}

/// Dynamo's sequence hash vectors (tokens 1..=8, block size 4): the mock
/// engines' prefix identity is Dynamo's.
#[test]
fn sequence_hashes_match_dynamos_vectors() {
    use kv_indexer::hash::{local_hashes_into, seed_for};
    let seqs = |lora, salt| {
        let (mut locals, mut seqs) = (Vec::new(), Vec::new());
        local_hashes_into(&[1, 2, 3, 4, 5, 6, 7, 8], 4, seed_for(lora, salt), &mut locals);
        trace::dynamo_hash::sequence_hashes_into(&locals, &mut seqs);
        seqs
    };
    assert_eq!(seqs(None, None), vec![14643705804678351452, 4945711292740353085]);
    assert_eq!(seqs(Some("adapter-a"), None)[1], 17518568667535815909);
    assert_eq!(seqs(None, Some("tenant-1"))[1], 10698633946847767502);
}

#[test]
fn engine_evicts_least_recently_released_tail_first() {
    let mut e = MockEngine::new(4, 7);
    let (la, sa) = seqs(2, 100);
    let (lb, sb) = seqs(2, 200);
    let a = e.admit(None, &la, &sa);
    assert_eq!(a.stored.len(), 1);
    assert_eq!(a.stored[0].parent, None);
    e.release(&sa);
    e.admit(None, &lb, &sb);
    e.release(&sb);
    // A third sequence of 2 blocks needs two evictions: A's, tail first.
    let (lc, sc) = seqs(2, 300);
    let c = e.admit(None, &lc, &sc);
    let evicted: Vec<u64> = c.removed.iter().map(|r| r.seq_hash).collect();
    assert_eq!(evicted, vec![sa[1], sa[0]]);
    assert!(e.contains(sb[0]) && e.contains(sb[1]));
}

#[test]
fn engine_never_evicts_referenced_blocks_and_counts_shortfall() {
    let mut e = MockEngine::new(3, 7);
    let (la, sa) = seqs(2, 100);
    e.admit(None, &la, &sa); // held, not released
    let (lb, sb) = seqs(3, 200);
    let b = e.admit(None, &lb, &sb);
    assert!(b.removed.is_empty());
    assert_eq!(b.held_blocks, 1);
    assert_eq!(b.shortfall_blocks, 2);
    assert!(e.contains(sa[0]) && e.contains(sa[1]));
}

#[test]
fn engine_hits_prefix_and_chains_new_blocks_to_it() {
    let mut e = MockEngine::new(16, 7);
    let (la, sa) = seqs(3, 100);
    e.admit(None, &la, &sa);
    let mut lb = la[..2].to_vec();
    lb.push(999);
    let mut sb = Vec::new();
    trace::dynamo_hash::sequence_hashes_into(&lb, &mut sb);
    let b = e.admit(None, &lb, &sb);
    assert_eq!(b.hit_blocks, 2);
    assert_eq!(b.stored.len(), 1);
    let parent = b.stored[0].parent.expect("continues the shared prefix");
    assert_eq!(parent, (e.engine_hash(sa[1]).unwrap(), sa[1]));
}

#[test]
fn engine_hashes_are_opaque_and_per_engine() {
    let (l, s) = seqs(2, 100);
    let mut e1 = MockEngine::new(8, 1);
    let mut e2 = MockEngine::new(8, 2);
    e1.admit(None, &l, &s);
    e2.admit(None, &l, &s);
    let (h1, h2) = (e1.engine_hash(s[1]).unwrap(), e2.engine_hash(s[1]).unwrap());
    assert_ne!(h1, h2);
    assert_ne!(h1, s[1], "engine hashes must not follow the index's chain");
}

fn request(t: u64, ids: &[u64], input: u32, output: u32) -> TraceRequest {
    TraceRequest { timestamp_ms: t, input_tokens: input, output_tokens: output, hash_ids: ids.to_vec() }
}

/// A small workload whose engines must evict: 60 requests over 3 workers
/// sharing prefixes, each decoding 40 tokens.
fn small_workload(decode_events: bool) -> trace::workload::Workload {
    let mut reqs = Vec::new();
    for i in 0..60u64 {
        let ids = [0, 1 + i % 5, 100 + i];
        reqs.push(request(i * 10, &ids, 1400, 40));
    }
    let cfg = WorkloadConfig {
        block_size: 16,
        workers: 3,
        gpu_blocks: 200,
        assign: Assign::RoundRobin,
        decode_us_per_token: 1100,
        decode_events,
        seed: 5,
        verify_samples: 60,
    };
    generate(&reqs, &cfg).unwrap()
}

/// Applies every event in order to our index fed `hashes` and checks every
/// sampled query against the engines' final caches.
fn check_rebuilds_engines(wl: &trace::workload::Workload, hashes: EngineHashes) {
    let ours = trace::ours::Ours::new(wl, 2, hashes);
    for (i, op) in wl.ops.iter().enumerate() {
        if op.is_event() {
            ours.submit(op.worker, ours.build_event(op, wl, i as u64));
        }
    }
    ours.drain();
    assert_eq!(ours.event_problems(), 0);
    assert_eq!(ours.memory().unwrap().pairs, wl.stats.live_pairs_end);
    let mut with_hits = 0;
    for s in &wl.samples {
        let mut got = Vec::new();
        ours.find_matches(&wl.query_locals[s.start..s.start + s.len as usize], &mut got);
        got.sort_unstable();
        assert_eq!(got, s.expected);
        with_hits += usize::from(!s.expected.is_empty());
    }
    assert!(with_hits > 0);
}

#[test]
fn generated_events_rebuild_the_engines_caches() {
    let wl = small_workload(false);
    assert!(wl.stats.removed_blocks > 0, "the small cache must evict");
    assert!(wl.stats.output_blocks > 0);
    assert!(wl.stats.engine_hit_blocks > 0);
    assert_eq!(wl.stats.requests, 60);
    assert_eq!(wl.stats.query_blocks, 60 * (1400 / 16));
    assert!(wl.ops.windows(2).all(|p| p[0].t_us <= p[1].t_us));
    check_rebuilds_engines(&wl, EngineHashes::Engine);
    check_rebuilds_engines(&wl, EngineHashes::Shared);
}

#[test]
fn decode_events_store_output_blocks_one_at_a_time_as_they_complete() {
    let at_completion = small_workload(false);
    let wl = small_workload(true);
    assert!(wl.ops.windows(2).all(|p| p[0].t_us <= p[1].t_us));
    assert_eq!(wl.stats.requests, at_completion.stats.requests);
    // Requests arrive every 10 ms and decode 1.1 ms a token; 1400 prompt
    // tokens end 8 tokens into block 87, so output blocks 87, 88 and 89
    // complete 8, 24 and 40 tokens in: 8.8, 26.4 and 44 ms after arrival.
    let offsets_us = [8_800, 26_400, 44_000];
    let stores: std::collections::HashMap<u64, &trace::workload::Op> = wl
        .ops
        .iter()
        .filter(|o| matches!(o.kind, OpKind::Stored { .. }) && o.t_us % 10_000 != 0)
        .map(|o| (o.t_us, o))
        .collect();
    assert_eq!(stores.len() as u64, wl.stats.output_blocks, "one event per output block");
    assert!(wl.stats.output_blocks > 60, "most requests store their output");
    for op in stores.values() {
        assert_eq!(op.len, 1);
        let k = offsets_us.iter().position(|d| (op.t_us - d) % 10_000 == 0).expect("at a block's completion");
        let OpKind::Stored { parent: Some((parent_engine, _)) } = op.kind else { panic!("output has a parent") };
        if k > 0 {
            let before = stores[&(op.t_us - offsets_us[k] + offsets_us[k - 1])];
            assert_eq!(parent_engine, wl.stored[before.start].engine_hash, "continues the block before");
        }
    }
    check_rebuilds_engines(&wl, EngineHashes::Engine);
    check_rebuilds_engines(&wl, EngineHashes::Shared);
}

#[test]
fn every_request_queries_before_its_stores() {
    let reqs = vec![request(0, &[1, 2], 1024, 0), request(5, &[1, 3], 1024, 0)];
    let cfg = WorkloadConfig {
        block_size: 64,
        workers: 1,
        gpu_blocks: 1000,
        assign: Assign::RoundRobin,
        decode_us_per_token: 0,
        decode_events: false,
        seed: 1,
        verify_samples: 0,
    };
    let wl = generate(&reqs, &cfg).unwrap();
    let kinds: Vec<&str> = wl
        .ops
        .iter()
        .map(|o| match o.kind {
            OpKind::Query => "q",
            OpKind::Stored { parent: None } => "s0",
            OpKind::Stored { parent: Some(_) } => "s",
            OpKind::Removed => "r",
        })
        .collect();
    // The second request shares 8 blocks (id 1) and stores 8 new ones after them.
    assert_eq!(kinds, vec!["q", "s0", "q", "s"]);
    assert_eq!(wl.ops[3].len, 8);
    assert_eq!(wl.stats.engine_hit_blocks, 8);
}

#[test]
fn trace_reader_checks_lines_and_duplicates_hash_spaces() {
    let dir = std::env::temp_dir().join(format!("trace_bench_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.jsonl");
    std::fs::write(
        &good,
        "{\"timestamp\": 0, \"input_length\": 9999, \"output_length\": 3, \"hash_ids\": [4, 5]}\n\
         {\"timestamp\": 2, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [4]}\n",
    )
    .unwrap();
    let reqs = load(good.to_str().unwrap()).unwrap();
    assert_eq!(reqs[0].input_tokens, 1024, "clamped to the ids' tokens");
    let dup = duplicate(&reqs, 2).unwrap();
    assert_eq!(dup.len(), 4);
    assert_eq!(dup[1].hash_ids, vec![10, 11]);
    assert_eq!(dup[1].timestamp_ms, 0);

    let bad = dir.join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n\
         {\"timestamp\": 4, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n",
    )
    .unwrap();
    let err = load(bad.to_str().unwrap()).unwrap_err();
    assert!(err.contains(":2:"), "{err}");
    std::fs::write(&bad, "{\"timestamp\": 5}\n").unwrap();
    assert!(load(bad.to_str().unwrap()).unwrap_err().contains(":1:"));
    std::fs::remove_dir_all(&dir).unwrap();
}

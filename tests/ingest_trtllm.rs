//! A TensorRT-LLM streaming publisher over real ZMQ: its maps, signed
//! hashes, "GPU" medium and replay replies (the end marker's topic empty).
//! Stores, removes, a ring fill, a replayed gap and a restart come out
//! exact; through the daemon, a multimodal store is applied (no resync)
//! and found with the router's tokens, and an odd store beside it is
//! skipped while its batch applies.

mod support;

use std::sync::Arc;

use kv_indexer::hash::{mm_identifier_hash, mm_pad_token};
use kv_indexer::ingest::Ingest;
use kv_indexer::{StorageTier, WorkerId};
use rmp::encode::{write_array_len, write_f64, write_map_len, write_nil, write_sint, write_str, write_uint};
use serde_json::{json, Value};
use support::daemon::Daemon;
use support::harness::{assert_converges, settle, spec_for, test_config, wait_connected};
use support::model_sink::ModelSink;
use support::publisher::{Encoding, HashForm, PublisherConfig, ReplyForm, TestEvent, TestPublisher};
use support::truth_check::metric;
use support::wait_until;

fn trtllm(seed: u64) -> TestPublisher {
    TestPublisher::new(PublisherConfig {
        encoding: Encoding::TrtLlm,
        hash_form: HashForm::Int,
        reply_form: ReplyForm::FourFramesBareEnd,
        batch_dp_rank: Some(0),
        topic: Vec::new(),
        seed,
        ..PublisherConfig::default()
    })
}

#[test]
fn stores_removes_fill_gap_and_restart_come_out_exact() {
    let worker = WorkerId::new(40, 0);
    let ingest = Ingest::start(test_config()).unwrap();
    let mut p = trtllm(11);
    // Published before anyone listens: only the ring fill brings these.
    p.publish_random(20);
    let sink = Arc::new(ModelSink::new());
    ingest.add_listener(spec_for(worker, &p, &sink)).unwrap();
    wait_connected(&mut p, 1, 1);
    p.publish_random(10);
    settle(&ingest, worker, &p);
    assert_converges(&sink, worker, &p);
    let held = &p.truth()[StorageTier::Device.index()];
    assert!(held.iter().any(|&h| h >= 1 << 63) && held.iter().any(|&h| h < 1 << 63), "signed hashes of both signs");

    // Three batches lost in transit: replayed from the ring.
    p.lose_next(3);
    p.publish_random(3);
    p.publish_random(5);
    settle(&ingest, worker, &p);
    assert_converges(&sink, worker, &p);
    let c = ingest.counters();
    assert_eq!((c.gaps_detected, c.replays_ok, c.batches_lost, c.resyncs), (1, 1, 0, 0));
    assert_eq!((c.undecodable_batches, c.malformed_messages), (0, 0));
    assert!(c.batches_filled >= 20, "{c:?}");

    // A restart: seq 0 again, an empty cache.
    let old: Vec<u64> = p.truth()[StorageTier::Device.index()].iter().copied().collect();
    p.restart(false);
    p.publish_random(10);
    settle(&ingest, worker, &p);
    assert_converges(&sink, worker, &p);
    let survivors = old.iter().filter(|&&h| sink.holds(worker, StorageTier::Device, h)).count();
    let restored = old.iter().filter(|h| p.truth()[StorageTier::Device.index()].contains(h)).count();
    assert_eq!(survivors, restored, "a block of the old process survived");
    let c = ingest.counters();
    assert_eq!((c.restarts, c.resyncs, c.batches_lost), (1, 0, 0));
}

const OFFSET: u32 = 200_000;

/// One TensorRT-LLM store map, its tokens given as ints or digest strings.
fn store_map(buf: &mut Vec<u8>, hashes: &[u64], parent: Option<u64>, tokens: &[Value], keys: &[Vec<(String, u64)>]) {
    write_map_len(buf, 9).unwrap();
    write_str(buf, "type").unwrap();
    write_str(buf, "BlockStored").unwrap();
    write_str(buf, "block_hashes").unwrap();
    write_array_len(buf, hashes.len() as u32).unwrap();
    for &h in hashes {
        write_sint(buf, h as i64).unwrap();
    }
    write_str(buf, "parent_block_hash").unwrap();
    match parent {
        Some(h) => drop(write_sint(buf, h as i64).unwrap()),
        None => write_nil(buf).unwrap(),
    }
    write_str(buf, "token_ids").unwrap();
    write_array_len(buf, tokens.len() as u32).unwrap();
    for t in tokens {
        match t {
            Value::String(s) => write_str(buf, s).unwrap(),
            Value::Number(n) if n.is_u64() => drop(write_uint(buf, n.as_u64().unwrap()).unwrap()),
            // An odd token: a float.
            Value::Number(n) => rmp::encode::write_f64(buf, n.as_f64().unwrap()).unwrap(),
            other => panic!("token {other}"),
        }
    }
    write_str(buf, "block_size").unwrap();
    write_uint(buf, 4).unwrap();
    write_str(buf, "lora_id").unwrap();
    write_nil(buf).unwrap();
    write_str(buf, "medium").unwrap();
    write_str(buf, "GPU").unwrap();
    write_str(buf, "lora_name").unwrap();
    write_nil(buf).unwrap();
    write_str(buf, "mm_keys").unwrap();
    write_array_len(buf, keys.len() as u32).unwrap();
    for block in keys {
        write_array_len(buf, block.len() as u32).unwrap();
        for (digest, start) in block {
            write_map_len(buf, 4).unwrap();
            for (k, v) in [("type", "mm_key"), ("hash", digest.as_str())] {
                write_str(buf, k).unwrap();
                write_str(buf, v).unwrap();
            }
            write_str(buf, "start_offset").unwrap();
            write_uint(buf, *start).unwrap();
            write_str(buf, "uuid").unwrap();
            write_str(buf, "photo-7").unwrap();
        }
    }
}

fn batch(stores: impl FnOnce(&mut Vec<u8>), count: u32) -> Vec<u8> {
    let mut buf = Vec::new();
    write_array_len(&mut buf, 3).unwrap();
    write_f64(&mut buf, 1_700_000_000.0).unwrap();
    write_array_len(&mut buf, count).unwrap();
    stores(&mut buf);
    write_uint(&mut buf, 0).unwrap();
    buf
}

/// Every `block_hash` a `/dump` lists.
fn dumped_hashes(v: &Value) -> Vec<u64> {
    match v {
        Value::Object(m) => m
            .iter()
            .flat_map(|(k, v)| match (k.as_str(), v.as_u64()) {
                ("block_hash", Some(h)) => vec![h],
                _ => dumped_hashes(v),
            })
            .collect(),
        Value::Array(a) => a.iter().flat_map(dumped_hashes).collect(),
        _ => Vec::new(),
    }
}

/// (longest match, device) of instance 1, in tokens.
fn depth(d: &Daemon, tokens: &[u32]) -> (u64, u64) {
    let (status, v) = d.post_json("/query", json!({"token_ids": tokens, "model_name": "m"}));
    assert_eq!(status, 200, "{v}");
    let i = &v["instances"]["1"];
    (i["longest_matched"].as_u64().unwrap_or(0), i["gpu"].as_u64().unwrap_or(0))
}

#[test]
fn a_multimodal_store_is_applied_and_found_with_the_routers_tokens() {
    let mut p = trtllm(12);
    let workers = format!("1={}", p.endpoint);
    let d = Daemon::start(&["--block-size", "4", "--model-name", "m", "--workers", &workers]);
    assert!(p.wait_subscribed(1));
    let TestEvent::Stored { hashes: text, .. } = p.new_store(StorageTier::Device, None, 2) else { unreachable!() };
    let leaf = *text.last().unwrap();
    p.publish(vec![TestEvent::Stored { tier: StorageTier::Device, parent: None, hashes: text }]);
    let text_tokens = p.chain_tokens(leaf);

    // An image over two blocks, then text; beside it in the batch, a store
    // with a token no engine sends (a float), whose own chain is skipped.
    let digest = "7e".repeat(32);
    let mm = [0xF000_0000_0000_0001u64, 0x0000_0000_0000_0002];
    let tail = [0x8000_0000_0000_0003u64];
    let sent: Vec<Value> = vec![
        json!(5),
        json!(digest),
        json!(OFFSET + 1),
        json!(OFFSET + 2),
        json!(OFFSET + 3),
        json!(OFFSET + 4),
        json!(9),
        json!(9),
    ];
    let keys = vec![vec![(digest.clone(), 0)], vec![(digest.clone(), 3)]];
    let payload = batch(
        |b| {
            store_map(b, &[0x4444], None, &[json!(1), json!(2.5), json!(3), json!(4)], &[vec![]]);
            store_map(b, &mm, Some(leaf), &sent, &keys);
            store_map(b, &tail, Some(mm[1]), &[json!(10), json!(11), json!(12), json!(13)], &[vec![]]);
        },
        3,
    );
    p.send_payload(payload);

    let pad = mm_pad_token(mm_identifier_hash("photo-7").unwrap());
    let mut routed = text_tokens.clone();
    routed.extend([5, pad, pad, pad, pad, pad, 9, 9, 10, 11, 12, 13]);
    assert!(wait_until(|| depth(&d, &routed) == (20, 20)), "{:?}", depth(&d, &routed));

    // The tokens as the engine sent them (the digest as 0) reach only the text.
    let mut raw = text_tokens.clone();
    raw.extend([5, 0, OFFSET + 1, OFFSET + 2, OFFSET + 3, OFFSET + 4, 9, 9]);
    assert_eq!(depth(&d, &raw), (8, 8));
    let held = dumped_hashes(&d.dump());
    for h in [mm[0], mm[1], tail[0], leaf] {
        assert!(held.contains(&h), "{h} not listed: {held:?}");
    }
    assert!(!held.contains(&0x4444), "the odd store was applied");

    for (name, want) in [("kv_indexer_resyncs_total", 0), ("kv_indexer_undecodable_batches_total", 0)] {
        assert_eq!(metric(&d, name), want, "{name}");
    }
    let (_, text) = d.get("/metrics");
    assert!(text.contains("kv_indexer_events_skipped_total{reason=\"malformed_store\"} 1"), "{text}");
    assert!(text.contains("kv_indexer_events_skipped_total{reason=\"unmatchable_multimodal\"} 0"), "{text}");
}

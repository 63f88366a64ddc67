//! Decodes every frame captured from released vLLM and SGLang publishers
//! (tests/fixtures/wire/, see scripts/capture_wire_fixtures.sh) and those
//! of TensorRT-LLM's streaming publisher (re-encoded from its source by
//! scripts/trtllm_wire_fixtures.py), and checks the result against what the
//! engine was asked to publish.

mod wire_support;

use std::collections::HashMap;

use kv_indexer::hash::{local_hash, seed_for, BASE_SEED};
use kv_indexer::wire::{
    decode_payload, split_frames, split_replay_frames, RawEvent, ReplayReply, SkipCounters, SkipReason, WorkerConverter,
};
use kv_indexer::wire::{RawMmKey, RawMultimodal, RawStored};
use kv_indexer::{Event, EventKind, StorageTier, WorkerId};
use serde_json::{json, Value};
use wire_support::{load_all, Fixture};

fn multimodal_json(m: &RawMultimodal) -> Value {
    let keys = m.mm_keys.as_ref().map(|blocks| {
        let key = |k: &RawMmKey| json!({"hash": k.hash, "start_offset": k.start_offset, "uuid": k.uuid});
        blocks.iter().map(|b| b.iter().map(key).collect::<Vec<_>>()).collect::<Vec<_>>()
    });
    json!({"string_tokens": m.string_tokens, "mm_keys": keys})
}

/// Renders a decoded event in the sidecar's shape.
fn event_json(event: &RawEvent) -> Value {
    match event {
        RawEvent::Stored(s) => {
            let mut v = stored_json(s);
            if let Some(m) = &s.multimodal {
                v["multimodal"] = multimodal_json(m);
            }
            v
        }
        RawEvent::Removed(r) => json!({
            "type": "removed",
            "block_hashes": r.block_hashes,
            "medium": r.medium,
            "group_idx": r.group_idx,
            "locality": r.locality,
            "ownership": r.ownership,
        }),
        RawEvent::Cleared => json!({"type": "cleared"}),
        RawEvent::Unknown => json!({"type": "unknown"}),
        RawEvent::MalformedStore => json!({"type": "malformed_store"}),
    }
}

fn stored_json(s: &RawStored) -> Value {
    json!({
        "type": "stored",
        "block_hashes": s.block_hashes,
        "parent_block_hash": s.parent_block_hash,
        "token_ids": s.token_ids,
        "block_size": s.block_size,
        "lora_id": s.lora_id,
        "lora_name": s.lora_name,
        "medium": s.medium,
        "cache_salt": s.cache_salt,
        "extra_keys_salt": s.extra_keys_salt,
        "block_mm_hashes": s.block_mm_hashes,
        "opaque_extra_keys_from": s.opaque_extra_keys_from,
        "group_idx": s.group_idx,
        "kv_cache_spec_kind": s.kv_cache_spec_kind,
        "locality": s.locality,
        "ownership": s.ownership,
    })
}

#[test]
fn every_engine_format_is_captured() {
    let names: Vec<String> = load_all().into_iter().map(|f| f.name).collect();
    for version in [
        "vllm-0.9.0-r0",
        "vllm-0.11.0-r3",
        "vllm-0.23.0-r0",
        "vllm-0.25.1-r3",
        "vllm-0.26.0-r3",
        "vllm-0.33.0-r0",
        "sglang-0.5.16-r0",
        "sglang-0.5.20-r3",
        "sglang-0.5.22-r3",
        "sglang-0.5.23-r0",
        "trtllm-2026.07-r0",
        "trtllm-2026.07-r2",
    ] {
        assert!(names.iter().any(|n| n == version), "missing fixture {version}");
    }
}

#[test]
fn live_frames_decode_to_what_the_engine_published() {
    for f in load_all() {
        let expected = f.sidecar["live"].as_array().unwrap();
        assert_eq!(f.live.len(), expected.len(), "{}", f.name);
        let topic = f.sidecar["topic"].as_str().unwrap().as_bytes();
        for (frames, want) in f.live.iter().zip(expected) {
            let ctx = format!("{} seq {}", f.name, want["seq"]);
            assert_eq!(frames[0], topic, "{ctx}: topic");
            let (seq, payload) = split_frames(frames).unwrap();
            assert_eq!(seq, want["seq"].as_u64().unwrap(), "{ctx}");
            let batch = decode_payload(payload).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert_eq!(batch.timestamp, want["ts"].as_f64().unwrap(), "{ctx}");
            assert_eq!(batch.dp_rank.map(u64::from), want["dp_rank"].as_u64(), "{ctx}");
            let got: Vec<Value> = batch.events.iter().map(event_json).collect();
            assert_eq!(&got, want["events"].as_array().unwrap(), "{ctx}");
        }
    }
}

#[test]
fn replay_replies_repeat_the_live_payloads_and_end() {
    for f in load_all() {
        let replay = &f.sidecar["replay"];
        let seqs: Vec<u64> = replay["seqs"].as_array().unwrap().iter().map(|s| s.as_u64().unwrap()).collect();
        assert_eq!(f.replay.len(), seqs.len() + 1, "{}", f.name);
        let width = replay["frames_per_reply"].as_u64().unwrap() as usize;
        let live: HashMap<u64, &[u8]> = f.live.iter().map(|m| split_frames(m).unwrap()).collect();
        for (reply, &want_seq) in f.replay.iter().zip(&seqs) {
            assert_eq!(reply.len(), width, "{}", f.name);
            match split_replay_frames(reply).unwrap() {
                ReplayReply::Batch { seq, payload } => {
                    assert_eq!(seq, want_seq, "{}", f.name);
                    assert_eq!(payload, live[&seq], "{}: replayed payload differs", f.name);
                    decode_payload(payload).unwrap();
                }
                ReplayReply::End => panic!("{}: early end marker", f.name),
            }
        }
        assert_eq!(split_replay_frames(f.replay.last().unwrap()).unwrap(), ReplayReply::End, "{}", f.name);
    }
}

/// Converts a whole capture; returns per engine hash the (tier, local hash)
/// of the last store naming it, every output event, and the skip counters.
fn convert(f: &Fixture) -> (HashMap<u64, (StorageTier, u64)>, Vec<Event>, SkipCounters) {
    let worker = WorkerId::new(1, f.sidecar["dp_rank"].as_u64().unwrap() as u32);
    let mut conv = WorkerConverter::new(16);
    let skips = SkipCounters::new();
    let mut out = Vec::new();
    for frames in &f.live {
        let (_, payload) = split_frames(frames).unwrap();
        let batch = decode_payload(payload).unwrap();
        conv.convert(worker, &batch.events, &mut out, &skips, &|_, _| {});
    }
    let mut stored = HashMap::new();
    for e in &out {
        assert_eq!(e.worker, worker);
        if let EventKind::Stored { blocks, .. } = &e.kind {
            for b in blocks {
                stored.insert(b.engine_hash, (e.tier, b.local_hash));
            }
        }
    }
    (stored, out, skips)
}

fn tokens(first: u32, last: u32) -> Vec<u32> {
    (first..=last).collect()
}

/// The sidecar's stored event whose first hash is `hash`.
fn sent_store(f: &Fixture, hash: u64) -> Value {
    f.sidecar["live"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|b| b["events"].as_array().unwrap())
        .find(|e| e["type"] == "stored" && e["block_hashes"][0] == json!(hash))
        .unwrap_or_else(|| panic!("{}: no store of {hash}", f.name))
        .clone()
}

#[test]
fn captured_scenario_converts_as_the_rules_say() {
    const SALTED_ROOT: u64 = 1 << 63;
    for f in load_all().into_iter().filter(|f| f.sidecar["engine"] != "trtllm") {
        let name = &f.name;
        let (stored, out, skips) = convert(&f);
        let plain = seed_for(None, None);
        let device = StorageTier::Device;

        // A plain chain: tokens hashed with the base seed, device tier.
        assert_eq!(stored[&7], (device, local_hash(&tokens(17, 32), plain)), "{name}");

        // LoRA: hashed under its name, or skipped when only an id is sent (vLLM 0.9).
        let lora = sent_store(&f, 300);
        match (lora["lora_name"].as_str(), lora["lora_id"].is_null()) {
            (Some(n), _) => assert_eq!(stored[&300].1, local_hash(&tokens(33, 48), seed_for(Some(n), None)), "{name}"),
            (None, false) => assert!(!stored.contains_key(&300), "{name}: nameless LoRA kept"),
            (None, true) => assert_eq!(stored[&300].1, local_hash(&tokens(33, 48), plain)),
        }

        // Salt: named by the root store (SGLang field or vLLM tag) and
        // inherited by the child, which names none in vLLM.
        let root = sent_store(&f, 1 << 40);
        let salt = root["cache_salt"].as_str().or(root["extra_keys_salt"].as_str());
        let salted = seed_for(None, salt);
        assert_eq!(stored[&SALTED_ROOT].1, local_hash(&tokens(117, 132), salted), "{name}");
        assert_eq!(stored[&u64::MAX].1, local_hash(&tokens(133, 148), salted), "{name}");
        if f.sidecar["engine"] == "vllm" && salt.is_some() {
            assert!(sent_store(&f, u64::MAX)["extra_keys_salt"].is_null());
        }

        // Multimodal: the marked hash is appended; a native identifier is opaque.
        let has_extra_keys = !sent_store(&f, 11)["block_mm_hashes"].as_array().unwrap().is_empty();
        if has_extra_keys {
            let mut bytes: Vec<u8> = tokens(201, 216).iter().flat_map(|t| t.to_le_bytes()).collect();
            bytes.extend(0x0123_4567_89ab_cdefu64.to_le_bytes());
            let want = xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, BASE_SEED);
            assert_eq!(stored[&11].1, want, "{name}");
            assert!(!stored.contains_key(&12), "{name}: opaque key hashed");
            assert!(skips.get(SkipReason::OpaqueExtraKeys) >= 1, "{name}");
        } else {
            assert_eq!(stored[&11].1, local_hash(&tokens(201, 216), plain), "{name}");
        }

        // Lower tiers and what must never be indexed.
        // The first block is re-stored in the CPU tier, where the version has media.
        let lower = &f.sidecar["live"][4]["events"][0];
        assert_eq!(lower["block_hashes"][0], json!(0xF000_0000_0000_AA01u64));
        let cpu = if lower["medium"].is_null() { device } else { StorageTier::HostPinned };
        assert_eq!(stored[&0xF000_0000_0000_AA01].0, cpu, "{name}");
        for hash in [13, 23, 24, 26] {
            assert!(!stored.contains_key(&hash), "{name}: {hash} indexed");
        }
        // The sliding-window store is only recognisable where the version says so.
        if f.sidecar["engine"] == "vllm" {
            let sliding_known = !sent_store(&f, 21)["kv_cache_spec_kind"].is_null();
            assert_eq!(stored.contains_key(&21), !sliding_known, "{name}");
        }
        if stored.contains_key(&22) {
            assert_eq!(stored[&22].0, StorageTier::Disk, "{name}");
        }
        if f.sidecar["engine"] == "sglang" {
            assert_eq!(stored[&25].0, StorageTier::Disk, "{name}");
            assert_eq!(skips.get(SkipReason::BlockSizeMismatch), 1, "{name}: partial page");
        }

        // The batch of removes, then the clear that ends every capture.
        let removed: Vec<&Vec<u64>> = out
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Removed { engine_hashes } => Some(engine_hashes),
                _ => None,
            })
            .collect();
        assert_eq!(removed[0], &vec![300, 70000], "{name}");
        assert_eq!(out.last().unwrap().kind, EventKind::Cleared, "{name}");
    }
}

/// TensorRT-LLM: signed hashes, "GPU", multimodal stores hashed as a router
/// hashes them, an item without uuid stored where no query meets it.
#[test]
fn trtllm_capture_converts_as_a_router_hashes() {
    let captures: Vec<Fixture> = load_all().into_iter().filter(|f| f.sidecar["engine"] == "trtllm").collect();
    assert_eq!(captures.len(), 2);
    for f in captures {
        let name = &f.name;
        let (stored, out, skips) = convert(&f);
        let plain = seed_for(None, None);
        let device = StorageTier::Device;
        let live = f.sidecar["live"].as_array().unwrap();
        let hashes = |batch: usize| -> Vec<u64> {
            serde_json::from_value(live[batch]["events"][0]["block_hashes"].clone()).unwrap()
        };
        // About half the hashes are negative on the wire.
        let all: Vec<u64> = (0..4).flat_map(hashes).collect();
        assert!(all.iter().any(|&h| h >= 1 << 63) && all.iter().any(|&h| h < 1 << 63), "{name}");

        // Text: the tokens as sent.
        let chain = hashes(0);
        assert_eq!(stored[&chain[0]], (device, local_hash(&tokens(1, 16), plain)), "{name}");
        assert_eq!(stored[&chain[1]], (device, local_hash(&tokens(17, 32), plain)), "{name}");

        // Multimodal: the router's tokens, or a hash no query meets.
        for store in f.sidecar["router_tokens"].as_array().unwrap() {
            let engine: Vec<u64> = serde_json::from_value(store["block_hashes"].clone()).unwrap();
            let raw: Vec<u32> = serde_json::from_value(
                live.iter()
                    .flat_map(|b| b["events"].as_array().unwrap())
                    .find(|e| e["block_hashes"][0] == json!(engine[0]))
                    .unwrap()["token_ids"]
                    .clone(),
            )
            .unwrap();
            for (i, (h, routed)) in engine.iter().zip(store["tokens"].as_array().unwrap()).enumerate() {
                let got = stored[h].1;
                let sent = &raw[i * 16..(i + 1) * 16];
                match routed.as_array() {
                    Some(t) => {
                        let t: Vec<u32> = t.iter().map(|v| v.as_u64().unwrap() as u32).collect();
                        assert_eq!(got, local_hash(&t, plain), "{name}: block {h}");
                        if t.iter().any(|&x| x >= 1_000_000) {
                            assert_ne!(got, local_hash(sent, plain), "{name}: block {h} hashed as sent");
                        }
                    }
                    None => assert_ne!(got, local_hash(sent, plain), "{name}: block {h} matchable"),
                }
            }
        }
        assert_eq!(skips.get(SkipReason::UnmatchableMultimodal), 1, "{name}");
        assert_eq!(skips.total(), 1, "{name}: {:?}", skips.snapshot());

        // Removes name the signed hashes; the clear ends the capture.
        let removed: Vec<&Vec<u64>> = out
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Removed { engine_hashes } => Some(engine_hashes),
                _ => None,
            })
            .collect();
        assert_eq!(removed.len(), 2, "{name}");
        assert_eq!(*removed[0], vec![hashes(1)[0], *hashes(2).last().unwrap()], "{name}");
        assert_eq!(out.last().unwrap().kind, EventKind::Cleared, "{name}");
    }
}

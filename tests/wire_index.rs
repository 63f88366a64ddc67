//! Captured engine frames, decoded and converted, applied to the real index:
//! queries hashed the way a router hashes them find what the engine stored.

mod wire_support;

use kv_indexer::hash::{local_hashes_into, seed_for};
use kv_indexer::index::{Index, IndexConfig, Matches};
use kv_indexer::wire::{decode_payload, split_block_hash, split_frames, SkipCounters, WorkerConverter};
use kv_indexer::{EventKind, WorkerId};
use wire_support::{load_all, Fixture};

/// Applies the capture's live batches `[..upto]` to a fresh index of `block_size`.
fn index_of(f: &Fixture, block_size: u32, upto: usize) -> (Index, WorkerId) {
    let worker = WorkerId::new(9, f.sidecar["dp_rank"].as_u64().unwrap() as u32);
    let index = Index::new(IndexConfig::new(block_size));
    let mut conv = WorkerConverter::new(block_size);
    let skips = SkipCounters::new();
    let mut events = Vec::new();
    for frames in &f.live[..upto] {
        let (_, payload) = split_frames(frames).unwrap();
        let batch = decode_payload(payload).unwrap();
        conv.convert(worker, &batch.events, &mut events, &skips, &|_, _| {});
    }
    for e in &events {
        index.apply(e);
    }
    (index, worker)
}

fn query(index: &Index, first: u32, last: u32, block_size: u32, salt: Option<&str>) -> Matches {
    let tokens: Vec<u32> = (first..=last).collect();
    let mut locals = Vec::new();
    local_hashes_into(&tokens, block_size as usize, seed_for(None, salt), &mut locals);
    index.find_matches(&locals)
}

/// (device, host, disk) depths of `worker`, zeros when absent.
fn depths(m: &Matches, worker: WorkerId) -> (u32, u32, u32) {
    m.workers.iter().find(|w| w.worker == worker).map_or((0, 0, 0), |w| (w.device, w.host, w.disk))
}

fn salt_of(f: &Fixture) -> Option<String> {
    let root = &f.sidecar["live"][1]["events"][0];
    root["cache_salt"].as_str().or(root["extra_keys_salt"].as_str()).map(str::to_owned)
}

#[test]
fn stored_prefixes_are_found_and_salts_keep_tenants_apart() {
    for f in load_all().into_iter().filter(|f| f.sidecar["engine"] != "trtllm") {
        let name = &f.name;
        let before_clear = f.live.len() - 1;
        let (index, worker) = index_of(&f, 16, before_clear);
        assert_eq!(depths(&query(&index, 1, 32, 16, None), worker), (2, 2, 2), "{name}");
        let salt = salt_of(&f);
        let salted = query(&index, 101, 148, 16, salt.as_deref());
        assert_eq!(depths(&salted, worker), (3, 3, 3), "{name}: salted chain");
        if salt.is_some() {
            let unsalted = query(&index, 101, 148, 16, None);
            assert_eq!(depths(&unsalted, worker).0, 0, "{name}: salt ignored");
            let other = query(&index, 101, 148, 16, Some("tenant-2"));
            assert_eq!(depths(&other, worker).0, 0, "{name}: wrong salt matched");
        }
        // The whole capture ends with AllBlocksCleared.
        let (index, worker) = index_of(&f, 16, f.live.len());
        assert_eq!(depths(&query(&index, 1, 32, 16, None), worker), (0, 0, 0), "{name}");
        assert_eq!(index.stats().pairs, 0, "{name}");
    }
}

#[test]
fn engine_blocks_larger_than_the_index_blocks_are_split_and_removed_whole() {
    for f in load_all().into_iter().filter(|f| f.sidecar["engine"] != "trtllm") {
        let name = &f.name;
        let before_clear = f.live.len() - 1;
        let (index, worker) = index_of(&f, 8, before_clear);
        // 32 tokens = 2 engine blocks = 4 index blocks.
        assert_eq!(depths(&query(&index, 1, 32, 8, None), worker), (4, 4, 4), "{name}");
        let salt = salt_of(&f);
        assert_eq!(depths(&query(&index, 101, 148, 8, salt.as_deref()), worker).0, 6, "{name}");
        // Blocks 300 and 70000 were removed by engine hash: no piece of them is left.
        let held: Vec<u64> = index
            .dump_events()
            .iter()
            .filter_map(|e| match &e.event.kind {
                EventKind::Stored { blocks, .. } => Some(blocks.iter().map(|b| b.engine_hash)),
                _ => None,
            })
            .flatten()
            .collect();
        assert!(held.contains(&split_block_hash(7, 0)), "{name}: dump lacks a split block");
        for gone in [300, split_block_hash(300, 0), 70000, split_block_hash(70000, 0)] {
            assert!(!held.contains(&gone), "{name}: {gone} survived its remove");
        }
    }
}

/// The router's tokens for every block of `f`'s first multimodal store.
fn router_tokens(f: &Fixture) -> Vec<u32> {
    let store = &f.sidecar["router_tokens"][0]["tokens"];
    store.as_array().unwrap().iter().flat_map(|b| b.as_array().unwrap()).map(|t| t.as_u64().unwrap() as u32).collect()
}

fn depth_of(index: &Index, tokens: &[u32], block_size: u32, worker: WorkerId) -> (u32, u32, u32) {
    let mut locals = Vec::new();
    local_hashes_into(tokens, block_size as usize, seed_for(None, None), &mut locals);
    depths(&index.find_matches(&locals), worker)
}

#[test]
fn trtllm_multimodal_prefixes_are_found_with_the_routers_tokens() {
    for f in load_all().into_iter().filter(|f| f.sidecar["engine"] == "trtllm") {
        let name = &f.name;
        // Text chain (2 blocks), its child (1), then three multimodal blocks.
        let mut tokens: Vec<u32> = (1..=48).collect();
        tokens.extend(router_tokens(&f));
        for block_size in [16, 8] {
            let (index, worker) = index_of(&f, block_size, 3);
            let per = 16 / block_size;
            assert_eq!(depth_of(&index, &tokens, block_size, worker), (6 * per, 6 * per, 6 * per), "{name}");
            // The tokens as the engine sent them (digest as 0, offset ids) reach only the text.
            let sent: Vec<u32> =
                serde_json::from_value(f.sidecar["live"][2]["events"][0]["token_ids"].clone()).unwrap();
            let raw: Vec<u32> = (1..=48).chain(sent).collect();
            assert_eq!(depth_of(&index, &raw, block_size, worker).0, 3 * per, "{name}: sent tokens matched");
        }
        // After the removes, the child is gone and so is the rest of the chain.
        let (index, worker) = index_of(&f, 16, 5);
        assert_eq!(depth_of(&index, &tokens, 16, worker), (2, 2, 2), "{name}");
    }
}

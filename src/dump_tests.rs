//! The `/dump` format: what we write and refuse, round trips (ours ->
//! ours, ours -> Dynamo's types -> ours), and a live index dumped, parsed
//! and replayed into an empty one.
//!
//! Dynamo's side is modelled by test-only types with the same serde shape
//! as its 1.6.1 `RouterEvent` family (field names, enum tagging, defaults,
//! unknown fields ignored), so "Dynamo reads our dump" means these types
//! deserialize it, and "we read Dynamo's dump" means we parse what these
//! types serialize.

use super::*;
use crate::event::EventKind;
use crate::index::{Index, IndexConfig};
use serde_json::{json, Value};
use std::collections::HashMap;

/// Parses a `/dump` body (ours or Dynamo's) into its entries.
fn parse_dump(body: &[u8]) -> Result<Vec<DumpEntry>, BodyError> {
    parse_dump_counted(body).map(|d| d.entries)
}

fn w(i: u64, r: u32) -> WorkerId {
    WorkerId::new(i, r)
}

fn blocks(pairs: &[(u64, u64)]) -> Vec<StoredBlock> {
    pairs.iter().map(|&(engine_hash, local_hash)| StoredBlock { engine_hash, local_hash }).collect()
}

#[test]
fn writes_dynamo_router_events() {
    let entry = DumpEntry {
        model_name: "m".into(),
        tenant_id: "t".into(),
        block_size: 16,
        events: vec![
            Event::stored(w(7, 1), StorageTier::Device, Some(11), blocks(&[(12, 99)])).into(),
            Event::stored(w(7, 0), StorageTier::HostPinned, None, blocks(&[(u64::MAX, 1), (2, 3)])).into(),
            Event::removed(w(8, 0), StorageTier::Disk, vec![5, 6]).into(),
            Event::cleared(w(9, 2)).into(),
            DumpEvent {
                event: Event::stored(w(7, 1), StorageTier::Disk, Some(77), blocks(&[(13, 98)])),
                orphan: Some(Orphan { position: 4, anchor: Some(12), missing: vec![41, 42] }),
            },
            DumpEvent {
                event: Event::stored(w(7, 1), StorageTier::Device, Some(78), blocks(&[(14, 97)])),
                orphan: Some(Orphan { position: 2, anchor: None, missing: vec![43, 44] }),
            },
        ],
    };
    let mut out = Vec::new();
    write_dump(&mut out, std::slice::from_ref(&entry));
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        v,
        json!({"m:t": {"model_name": "m", "tenant_id": "t", "block_size": 16, "events": [
            {"worker_id": 7, "storage_tier": "device", "residency_domain": "worker", "event": {"event_id": 0, "data": {"stored": {
                "parent_hash": 11, "start_position": null,
                "blocks": [{"block_hash": 12, "tokens_hash": 99, "mm_extra_info": null}]}}, "dp_rank": 1}},
            {"worker_id": 7, "storage_tier": "host_pinned", "residency_domain": "worker", "event": {"event_id": 1, "data": {"stored": {
                "parent_hash": null, "start_position": null,
                "blocks": [{"block_hash": u64::MAX, "tokens_hash": 1, "mm_extra_info": null},
                           {"block_hash": 2, "tokens_hash": 3, "mm_extra_info": null}]}}, "dp_rank": 0}},
            {"worker_id": 8, "storage_tier": "disk", "residency_domain": "worker", "event": {"event_id": 2, "data": {"removed": {
                "block_hashes": [5, 6]}}, "dp_rank": 0}},
            {"worker_id": 9, "storage_tier": "device", "residency_domain": "worker", "event": {"event_id": 3, "data": "cleared", "dp_rank": 2}},
            {"worker_id": 7, "storage_tier": "disk", "residency_domain": "worker", "event": {"event_id": 4, "data": {"stored": {
                "parent_hash": 77, "start_position": 4,
                "blocks": [{"block_hash": 13, "tokens_hash": 98, "mm_extra_info": null}],
                "kv_indexer_orphan": {"anchor_hash": 12, "missing_tokens_hashes": [41, 42]}}}, "dp_rank": 1}},
            {"worker_id": 7, "storage_tier": "device", "residency_domain": "worker", "event": {"event_id": 5, "data": {"stored": {
                "parent_hash": 78, "start_position": 2,
                "blocks": [{"block_hash": 14, "tokens_hash": 97, "mm_extra_info": null}],
                "kv_indexer_orphan": {"anchor_hash": null, "missing_tokens_hashes": [43, 44]}}}, "dp_rank": 1}}
        ]}})
    );
    let back = parse_dump(&out).unwrap();
    assert_eq!(back, vec![entry], "read back as written");
}

#[test]
fn orphans_whose_positions_do_not_add_up_refuse_the_dump() {
    let event = |start: &str, orphan: &str| {
        format!(
            r#"{{"m:t": {{"block_size": 4, "events": [{{"worker_id": 1, "event": {{"event_id": 0, "data": {{"stored": {{
            "parent_hash": 9, "start_position": {start}, "blocks": [{{"block_hash": 1, "tokens_hash": 2}}],
            "kv_indexer_orphan": {orphan}}}}}}}}}]}}}}"#
        )
    };
    let ok = [
        ("3", r#"{"anchor_hash": 5, "missing_tokens_hashes": [1, 2]}"#),
        ("2", r#"{"missing_tokens_hashes": [1, 2]}"#),
    ];
    for (start, orphan) in ok {
        let d = parse_dump(event(start, orphan).as_bytes()).unwrap();
        assert!(d[0].events[0].orphan.is_some(), "{start} {orphan}");
    }
    let bad = [
        ("null", r#"{"anchor_hash": 5, "missing_tokens_hashes": [1]}"#),
        ("2", r#"{"anchor_hash": 5, "missing_tokens_hashes": [1, 2]}"#),
        ("3", r#"{"anchor_hash": null, "missing_tokens_hashes": [1, 2]}"#),
        ("0", r#"{"anchor_hash": null, "missing_tokens_hashes": []}"#),
        ("1", r#"{"anchor_hash": 5}"#),
        ("1", r#"{"anchor_hash": "x", "missing_tokens_hashes": []}"#),
    ];
    for (start, orphan) in bad {
        let err = parse_dump(event(start, orphan).as_bytes()).expect_err(orphan);
        assert_eq!(err.status(), 422, "{start} {orphan}: {err}");
    }
}

#[test]
fn reads_dynamo_defaults_and_skips() {
    let body = br#"{
        "a:b:c": {"block_size": 4, "events": [
            {"worker_id": 1, "event": {"event_id": 9, "data": {"stored": {"blocks": [
                {"block_hash": -1, "tokens_hash": 5, "mm_extra_info": {"mm_objects": [{"mm_hash": 1, "offsets": [[0, 2]]}]}}]}}}},
            {"worker_id": 1, "storage_tier": "g4_remote", "event": {"event_id": 1, "data": "cleared"}},
            {"worker_id": 1, "residency_domain": "cache_owner", "state_source": {"x": 1},
             "event": {"event_id": 2, "data": {"cleared": null}}},
            {"worker_id": 2, "residency_domain": "worker", "session_id": "s",
             "event": {"event_id": 3, "data": {"cleared": null}, "dp_rank": 3}}
        ]},
        "broken:x": {"error": "indexer offline"}
    }"#;
    let d = parse_dump_counted(body).unwrap();
    assert_eq!(d.skipped_events, 2);
    assert_eq!(d.unsupported_residency, [0, 0, 1]);
    assert_eq!(d.skipped_entries, 1);
    assert_eq!(
        d.entries,
        vec![DumpEntry {
            model_name: "a".into(),
            tenant_id: "b:c".into(),
            block_size: 4,
            events: vec![
                Event::stored(w(1, 0), StorageTier::Device, None, blocks(&[(u64::MAX, 5)])).into(),
                Event::cleared(w(2, 3)).into(),
            ],
        }]
    );
}

#[test]
fn only_the_worker_residency_domain_is_applied() {
    let event = |domain: &str| {
        format!(
            r#"{{"worker_id": 1, {domain} "event": {{"event_id": 0, "data": {{"stored": {{"blocks": [{{"block_hash": 1, "tokens_hash": 2}}]}}}}}}}}"#
        )
    };
    let domains = [
        r#""residency_domain": "worker","#,
        "",
        r#""residency_domain": "cache_owner","#,
        r#""residency_domain": "future_domain","#,
        r#""residency_domain": null,"#,
        r#""residency_domain": 3,"#,
        r#""residency_domain": {"a": [1]},"#,
    ];
    let events: Vec<String> = domains.iter().map(|d| event(d)).collect();
    let body = format!(r#"{{"m:t": {{"block_size": 4, "events": [{}]}}}}"#, events.join(","));
    let d = parse_dump_counted(body.as_bytes()).unwrap();
    assert_eq!(d.entries[0].events.len(), 2, "worker and missing are applied");
    assert_eq!((d.skipped_events, d.unsupported_residency), (5, [5, 0, 0]));
}

#[test]
fn refuses_what_cannot_be_placed() {
    let cases: [(&[u8], u16); 8] = [
        (br#"{"nocolon": {"block_size": 4, "events": []}}"#, 422),
        (br#"{"m:t": {"events": []}}"#, 422),
        (br#"{"m:t": {"block_size": 0, "events": []}}"#, 400),
        (br#"{"m:t": {"block_size": 4, "events": [{"worker_id": 1, "event": {"data": "cleared"}}]}}"#, 422),
        (br#"{"m:t": {"block_size": 4, "events": [{"worker_id": 1, "event": {"event_id": 0, "data": "exploded"}}]}}"#, 422),
        (br#"{"m:t": {"block_size": 4, "events": [{"worker_id": -1, "event": {"event_id": 0, "data": "cleared"}}]}}"#, 422),
        (br#"[]"#, 422),
        (br#"{"m:t": {"block_size": 4, "events": [}"#, 400),
    ];
    for (body, status) in cases {
        let err = parse_dump(body).expect_err(&String::from_utf8_lossy(body));
        assert_eq!(err.status(), status, "{}: {err}", String::from_utf8_lossy(body));
    }
    let deep = format!("{{\"m:t\":{{\"block_size\":4,\"x\":{}}}}}", "[".repeat(100_000));
    assert_eq!(parse_dump(deep.as_bytes()).unwrap_err().status(), 400);
}

/// Serde shapes of Dynamo's dump, written from its derives' field lists.
mod dynamo {
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub struct DumpEntry {
        pub block_size: u32,
        pub events: Vec<RouterEvent>,
    }

    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub struct RouterEvent {
        pub worker_id: u64,
        #[serde(default)]
        pub storage_tier: StorageTier,
        pub event: KvCacheEvent,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub session_id: Option<String>,
    }

    #[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq)]
    #[serde(rename_all = "snake_case")]
    pub enum StorageTier {
        #[default]
        Device,
        HostPinned,
        Disk,
        External,
    }

    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub struct KvCacheEvent {
        pub event_id: u64,
        pub data: KvCacheEventData,
        #[serde(default)]
        pub dp_rank: u32,
    }

    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[serde(rename_all = "snake_case")]
    pub enum KvCacheEventData {
        Stored(KvCacheStoreData),
        Removed(KvCacheRemoveData),
        Cleared,
    }

    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub struct KvCacheStoreData {
        pub parent_hash: Option<u64>,
        pub start_position: Option<u32>,
        pub blocks: Vec<KvCacheStoredBlockData>,
    }

    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub struct KvCacheStoredBlockData {
        pub block_hash: u64,
        pub tokens_hash: u64,
        pub mm_extra_info: Option<BlockExtraInfo>,
    }

    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub struct BlockExtraInfo {
        pub mm_objects: Vec<BlockMmObjectInfo>,
    }

    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub struct BlockMmObjectInfo {
        pub mm_hash: u64,
        pub offsets: Vec<(usize, usize)>,
    }

    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub struct KvCacheRemoveData {
        pub block_hashes: Vec<u64>,
    }
}

use crate::test_rng::RngStar as Rng;

fn random_events(r: &mut Rng, n: usize) -> Vec<DumpEvent> {
    (0..n)
        .map(|_| {
            let worker = WorkerId::new(r.below(5) + (r.below(2) << 63), r.below(3) as u32);
            let tier = StorageTier::ALL[r.below(4) as usize];
            let kind = match r.below(6) {
                0 => EventKind::Cleared,
                1 => EventKind::Removed { engine_hashes: (0..r.below(5)).map(|_| r.next()).collect() },
                _ => EventKind::Stored {
                    parent: (r.below(2) == 0).then(|| r.next()),
                    blocks: (0..r.below(6))
                        .map(|_| StoredBlock { engine_hash: r.next(), local_hash: r.next() })
                        .collect(),
                },
            };
            // Some stores are orphans, hanging under missing ancestors.
            let orphan = matches!(kind, EventKind::Stored { .. }).then_some(()).filter(|_| r.below(4) == 0).map(|_| {
                let missing: Vec<u64> = (0..r.below(4)).map(|_| r.next()).collect();
                let anchor = (missing.is_empty() || r.below(2) == 0).then(|| r.next());
                let position = missing.len() as u32 + anchor.map_or(0, |_| 1 + r.below(50) as u32);
                Orphan { position, anchor, missing }
            });
            DumpEvent { event: Event { worker, tier, kind }, orphan }
        })
        .collect()
}

fn tier_to_dynamo(t: StorageTier) -> dynamo::StorageTier {
    match t {
        StorageTier::Device => dynamo::StorageTier::Device,
        StorageTier::HostPinned => dynamo::StorageTier::HostPinned,
        StorageTier::Disk => dynamo::StorageTier::Disk,
        StorageTier::External => dynamo::StorageTier::External,
    }
}

/// What Dynamo's indexer would hold for our event, as its own type.
fn to_dynamo(d: &DumpEvent, event_id: u64) -> dynamo::RouterEvent {
    let e = &d.event;
    let data = match &e.kind {
        EventKind::Stored { parent, blocks } => dynamo::KvCacheEventData::Stored(dynamo::KvCacheStoreData {
            parent_hash: *parent,
            start_position: d.orphan.as_ref().map(|o| o.position),
            blocks: blocks
                .iter()
                .map(|b| dynamo::KvCacheStoredBlockData {
                    block_hash: b.engine_hash,
                    tokens_hash: b.local_hash,
                    mm_extra_info: None,
                })
                .collect(),
        }),
        EventKind::Removed { engine_hashes } => {
            dynamo::KvCacheEventData::Removed(dynamo::KvCacheRemoveData { block_hashes: engine_hashes.clone() })
        }
        EventKind::Cleared => dynamo::KvCacheEventData::Cleared,
    };
    dynamo::RouterEvent {
        worker_id: e.worker.instance_id,
        storage_tier: tier_to_dynamo(e.tier),
        event: dynamo::KvCacheEvent { event_id, data, dp_rank: e.worker.dp_rank },
        session_id: None,
    }
}

fn entries(r: &mut Rng) -> Vec<DumpEntry> {
    vec![
        DumpEntry {
            model_name: "llama".into(),
            tenant_id: "default".into(),
            block_size: 16,
            events: random_events(r, 300),
        },
        DumpEntry {
            model_name: "q\"wen\\7b".into(),
            tenant_id: "acme\n".into(),
            block_size: 64,
            events: random_events(r, 50),
        },
        DumpEntry { model_name: "empty".into(), tenant_id: "t".into(), block_size: 1, events: vec![] },
    ]
}

#[test]
fn ours_round_trips_through_ours() {
    let mut r = Rng(0x1234_5678_9abc_def1);
    let mut all = entries(&mut r);
    // Names with ':' survive through the explicit fields.
    all.push(DumpEntry {
        model_name: "org/model:v2".into(),
        tenant_id: "a:b".into(),
        block_size: 32,
        events: random_events(&mut r, 20),
    });
    let mut out = Vec::new();
    write_dump(&mut out, &all);
    let back = parse_dump_counted(&out).unwrap();
    assert_eq!(back.skipped_events, 0);
    assert_eq!(back.skipped_entries, 0);
    assert_eq!(back.entries, all);
}

#[test]
fn dynamo_reads_our_dump() {
    let mut r = Rng(0x0bad_cafe_f00d_0001);
    let ours = entries(&mut r);
    let mut out = Vec::new();
    write_dump(&mut out, &ours);
    // As Dynamo's recovery reads a peer's /dump.
    let theirs: HashMap<String, dynamo::DumpEntry> = serde_json::from_slice(&out).unwrap();
    assert_eq!(theirs.len(), ours.len());
    for entry in &ours {
        let key = format!("{}:{}", entry.model_name, entry.tenant_id);
        let got = &theirs[&key];
        assert_eq!(got.block_size, entry.block_size);
        let want: Vec<dynamo::RouterEvent> =
            entry.events.iter().enumerate().map(|(i, e)| to_dynamo(e, i as u64)).collect();
        assert_eq!(got.events, want, "{key}");
    }
}

#[test]
fn we_read_dynamos_dump() {
    let mut r = Rng(0xfeed_beef_0000_0007);
    let ours = entries(&mut r);
    // As Dynamo's /dump writes it: key "model:tenant", no name fields.
    let mut theirs = serde_json::Map::new();
    for entry in &ours {
        let events: Vec<dynamo::RouterEvent> = entry
            .events
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let mut d = to_dynamo(e, 1000 + i as u64);
                // Dynamo's own extras that we ignore.
                if i % 3 == 0 {
                    d.session_id = Some("s".into());
                }
                if let dynamo::KvCacheEventData::Stored(s) = &mut d.event.data {
                    s.start_position = Some(i as u32);
                    if let Some(b) = s.blocks.first_mut() {
                        b.mm_extra_info = Some(dynamo::BlockExtraInfo {
                            mm_objects: vec![dynamo::BlockMmObjectInfo { mm_hash: 9, offsets: vec![(0, 3)] }],
                        });
                    }
                }
                d
            })
            .collect();
        let value = serde_json::json!({"block_size": entry.block_size, "events": events});
        theirs.insert(format!("{}:{}", entry.model_name, entry.tenant_id), value);
    }
    let body = serde_json::to_vec(&theirs).unwrap();
    let mut back = parse_dump(&body).unwrap();
    back.sort_by(|a, b| a.model_name.cmp(&b.model_name));
    let mut want = ours.clone();
    want.sort_by(|a, b| a.model_name.cmp(&b.model_name));
    // Dynamo has no orphans: what it writes is the events alone.
    want.iter_mut().flat_map(|e| &mut e.events).for_each(|e| e.orphan = None);
    assert_eq!(back, want);
}

#[test]
fn a_dynamo_dump_as_text() {
    // Written by hand the way Dynamo's serializer lays it out.
    let body = br#"{"m:default":{"block_size":16,"events":[
        {"worker_id":7,"storage_tier":"device","event":{"event_id":0,"data":{"stored":{"parent_hash":null,"start_position":null,"blocks":[{"block_hash":11,"tokens_hash":101,"mm_extra_info":null},{"block_hash":12,"tokens_hash":102,"mm_extra_info":null}]}},"dp_rank":0}},
        {"worker_id":7,"storage_tier":"device","event":{"event_id":1,"data":{"stored":{"parent_hash":12,"start_position":null,"blocks":[{"block_hash":13,"tokens_hash":103,"mm_extra_info":null}]}},"dp_rank":1}},
        {"worker_id":8,"storage_tier":"host_pinned","event":{"event_id":0,"data":{"stored":{"parent_hash":null,"start_position":null,"blocks":[{"block_hash":18446744073709551615,"tokens_hash":101,"mm_extra_info":null}]}},"dp_rank":0}},
        {"worker_id":8,"storage_tier":"disk","event":{"event_id":1,"data":{"removed":{"block_hashes":[1,2]}},"dp_rank":0}},
        {"worker_id":9,"storage_tier":"external","event":{"event_id":2,"data":"cleared","dp_rank":0}}
    ]}}"#;
    let b = |engine_hash, local_hash| StoredBlock { engine_hash, local_hash };
    let w = WorkerId::new;
    assert_eq!(
        parse_dump(body).unwrap(),
        vec![DumpEntry {
            model_name: "m".into(),
            tenant_id: "default".into(),
            block_size: 16,
            events: vec![
                Event::stored(w(7, 0), StorageTier::Device, None, vec![b(11, 101), b(12, 102)]).into(),
                Event::stored(w(7, 1), StorageTier::Device, Some(12), vec![b(13, 103)]).into(),
                Event::stored(w(8, 0), StorageTier::HostPinned, None, vec![b(u64::MAX, 101)]).into(),
                Event::removed(w(8, 0), StorageTier::Disk, vec![1, 2]).into(),
                Event { worker: w(9, 0), tier: StorageTier::External, kind: EventKind::Cleared }.into(),
            ],
        }]
    );
}

/// Stores blocks `start..start + len` of the chain named by `seed` for
/// `worker` in `tier`; local hashes depend on the position only through the
/// chain, so queries of that chain walk down through the tiers.
fn chain(worker: WorkerId, tier: StorageTier, seed: u64, start: u64, len: u64) -> Event {
    let engine = |i: u64| seed * 1000 + i;
    let blocks =
        (start..start + len).map(|i| StoredBlock { engine_hash: engine(i), local_hash: 500 + i + seed }).collect();
    Event::stored(worker, tier, start.checked_sub(1).map(engine), blocks)
}

#[test]
fn a_live_index_survives_dump_and_load() {
    let index = Index::new(IndexConfig::new(16));
    let workers: Vec<WorkerId> = (0..6).map(|i| WorkerId::new(100 + i / 2, (i % 2) as u32)).collect();
    for (n, &w) in workers.iter().enumerate() {
        let n = n as u64;
        index.apply(&chain(w, StorageTier::Device, n % 3, 0, 4 + n));
        index.apply(&chain(w, StorageTier::HostPinned, n % 3, 4 + n, 3));
        index.apply(&chain(w, StorageTier::Disk, n % 3, 7 + n, 1));
    }
    // Worker 1 (chain 1) loses a device block in the middle of its prefix,
    // worker 3 (chain 0) the host block its disk block hangs under.
    index.apply(&Event::removed(workers[1], StorageTier::Device, vec![1000 + 2]));
    index.apply(&Event::removed(workers[3], StorageTier::HostPinned, vec![9]));

    let entry = DumpEntry {
        model_name: "m".into(),
        tenant_id: "default".into(),
        block_size: index.block_size(),
        events: index.dump_events(),
    };
    assert_eq!(entry.events.iter().filter(|e| e.orphan.is_some()).count(), 2, "{:?}", entry.events);
    let mut body = Vec::new();
    write_dump(&mut body, std::slice::from_ref(&entry));
    let back = parse_dump(&body).unwrap();
    assert_eq!(back, vec![entry.clone()], "read back as written");
    let replica = Index::new(IndexConfig::new(back[0].block_size));
    let loaded = replica.load_dump(&back[0].events, |_, _| {});
    assert_eq!((loaded.orphans, loaded.blocks_refused), (2, 0));
    assert_eq!(replica.workers(), index.workers());
    assert_eq!(replica.stats().pairs, index.stats().pairs);
    let canonical = |events: Vec<DumpEvent>| {
        let mut v: Vec<String> = events.iter().map(|e| format!("{e:?}")).collect();
        v.sort();
        v
    };
    assert_eq!(canonical(replica.dump_events()), canonical(entry.events.clone()));
    for seed in 0..3u64 {
        let query: Vec<u64> = (0..16).map(|i| 500 + i + seed).collect();
        let sorted = |mut m: crate::index::Matches| {
            m.workers.sort_by_key(|w| w.worker);
            m
        };
        let want = sorted(index.find_matches(&query));
        assert!(want.workers.iter().any(|m| m.host > m.device && m.disk > m.host));
        assert_eq!(sorted(replica.find_matches(&query)), want, "query seed {seed}");
    }
}

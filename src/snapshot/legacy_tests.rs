//! Formats 3 and 4 still read: round trips through a format 4 writer kept
//! here (the one those builds had), every truncation, every header field's
//! corruption, and random bytes (raw, and sealed with valid checksums so
//! the body decoder itself is exercised) never panic; and such a file
//! opened and loaded as a stream says what it decodes to.

use super::*;
use crate::dump::Collect;
use crate::endpoint::ADDRESS_BYTES_MAX;
use crate::ingest::Watermark;
use crate::log::truncate_utf8;
use crate::registry::RegisterArgs;
use crate::snapshot::codec::{put_registrations, FORMAT_VERSION, MAGIC};
use crate::snapshot::SavedRegistration;
use rustc_hash::FxHashMap;

/// A format 4 file image, as the builds that wrote format 4 wrote it.
pub(crate) fn encode(s: &Snapshot) -> Vec<u8> {
    let mut body = Vec::new();
    put_registrations(&mut body, &s.registrations);
    body.extend_from_slice(&(s.indexes.len() as u32).to_le_bytes());
    for ix in &s.indexes {
        put_name(&mut body, &ix.model_name);
        put_name(&mut body, &ix.tenant_id);
        body.extend_from_slice(&ix.block_size.to_le_bytes());
        let table = put_workers(&mut body, &ix.events);
        let count_at = body.len();
        body.extend_from_slice(&0u64.to_le_bytes());
        let events: u64 = ix.events.iter().map(|e| put_event(&mut body, e, &table)).sum();
        body[count_at..count_at + 8].copy_from_slice(&events.to_le_bytes());
    }
    let mut out = Vec::new();
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&4u32.to_le_bytes());
    let version = truncate_utf8(&s.daemon_version, VERSION_BYTES_MAX);
    out.extend_from_slice(&(version.len() as u16).to_le_bytes());
    out.extend_from_slice(version.as_bytes());
    out.extend_from_slice(&s.created_unix_ms.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&xxh3_64(&body).to_le_bytes());
    let header_sum = xxh3_64(&out);
    out.extend_from_slice(&header_sum.to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn put_name(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_workers(out: &mut Vec<u8>, events: &[DumpEvent]) -> FxHashMap<WorkerId, u32> {
    let mut table: FxHashMap<WorkerId, u32> = FxHashMap::default();
    let mut workers: Vec<WorkerId> = Vec::new();
    for e in events {
        table.entry(e.event.worker).or_insert_with(|| {
            workers.push(e.event.worker);
            (workers.len() - 1) as u32
        });
    }
    out.extend_from_slice(&(workers.len() as u32).to_le_bytes());
    for w in &workers {
        out.extend_from_slice(&w.instance_id.to_le_bytes());
        out.extend_from_slice(&w.dp_rank.to_le_bytes());
    }
    table
}

fn put_event(out: &mut Vec<u8>, DumpEvent { event: e, orphan }: &DumpEvent, table: &FxHashMap<WorkerId, u32>) -> u64 {
    let head = |out: &mut Vec<u8>, kind: u8, parent: Option<u64>, orphan: Option<&Orphan>| {
        let tag = e.tier.index() as u8
            | kind << TAG_KIND_SHIFT
            | if parent.is_some() { TAG_HAS_PARENT } else { 0 }
            | if orphan.is_some() { TAG_ORPHAN } else { 0 };
        out.push(tag);
        out.extend_from_slice(&table[&e.worker].to_le_bytes());
        if let Some(p) = parent {
            out.extend_from_slice(&p.to_le_bytes());
        }
        if let Some(o) = orphan {
            out.extend_from_slice(&o.position.to_le_bytes());
            out.push(o.anchor.is_some() as u8);
            if let Some(a) = o.anchor {
                out.extend_from_slice(&a.to_le_bytes());
            }
            out.extend_from_slice(&(o.missing.len() as u32).to_le_bytes());
            for l in &o.missing {
                out.extend_from_slice(&l.to_le_bytes());
            }
        }
    };
    match &e.kind {
        EventKind::Stored { parent, blocks } => {
            let (mut parent, mut orphan, mut events) = (*parent, orphan.as_ref(), 0);
            for piece in blocks.chunks(BLOCKS_PER_EVENT_MAX).chain(blocks.is_empty().then_some(&[][..])) {
                head(out, KIND_STORED, parent, orphan.take());
                out.extend_from_slice(&(piece.len() as u32).to_le_bytes());
                for b in piece {
                    out.extend_from_slice(&b.engine_hash.to_le_bytes());
                    out.extend_from_slice(&b.local_hash.to_le_bytes());
                }
                parent = piece.last().map(|b| b.engine_hash);
                events += 1;
            }
            events
        }
        EventKind::Removed { engine_hashes } => {
            head(out, KIND_REMOVED, None, None);
            out.extend_from_slice(&(engine_hashes.len() as u32).to_le_bytes());
            for h in engine_hashes {
                out.extend_from_slice(&h.to_le_bytes());
            }
            1
        }
        EventKind::Cleared => {
            head(out, KIND_CLEARED, None, None);
            1
        }
    }
}

pub(crate) fn sample() -> Snapshot {
    let w1 = WorkerId::new(1, 0);
    let w2 = WorkerId::new(u64::MAX, 3);
    let b = |e: u64, l: u64| StoredBlock { engine_hash: e, local_hash: l };
    Snapshot {
        created_unix_ms: 1_700_000_000_123,
        daemon_version: "0.1.0".into(),
        registrations: vec![
            SavedRegistration {
                args: RegisterArgs {
                    instance_id: w1.instance_id,
                    dp_rank: w1.dp_rank,
                    endpoint: "tcp://127.0.0.1:5557".into(),
                    replay_endpoint: Some("tcp://127.0.0.1:5558".into()),
                    model_name: "llama".into(),
                    tenant_id: "default".into(),
                    block_size: 16,
                },
                last_seq: Some(Watermark { seq: 41, digest: Some(0x5eed) }),
            },
            SavedRegistration {
                args: RegisterArgs {
                    instance_id: w2.instance_id,
                    dp_rank: w2.dp_rank,
                    endpoint: "ipc:///tmp/ä".into(),
                    replay_endpoint: None,
                    model_name: "m:with:colons".into(),
                    tenant_id: "t".into(),
                    block_size: 4,
                },
                last_seq: None,
            },
        ],
        indexes: vec![
            SavedIndex {
                model_name: "llama".into(),
                tenant_id: "default".into(),
                block_size: 16,
                events: vec![
                    Event::stored(w1, StorageTier::Device, None, vec![b(1, 10), b(2, 20)]).into(),
                    Event::stored(w1, StorageTier::HostPinned, Some(2), vec![b(u64::MAX, 0)]).into(),
                    Event::stored(w2, StorageTier::External, Some(7), vec![b(3, 30)]).into(),
                    DumpEvent {
                        event: Event::stored(w2, StorageTier::Disk, Some(8), vec![b(5, 50), b(6, 60)]),
                        orphan: Some(Orphan { position: 3, anchor: Some(3), missing: vec![40] }),
                    },
                    DumpEvent {
                        event: Event::stored(w1, StorageTier::Device, Some(9), vec![b(11, 70)]),
                        orphan: Some(Orphan { position: 2, anchor: None, missing: vec![41, 42] }),
                    },
                    Event::removed(w2, StorageTier::Disk, vec![3, 4]).into(),
                    Event::cleared(w1).into(),
                ],
            },
            SavedIndex { model_name: "empty".into(), tenant_id: "t".into(), block_size: 1, events: vec![] },
        ],
    }
}

/// Rebuilds the header around `body` with valid checksums (a "writer bug" file).
fn seal(body: &[u8]) -> Vec<u8> {
    seal_as(4, body)
}

/// `seal`, with the header saying `format`.
fn seal_as(format: u32, body: &[u8]) -> Vec<u8> {
    let s = Snapshot { created_unix_ms: 5, daemon_version: "x".into(), registrations: vec![], indexes: vec![] };
    let mut out = encode(&s);
    out[8..12].copy_from_slice(&format.to_le_bytes());
    let header_len = out.len() - 8; // empty body: 8 bytes of counts
    out.truncate(header_len);
    let fixed = header_len - 32;
    out[fixed + 8..fixed + 16].copy_from_slice(&(body.len() as u64).to_le_bytes());
    out[fixed + 16..fixed + 24].copy_from_slice(&xxh3_64(body).to_le_bytes());
    let sum = xxh3_64(&out[..header_len - 8]);
    out[header_len - 8..].copy_from_slice(&sum.to_le_bytes());
    out.extend_from_slice(body);
    out
}

fn header_len(file: &[u8]) -> usize {
    14 + u16::from_le_bytes([file[12], file[13]]) as usize + 32
}

#[test]
fn round_trip_is_exact() {
    let s = sample();
    let bytes = encode(&s);
    assert_eq!(&bytes[..8], b"KVIXSNAP");
    assert_eq!(decode(&bytes).unwrap(), s);
    let empty = Snapshot { created_unix_ms: 0, daemon_version: String::new(), registrations: vec![], indexes: vec![] };
    assert_eq!(decode(&encode(&empty)).unwrap(), empty);
}

#[test]
fn a_format_4_file_opened_as_a_stream_loads_what_it_decodes_to() {
    let s = sample();
    let bytes = encode(&s);
    let opened = crate::snapshot::read::open(&bytes[..], bytes.len() as u64).unwrap();
    assert_eq!(opened.head.format, 4);
    assert_eq!(opened.head.registrations, s.registrations);
    assert_eq!((opened.head.created_unix_ms, opened.head.daemon_version.as_str()), (s.created_unix_ms, "0.1.0"));
    let mut sink = Collect::default();
    let loaded = opened.load(&mut sink).unwrap();
    assert_eq!(sink.0, s.indexes);
    assert_eq!((loaded.indexes, loaded.events), (2, 7));
    // Read whole, it is still bounded by what its header announces.
    let mut longer = bytes.clone();
    longer.push(0);
    let e = crate::snapshot::read::open(&longer[..], longer.len() as u64).err();
    assert_eq!(e, Some(SnapshotError::TrailingBytes { extra: 1 }));
}

#[test]
fn a_format_3_file_loads_with_watermarks_without_a_digest() {
    // One registration as format 3 wrote it, watermark 41, and no index.
    let mut body = Vec::new();
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(&7u64.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend_from_slice(&16u32.to_le_bytes());
    let put = |body: &mut Vec<u8>, text: &str| {
        body.extend_from_slice(&(text.len() as u32).to_le_bytes());
        body.extend_from_slice(text.as_bytes());
    };
    put(&mut body, "tcp://127.0.0.1:5557");
    body.push(0);
    put(&mut body, "m");
    put(&mut body, "t");
    body.push(1);
    body.extend_from_slice(&41u64.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    let s = decode(&seal_as(3, &body)).unwrap();
    assert_eq!(s.registrations[0].last_seq, Some(Watermark { seq: 41, digest: None }));
    // The same body read as format 4 lacks the digest flag.
    assert!(matches!(decode(&seal_as(4, &body)), Err(SnapshotError::Malformed(_))));
    assert_eq!(decode(&seal_as(2, &body)), Err(SnapshotError::OldVersion { format: 2 }));
}

#[test]
fn seal_matches_encode() {
    let bytes = encode(&sample());
    let body = &bytes[header_len(&bytes)..];
    assert_eq!(decode(&seal(body)).unwrap().indexes, sample().indexes);
}

#[test]
fn every_truncation_fails_cleanly() {
    let bytes = encode(&sample());
    for len in 0..bytes.len() {
        let e = decode(&bytes[..len]).expect_err("a prefix must not decode");
        let expected = match len {
            0 => matches!(e, SnapshotError::Empty),
            _ => matches!(e, SnapshotError::Truncated { .. }),
        };
        assert!(expected, "prefix of {len} bytes: {e:?}");
        let opened = crate::snapshot::read::open(&bytes[..len], len as u64).err();
        assert_eq!(opened, Some(e), "opened as a stream, prefix of {len} bytes");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert_eq!(decode(&longer), Err(SnapshotError::TrailingBytes { extra: 1 }));
}

#[test]
fn foreign_future_and_corrupt_headers_are_named() {
    let bytes = encode(&sample());
    let mut foreign = bytes.clone();
    foreign[0] = b'X';
    assert_eq!(decode(&foreign), Err(SnapshotError::Foreign));
    assert_eq!(decode(b"{\"json\": true}"), Err(SnapshotError::Foreign));
    assert_eq!(decode(b"KV"), Err(SnapshotError::Truncated { have: 2, need: 12 }));

    let mut future = bytes.clone();
    future[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    assert_eq!(decode(&future), Err(SnapshotError::FutureVersion { format: FORMAT_VERSION + 1 }));
    let mut zero = bytes.clone();
    zero[8..12].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(decode(&zero), Err(SnapshotError::UnknownVersion { format: 0 }));

    // Any flipped bit past the format field is caught by a checksum (or a
    // length check when it hits a length).
    let h = header_len(&bytes);
    for i in 12..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0x10;
        let e = decode(&b).expect_err("corruption must be detected");
        if i >= h {
            assert_eq!(e, SnapshotError::Checksum, "byte {i}");
        }
    }
}

#[test]
fn bad_bodies_with_valid_checksums_are_malformed_not_half_decoded() {
    let bytes = encode(&sample());
    let body = bytes[header_len(&bytes)..].to_vec();
    // Every truncation of the body, sealed: the decoder itself must refuse.
    for len in 0..body.len() {
        match decode(&seal(&body[..len])) {
            Err(SnapshotError::Malformed(_)) => {}
            other => panic!("body prefix of {len} bytes: {other:?}"),
        }
    }
    let mut extra = body.clone();
    extra.push(0);
    assert!(matches!(decode(&seal(&extra)), Err(SnapshotError::Malformed(_))));
    // Huge counts are refused before any allocation.
    let mut huge = body.clone();
    huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(decode(&seal(&huge)), Err(SnapshotError::Malformed(_))));
}

#[test]
fn body_limit_is_checked_from_the_header() {
    let mut bytes = encode(&sample());
    let h = header_len(&bytes);
    let fixed = h - 32;
    bytes[fixed + 8..fixed + 16].copy_from_slice(&(BODY_BYTES_MAX + 1).to_le_bytes());
    let sum = xxh3_64(&bytes[..h - 8]);
    bytes[h - 8..h].copy_from_slice(&sum.to_le_bytes());
    assert_eq!(decode(&bytes), Err(SnapshotError::TooLarge { bytes: BODY_BYTES_MAX + 1, max: BODY_BYTES_MAX }));
    let opened = crate::snapshot::read::open(&bytes[..], bytes.len() as u64).err();
    assert_eq!(
        opened,
        Some(SnapshotError::TooLarge { bytes: BODY_BYTES_MAX + 1, max: BODY_BYTES_MAX }),
        "refused before it is read"
    );
}

use crate::test_rng::Rng;

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0x5eed);
    let valid = encode(&sample());
    let body = valid[header_len(&valid)..].to_vec();
    for round in 0..20_000 {
        let len = (rng.next() % 200) as usize;
        let mut junk: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if round % 2 == 0 {
            // Raw junk: rejected by the header checks.
            if round % 4 == 0 && len >= 8 {
                junk[..8].copy_from_slice(&MAGIC);
            }
            assert!(decode(&junk).is_err());
        } else {
            // A valid body with a few bytes mutated, sealed, so the body
            // decoder meets it; or junk appended to a valid prefix.
            let mut b = body.clone();
            for _ in 0..1 + rng.next() % 4 {
                let i = (rng.next() as usize) % b.len();
                b[i] = rng.next() as u8;
            }
            if round % 3 == 0 {
                b.truncate((rng.next() as usize) % b.len());
                b.extend_from_slice(&junk);
            }
            let _ = decode(&seal(&b));
        }
    }
}

#[test]
fn a_chain_longer_than_an_event_is_written_as_chained_events() {
    let w = WorkerId::new(9, 1);
    let n = BLOCKS_PER_EVENT_MAX + 5;
    let blocks: Vec<StoredBlock> = (0..n as u64).map(|i| StoredBlock { engine_hash: i + 100, local_hash: i }).collect();
    let mut s = sample();
    // An orphan's chain: the first piece keeps where it hangs.
    let orphan = Orphan { position: 9, anchor: None, missing: (0..9).collect() };
    s.indexes[1].events = vec![DumpEvent {
        event: Event::stored(w, StorageTier::Disk, Some(7), blocks.clone()),
        orphan: Some(orphan.clone()),
    }];
    let back = decode(&encode(&s)).unwrap();
    let (first, rest) = blocks.split_at(BLOCKS_PER_EVENT_MAX);
    let want = vec![
        DumpEvent { event: Event::stored(w, StorageTier::Disk, Some(7), first.to_vec()), orphan: Some(orphan) },
        Event::stored(w, StorageTier::Disk, Some(first.last().unwrap().engine_hash), rest.to_vec()).into(),
    ];
    assert_eq!(back.indexes[1].events, want);
    assert_eq!(back.registrations, s.registrations);
    // A store of no blocks stays one event.
    s.indexes[1].events = vec![Event::stored(w, StorageTier::Disk, Some(7), Vec::new()).into()];
    assert_eq!(decode(&encode(&s)).unwrap().indexes[1].events, s.indexes[1].events);
}

#[test]
fn every_limit_is_the_daemon_s_own() {
    // What the registry and ingest accept, a snapshot holds: at the limits
    // it round-trips, past them it is refused.
    let mut s = sample();
    s.registrations[0].args.model_name = "m".repeat(NAME_BYTES_MAX);
    s.registrations[0].args.endpoint = format!("tcp://{}:1", "h".repeat(ADDRESS_BYTES_MAX - 8));
    s.indexes[1].tenant_id = "t".repeat(NAME_BYTES_MAX);
    assert_eq!(decode(&encode(&s)).unwrap().registrations, s.registrations);
    for long in [
        |s: &mut Snapshot| s.registrations[0].args.model_name.push('m'),
        |s: &mut Snapshot| s.registrations[0].args.endpoint.push('1'),
        |s: &mut Snapshot| s.indexes[1].tenant_id.push('t'),
    ] {
        let mut s = s.clone();
        long(&mut s);
        // The encoder asserts what the registry guarantees; a file past it is refused.
        let bytes = std::panic::catch_unwind(|| encode(&s));
        if let Ok(bytes) = bytes {
            assert!(matches!(decode(&bytes), Err(SnapshotError::Malformed(_))));
        }
    }
}

#[test]
fn an_orphan_whose_positions_do_not_add_up_is_refused() {
    let w = WorkerId::new(9, 1);
    let b = StoredBlock { engine_hash: 5, local_hash: 6 };
    for orphan in [
        Orphan { position: 1, anchor: None, missing: vec![] },
        Orphan { position: 2, anchor: Some(3), missing: vec![7, 8] },
        Orphan { position: 3, anchor: None, missing: vec![7] },
    ] {
        let mut s = sample();
        s.indexes[1].events =
            vec![DumpEvent { event: Event::stored(w, StorageTier::Device, Some(4), vec![b]), orphan: Some(orphan) }];
        assert!(matches!(decode(&encode(&s)), Err(SnapshotError::Malformed(_))));
    }
}

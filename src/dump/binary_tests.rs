//! The compact peer format: round trips, and every truncation, every
//! corrupted byte and each malformed record refused by name.

use super::*;
use crate::dump::{Collect, DumpEntry};

fn w(i: u64, r: u32) -> WorkerId {
    WorkerId::new(i, r)
}

fn stored(worker: WorkerId, tier: StorageTier, parent: Option<u64>, hashes: &[u64]) -> DumpEvent {
    let blocks = hashes.iter().map(|&h| StoredBlock { engine_hash: h, local_hash: h ^ 0x5555 }).collect();
    DumpEvent::plain(Event::stored(worker, tier, parent, blocks))
}

fn entries() -> Vec<DumpEntry> {
    let orphan = DumpEvent {
        event: Event::stored(
            w(7, 1),
            StorageTier::Disk,
            Some(77),
            vec![StoredBlock { engine_hash: 13, local_hash: 98 }],
        ),
        orphan: Some(Orphan { position: 4, anchor: Some(12), missing: vec![41, 42] }),
    };
    let root_orphan = DumpEvent {
        event: Event::stored(
            w(7, 1),
            StorageTier::Device,
            Some(78),
            vec![StoredBlock { engine_hash: 14, local_hash: 9 }],
        ),
        orphan: Some(Orphan { position: 2, anchor: None, missing: vec![43, 44] }),
    };
    vec![
        DumpEntry {
            model_name: "m:with:colons".into(),
            tenant_id: "t".into(),
            block_size: 16,
            events: vec![
                stored(w(7, 1), StorageTier::Device, None, &[11, 12]),
                orphan,
                root_orphan,
                stored(w(7, 0), StorageTier::HostPinned, Some(u64::MAX), &[u64::MAX - 1]),
                DumpEvent::plain(Event::removed(w(8, 0), StorageTier::External, vec![5, 6])),
                DumpEvent::plain(Event::cleared(w(9, 2))),
                stored(w(7, 1), StorageTier::Device, Some(12), &[]),
            ],
        },
        DumpEntry { model_name: "empty".into(), tenant_id: "default".into(), block_size: 1, events: vec![] },
        DumpEntry {
            model_name: "n".into(),
            tenant_id: "default".into(),
            block_size: crate::ingest::BLOCK_SIZE_MAX,
            events: vec![stored(w(1, 0), StorageTier::Device, None, &[1])],
        },
    ]
}

fn encode(entries: &[DumpEntry]) -> Vec<u8> {
    let (mut out, mut wr) = (Vec::new(), Writer::default());
    wr.start(&mut out);
    for e in entries {
        wr.index(&mut out, &e.model_name, &e.tenant_id, e.block_size);
        for ev in &e.events {
            wr.event(&mut out, ev);
        }
    }
    wr.end(&mut out);
    out
}

fn decode(bytes: &[u8]) -> Result<Vec<DumpEntry>, String> {
    let mut sink = Collect::default();
    read_compact(bytes, &mut sink).map_err(|e| e.message())?;
    Ok(sink.0)
}

#[test]
fn a_compact_dump_reads_back_as_written() {
    let e = entries();
    let bytes = encode(&e);
    assert_eq!(decode(&bytes).unwrap(), e);
    let pairs: u64 = e.iter().map(DumpEntry::pairs).sum();
    // Names, worker records and event heads aside, a block is its two hashes.
    assert!(bytes.len() < 400 + 16 * pairs as usize, "{} bytes", bytes.len());
}

#[test]
fn a_chain_longer_than_an_event_goes_as_chained_events() {
    let hashes: Vec<u64> = (1..=BLOCKS_PER_EVENT_MAX as u64 + 3).collect();
    let long = DumpEntry {
        model_name: "m".into(),
        tenant_id: "t".into(),
        block_size: 4,
        events: vec![stored(w(1, 0), StorageTier::Device, None, &hashes)],
    };
    let back = decode(&encode(std::slice::from_ref(&long))).unwrap();
    assert_eq!(back[0].events.len(), 2);
    assert_eq!(back[0].pairs(), hashes.len() as u64);
    let EventKind::Stored { parent, .. } = &back[0].events[1].event.kind else { panic!() };
    assert_eq!(*parent, Some(BLOCKS_PER_EVENT_MAX as u64), "the second piece hangs under the first's last block");
}

#[test]
fn every_truncation_is_refused() {
    let bytes = encode(&entries());
    for cut in 0..bytes.len() {
        let err = decode(&bytes[..cut]).expect_err(&format!("cut at {cut}"));
        let expected = if cut < 8 { "truncated" } else { "truncated: the dump ends before its end record" };
        assert!(err.contains(expected), "cut at {cut}: {err}");
    }
}

#[test]
fn every_corrupted_byte_is_refused() {
    let bytes = encode(&entries());
    for at in 0..bytes.len() {
        for flip in [0x01u8, 0x80] {
            let mut bad = bytes.clone();
            bad[at] ^= flip;
            assert!(decode(&bad).is_err(), "byte {at} ^ {flip:#x} was read");
        }
    }
}

#[test]
fn malformed_records_are_refused_by_name() {
    let good = encode(&entries());
    let head = |rest: &[u8]| {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&FORMAT.to_le_bytes());
        b.extend_from_slice(rest);
        b
    };
    let index = |name_len: u32, block_size: u32| {
        let mut b = vec![REC_INDEX];
        b.extend_from_slice(&name_len.to_le_bytes());
        b.extend(std::iter::repeat_n(b'm', name_len as usize));
        b.extend_from_slice(&1u32.to_le_bytes());
        b.push(b't');
        b.extend_from_slice(&block_size.to_le_bytes());
        b
    };
    let worker = [&[REC_WORKER][..], &7u64.to_le_bytes(), &0u32.to_le_bytes()].concat();
    let too_many = [&[REC_EVENT, 0][..], &(BLOCKS_PER_EVENT_MAX as u32 + 1).to_le_bytes()].concat();
    let mut trailing = good.clone();
    trailing.push(0);
    let mut future = good.clone();
    future[8] = 2;
    for (bytes, why) in [
        (b"KVIXSNAP\x01\x00\x00\x00".to_vec(), "bad magic"),
        (future, "format 2; this build reads format 1"),
        (head(&[9]), "unknown record kind 9"),
        (head(&worker), "a worker before its index"),
        (head(&[index(1, 4), vec![REC_EVENT, 0]].concat()), "an event before its worker"),
        (head(&index(0, 4)), "a model name of 0 bytes"),
        (head(&index(NAME_BYTES_READ_MAX as u32 + 1, 4)), "outside 1..=4096"),
        (head(&index(1, 0)), "block_size 0 outside"),
        (head(&[index(1, 4), worker.clone(), vec![REC_EVENT, 0b0100_0000]].concat()), "bad event tag 0x40"),
        (head(&[index(1, 4), worker.clone(), vec![REC_EVENT, 0b0001_0100]].concat()), "bad event tag 0x14"),
        (head(&[index(1, 4), worker.clone(), too_many].concat()), "over the limit of 262144"),
        (head(&[index(1, 4), vec![REC_END], 1u64.to_le_bytes().to_vec(), vec![0; 8]].concat()), "counts 1 events"),
        (trailing, "bytes after the end record"),
    ] {
        let err = decode(&bytes).expect_err(why);
        assert!(err.contains(why), "{why}: {err}");
    }
}

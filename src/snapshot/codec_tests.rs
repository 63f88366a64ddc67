//! The streamed format: a file written from live indexes reads back as
//! they dump, with its registrations and watermarks; every truncation,
//! every flipped byte, bytes past the end and every count past its limit
//! are named; mutated files never panic the reader.

use super::*;
use crate::dump::binary::Counts;
use crate::dump::stream::{DumpStream, Source};
use crate::dump::{Collect, DumpEntry};
use crate::event::{Event, StorageTier, StoredBlock};
use crate::index::{Index, IndexConfig};
use crate::registry::INDEXES_MAX;
use crate::snapshot::read::{open, Head, LoadedFile};
use crate::snapshot::write::write;
use crate::test_rng::Rng;
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64;

fn registrations() -> Vec<SavedRegistration> {
    let reg =
        |instance_id: u64, dp_rank: u32, endpoint: &str, replay: Option<&str>, model: &str, bs: u32| RegisterArgs {
            instance_id,
            dp_rank,
            endpoint: endpoint.into(),
            replay_endpoint: replay.map(Into::into),
            model_name: model.into(),
            tenant_id: "default".into(),
            block_size: bs,
        };
    vec![
        SavedRegistration {
            args: reg(1, 0, "tcp://127.0.0.1:5557", Some("tcp://127.0.0.1:5558"), "llama", 16),
            last_seq: Some(Watermark { seq: 41, digest: Some(0x5eed) }),
        },
        SavedRegistration {
            args: reg(u64::MAX, 3, "ipc:///tmp/ä", None, "m:with:colons", 4),
            last_seq: Some(Watermark { seq: 7, digest: None }),
        },
        SavedRegistration { args: reg(2, 1, "tcp://h:1", None, "llama", 16), last_seq: None },
    ]
}

fn chain(instance: u64, rank: u32, tier: StorageTier, parent: Option<u64>, first: u64, n: u64) -> Event {
    let blocks = (first..first + n).map(|h| StoredBlock { engine_hash: h, local_hash: h * 3 + 1 }).collect();
    Event::stored(WorkerId::new(instance, rank), tier, parent, blocks)
}

/// Two indexes with workers in several tiers, an orphan, and an empty one.
fn indexes() -> Vec<(&'static str, Arc<Index>)> {
    let a = Arc::new(Index::new(IndexConfig::new(16)));
    for i in 0..12u64 {
        a.apply(&chain(i, (i % 3) as u32, StorageTier::Device, None, i * 1000, 1 + i % 5));
    }
    a.apply(&chain(1, 1, StorageTier::HostPinned, Some(1000), 1_000_000, 2));
    // A hole: worker 4's second block goes, so its third is an orphan.
    a.apply(&Event::removed(WorkerId::new(4, 1), StorageTier::Device, vec![4001]));
    let b = Arc::new(Index::new(IndexConfig::new(4)));
    b.apply(&chain(u64::MAX, 3, StorageTier::Disk, None, 77, 3));
    vec![("llama", a), ("empty", Arc::new(Index::new(IndexConfig::new(1)))), ("m:with:colons", b)]
}

fn file_of(registrations: &[SavedRegistration], indexes: &[(&str, Arc<Index>)]) -> (Vec<u8>, Counts) {
    let sources = indexes
        .iter()
        .map(|(m, ix)| Source { model_name: (*m).into(), tenant_id: "default".into(), index: ix.clone() })
        .collect();
    let mut out = Vec::new();
    let written = write(&mut out, 1_700_000_000_123, "0.1.0", registrations, DumpStream::records(sources)).unwrap();
    assert_eq!(written.bytes, out.len() as u64);
    assert_eq!(written.registrations, registrations.len());
    (out, written.counts)
}

fn file() -> Vec<u8> {
    file_of(&registrations(), &indexes()).0
}

/// Opens and loads `bytes` as a file of that length.
fn read(bytes: &[u8]) -> Result<(Head, Vec<DumpEntry>, LoadedFile), SnapshotError> {
    let opened = open(bytes, bytes.len() as u64)?;
    let head = opened.head.clone();
    let mut sink = Collect::default();
    let loaded = opened.load(&mut sink)?;
    Ok((head, sink.0, loaded))
}

/// Where the registrations section begins: past the header.
fn section_at(file: &[u8]) -> usize {
    14 + u16::from_le_bytes([file[12], file[13]]) as usize + 8
}

/// Where the events begin: past the header and the registrations.
fn events_at(file: &[u8]) -> usize {
    let at = section_at(file);
    at + 4 + u32::from_le_bytes(file[at..at + 4].try_into().unwrap()) as usize
}

/// A file of these registration bytes, records (with their end) and
/// trailer counts, with a right checksum.
fn forge(registrations: &[u8], records: &[u8], counts: [u64; 4]) -> Vec<u8> {
    let valid = file_of(&[], &[]).0;
    let mut out = valid[..section_at(&valid)].to_vec();
    out.extend_from_slice(&(registrations.len() as u32).to_le_bytes());
    out.extend_from_slice(registrations);
    out.extend_from_slice(records);
    out.extend_from_slice(&(counts[0] as u32).to_le_bytes());
    out.extend_from_slice(&(counts[1] as u32).to_le_bytes());
    out.extend_from_slice(&counts[2].to_le_bytes());
    out.extend_from_slice(&counts[3].to_le_bytes());
    let sum = xxh3_64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// `file`'s checksum made right again after a change.
fn reseal(file: &mut [u8]) {
    let n = file.len() - 8;
    let sum = xxh3_64(&file[..n]);
    file[n..].copy_from_slice(&sum.to_le_bytes());
}

#[test]
fn a_file_reads_back_as_the_indexes_dump() {
    let (bytes, counts) = file_of(&registrations(), &indexes());
    assert_eq!(&bytes[..8], b"KVIXSNAP");
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), FORMAT_VERSION);
    let (head, entries, loaded) = read(&bytes).unwrap();
    let want = Head {
        format: FORMAT_VERSION,
        created_unix_ms: 1_700_000_000_123,
        daemon_version: "0.1.0".into(),
        registrations: registrations(),
    };
    assert_eq!(head, want);
    let dumps: Vec<DumpEntry> = indexes()
        .into_iter()
        .map(|(m, ix)| DumpEntry {
            model_name: m.into(),
            tenant_id: "default".into(),
            block_size: ix.block_size(),
            events: ix.dump_events(),
        })
        .collect();
    assert!(dumps[0].events.iter().any(|e| e.orphan.is_some()), "an orphan is carried");
    assert_eq!(entries, dumps);
    let pairs: u64 = dumps.iter().map(DumpEntry::pairs).sum();
    assert_eq!(loaded, LoadedFile { indexes: 3, events: counts.events, blocks: pairs });
    assert_eq!((counts.indexes, counts.blocks), (3, pairs));
    // Nothing at all is a file too.
    let (empty, _) = file_of(&[], &[]);
    let (head, entries, _) = read(&empty).unwrap();
    assert!(head.registrations.is_empty() && entries.is_empty());
}

#[test]
fn every_truncation_is_named() {
    let bytes = file();
    for len in 0..bytes.len() {
        let e = read(&bytes[..len]).expect_err("a prefix must not load");
        match e {
            SnapshotError::Empty => assert_eq!(len, 0),
            SnapshotError::Truncated { have, need } => assert!(have == len as u64 && need > have, "{len}: {e:?}"),
            e => panic!("prefix of {len} bytes: {e:?}"),
        }
    }
}

#[test]
fn every_flipped_byte_is_caught_and_a_flipped_hash_by_the_checksum() {
    let bytes = file();
    for at in 0..bytes.len() {
        for flip in [0x01u8, 0x80] {
            let mut bad = bytes.clone();
            bad[at] ^= flip;
            let e = read(&bad).expect_err(&format!("byte {at} ^ {flip:#x} was read"));
            if at >= bytes.len() - TRAILER_BYTES {
                assert_eq!(e, SnapshotError::Checksum, "trailer byte {at}");
            }
        }
    }
    // The first block's engine hash, inside the events.
    let at = events_at(&bytes) + bytes[events_at(&bytes)..].windows(8).position(|w| w == 0u64.to_le_bytes()).unwrap();
    let mut bad = bytes.clone();
    bad[at] ^= 0x40;
    assert_eq!(read(&bad).err(), Some(SnapshotError::Checksum));
}

#[test]
fn bytes_past_the_end_and_other_formats_are_named() {
    let bytes = file();
    let mut longer = bytes.clone();
    longer.push(0);
    assert_eq!(read(&longer).err(), Some(SnapshotError::TrailingBytes { extra: 1 }));
    for (format, e) in [
        (FORMAT_VERSION + 1, SnapshotError::FutureVersion { format: FORMAT_VERSION + 1 }),
        (0, SnapshotError::UnknownVersion { format: 0 }),
        (2, SnapshotError::OldVersion { format: 2 }),
    ] {
        let mut b = bytes.clone();
        b[8..12].copy_from_slice(&format.to_le_bytes());
        assert_eq!(read(&b).err(), Some(e));
    }
    let mut foreign = bytes.clone();
    foreign[0] = b'X';
    assert_eq!(read(&foreign).err(), Some(SnapshotError::Foreign));
    assert_eq!(read(b"KV").err(), Some(SnapshotError::Truncated { have: 2, need: 12 }));
    let mut long_version = bytes.clone();
    long_version[12..14].copy_from_slice(&(VERSION_BYTES_MAX as u16 + 1).to_le_bytes());
    assert_eq!(read(&long_version).err(), Some(SnapshotError::CorruptHeader));
}

fn malformed(bytes: &[u8], why: &str) {
    match read(bytes) {
        Err(SnapshotError::Malformed(m)) => assert!(m.contains(why), "{why}: {m}"),
        other => panic!("{why}: {other:?}"),
    }
}

#[test]
fn every_count_past_its_limit_is_refused_before_it_is_read() {
    let end = [0u8]; // the records' end
                     // A registrations section larger than any registry holds.
    let mut huge = forge(&[], &end, [0; 4]);
    let at = section_at(&huge);
    huge[at..at + 4].copy_from_slice(&(REGISTRATIONS_BYTES_MAX as u32 + 1).to_le_bytes());
    malformed(&huge, "over the limit");
    // More registrations than listeners.
    malformed(&forge(&(REGISTRATIONS_MAX as u32 + 1).to_le_bytes(), &end, [0; 4]), "over the limit of 4096");
    // More indexes than a daemon keeps.
    let mut records = Vec::new();
    for i in 0..=INDEXES_MAX {
        let name = format!("m{i}");
        records.push(1);
        records.extend_from_slice(&(name.len() as u32).to_le_bytes());
        records.extend_from_slice(name.as_bytes());
        records.extend_from_slice(&1u32.to_le_bytes());
        records.push(b't');
        records.extend_from_slice(&4u32.to_le_bytes());
    }
    records.push(0);
    let regs = 0u32.to_le_bytes();
    malformed(&forge(&regs, &records, [0, INDEXES_MAX as u64 + 1, 0, 0]), "more than 1024 indexes");
    // Counts that do not match what came (a writer bug), checksum right.
    let mut miscounted = file();
    let n = miscounted.len() - TRAILER_BYTES + 8;
    miscounted[n] ^= 1;
    reseal(&mut miscounted);
    malformed(&miscounted, "the trailer counts");
    // A record the compact reader refuses, by name and offset.
    malformed(&forge(&regs, &[9], [0; 4]), "unknown record kind 9");
    // Bytes after the registrations inside their section.
    malformed(&forge(&[0, 0, 0, 0, 0], &end, [0; 4]), "bytes left after the registrations");
}

#[test]
fn mutated_files_never_panic_the_reader() {
    let mut rng = Rng(0x5eed);
    let valid = file();
    let events = events_at(&valid);
    for round in 0..5_000 {
        let mut b = valid.clone();
        for _ in 0..1 + rng.next() % 4 {
            let i = events + (rng.next() as usize) % (b.len() - events);
            b[i] ^= 1 + (rng.next() % 255) as u8;
        }
        if round % 3 == 0 {
            b.truncate(events + (rng.next() as usize) % (b.len() - events));
            let junk: Vec<u8> = (0..rng.next() % 64).map(|_| rng.next() as u8).collect();
            b.extend_from_slice(&junk);
        }
        if b != valid {
            assert!(read(&b).is_err(), "round {round}");
        }
        // Sealed again, so the record reader meets the damage itself.
        if b.len() >= events + TRAILER_BYTES {
            reseal(&mut b);
            let _ = read(&b);
        }
    }
}

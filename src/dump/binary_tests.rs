//! The compact peer format: round trips, with and without watermarks,
//! and every truncation, every corrupted byte and each malformed record
//! refused by name.

use super::*;
use crate::dump::{Collect, DumpEntry};
use crate::endpoint::ADDRESS_BYTES_MAX;
use crate::ingest::{StreamMark, Watermark, DP_RANKS_PER_LISTENER_MAX, LISTENERS_MAX};

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
    decode_marked(bytes).map(|(entries, _)| entries)
}

/// A sink that keeps entries, and the watermarks if any came.
#[derive(Default)]
struct Marked {
    entries: Collect,
    marks: Option<Vec<PeerWatermark>>,
}

impl DumpSink for Marked {
    fn index(&mut self, model_name: &str, tenant_id: &str, block_size: u32) -> Result<(), String> {
        self.entries.index(model_name, tenant_id, block_size)
    }

    fn event(&mut self, event: DumpEvent) -> Result<(), String> {
        self.entries.event(event)
    }

    fn watermarks(&mut self, marks: Vec<PeerWatermark>) -> Result<(), String> {
        assert!(self.marks.replace(marks).is_none(), "watermarks are handed on once");
        Ok(())
    }
}

fn decode_marked(bytes: &[u8]) -> Result<(Vec<DumpEntry>, Option<Vec<PeerWatermark>>), String> {
    let mut sink = Marked::default();
    read_compact(bytes, &mut sink).map_err(|e| e.message())?;
    Ok((sink.entries.0, sink.marks))
}

fn mark(instance: u64, rank: u32, seq: u64, digest: Option<u64>, ranks: &[u32]) -> PeerWatermark {
    PeerWatermark {
        model_name: "m:with:colons".into(),
        tenant_id: "t".into(),
        mark: StreamMark {
            worker: w(instance, rank),
            endpoint: format!("tcp://10.0.0.{instance}:5557"),
            watermark: Watermark { seq, digest },
            ranks: ranks.to_vec(),
        },
    }
}

fn marks() -> Vec<PeerWatermark> {
    vec![mark(7, 1, 41, Some(0xDEAD_BEEF), &[0, 3]), mark(8, 0, 0, None, &[]), mark(9, 2, u64::MAX, Some(0), &[])]
}

/// A format-2 dump of `entries` whose watermarks record holds `marks`.
fn encode_marked(entries: &[DumpEntry], marks: &[PeerWatermark]) -> Vec<u8> {
    let (mut out, mut wr) = (Vec::new(), Writer::default());
    wr.start_with_watermarks(&mut out);
    for e in entries {
        wr.index(&mut out, &e.model_name, &e.tenant_id, e.block_size);
        for ev in &e.events {
            wr.event(&mut out, ev);
        }
    }
    wr.watermarks(&mut out, marks);
    wr.end(&mut out);
    out
}

/// The magic, `format`, then `rest`, and an end record that counts no
/// events and sums every byte before it.
fn framed(format: u32, rest: &[u8]) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&format.to_le_bytes());
    b.extend_from_slice(rest);
    b.push(REC_END);
    let sum = xxhash_rust::xxh3::xxh3_64(&b);
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&sum.to_le_bytes());
    b
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
    future[8] = 3;
    for (bytes, why) in [
        (b"KVIXSNAP\x01\x00\x00\x00".to_vec(), "bad magic"),
        (future, "format 3; this build reads formats 1 and 2"),
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

#[test]
fn watermarks_read_back_as_written_and_only_once_the_dump_is_whole() {
    let e = entries();
    for marks in [marks(), Vec::new()] {
        let bytes = encode_marked(&e, &marks);
        assert_eq!(bytes[8..12], FORMAT_WATERMARKS.to_le_bytes());
        assert_eq!(decode_marked(&bytes).unwrap(), (e.clone(), Some(marks)));
    }
    // A format-1 dump, an older peer's, hands on none.
    assert_eq!(decode_marked(&encode(&e)).unwrap(), (e, None));
}

#[test]
fn a_format_1_dump_is_today_s_bytes_and_a_prefix_of_format_2_s() {
    let e = entries();
    let (old, new) = (encode(&e), encode_marked(&e, &marks()));
    assert_eq!(old[..12], [&MAGIC[..], &1u32.to_le_bytes()].concat(), "format 1, as every earlier build wrote");
    // Everything but the format and the end record: the same records, the
    // watermarks after them.
    let records = &old[12..old.len() - 17];
    assert_eq!(&new[12..12 + records.len()], records);
    assert_eq!(new[12 + records.len()], REC_WATERMARKS);
}

#[test]
fn every_truncation_and_corrupted_byte_of_a_dump_with_watermarks_is_refused() {
    let bytes = encode_marked(&entries(), &marks());
    for cut in 0..bytes.len() {
        assert!(decode_marked(&bytes[..cut]).is_err(), "cut at {cut}");
    }
    for at in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[at] ^= 0x01;
        assert!(decode_marked(&bad).is_err(), "byte {at} was read");
    }
}

#[test]
fn malformed_watermarks_are_refused_by_name() {
    let mut wm = Vec::new();
    watermarks::put(&mut wm, &[mark(7, 1, 41, Some(5), &[0, 3])]);
    let with = |count: u32, listener: &[u8]| [&[REC_WATERMARKS][..], &count.to_le_bytes(), listener].concat();
    // One listener: instance and rank, the endpoint's length and bytes,
    // ..., seq, digest flag and digest, the ranks' count and two ranks.
    let listener = &wm[4..];
    let mut long_endpoint = listener.to_vec();
    long_endpoint[12..16].copy_from_slice(&(ADDRESS_BYTES_MAX as u32 + 1).to_le_bytes());
    let flag_at = listener.len() - 2 * 4 - 4 - 8 - 1;
    let mut bad_flag = listener.to_vec();
    bad_flag[flag_at] = 2;
    let mut many_ranks = listener.to_vec();
    let ranks_at = listener.len() - 2 * 4 - 4;
    many_ranks[ranks_at..ranks_at + 4].copy_from_slice(&(DP_RANKS_PER_LISTENER_MAX as u32).to_le_bytes());
    let twice = [listener, listener].concat();
    let f2 = FORMAT_WATERMARKS;
    let mut index_after = vec![REC_INDEX];
    put_name(&mut index_after, "m");
    put_name(&mut index_after, "t");
    index_after.extend_from_slice(&16u32.to_le_bytes());
    let mut short = MAGIC.to_vec();
    short.extend_from_slice(&f2.to_le_bytes());
    short.extend_from_slice(&with(2, listener));
    for (bytes, why) in [
        (framed(f2, &with(LISTENERS_MAX as u32 + 1, &[])), "4097 watermarks, over the limit of 4096"),
        (framed(f2, &with(1, &long_endpoint)), "an endpoint of 257 bytes, outside 1..=256"),
        (framed(f2, &with(1, &bad_flag)), "digest flag byte 2"),
        (framed(f2, &with(1, &many_ranks)), "1024 dp ranks, over the limit of 1023"),
        (framed(f2, &with(2, &twice)), "the watermark of worker 7:1 is listed twice"),
        (short, "truncated"),
        (framed(f2, &[]), "a format-2 dump ends without its watermarks"),
        (framed(f2, &[with(0, &[]), with(0, &[])].concat()), "a record after the watermarks other than the end"),
        (framed(f2, &[with(0, &[]), index_after].concat()), "a record after the watermarks other than the end"),
        (framed(FORMAT, &with(0, &[])), "unknown record kind 4"),
    ] {
        let err = decode_marked(&bytes).expect_err(why);
        assert!(err.contains(why), "{why}: {err}");
    }
    // The frame itself is sound: with a well-formed record it reads.
    assert_eq!(decode_marked(&framed(f2, &with(1, listener))).unwrap().1, Some(vec![mark(7, 1, 41, Some(5), &[0, 3])]));
}

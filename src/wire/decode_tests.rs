//! Unit tests of the batch decoder on hand-built payloads: both encodings,
//! every hash form and header width, and every malformed shape.

use super::*;

/// A tiny msgpack writer that can force header widths.
#[derive(Default, Clone)]
struct Mp(Vec<u8>);

impl Mp {
    fn new() -> Self {
        Self::default()
    }
    fn arr(mut self, n: u32) -> Self {
        rmp::encode::write_array_len(&mut self.0, n).unwrap();
        self
    }
    fn map(mut self, n: u32) -> Self {
        rmp::encode::write_map_len(&mut self.0, n).unwrap();
        self
    }
    fn map16(mut self, n: u16) -> Self {
        self.0.push(0xde);
        self.0.extend(n.to_be_bytes());
        self
    }
    fn map32(mut self, n: u32) -> Self {
        self.0.push(0xdf);
        self.0.extend(n.to_be_bytes());
        self
    }
    fn s(mut self, v: &str) -> Self {
        rmp::encode::write_str(&mut self.0, v).unwrap();
        self
    }
    fn u(mut self, v: u64) -> Self {
        rmp::encode::write_uint(&mut self.0, v).unwrap();
        self
    }
    fn i(mut self, v: i64) -> Self {
        rmp::encode::write_sint(&mut self.0, v).unwrap();
        self
    }
    fn f(mut self, v: f64) -> Self {
        rmp::encode::write_f64(&mut self.0, v).unwrap();
        self
    }
    fn bin(mut self, v: &[u8]) -> Self {
        rmp::encode::write_bin(&mut self.0, v).unwrap();
        self
    }
    fn nil(mut self) -> Self {
        self.0.push(0xc0);
        self
    }
    fn raw(mut self, bytes: &[u8]) -> Self {
        self.0.extend_from_slice(bytes);
        self
    }
    fn u32s(mut self, v: &[u32]) -> Self {
        self = self.arr(v.len() as u32);
        for &t in v {
            self = self.u(u64::from(t));
        }
        self
    }
    fn hashes(mut self, v: &[u64]) -> Self {
        self = self.arr(v.len() as u32);
        for &h in v {
            self = self.u(h);
        }
        self
    }
    fn done(self) -> Vec<u8> {
        self.0
    }
}

fn batch(events: &[Vec<u8>], rank: Option<Option<u32>>) -> Vec<u8> {
    let len = if rank.is_some() { 3 } else { 2 };
    let mut mp = Mp::new().arr(len).f(1.5).arr(events.len() as u32);
    for e in events {
        mp = mp.raw(e);
    }
    match rank {
        Some(Some(r)) => mp = mp.u(u64::from(r)),
        Some(None) => mp = mp.nil(),
        None => {}
    }
    mp.done()
}

fn only_event(payload: &[u8]) -> RawEvent {
    let mut b = decode_payload(payload).unwrap();
    assert_eq!(b.events.len(), 1);
    b.events.pop().unwrap()
}

fn stored(e: RawEvent) -> RawStored {
    match e {
        RawEvent::Stored(s) => s,
        other => panic!("expected a store, got {other:?}"),
    }
}

fn tokens(n: u32) -> Vec<u32> {
    (1..=n).collect()
}

fn stored_map_fields(mp: Mp) -> Mp {
    mp.s("block_hashes")
        .hashes(&[u64::MAX, 5])
        .s("parent_block_hash")
        .u(1 << 63)
        .s("token_ids")
        .u32s(&tokens(8))
        .s("block_size")
        .u(4)
        .s("lora_id")
        .nil()
        .s("medium")
        .s("GPU")
        .s("lora_name")
        .s("adapter-a")
}

#[test]
fn tagged_map_in_any_order_with_unknown_keys() {
    // Unknown keys of several shapes, including a non-string key, around the known ones.
    let ev = stored_map_fields(Mp::new().map(14).s("session_id").s("s1"))
        .s("lookahead_token_ids")
        .arr(1)
        .u32s(&[1, 2])
        .raw(&[0x01]) // integer key
        .map(1)
        .s("x")
        .nil()
        .s("group_idx")
        .u(0)
        .s("kv_cache_spec_kind")
        .s("full_attention")
        .s("cache_salt")
        .s("")
        .s("type")
        .s("BlockStored")
        .done();
    let s = stored(only_event(&batch(&[ev], Some(Some(2))))); // 14 pairs in a fixmap
    assert_eq!(s.block_hashes, vec![u64::MAX, 5]);
    assert_eq!(s.parent_block_hash, Some(1 << 63));
    assert_eq!(s.token_ids, tokens(8));
    assert_eq!(s.block_size, 4);
    assert_eq!(s.medium.as_deref(), Some("GPU"));
    assert_eq!(s.lora_name.as_deref(), Some("adapter-a"));
    assert_eq!(s.cache_salt, None, "an empty salt counts as absent");
    assert_eq!(s.group_idx, Some(0));
    assert_eq!(s.kv_cache_spec_kind.as_deref(), Some("full_attention"));
}

#[test]
fn map16_and_map32_headers_decode_like_fixmaps() {
    let body = |mp: Mp| stored_map_fields(mp).s("type").s("BlockStored").done();
    let fix = stored(only_event(&batch(&[body(Mp::new().map(8))], None)));
    let m16 = stored(only_event(&batch(&[body(Mp::new().map16(8))], None)));
    let m32 = stored(only_event(&batch(&[body(Mp::new().map32(8))], None)));
    assert_eq!(fix, m16);
    assert_eq!(fix, m32);
}

#[test]
fn positional_vllm_layout_with_trailing_extras() {
    let ev = Mp::new()
        .arr(16)
        .s("BlockStored")
        .hashes(&[10, 11])
        .nil()
        .u32s(&tokens(8))
        .u(4)
        .u(3)
        .s("cpu")
        .s("lora")
        .arr(2)
        .arr(2)
        .s("lora")
        .s("dynamo-cache-salt:t1")
        .nil()
        .u(1)
        .s("sliding_window")
        .u(128)
        .s("REMOTE")
        .s("kvcr")
        .s("future-field")
        .arr(0)
        .done();
    let s = stored(only_event(&batch(&[ev], Some(Some(0)))));
    assert_eq!(s.block_hashes, vec![10, 11]);
    assert_eq!(s.parent_block_hash, None);
    assert_eq!(s.lora_id, Some(3));
    assert_eq!(s.medium.as_deref(), Some("cpu"));
    assert_eq!(s.lora_name.as_deref(), Some("lora"));
    assert_eq!(s.extra_keys_salt.as_deref(), Some("t1"));
    assert_eq!(s.opaque_extra_keys_from, None);
    assert_eq!(s.group_idx, Some(1));
    assert_eq!(s.kv_cache_spec_kind.as_deref(), Some("sliding_window"));
    assert_eq!(s.locality.as_deref(), Some("REMOTE"));
    assert_eq!(s.ownership.as_deref(), Some("kvcr"));
}

#[test]
fn positional_short_tuples_and_sglang_salt_slot() {
    // vLLM 0.9: [tag, hashes, parent, tokens, block_size, lora_id]
    let short = Mp::new().arr(6).s("BlockStored").hashes(&[1]).u(9).u32s(&tokens(4)).u(4).nil().done();
    let s = stored(only_event(&batch(&[short], None)));
    assert_eq!((s.parent_block_hash, s.medium.clone()), (Some(9), None));
    // A map in the lora_name slot carries SGLang's cache_salt.
    let salted = Mp::new()
        .arr(8)
        .s("BlockStored")
        .hashes(&[1])
        .nil()
        .u32s(&tokens(4))
        .u(4)
        .nil()
        .s("GPU")
        .map(2)
        .s("other")
        .arr(1)
        .nil()
        .s("cache_salt")
        .s("tenant-9")
        .done();
    let s = stored(only_event(&batch(&[salted], None)));
    assert_eq!(s.cache_salt.as_deref(), Some("tenant-9"));
    assert_eq!(s.lora_name, None);
}

#[test]
fn every_hash_form_normalises_to_u64() {
    let mut bytes32 = vec![0xaa; 24];
    bytes32.extend(0x0102_0304_0506_0708u64.to_be_bytes());
    let ev = Mp::new()
        .arr(2)
        .s("BlockRemoved")
        .arr(9)
        .u(7)
        .raw(&[0xcc, 0xff])
        .raw(&[0xcd, 0x01, 0x00])
        .raw(&[0xce, 0x00, 0x01, 0x00, 0x00])
        .raw(&[0xcf, 0xf0, 0, 0, 0, 0, 0, 0, 1])
        .i(-1)
        .i(i64::MIN)
        .bin(&bytes32)
        .bin(&[0x01, 0x02])
        .done();
    let RawEvent::Removed(r) = only_event(&batch(&[ev], None)) else {
        panic!("expected a remove");
    };
    assert_eq!(
        r.block_hashes,
        vec![7, 255, 256, 65536, 0xf000_0000_0000_0001, u64::MAX, 1 << 63, 0x0102_0304_0506_0708, 0x0102]
    );
}

#[test]
fn removed_cleared_and_unknown_in_both_encodings() {
    let removed_pos = Mp::new().arr(4).s("BlockRemoved").hashes(&[3]).s("CPU").u(0).done();
    let removed_map = Mp::new()
        .map(4)
        .s("medium")
        .nil()
        .s("type")
        .s("BlockRemoved")
        .s("block_hashes")
        .hashes(&[4])
        .s("locality")
        .s("LOCAL")
        .done();
    let cleared_pos = Mp::new().arr(1).s("AllBlocksCleared").done();
    let cleared_map = Mp::new().map(1).s("type").s("AllBlocksCleared").done();
    let unknown_pos = Mp::new().arr(3).s("BlockUpdated").map(1).s("a").arr(1).nil().u(1).done();
    let unknown_map = Mp::new().map(2).s("type").s("Ignored").s("x").arr(0).done();
    let b = decode_payload(&batch(
        &[removed_pos, removed_map, cleared_pos, cleared_map, unknown_pos, unknown_map],
        Some(None),
    ))
    .unwrap();
    assert_eq!(b.timestamp, 1.5);
    assert_eq!(b.dp_rank, None);
    assert_eq!(
        b.events[0],
        RawEvent::Removed(RawRemoved {
            block_hashes: vec![3],
            medium: Some("CPU".into()),
            group_idx: Some(0),
            ..Default::default()
        })
    );
    assert_eq!(
        b.events[1],
        RawEvent::Removed(RawRemoved { block_hashes: vec![4], locality: Some("LOCAL".into()), ..Default::default() })
    );
    assert_eq!(&b.events[2..], &[RawEvent::Cleared, RawEvent::Cleared, RawEvent::Unknown, RawEvent::Unknown]);
}

#[test]
fn batch_rank_absent_nil_present_and_trailing_elements() {
    let cleared = Mp::new().arr(1).s("AllBlocksCleared").done();
    assert_eq!(decode_payload(&batch(std::slice::from_ref(&cleared), None)).unwrap().dp_rank, None);
    assert_eq!(decode_payload(&batch(std::slice::from_ref(&cleared), Some(None))).unwrap().dp_rank, None);
    assert_eq!(decode_payload(&batch(std::slice::from_ref(&cleared), Some(Some(7)))).unwrap().dp_rank, Some(7));
    let longer = Mp::new().arr(5).u(3).arr(0).u(1).s("extra").map(0).done();
    let b = decode_payload(&longer).unwrap();
    assert_eq!((b.timestamp, b.dp_rank, b.events.len()), (3.0, Some(1), 0));
}

#[test]
fn bigram_token_pairs_keep_the_first_token() {
    let ev =
        Mp::new().arr(5).s("BlockStored").hashes(&[1]).nil().arr(2).arr(2).u(10).u(11).arr(2).u(11).u(12).u(2).done();
    assert_eq!(stored(only_event(&batch(&[ev], None))).token_ids, vec![10, 11]);
}

#[test]
fn extra_keys_of_every_shape() {
    let mm = "00000000000000ff000000000000000000000000000000000000000000000000";
    let ev = Mp::new()
        .arr(9)
        .s("BlockStored")
        .hashes(&[1, 2, 3])
        .nil()
        .u32s(&tokens(6))
        .u(2)
        .nil()
        .nil()
        .nil()
        .arr(3)
        .arr(1)
        .arr(2)
        .s(mm)
        .i(-3)
        .nil()
        .arr(2)
        .bin(b"digest")
        .arr(2)
        .u(1)
        .u(2)
        .done();
    let s = stored(only_event(&batch(&[ev], None)));
    assert_eq!(s.block_mm_hashes, vec![vec![0xff], vec![], vec![]]);
    assert_eq!(s.opaque_extra_keys_from, Some(2));
}

fn assert_err(payload: &[u8], needle: &str) {
    match decode_payload(payload) {
        Ok(b) => panic!("decoded {b:?}, expected an error containing {needle:?}"),
        Err(e) => assert!(e.to_string().contains(needle), "{e} lacks {needle:?}"),
    }
}

#[test]
fn malformed_batches_fail_with_a_reason() {
    let cleared = Mp::new().arr(1).s("AllBlocksCleared").done();
    assert_err(&Mp::new().map(0).done(), "expected an array");
    assert_err(&Mp::new().arr(1).f(1.0).done(), "batch has 1 elements");
    assert_err(&Mp::new().arr(2).s("now").arr(0).done(), "timestamp");
    assert_err(&Mp::new().arr(2).f(1.0).nil().done(), "events: expected an array");
    assert_err(&Mp::new().arr(3).f(1.0).arr(0).i(-1).done(), "data_parallel_rank");
    assert_err(&Mp::new().arr(3).f(1.0).arr(0).u(1 << 40).done(), "data_parallel_rank");
    let mut trailing = batch(&[cleared], None);
    trailing.push(0xc0);
    assert_err(&trailing, "trailing bytes");
    assert_err(&[], "truncated");
    assert_err(&[0xc1], "reserved");
}

#[test]
fn malformed_events_fail_with_a_reason() {
    let ev = |e: Vec<u8>| batch(&[e], None);
    assert_err(&ev(Mp::new().u(1).done()), "tagged map or array");
    assert_err(&ev(Mp::new().arr(0).done()), "no type tag");
    assert_err(&ev(Mp::new().arr(1).u(1).done()), "event type");
    assert_err(&ev(Mp::new().map(1).s("block_hashes").hashes(&[1]).done()), "no \"type\"");
    assert_err(&ev(Mp::new().arr(1).s("BlockRemoved").done()), "without block_hashes");
    assert_err(&ev(Mp::new().arr(2).s("BlockRemoved").arr(1).s("h").done()), "block hash");
    assert_err(&ev(Mp::new().arr(2).s("BlockRemoved").arr(1).bin(&[]).done()), "non-empty bytes");
    assert_err(&ev(Mp::new().arr(2).s("BlockRemoved").nil().done()), "block_hashes: expected an array");
    let bad_utf8 = Mp::new().arr(3).s("BlockRemoved").hashes(&[1]).raw(&[0xa2, 0xff, 0xfe]).done();
    assert_err(&ev(bad_utf8), "not UTF-8");
    let wrong_medium = Mp::new().arr(3).s("BlockRemoved").hashes(&[1]).u(5).done();
    assert_err(&ev(wrong_medium), "medium");
    let wrong_group =
        Mp::new().map(3).s("type").s("BlockRemoved").s("block_hashes").hashes(&[1]).s("group_idx").s("0").done();
    assert_err(&ev(wrong_group), "group_idx");
    let bad_removed_map =
        Mp::new().map(3).s("type").s("BlockRemoved").s("block_hashes").arr(1).f(1.0).s("medium").nil().done();
    assert_err(&ev(bad_removed_map), "block hash");
}

#[test]
fn odd_stores_are_skipped_and_the_rest_of_the_batch_applies() {
    let cleared = Mp::new().arr(1).s("AllBlocksCleared").done();
    let store = |tokens: Mp, size: Mp| {
        Mp::new().arr(5).s("BlockStored").hashes(&[1]).nil().raw(&tokens.done()).raw(&size.done()).done()
    };
    let map_store = |field: &str, value: Mp| {
        stored_map_fields(Mp::new().map(9)).s("type").s("BlockStored").s(field).raw(&value.done()).done()
    };
    let odd = [
        store(Mp::new().arr(1).i(-1), Mp::new().u(1)),
        store(Mp::new().arr(1).u(1 << 32), Mp::new().u(1)),
        store(Mp::new().arr(1).f(1.5), Mp::new().u(1)),
        store(Mp::new().arr(1).nil(), Mp::new().u(1)),
        store(Mp::new().arr(1).arr(3).u(1).u(2).u(3), Mp::new().u(1)),
        store(Mp::new().u32s(&[1]), Mp::new().i(-16)),
        store(Mp::new().u32s(&[1]), Mp::new().u(1 << 33)),
        store(Mp::new().u32s(&[1]), Mp::new().nil()),
        Mp::new().arr(3).s("BlockStored").hashes(&[1]).nil().done(),
        Mp::new().arr(8).s("BlockStored").hashes(&[1]).nil().u32s(&[1]).u(1).nil().nil().u(5).done(),
        // Map stores: a later field of a wrong type, and mm_keys of a wrong shape.
        map_store("group_idx", Mp::new().s("0")),
        map_store("mm_keys", Mp::new().arr(1).arr(1).u(5)),
        map_store("mm_keys", Mp::new().arr(1).arr(1).map(1).s("hash").s("ab")),
        map_store("mm_keys", Mp::new().arr(1).arr(1).map(2).s("hash").s("ab").s("start_offset").i(-1)),
    ];
    for (i, e) in odd.into_iter().enumerate() {
        let b = decode_payload(&batch(&[e, cleared.clone()], None)).unwrap_or_else(|e| panic!("case {i}: {e}"));
        assert_eq!(b.events, vec![RawEvent::MalformedStore, RawEvent::Cleared], "case {i}");
    }
}

#[test]
fn string_tokens_and_mm_keys_are_kept_as_sent() {
    let digest = "ab".repeat(32);
    let key = |start: u64, uuid: Option<&str>| {
        let mp = Mp::new().map(if uuid.is_some() { 4 } else { 3 }).s("type").s("mm_key").s("hash").s(&digest);
        let mp = mp.s("start_offset").u(start);
        match uuid {
            Some(u) => mp.s("uuid").s(u),
            None => mp,
        }
    };
    let tokens = Mp::new().arr(8).u(1).s(&digest).u(1001).u(1002).u(1003).i(7).u(1004).u(1005);
    let keys = Mp::new().arr(2).arr(1).raw(&key(0, Some("img")).done()).arr(2);
    let keys = keys.raw(&key(3, None).done()).raw(&key(4, Some("img")).done());
    let ev = Mp::new()
        .map(7)
        .s("type")
        .s("BlockStored")
        .s("block_hashes")
        .arr(2)
        .i(-5)
        .i(i64::MIN)
        .s("parent_block_hash")
        .nil()
        .s("token_ids")
        .raw(&tokens.done())
        .s("block_size")
        .u(4)
        .s("medium")
        .s("GPU")
        .s("mm_keys")
        .raw(&keys.done())
        .done();
    let s = stored(only_event(&batch(&[ev], Some(Some(0)))));
    assert_eq!(s.token_ids, vec![1, 0, 1001, 1002, 1003, 7, 1004, 1005]);
    let mm = s.multimodal.unwrap();
    assert_eq!(mm.string_tokens, vec![(1, digest.clone())]);
    assert_eq!(s.block_hashes, vec![(-5i64) as u64, 1 << 63]);
    assert_eq!(s.block_size, 4);
    let k = |start: u64, uuid: Option<&str>| RawMmKey {
        hash: digest.clone(),
        start_offset: start,
        uuid: uuid.map(Into::into),
    };
    assert_eq!(mm.mm_keys, Some(vec![vec![k(0, Some("img"))], vec![k(3, None), k(4, Some("img"))]]));
    // Nil keys, and nil per block, read as none.
    let nil_keys = stored_map_fields(Mp::new().map(9)).s("type").s("BlockStored").s("mm_keys").nil().done();
    assert_eq!(stored(only_event(&batch(&[nil_keys], None))).multimodal, None);
    let nil_block =
        stored_map_fields(Mp::new().map(9)).s("type").s("BlockStored").s("mm_keys").arr(2).nil().arr(0).done();
    let mm = stored(only_event(&batch(&[nil_block], None))).multimodal.unwrap();
    assert_eq!((mm.string_tokens.len(), mm.mm_keys), (0, Some(vec![vec![], vec![]])));
}

#[test]
fn every_truncation_of_a_valid_payload_fails() {
    let ev = stored_map_fields(Mp::new().map(8)).s("type").s("BlockStored").done();
    let payload = batch(&[ev, Mp::new().arr(1).s("AllBlocksCleared").done()], Some(Some(1)));
    decode_payload(&payload).unwrap();
    for cut in 0..payload.len() {
        assert!(decode_payload(&payload[..cut]).is_err(), "prefix of {cut} bytes decoded");
    }
}

#[test]
fn absurd_lengths_fail_before_allocating() {
    // A header claiming more elements than bytes remain.
    assert_err(&[0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0x7f, 0xff, 0xff, 0xff], "claims");
    // Counts within the bytes but over the named limits.
    let over = EVENTS_PER_BATCH_MAX + 1;
    let mut many = Mp::new().arr(2).f(0.0).raw(&[0xdd]).raw(&over.to_be_bytes()).done();
    many.resize(many.len() + over as usize, 0xc0);
    assert_err(&many, "limit");
    // A store over a limit is skipped (each element walked, none kept); a
    // remove over one fails the batch.
    let tokens_over = TOKENS_PER_EVENT_MAX + 1;
    let mut long = Mp::new().arr(2).f(0.0).arr(1).arr(5).s("BlockStored").hashes(&[1]).nil().raw(&[0xdd]).done();
    long.extend(tokens_over.to_be_bytes());
    long.resize(long.len() + tokens_over as usize, 0x01);
    long.push(0x04);
    assert_eq!(decode_payload(&long).unwrap().events, vec![RawEvent::MalformedStore]);
    let hashes_over = BLOCKS_PER_EVENT_MAX as u32 + 1;
    let mut wide = Mp::new().arr(2).f(0.0).arr(1).arr(2).s("BlockRemoved").raw(&[0xdd]).done();
    wide.extend(hashes_over.to_be_bytes());
    wide.resize(wide.len() + hashes_over as usize, 0x01);
    assert_err(&wide, "limit");
    assert_err(&vec![0u8; PAYLOAD_BYTES_MAX + 1], "limit");
}

#[test]
fn deep_nesting_in_an_unknown_field_fails_cleanly() {
    let mut ev = Mp::new().map(2).s("type").s("AllBlocksCleared").s("deep").done();
    ev.extend(std::iter::repeat_n(0x91, 10_000));
    ev.push(0xc0);
    assert_err(&batch(&[ev], None), "nesting");
}

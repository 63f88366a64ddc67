//! Unit tests of the converter: every skip rule, salts, splitting, groups.

use super::*;
use crate::event::EventKind;
use crate::hash::{local_hash, seed_for};
use crate::wire::{RawMmKey, RawMultimodal};

const W: WorkerId = WorkerId::new(7, 1);
const BS: u32 = 4;

fn store(hashes: &[u64], parent: Option<u64>, first_token: u32) -> RawStored {
    let n = hashes.len() as u32 * BS;
    RawStored {
        block_hashes: hashes.to_vec(),
        parent_block_hash: parent,
        token_ids: (first_token..first_token + n).collect(),
        block_size: BS,
        medium: Some("GPU".into()),
        ..Default::default()
    }
}

fn remove(hashes: &[u64]) -> RawRemoved {
    RawRemoved { block_hashes: hashes.to_vec(), ..Default::default() }
}

fn run(conv: &mut WorkerConverter, events: Vec<RawEvent>) -> (Vec<Event>, SkipCounters) {
    let skips = SkipCounters::new();
    let mut out = Vec::new();
    conv.convert(W, &events, &mut out, &skips, &|_, _| {});
    (out, skips)
}

/// Converts one event with a fresh converter; returns its output and the single skip reason, if any.
fn one(event: RawEvent) -> (Vec<Event>, Option<SkipReason>) {
    let (out, skips) = run(&mut WorkerConverter::new(BS), vec![event]);
    let reasons: Vec<_> = SkipReason::ALL.into_iter().filter(|&r| skips.get(r) > 0).collect();
    assert!(reasons.len() <= 1, "{reasons:?}");
    (out, reasons.first().copied())
}

fn skipped(event: RawEvent) -> SkipReason {
    let (out, reason) = one(event);
    assert!(out.is_empty(), "{out:?}");
    reason.expect("a skip reason")
}

fn blocks(event: &Event) -> (&Option<u64>, &Vec<StoredBlock>) {
    match &event.kind {
        EventKind::Stored { parent, blocks } => (parent, blocks),
        other => panic!("expected a store, got {other:?}"),
    }
}

fn locals(tokens: &[u32], seed: u64) -> Vec<u64> {
    tokens.chunks_exact(BS as usize).map(|b| local_hash(b, seed)).collect()
}

#[test]
fn plain_store_hashes_tokens_and_keeps_engine_hashes() {
    let (out, reason) = one(RawEvent::Stored(store(&[10, 11], Some(9), 1)));
    assert_eq!(reason, None);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].worker, out[0].tier), (W, StorageTier::Device));
    let (parent, b) = blocks(&out[0]);
    assert_eq!(*parent, Some(9));
    let expected = locals(&(1..=8).collect::<Vec<_>>(), seed_for(None, None));
    assert_eq!(b.iter().map(|b| b.engine_hash).collect::<Vec<_>>(), vec![10, 11]);
    assert_eq!(b.iter().map(|b| b.local_hash).collect::<Vec<_>>(), expected);
    // The published vector: tokens 1..=8, block size 4, no LoRA or salt.
    assert_eq!(expected, vec![14643705804678351452, 16777012769546811212]);
}

#[test]
fn lora_name_selects_the_seed() {
    let mut s = store(&[1, 2], None, 1);
    s.lora_name = Some("adapter-a".into());
    s.lora_id = Some(3);
    let (out, _) = one(RawEvent::Stored(s));
    let got: Vec<_> = blocks(&out[0]).1.iter().map(|b| b.local_hash).collect();
    assert_eq!(got, vec![11381080598872079209, 5698110331184095209]);
}

#[test]
fn each_placement_rule_skips() {
    let with = |f: fn(&mut RawStored)| {
        let mut s = store(&[1], None, 1);
        f(&mut s);
        skipped(RawEvent::Stored(s))
    };
    assert_eq!(with(|s| s.locality = Some("REMOTE".into())), SkipReason::RemoteLocality);
    assert_eq!(with(|s| s.locality = Some("ELSEWHERE".into())), SkipReason::UnknownLocality);
    assert_eq!(with(|s| s.ownership = Some("kvcr".into())), SkipReason::KvcrOwnership);
    assert_eq!(with(|s| s.ownership = Some("someone".into())), SkipReason::UnknownOwnership);
    assert_eq!(with(|s| s.medium = Some("TAPE".into())), SkipReason::UnknownMedium);
    assert_eq!(with(|s| s.kv_cache_spec_kind = Some("sliding_window".into())), SkipReason::NonMainAttention);
    assert_eq!(with(|s| s.kv_cache_spec_kind = Some("mamba".into())), SkipReason::NonMainAttention);
    assert_eq!(with(|s| s.kv_cache_spec_kind = Some("unknown".into())), SkipReason::NonMainAttention);
    assert_eq!(with(|s| s.group_idx = Some(1)), SkipReason::OtherKvGroup);
    assert_eq!(with(|s| s.block_hashes.clear()), SkipReason::EmptyEvent);
    assert_eq!(with(|s| s.lora_id = Some(2)), SkipReason::LoraWithoutName);
    assert_eq!(with(|s| s.parent_block_hash = Some(1)), SkipReason::SelfReferencingStore);
    assert_eq!(with(|s| s.block_size = 3), SkipReason::BlockSizeMismatch);
    assert_eq!(with(|s| s.token_ids.pop().map(drop).unwrap()), SkipReason::TokenCountMismatch);
    assert_eq!(with(|s| s.opaque_extra_keys_from = Some(0)), SkipReason::OpaqueExtraKeys);
    // Accepted variants of the same fields.
    let (out, reason) = one(RawEvent::Stored(RawStored {
        locality: Some("local".into()),
        medium: Some("cpu_pinned".into()),
        kv_cache_spec_kind: Some("mla_attention".into()),
        group_idx: Some(0),
        ..store(&[1], None, 1)
    }));
    assert_eq!((reason, out[0].tier), (None, StorageTier::HostPinned));
}

#[test]
fn placeholder_lower_tier_stores_are_skipped() {
    let placeholder =
        RawStored { block_hashes: vec![5], medium: Some("CPU".into()), group_idx: Some(0), ..Default::default() };
    assert_eq!(skipped(RawEvent::Stored(placeholder.clone())), SkipReason::PlaceholderStore);
    let zero_size = RawStored { block_size: 0, ..store(&[5], None, 1) };
    assert_eq!(skipped(RawEvent::Stored(zero_size)), SkipReason::PlaceholderStore);
}

#[test]
fn duplicate_hashes_in_a_long_store_are_caught() {
    let mut hashes: Vec<u64> = (100..140).collect();
    hashes[30] = 105;
    assert_eq!(skipped(RawEvent::Stored(store(&hashes, None, 1))), SkipReason::SelfReferencingStore);
    let distinct: Vec<u64> = (100..140).collect();
    assert_eq!(one(RawEvent::Stored(store(&distinct, None, 1))).1, None);
}

#[test]
fn unknown_events_and_remove_rules() {
    assert_eq!(skipped(RawEvent::Unknown), SkipReason::UnknownEventType);
    assert_eq!(skipped(RawEvent::Removed(remove(&[]))), SkipReason::EmptyEvent);
    let remote = RawRemoved { locality: Some("REMOTE".into()), ..remove(&[1]) };
    assert_eq!(skipped(RawEvent::Removed(remote)), SkipReason::RemoteLocality);
    let unknown_medium = RawRemoved { medium: Some("TAPE".into()), ..remove(&[1]) };
    assert_eq!(skipped(RawEvent::Removed(unknown_medium)), SkipReason::UnknownMedium);
    let mut conv = WorkerConverter::new(BS);
    let disk = |e: RawRemoved| RawRemoved { medium: Some("DISK".into()), ..e };
    let stored = RawStored { medium: Some("DISK".into()), ..store(&[1, 2], None, 1) };
    let (out, skips) = run(&mut conv, vec![RawEvent::Stored(stored), RawEvent::Removed(disk(remove(&[1, 2])))]);
    assert_eq!(skips.total(), 0);
    assert_eq!(out[1], Event::removed(W, StorageTier::Disk, vec![1, 2]));
}

/// Every hash a remove of `engine` could need when the block's size is unknown.
fn all_pieces(engine: u64) -> impl Iterator<Item = u64> {
    (0..SPLIT_FACTOR_MAX - 1).map(move |j| split_block_hash(engine, j)).chain([engine])
}

#[test]
fn before_a_tiers_first_store_a_remove_takes_every_possible_piece() {
    // A warm start: the index holds blocks this converter never saw cut.
    let mut conv = WorkerConverter::new(BS);
    let (out, _) = run(&mut conv, vec![RawEvent::Removed(remove(&[5, 6]))]);
    let expected: Vec<u64> = all_pieces(5).chain(all_pieces(6)).collect();
    assert_eq!(out, vec![Event::removed(W, StorageTier::Device, expected)]);
    // A store teaches its own tier's size only.
    let host = |e: RawRemoved| RawRemoved { medium: Some("CPU".into()), ..e };
    let (out, _) = run(
        &mut conv,
        vec![
            RawEvent::Stored(store(&[7], None, 1)),
            RawEvent::Removed(remove(&[7])),
            RawEvent::Removed(host(remove(&[8]))),
        ],
    );
    assert_eq!(out[1], Event::removed(W, StorageTier::Device, vec![7]));
    assert_eq!(out[2], Event::removed(W, StorageTier::HostPinned, all_pieces(8).collect()));
    // A clear forgets the sizes again.
    let (out, _) = run(&mut conv, vec![RawEvent::Cleared, RawEvent::Removed(remove(&[7]))]);
    assert_eq!(out[1], Event::removed(W, StorageTier::Device, all_pieces(7).collect()));
}

#[test]
fn an_unknown_split_names_only_the_pieces_the_index_holds() {
    let mut conv = WorkerConverter::new(BS);
    let (mut out, skips) = (Vec::new(), SkipCounters::new());
    let held = [split_block_hash(5, 0), split_block_hash(5, 1)];
    let retain = |tier: StorageTier, hashes: &mut Vec<u64>| {
        assert_eq!(tier, StorageTier::Device);
        hashes.retain(|h| held.contains(h));
    };
    conv.convert(W, &[RawEvent::Removed(remove(&[5, 6]))], &mut out, &skips, &retain);
    assert_eq!(out, vec![Event::removed(W, StorageTier::Device, vec![held[0], held[1], 5, 6])]);
}

#[test]
fn before_the_first_store_removes_of_any_group_not_marked_non_main_apply() {
    // After a warm start the index may hold a main group other than 0.
    let mut conv = WorkerConverter::new(BS);
    let group = |g, kind: Option<&str>| {
        RawEvent::Removed(RawRemoved { group_idx: Some(g), kv_cache_spec_kind: kind.map(Into::into), ..remove(&[1]) })
    };
    let (out, skips) = run(&mut conv, vec![group(1, None), group(2, Some("sliding_window"))]);
    assert_eq!(out.len(), 1);
    assert_eq!(skips.get(SkipReason::NonMainAttention), 1);
    // Once a store has been converted, group 0 is assumed main until a store says otherwise.
    let (out, skips) = run(&mut conv, vec![RawEvent::Stored(store(&[1], None, 1)), group(1, None)]);
    assert_eq!(out.len(), 1, "the store only");
    assert_eq!(skips.get(SkipReason::OtherKvGroup), 1);
}

#[test]
fn groups_learned_from_stores_decide_removes() {
    let mut conv = WorkerConverter::new(BS);
    let sliding =
        RawStored { group_idx: Some(0), kv_cache_spec_kind: Some("sliding_window".into()), ..store(&[1], None, 1) };
    let full =
        RawStored { group_idx: Some(1), kv_cache_spec_kind: Some("full_attention".into()), ..store(&[1], None, 1) };
    let group = |g| RawEvent::Removed(RawRemoved { group_idx: Some(g), ..remove(&[1]) });
    let (out, skips) =
        run(&mut conv, vec![RawEvent::Stored(sliding), RawEvent::Stored(full), group(0), group(1), group(2)]);
    assert_eq!(out.len(), 2, "the full-attention store and its remove");
    assert!(matches!(out[1].kind, EventKind::Removed { .. }));
    assert_eq!(skips.get(SkipReason::NonMainAttention), 2);
    assert_eq!(skips.get(SkipReason::OtherKvGroup), 1);
    // A second main group is not indexed: its removes would drop blocks the first still holds.
    let second_full =
        RawStored { group_idx: Some(2), kv_cache_spec_kind: Some("full_attention".into()), ..store(&[3], None, 1) };
    let (out, skips) = run(&mut conv, vec![RawEvent::Stored(second_full)]);
    assert!(out.is_empty());
    assert_eq!(skips.get(SkipReason::OtherKvGroup), 1);
}

#[test]
fn salt_from_event_or_tag_and_inherited_by_children() {
    let salted_seed = seed_for(None, Some("tenant-1"));
    for (cache_salt, tag) in [(Some("tenant-1"), None), (None, Some("tenant-1"))] {
        let mut conv = WorkerConverter::new(BS);
        let root = RawStored {
            cache_salt: cache_salt.map(String::from),
            extra_keys_salt: tag.map(String::from),
            ..store(&[1, 2], None, 1)
        };
        let child = store(&[3], Some(2), 9);
        let unrelated = store(&[4], Some(99), 9);
        let (out, skips) =
            run(&mut conv, vec![RawEvent::Stored(root), RawEvent::Stored(child), RawEvent::Stored(unrelated)]);
        assert_eq!(skips.total(), 0);
        let root_locals: Vec<_> = blocks(&out[0]).1.iter().map(|b| b.local_hash).collect();
        assert_eq!(root_locals, vec![12236259103925738072, 16244233118725531467]);
        assert_eq!(blocks(&out[1]).1[0].local_hash, local_hash(&[9, 10, 11, 12], salted_seed));
        assert_eq!(blocks(&out[2]).1[0].local_hash, local_hash(&[9, 10, 11, 12], BASE_SEED_FOR_TEST));
        assert_eq!(conv.salts.len(), 3);
    }
}

const BASE_SEED_FOR_TEST: u64 = crate::hash::BASE_SEED;

#[test]
fn salt_entries_leave_with_their_last_tier_and_on_clear() {
    let mut conv = WorkerConverter::new(BS);
    let gpu = RawStored { cache_salt: Some("s".into()), ..store(&[1], None, 1) };
    let cpu = RawStored { medium: Some("CPU".into()), ..gpu.clone() };
    run(&mut conv, vec![RawEvent::Stored(gpu), RawEvent::Stored(cpu)]);
    run(&mut conv, vec![RawEvent::Removed(remove(&[1]))]);
    assert_eq!(conv.salts.len(), 1, "still held in the CPU tier");
    // A child stored now still inherits the salt through the CPU copy.
    let (out, _) = run(&mut conv, vec![RawEvent::Stored(store(&[2], Some(1), 5))]);
    assert_eq!(blocks(&out[0]).1[0].local_hash, local_hash(&[5, 6, 7, 8], seed_for(None, Some("s"))));
    run(&mut conv, vec![RawEvent::Removed(RawRemoved { medium: Some("CPU".into()), ..remove(&[1]) })]);
    assert_eq!(conv.salts.len(), 1, "the child is still there");
    let (out, _) = run(&mut conv, vec![RawEvent::Cleared]);
    assert_eq!(out, vec![Event::cleared(W)]);
    assert_eq!(conv.salts.len(), 0);
    // After the clear the old parent's salt is forgotten.
    let (out, _) = run(&mut conv, vec![RawEvent::Stored(store(&[3], Some(2), 5))]);
    assert_eq!(blocks(&out[0]).1[0].local_hash, local_hash(&[5, 6, 7, 8], BASE_SEED_FOR_TEST));
}

#[test]
fn engine_blocks_of_whole_multiples_are_split_and_removed_whole() {
    let mut conv = WorkerConverter::new(BS);
    let big = RawStored { block_size: 3 * BS, token_ids: (1..=24).collect(), ..store(&[50, 60], Some(40), 1) };
    let (out, skips) = run(&mut conv, vec![RawEvent::Stored(big)]);
    assert_eq!(skips.total(), 0);
    let (parent, b) = blocks(&out[0]);
    assert_eq!(*parent, Some(40));
    let engine: Vec<_> = b.iter().map(|b| b.engine_hash).collect();
    assert_eq!(
        engine,
        vec![
            split_block_hash(50, 0),
            split_block_hash(50, 1),
            50,
            split_block_hash(60, 0),
            split_block_hash(60, 1),
            60
        ]
    );
    let expected = locals(&(1..=24).collect::<Vec<_>>(), BASE_SEED_FOR_TEST);
    assert_eq!(b.iter().map(|b| b.local_hash).collect::<Vec<_>>(), expected);
    let (out, _) = run(&mut conv, vec![RawEvent::Removed(remove(&[60]))]);
    assert_eq!(
        out,
        vec![Event::removed(W, StorageTier::Device, vec![split_block_hash(60, 0), split_block_hash(60, 1), 60])]
    );
    let too_big = RawStored {
        block_size: (SPLIT_FACTOR_MAX + 1) * BS,
        token_ids: vec![0; ((SPLIT_FACTOR_MAX + 1) * BS) as usize],
        ..store(&[1], None, 1)
    };
    assert_eq!(skipped(RawEvent::Stored(too_big)), SkipReason::BlockSizeMismatch);
    let smaller = RawStored { block_size: 2, token_ids: vec![1, 2], ..store(&[1], None, 1) };
    assert_eq!(skipped(RawEvent::Stored(smaller)), SkipReason::BlockSizeMismatch);
}

#[test]
fn each_tier_removes_blocks_of_its_own_size() {
    // GPU blocks of one index block, the offloader's host blocks of two: a
    // host remove after a GPU store still takes both halves of its block.
    let mut conv = WorkerConverter::new(BS);
    let host = RawStored {
        block_size: 2 * BS,
        token_ids: (1..=8).collect(),
        medium: Some("CPU".into()),
        ..store(&[900], None, 1)
    };
    run(&mut conv, vec![RawEvent::Stored(store(&[11, 12], None, 1)), RawEvent::Stored(host)]);
    run(&mut conv, vec![RawEvent::Stored(store(&[21], None, 50))]);
    let (out, _) = run(&mut conv, vec![RawEvent::Removed(RawRemoved { medium: Some("CPU".into()), ..remove(&[900]) })]);
    assert_eq!(out, vec![Event::removed(W, StorageTier::HostPinned, vec![split_block_hash(900, 0), 900])]);
    let (out, _) = run(&mut conv, vec![RawEvent::Removed(remove(&[11]))]);
    assert_eq!(out, vec![Event::removed(W, StorageTier::Device, vec![11])]);
}

#[test]
fn multimodal_hashes_are_appended_and_opaque_tails_dropped() {
    let s = RawStored {
        block_mm_hashes: vec![vec![], vec![3, 9]],
        opaque_extra_keys_from: Some(2),
        ..store(&[1, 2, 3], None, 1)
    };
    let (out, skips) = run(&mut WorkerConverter::new(BS), vec![RawEvent::Stored(s)]);
    assert_eq!(skips.get(SkipReason::OpaqueExtraKeys), 1, "the tail is counted");
    let b = blocks(&out[0]).1;
    assert_eq!(b.len(), 2, "blocks before the opaque one are kept");
    assert_eq!(b[0].local_hash, local_hash(&[1, 2, 3, 4], BASE_SEED_FOR_TEST));
    let mut bytes: Vec<u8> = [5u32, 6, 7, 8].iter().flat_map(|t| t.to_le_bytes()).collect();
    bytes.extend(3u64.to_le_bytes());
    bytes.extend(9u64.to_le_bytes());
    assert_eq!(b[1].local_hash, xxh3_64_with_seed(&bytes, BASE_SEED_FOR_TEST));
}

#[test]
fn salt_table_is_bounded() {
    let mut conv = WorkerConverter::new(BS);
    let hashes: Vec<u64> = (1..=SALTED_BLOCKS_MAX as u64).collect();
    let full = RawStored {
        cache_salt: Some("s".into()),
        token_ids: vec![1; SALTED_BLOCKS_MAX * BS as usize],
        ..store(&hashes[..1], None, 1)
    };
    let full = RawStored { block_hashes: hashes, ..full };
    let (out, _) = run(&mut conv, vec![RawEvent::Stored(full)]);
    assert_eq!(out.len(), 1);
    assert_eq!(conv.salts.len(), SALTED_BLOCKS_MAX);
    let one_more = RawStored { cache_salt: Some("s".into()), ..store(&[u64::MAX], None, 1) };
    let (out, skips) = run(&mut conv, vec![RawEvent::Stored(one_more)]);
    assert!(out.is_empty());
    assert_eq!(skips.get(SkipReason::SaltTableFull), 1);
    // Unsalted stores are unaffected.
    let (out, _) = run(&mut conv, vec![RawEvent::Stored(store(&[u64::MAX - 1], None, 1))]);
    assert_eq!(out.len(), 1);
}

#[test]
fn malformed_stores_are_counted() {
    assert_eq!(skipped(RawEvent::MalformedStore), SkipReason::MalformedStore);
}

/// A TensorRT-LLM store of `blocks` engine blocks of `size` tokens: text,
/// then an item (digest, offset 1000) over the rest, named `uuid`.
fn trtllm_mm_store(size: u32, uuid: Option<&str>) -> RawStored {
    let digest = "c".repeat(64);
    let mut tokens = vec![11, 12, 0];
    tokens.extend((1..=(2 * size - 3)).map(|k| 1000 + k));
    let key = |start: u64| RawMmKey { hash: digest.clone(), start_offset: start, uuid: uuid.map(Into::into) };
    RawStored {
        block_hashes: vec![(-3i64) as u64, 1 << 63],
        token_ids: tokens,
        multimodal: Some(Box::new(RawMultimodal {
            string_tokens: vec![(2, digest.clone())],
            mm_keys: Some(vec![vec![key(0)], vec![key(u64::from(size) - 2)]]),
        })),
        block_size: size,
        medium: Some("GPU".into()),
        ..Default::default()
    }
}

#[test]
fn trtllm_multimodal_blocks_hash_the_routers_tokens() {
    let pad = hash::mm_pad_token(hash::mm_identifier_hash("photo-1").unwrap());
    let plain = seed_for(None, None);
    for size in [BS, 2 * BS] {
        let (out, reason) = one(RawEvent::Stored(trtllm_mm_store(size, Some("photo-1"))));
        assert_eq!(reason, None);
        let mut routed = vec![11, 12];
        routed.resize(2 * size as usize, pad);
        let (_, got) = blocks(&out[0]);
        let want = locals(&routed, plain);
        assert_eq!(got.iter().map(|b| b.local_hash).collect::<Vec<_>>(), want, "engine blocks of {size}");
        assert_eq!(got.last().unwrap().engine_hash, 1 << 63);
    }
}

#[test]
fn trtllm_items_without_a_uuid_are_stored_unmatchable() {
    let s = trtllm_mm_store(BS, None);
    let (out, reason) = one(RawEvent::Stored(s.clone()));
    assert_eq!(reason, Some(SkipReason::UnmatchableMultimodal));
    let (_, got) = blocks(&out[0]);
    assert_eq!(got.iter().map(|b| b.engine_hash).collect::<Vec<_>>(), s.block_hashes);
    let pad = hash::mm_pad_token(0);
    for (b, chunk) in got.iter().zip(s.token_ids.chunks_exact(BS as usize)) {
        assert_ne!(b.local_hash, local_hash(chunk, seed_for(None, None)));
        assert_ne!(b.local_hash, local_hash(&[11, 12, pad, pad], seed_for(None, None)));
    }
}

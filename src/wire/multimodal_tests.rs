//! Unit tests of the multimodal rebuild: runs found without the offset,
//! ambiguity and missing identities err towards a miss, the learned offset.

use super::*;
use crate::hash::{local_hash, mm_identifier_hash, mm_pad_token, BASE_SEED};
use crate::wire::RawMultimodal;

const OFFSET: u32 = 1000;
const BS: usize = 4;

fn digest(c: char) -> String {
    c.to_string().repeat(64)
}

fn key(item: char, start: u64, uuid: Option<&str>) -> RawMmKey {
    RawMmKey { hash: digest(item), start_offset: start, uuid: uuid.map(str::to_owned) }
}

fn pad(uuid: &str) -> u32 {
    mm_pad_token(mm_identifier_hash(uuid).unwrap())
}

/// A token as the engine sends it: an int, or the digest of item `c`.
#[derive(Clone, Copy)]
enum T {
    I(u32),
    D(char),
}

fn store(tokens: &[T], keys: Option<Vec<Vec<RawMmKey>>>) -> RawStored {
    let mut mm = RawMultimodal { mm_keys: keys, ..RawMultimodal::default() };
    let mut s = RawStored { block_size: BS as u32, ..RawStored::default() };
    for (p, t) in tokens.iter().enumerate() {
        match *t {
            T::I(v) => s.token_ids.push(v),
            T::D(c) => {
                mm.string_tokens.push((p as u32, digest(c)));
                s.token_ids.push(0);
            }
        }
    }
    s.block_hashes = (0..tokens.len() / BS).map(|i| 100 + i as u64).collect();
    s.multimodal = Some(Box::new(mm));
    s
}

fn keys(s: &mut RawStored) -> &mut Vec<Vec<RawMmKey>> {
    s.multimodal.as_mut().unwrap().mm_keys.as_mut().unwrap()
}

use T::{D, I};

/// Two items across three blocks, text inside the first item's span and
/// right after the second (Dynamo's multimodal routing example).
fn two_items() -> RawStored {
    let tokens = [I(1), D('a'), I(1001), I(1002), I(1003), I(7), I(1004), I(1005), I(1006), D('b'), I(1001), I(9)];
    let (ua, ub) = (Some("image-a"), Some("clip-b"));
    let keys =
        vec![vec![key('a', 0, ua)], vec![key('a', 3, ua), key('a', 4, ua)], vec![key('a', 6, ua), key('b', 0, ub)]];
    store(&tokens, Some(keys))
}

#[test]
fn item_runs_become_pad_tokens_and_the_offset_is_learned() {
    let mut r = MmResolver::default();
    let (a, b) = (pad("image-a"), pad("clip-b"));
    let got = r.resolve(&two_items(), BS).unwrap();
    assert_eq!(
        got,
        vec![Routing::Tokens(vec![1, a, a, a]), Routing::Tokens(vec![a, 7, a, a]), Routing::Tokens(vec![a, b, b, 9])]
    );
    assert_eq!(r.offset, Some(OFFSET));
}

#[test]
fn text_only_stores_are_left_alone() {
    let mut r = MmResolver::default();
    assert_eq!(r.resolve(&store(&[I(1), I(2), I(3), I(4)], None), BS), None);
    assert_eq!(r.resolve(&store(&[I(1), I(2), I(3), I(4)], Some(vec![vec![]])), BS), None);
    // A text block beside a multimodal one keeps its tokens.
    let s = store(
        &[I(5), I(6), I(7), I(8), I(1), D('a'), I(1001), I(1002)],
        Some(vec![vec![], vec![key('a', 0, Some("u"))]]),
    );
    let got = r.resolve(&s, BS).unwrap();
    assert_eq!(got[0], Routing::Text);
}

#[test]
fn an_item_without_uuid_leaves_only_its_blocks_unmatchable() {
    let mut s = two_items();
    keys(&mut s)[2][1].uuid = None;
    let got = MmResolver::default().resolve(&s, BS).unwrap();
    let a = pad("image-a");
    assert_eq!(got[..2], [Routing::Tokens(vec![1, a, a, a]), Routing::Tokens(vec![a, 7, a, a])]);
    assert_eq!(got[2], Routing::Unresolved);
}

/// A change that makes a store's keys wrong.
type Spoil = Box<dyn Fn(&mut RawStored)>;

#[test]
fn keys_that_do_not_fit_err_towards_a_miss() {
    let cases: Vec<(&str, Spoil)> = vec![
        ("no keys at all", Box::new(|s| s.multimodal.as_mut().unwrap().mm_keys = None)),
        ("one list short", Box::new(|s| drop(keys(s).pop()))),
        ("digest differs", Box::new(|s| keys(s)[0][0].hash = digest('c'))),
        ("start moved", Box::new(|s| keys(s)[1][1].start_offset = 5)),
        ("a key too many", Box::new(|s| keys(s)[0].push(key('a', 9, Some("x"))))),
        ("a key missing", Box::new(|s| drop(keys(s)[1].pop()))),
    ];
    for (name, spoil) in cases {
        let mut s = two_items();
        spoil(&mut s);
        let mut r = MmResolver::default();
        let got = r.resolve(&s, BS).unwrap();
        assert!(got.iter().all(|b| *b == Routing::Unresolved), "{name}: {got:?}");
        assert_eq!(r.offset, None, "{name}");
    }
}

#[test]
fn two_readings_that_differ_are_unmatchable_until_the_offset_is_known() {
    // After the digest, 6 and 7 are either the item's tokens (offset 5) or
    // text (a one-token item): nothing in this event tells.
    let s = store(&[I(5), D('a'), I(6), I(7)], Some(vec![vec![key('a', 0, Some("u"))]]));
    let mut r = MmResolver::default();
    assert_eq!(r.resolve(&s, BS).unwrap(), vec![Routing::Unresolved]);
    assert_eq!(r.offset, None);
    // An earlier event taught the offset: the same store now reads one way.
    r.offset = Some(5);
    let u = pad("u");
    assert_eq!(r.resolve(&s, BS).unwrap(), vec![Routing::Tokens(vec![5, u, u, u])]);
    r.offset = Some(OFFSET);
    assert_eq!(r.resolve(&s, BS).unwrap(), vec![Routing::Tokens(vec![5, u, 6, 7])]);
}

#[test]
fn a_wrong_learned_offset_gives_way_to_one_that_fits() {
    let mut r = MmResolver { offset: Some(3) };
    let a = pad("image-a");
    assert_eq!(r.resolve(&two_items(), BS).unwrap()[0], Routing::Tokens(vec![1, a, a, a]));
    assert_eq!(r.offset, Some(OFFSET));
}

#[test]
fn a_continuing_run_is_found_from_its_start_offset_alone() {
    // The item started in an earlier event; this block opens with its 40th
    // to 42nd tokens, then text.
    let s = store(&[I(1040), I(1041), I(1042), I(3)], Some(vec![vec![key('a', 40, Some("u"))]]));
    let mut r = MmResolver::default();
    let u = pad("u");
    assert_eq!(r.resolve(&s, BS).unwrap(), vec![Routing::Tokens(vec![u, u, u, 3])]);
    assert_eq!(r.offset, Some(OFFSET));
}

#[test]
fn unmatchable_hashes_are_no_token_hash_and_depend_on_the_block() {
    let mut bytes = Vec::new();
    let tokens = [1, 0, 1001, 1002];
    let h = unmatchable_hash(&tokens, &[&digest('a')], 0, BASE_SEED, &mut bytes);
    assert_eq!(bytes.len() % 4, 1);
    assert_ne!(h, local_hash(&tokens, BASE_SEED));
    assert_eq!(h, unmatchable_hash(&tokens, &[&digest('a')], 0, BASE_SEED, &mut bytes), "deterministic");
    assert_ne!(h, unmatchable_hash(&tokens, &[&digest('b')], 0, BASE_SEED, &mut bytes));
    assert_ne!(h, unmatchable_hash(&tokens, &[&digest('a')], 1, BASE_SEED, &mut bytes));
    for strings in [&[][..], &["x"][..], &["xy"][..], &["xyz"][..]] {
        unmatchable_hash(&tokens, strings, 0, BASE_SEED, &mut bytes);
        assert_eq!(bytes.len() % 4, 1, "{strings:?}");
    }
}

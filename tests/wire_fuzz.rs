//! Property test: no input makes the wire module panic.
//!
//! Feeds random bytes, well-formed batches of random events, and captured
//! engine payloads with random mutations (bit flips, msgpack marker bytes,
//! inserted, deleted, duplicated and truncated spans), to `decode_payload`, the frame splitters and, for
//! whatever decodes, to a long-lived `WorkerConverter` (so its salt and group
//! state sees garbage too). A panic fails the test; errors are expected.
//!
//! 200,000 inputs by default. For a longer run, build in release and set
//! `WIRE_FUZZ_CASES` (and optionally `WIRE_FUZZ_SEED`):
//! `WIRE_FUZZ_CASES=20000000 cargo test --release --test wire_fuzz`

mod wire_support;

use kv_indexer::wire::{decode_payload, split_frames, split_replay_frames, SkipCounters, WorkerConverter};
use kv_indexer::WorkerId;

const CASES_DEFAULT: u64 = 200_000;
/// Longest random input, in bytes.
const RANDOM_LEN_MAX: usize = 512;
/// Most mutations applied to one captured payload.
const MUTATIONS_MAX: usize = 8;
/// Output events kept before the buffer is cleared.
const OUT_EVENTS_MAX: usize = 10_000;

/// SplitMix64: small, fast, good enough to drive mutations reproducibly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

/// Bytes that steer the decoder into interesting paths: container headers,
/// wide lengths, every scalar marker.
const INTERESTING: &[u8] = &[
    0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7, 0xc8, 0xc9, 0xca,
    0xcb, 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd3, 0xd4, 0xd8, 0xd9, 0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xe0, 0xff,
];

fn mutate(rng: &mut Rng, input: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(MUTATIONS_MAX) {
        let len = input.len();
        match rng.below(7) {
            0 if len > 0 => input[rng.below(len)] ^= 1 << rng.below(8),
            1 if len > 0 => input[rng.below(len)] = INTERESTING[rng.below(INTERESTING.len())],
            2 => {
                let at = rng.below(len + 1);
                input.insert(at, INTERESTING[rng.below(INTERESTING.len())]);
            }
            3 if len > 0 => {
                let at = rng.below(len);
                let end = (at + 1 + rng.below(16)).min(len);
                input.drain(at..end);
            }
            4 if len > 0 => {
                let at = rng.below(len);
                let end = (at + 1 + rng.below(32)).min(len);
                let span = input[at..end].to_vec();
                let to = rng.below(input.len() + 1);
                input.splice(to..to, span);
            }
            5 => input.truncate(rng.below(len + 1)),
            _ if len > 0 => input[rng.below(len)] = rng.byte(),
            _ => input.push(rng.byte()),
        }
    }
}

/// A well-formed batch of random events, so the converter sees every
/// combination of fields, not only what survives byte mutations.
fn random_batch(rng: &mut Rng) -> Vec<u8> {
    use rmp::encode::{write_array_len, write_f64, write_map_len, write_nil, write_sint, write_str, write_uint};
    const MEDIA: &[&str] = &["GPU", "cpu", "CPU_PINNED", "DISK", "STORAGE", "EXTERNAL", "TAPE", ""];
    const KINDS: &[&str] = &["full_attention", "sliding_window", "mamba", "unknown"];
    const KEYS: &[&str] = &[
        "dynamo-cache-salt:t",
        "adapter",
        "00000000000000aa000000000000000000000000000000000000000000000000",
        "native",
    ];
    let mut b = Vec::new();
    let hash = |rng: &mut Rng| rng.next() % 24;
    let events = rng.below(6);
    write_array_len(&mut b, 3).unwrap();
    write_f64(&mut b, 1.0).unwrap();
    write_array_len(&mut b, events as u32).unwrap();
    for _ in 0..events {
        let pick = |rng: &mut Rng, list: &[&'static str]| list[rng.below(list.len())];
        match rng.below(4) {
            0 | 1 => {
                let blocks = rng.below(4) as u32;
                let block_size = [0u32, 3, 4, 8, 16, 32, 1024][rng.below(7)];
                let tokens = if rng.below(4) == 0 { rng.below(40) as u32 } else { blocks * block_size };
                write_map_len(&mut b, 11).unwrap();
                write_str(&mut b, "type").unwrap();
                write_str(&mut b, "BlockStored").unwrap();
                write_str(&mut b, "block_hashes").unwrap();
                write_array_len(&mut b, blocks).unwrap();
                for _ in 0..blocks {
                    let h = hash(rng);
                    write_uint(&mut b, h).unwrap();
                }
                write_str(&mut b, "parent_block_hash").unwrap();
                if rng.below(2) == 0 {
                    write_nil(&mut b).unwrap();
                } else {
                    write_uint(&mut b, hash(rng)).unwrap();
                }
                write_str(&mut b, "token_ids").unwrap();
                write_array_len(&mut b, tokens).unwrap();
                for t in 0..tokens {
                    write_uint(&mut b, u64::from(t % 7)).unwrap();
                }
                write_str(&mut b, "block_size").unwrap();
                write_uint(&mut b, u64::from(block_size)).unwrap();
                write_str(&mut b, "medium").unwrap();
                write_str(&mut b, pick(rng, MEDIA)).unwrap();
                write_str(&mut b, "lora_name").unwrap();
                if rng.below(2) == 0 {
                    write_nil(&mut b).unwrap();
                } else {
                    write_str(&mut b, "adapter").unwrap();
                }
                write_str(&mut b, "cache_salt").unwrap();
                if rng.below(3) == 0 {
                    write_str(&mut b, "s").unwrap();
                } else {
                    write_nil(&mut b).unwrap();
                }
                write_str(&mut b, "extra_keys").unwrap();
                let entries = rng.below(4) as u32;
                write_array_len(&mut b, entries).unwrap();
                for _ in 0..entries {
                    if rng.below(2) == 0 {
                        write_nil(&mut b).unwrap();
                        continue;
                    }
                    write_array_len(&mut b, 1).unwrap();
                    if rng.below(2) == 0 {
                        write_str(&mut b, pick(rng, KEYS)).unwrap();
                    } else {
                        write_array_len(&mut b, 2).unwrap();
                        write_str(&mut b, pick(rng, KEYS)).unwrap();
                        write_sint(&mut b, rng.below(5) as i64 - 2).unwrap();
                    }
                }
                write_str(&mut b, "group_idx").unwrap();
                write_uint(&mut b, rng.below(3) as u64).unwrap();
                write_str(&mut b, "kv_cache_spec_kind").unwrap();
                write_str(&mut b, pick(rng, KINDS)).unwrap();
            }
            2 => {
                let blocks = rng.below(4) as u32;
                write_array_len(&mut b, 4).unwrap();
                write_str(&mut b, "BlockRemoved").unwrap();
                write_array_len(&mut b, blocks).unwrap();
                for _ in 0..blocks {
                    let h = hash(rng);
                    write_uint(&mut b, h).unwrap();
                }
                write_str(&mut b, pick(rng, MEDIA)).unwrap();
                write_uint(&mut b, rng.below(3) as u64).unwrap();
            }
            _ => {
                write_array_len(&mut b, 1).unwrap();
                write_str(&mut b, "AllBlocksCleared").unwrap();
            }
        }
    }
    write_uint(&mut b, rng.below(4) as u64).unwrap();
    b
}

#[test]
fn no_input_panics() {
    let cases: u64 = std::env::var("WIRE_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(CASES_DEFAULT);
    let seed: u64 = std::env::var("WIRE_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x6b76_7769_7265);
    let mut rng = Rng(seed);

    let mut corpus: Vec<Vec<u8>> = Vec::new();
    for f in wire_support::load_all() {
        for m in f.live.iter().chain(&f.replay) {
            corpus.push(m.last().unwrap().clone());
        }
    }
    corpus.retain(|p| !p.is_empty());
    assert!(corpus.len() > 100, "fixtures missing");

    let skips = SkipCounters::new();
    let mut converters = [WorkerConverter::new(16), WorkerConverter::new(4)];
    let worker = WorkerId::new(1, 0);
    let mut out = Vec::new();
    let (mut decoded, mut failed) = (0u64, 0u64);
    for case in 0..cases {
        let input = match case % 4 {
            0 => (0..rng.below(RANDOM_LEN_MAX)).map(|_| rng.byte()).collect(),
            1 => random_batch(&mut rng),
            _ => {
                let mut input = corpus[rng.below(corpus.len())].clone();
                mutate(&mut rng, &mut input);
                input
            }
        };
        match decode_payload(&input) {
            Ok(batch) => {
                decoded += 1;
                let conv = &mut converters[case as usize % 2];
                conv.convert(worker, &batch.events, &mut out, &skips, &|_, _| {});
                if out.len() > OUT_EVENTS_MAX {
                    out.clear();
                }
            }
            Err(e) => {
                failed += 1;
                assert!(!e.to_string().is_empty());
            }
        }
        // Frame splitting on shapes cut from the same bytes.
        let cut = rng.below(input.len() + 1);
        let frames = match rng.below(3) {
            0 => vec![input[..cut].to_vec(), input[cut..].to_vec()],
            1 => vec![vec![], input[..cut.min(8)].to_vec(), input.clone()],
            _ => vec![vec![], vec![], input[..cut.min(9)].to_vec(), input.clone()],
        };
        let _ = split_frames(&frames);
        let _ = split_replay_frames(&frames);
    }
    eprintln!("{cases} inputs: {decoded} decoded, {failed} rejected, {} events skipped", skips.total());
    // Both outcomes must have been exercised, or the mutations are too weak or too strong.
    assert!(decoded > cases / 100, "only {decoded} of {cases} inputs decoded");
    assert!(failed > cases / 100, "only {failed} of {cases} inputs failed");
}

#[test]
fn random_batches_are_well_formed() {
    // Otherwise the converter half of the property test would test nothing.
    let mut rng = Rng(1);
    for _ in 0..1_000 {
        let batch = random_batch(&mut rng);
        if let Err(e) = decode_payload(&batch) {
            panic!("{e}: {batch:02x?}");
        }
    }
}

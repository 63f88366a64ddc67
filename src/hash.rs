//! Token ids to block hashes.
//!
//! A request's tokens are cut into full blocks of `block_size` (the partial
//! tail is dropped: engines never cache it). Each block gets a *local* hash,
//! a position-free chunk hash of its tokens. The formula is the one Dynamo
//! and the Mooncake RFC use, so hashes computed by a router and by this
//! daemon agree. What identifies a whole prefix is the index's own chain
//! of local hashes (`index::chain`).

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of every local hash when no LoRA or salt is given.
pub const BASE_SEED: u64 = 1337;

/// The seed for local hashes of blocks under `lora_name` and `cache_salt`.
/// Empty strings count as absent.
pub fn seed_for(lora_name: Option<&str>, cache_salt: Option<&str>) -> u64 {
    let mut seed = BASE_SEED;
    if let Some(lora) = lora_name.filter(|s| !s.is_empty()) {
        seed = seed.wrapping_add(xxh3_64_with_seed(lora.as_bytes(), 0));
    }
    if let Some(salt) = cache_salt.filter(|s| !s.is_empty()) {
        seed = seed.wrapping_add(xxh3_64_with_seed(salt.as_bytes(), 1));
    }
    seed
}

/// Local hash of one block of tokens (u32 little-endian, concatenated).
pub fn local_hash(tokens: &[u32], seed: u64) -> u64 {
    // Blocks are small; a stack buffer covers the usual sizes without allocating.
    let mut stack = [0u8; 256];
    let len = tokens.len() * 4;
    if len <= stack.len() {
        for (chunk, t) in stack.chunks_exact_mut(4).zip(tokens) {
            chunk.copy_from_slice(&t.to_le_bytes());
        }
        xxh3_64_with_seed(&stack[..len], seed)
    } else {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        xxh3_64_with_seed(&bytes, seed)
    }
}

/// Appends the local hashes of every full block of `tokens` to `out`.
/// `block_size` must be at least 1.
pub fn local_hashes_into(tokens: &[u32], block_size: usize, seed: u64, out: &mut Vec<u64>) {
    assert!(block_size > 0, "block_size must be at least 1");
    out.extend(tokens.chunks_exact(block_size).map(|b| local_hash(b, seed)));
}

/// A block hash as JSON bodies and dumps carry it: any integer in
/// [-2^63, 2^64), a negative one taken as two's complement.
pub struct JsonHash(pub u64);

impl<'de> serde::Deserialize<'de> for JsonHash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = JsonHash;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an integer hash in [-2^63, 2^64)")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<JsonHash, E> {
                Ok(JsonHash(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<JsonHash, E> {
                Ok(JsonHash(v as u64))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn locals(tokens: &[u32], bs: usize, seed: u64) -> Vec<u64> {
        let mut out = Vec::new();
        local_hashes_into(tokens, bs, seed, &mut out);
        out
    }

    const TOKENS: [u32; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

    #[test]
    fn plain_vectors() {
        let l = locals(&TOKENS, 4, seed_for(None, None));
        assert_eq!(l, vec![14643705804678351452, 16777012769546811212]);
        assert_eq!(locals(&[9, 10, 11, 12], 4, BASE_SEED), vec![483935686894639516]);
    }

    #[test]
    fn lora_vectors() {
        let l = locals(&TOKENS, 4, seed_for(Some("adapter-a"), None));
        assert_eq!(l, vec![11381080598872079209, 5698110331184095209]);
    }

    #[test]
    fn salt_vectors() {
        let l = locals(&TOKENS, 4, seed_for(None, Some("tenant-1")));
        assert_eq!(l, vec![12236259103925738072, 16244233118725531467]);
    }

    #[test]
    fn empty_names_count_as_absent_and_tail_is_dropped() {
        assert_eq!(seed_for(Some(""), Some("")), BASE_SEED);
        assert_eq!(locals(&[1, 2, 3, 4, 5, 6, 7], 4, BASE_SEED).len(), 1);
        assert!(locals(&[1, 2, 3], 4, BASE_SEED).is_empty());
    }

    #[test]
    fn large_blocks_hash_like_small_ones() {
        let tokens: Vec<u32> = (0..200).collect();
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(local_hash(&tokens, 7), xxh3_64_with_seed(&bytes, 7));
    }
}

//! Token ids to block hashes.
//!
//! A request's tokens are cut into full blocks of `block_size` (the partial
//! tail is dropped: engines never cache it). Each block gets a *local* hash,
//! a position-free chunk hash of its tokens. The formula is the one Dynamo
//! and the Mooncake RFC use, so hashes computed by a router and by this
//! daemon agree. What identifies a whole prefix is the index's own chain
//! of local hashes (`index::chain`).
//!
//! A multimodal item (an image, a clip) enters a request's tokens, not a
//! side channel: a router writes every token position the item's embedding
//! fills as [`mm_pad_token`] of the item's identifier (Dynamo's convention,
//! SGLang's pad value), and hashes blocks as usual. An engine event that
//! marks those positions is rewritten the same way (`wire::multimodal`).

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

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

/// Smallest multimodal pad token; real vocabularies end below it.
pub const MM_PAD_BASE: u32 = 1_000_000;
/// Bits of an item's hash a pad token keeps.
const MM_PAD_HASH_MASK: u64 = (1 << 30) - 1;

/// The 64-bit hash of a multimodal item's identifier, as Dynamo's router
/// computes it: a 64-digit hex digest gives its first 16 digits, any other
/// non-empty string its XXH3-64 (seed 0); empty is None.
pub fn mm_identifier_hash(identifier: &str) -> Option<u64> {
    if identifier.is_empty() {
        return None;
    }
    let bytes = identifier.as_bytes();
    if bytes.len() == 64 && bytes.iter().all(u8::is_ascii_hexdigit) {
        return u64::from_str_radix(&identifier[..16], 16).ok();
    }
    Some(xxh3_64(bytes))
}

/// The token a router writes at every embedding position of the item whose
/// identifier hashes to `item_hash`: `MM_PAD_BASE` plus its low 30 bits.
pub fn mm_pad_token(item_hash: u64) -> u32 {
    // At most 1_000_000 + 2^30 - 1, below u32::MAX.
    MM_PAD_BASE + (item_hash & MM_PAD_HASH_MASK) as u32
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
    fn mm_identifiers_and_pad_tokens() {
        let digest = format!("0123456789abcdef{}", "f".repeat(48));
        assert_eq!(mm_identifier_hash(&digest), Some(0x0123_4567_89ab_cdef));
        assert_eq!(mm_identifier_hash(&digest.to_uppercase()), Some(0x0123_4567_89ab_cdef));
        // Not 64 hex digits: hashed as text.
        assert_eq!(mm_identifier_hash("image-0"), Some(xxh3_64(b"image-0")));
        assert_eq!(mm_identifier_hash(&digest[..63]), Some(xxh3_64(&digest.as_bytes()[..63])));
        assert_eq!(mm_identifier_hash(""), None);
        assert_eq!(mm_pad_token(0), 1_000_000);
        assert_eq!(mm_pad_token(u64::MAX), 1_000_000 + (1 << 30) - 1);
        assert_eq!(mm_pad_token(0x0123_4567_89ab_cdef), 1_000_000 + 0x09ab_cdef);
    }

    #[test]
    fn large_blocks_hash_like_small_ones() {
        let tokens: Vec<u32> = (0..200).collect();
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(local_hash(&tokens, 7), xxh3_64_with_seed(&bytes, 7));
    }
}

//! vLLM's per-block `extra_keys`, sorted into what a local hash needs.
//!
//! vLLM publishes, for each block, the extra values its own block hash mixed
//! in, untagged: the LoRA name (every block), multimodal identifiers as
//! `(identifier, offset)` pairs, the request's cache salt (first block of a
//! request only) and prompt-embedding digests (bytes). Untagged, a salt and
//! an identifier look alike, so only two conventions are trusted (Dynamo's):
//!
//! - a string `"dynamo-cache-salt:<salt>"` in the event's first block is the
//!   salt, after skipping one item equal to the LoRA name;
//! - a multimodal identifier of 16 hex digits followed by 48 `'0'`s carries a
//!   64-bit multimodal hash (the first 16 digits); the block's local hash
//!   appends those hashes, sorted, as u64 little-endian after its tokens.
//!
//! Anything else (a native identifier, a bare salt, a digest) changes the
//! engine's cache key in a way tokens cannot reproduce. Hashing such a block
//! from its tokens alone would make it match requests it does not serve, so
//! the block and the rest of its chain in that event are marked opaque and
//! the converter leaves them out.

/// Prefix that marks a cache salt among vLLM `extra_keys` (Dynamo's convention).
pub const CACHE_SALT_TAG: &str = "dynamo-cache-salt:";

/// One item of a block's `extra_keys`, borrowed from the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExtraKey<'a> {
    Text(&'a str),
    /// `(identifier, offset)`: a multimodal item (vLLM 0.19+).
    TextWithOffset(&'a str),
    /// Any other shape (bytes digest, number, nested value).
    Other,
}

/// `extra_keys` of one event as decoded: per block, None or its items.
pub(crate) type BlockKeys<'a> = Vec<Option<Vec<ExtraKey<'a>>>>;

/// What the converter needs from an event's `extra_keys`.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Classified {
    pub salt: Option<String>,
    pub block_mm_hashes: Vec<Vec<u64>>,
    pub opaque_from: Option<u32>,
}

/// The multimodal hash carried by an identifier in Dynamo's marked form.
fn marked_mm_hash(text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    if bytes.len() == 64 && bytes[..16].iter().all(u8::is_ascii_hexdigit) && bytes[16..].iter().all(|&b| b == b'0') {
        return u64::from_str_radix(&text[..16], 16).ok();
    }
    None
}

/// Sorts an event's keys into salt, multimodal hashes and the first opaque block.
pub(crate) fn classify(blocks: &BlockKeys<'_>, lora_name: Option<&str>) -> Classified {
    let mut out = Classified::default();
    let mut any_mm = false;
    for (index, keys) in blocks.iter().enumerate() {
        let mut hashes = Vec::new();
        let mut lora_pending = lora_name.filter(|n| !n.is_empty());
        for key in keys.iter().flatten() {
            let text = match *key {
                ExtraKey::Text(text) => {
                    if lora_pending == Some(text) {
                        lora_pending = None;
                        continue;
                    }
                    if let Some(salt) = text.strip_prefix(CACHE_SALT_TAG) {
                        if index == 0 && out.salt.is_none() && !salt.is_empty() {
                            out.salt = Some(salt.to_owned());
                        }
                        continue;
                    }
                    Some(text)
                }
                ExtraKey::TextWithOffset(text) => Some(text),
                ExtraKey::Other => None,
            };
            match text.and_then(marked_mm_hash) {
                Some(hash) => hashes.push(hash),
                None => {
                    if out.opaque_from.is_none() {
                        // Block counts are bounded far below u32::MAX by the decoder.
                        out.opaque_from = Some(u32::try_from(index).unwrap_or(u32::MAX));
                    }
                }
            }
        }
        hashes.sort_unstable();
        any_mm |= !hashes.is_empty();
        out.block_mm_hashes.push(hashes);
    }
    if !any_mm {
        out.block_mm_hashes = Vec::new();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ExtraKey::*;

    const MM_A: &str = "00000000000000aa000000000000000000000000000000000000000000000000";
    const MM_B: &str = "0123456789ABCDEF000000000000000000000000000000000000000000000000";

    #[test]
    fn tagged_salt_in_first_block_after_lora() {
        let blocks = vec![Some(vec![Text("adapter-a"), Text("dynamo-cache-salt:adapter-a")]), None];
        let c = classify(&blocks, Some("adapter-a"));
        assert_eq!(c.salt.as_deref(), Some("adapter-a"));
        assert_eq!(c.opaque_from, None);
        assert!(c.block_mm_hashes.is_empty());
    }

    #[test]
    fn lora_name_is_skipped_in_every_block() {
        let blocks = vec![Some(vec![Text("l")]), Some(vec![Text("l")])];
        assert_eq!(classify(&blocks, Some("l")), Classified::default());
        // Without a LoRA name the same string is opaque.
        assert_eq!(classify(&blocks, None).opaque_from, Some(0));
    }

    #[test]
    fn salt_outside_the_first_block_or_empty_is_ignored() {
        let blocks = vec![Some(vec![Text("dynamo-cache-salt:")]), Some(vec![Text("dynamo-cache-salt:x")])];
        let c = classify(&blocks, None);
        assert_eq!(c.salt, None);
        assert_eq!(c.opaque_from, None);
    }

    #[test]
    fn marked_mm_hashes_are_parsed_and_sorted() {
        let blocks = vec![None, Some(vec![TextWithOffset(MM_B), Text(MM_A)])];
        let c = classify(&blocks, None);
        assert_eq!(c.block_mm_hashes, vec![vec![], vec![0xaa, 0x0123_4567_89ab_cdef]]);
        assert_eq!(c.opaque_from, None);
    }

    #[test]
    fn native_identifiers_untagged_salts_and_digests_are_opaque() {
        let native = "9f".repeat(32);
        for key in [TextWithOffset(&native), Text("tenant-1"), Other] {
            let blocks = vec![None, None, Some(vec![key])];
            assert_eq!(classify(&blocks, None).opaque_from, Some(2), "{key:?}");
        }
        assert_eq!(marked_mm_hash(&"0".repeat(63)), None);
        assert_eq!(marked_mm_hash(&format!("{}1", &MM_A[..63])), None);
        assert_eq!(marked_mm_hash(&format!("g{}", &MM_A[1..])), None);
    }
}

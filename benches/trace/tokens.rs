//! Deterministic token ids for trace requests.
//!
//! A trace gives only block ids, so each id is expanded into
//! `TRACE_BLOCK_TOKENS` tokens derived from the id alone: two requests that
//! share an id share those tokens, and different ids give different tokens.
//! Output tokens come from the request's own key, so generated text never
//! collides with prompts. The mixing function is splitmix64 (public domain
//! constants), chosen for speed and full-avalanche output.

use super::mooncake::TRACE_BLOCK_TOKENS;

/// Domain tag that keeps output-token keys apart from hash-id keys.
const OUTPUT_DOMAIN: u64 = 0xA5A5_0000_0000_0000;

#[inline]
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A mixed 64-bit value derived from `x` (used for seeds and worker choice too).
pub fn mix64(x: u64) -> u64 {
    splitmix64(x)
}

/// Appends the prompt tokens of `hash_ids`, cut to `input_tokens`.
pub fn prompt_tokens(hash_ids: &[u64], input_tokens: usize, out: &mut Vec<u32>) {
    let start = out.len();
    for &id in hash_ids {
        let base = splitmix64(id);
        out.extend((0..TRACE_BLOCK_TOKENS as u64).map(|j| splitmix64(base ^ j) as u32));
    }
    out.truncate(start + input_tokens);
}

/// Appends `n` output tokens of the request whose key is `request_key`.
pub fn output_tokens(request_key: u64, n: usize, out: &mut Vec<u32>) {
    let base = splitmix64(request_key ^ OUTPUT_DOMAIN);
    out.extend((0..n as u64).map(|j| splitmix64(base.wrapping_add(j) ^ OUTPUT_DOMAIN) as u32));
}

//! Dynamo's sequence hashes: the prefix-identifying chain its mock engines
//! and routers compute from local hashes. The daemon never needs them (its
//! index derives its own chain, `index::chain`); the benches' mock engines
//! and the tests' exact models use them as an independent prefix identity.
//! Shared by `#[path]` with the index tests and the HTTP benches.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The seed of every sequence hash (LoRA and salt enter only through the
/// local hashes).
const SEED: u64 = 1337;

/// The sequence hash of a block whose parent has sequence hash `parent`.
#[inline]
pub fn chain_hash(parent: u64, local: u64) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&parent.to_le_bytes());
    bytes[8..].copy_from_slice(&local.to_le_bytes());
    xxh3_64_with_seed(&bytes, SEED)
}

/// Replaces `out` with the sequence hashes of the blocks whose local hashes are `locals`.
pub fn sequence_hashes_into(locals: &[u64], out: &mut Vec<u64>) {
    out.clear();
    let mut prev = None;
    out.extend(locals.iter().map(|&local| {
        let seq = prev.map_or(local, |p| chain_hash(p, local));
        prev = Some(seq);
        seq
    }));
}

//! The documents engines cache and clients ask for: a fixed pool, grouped
//! in families that share their first blocks (a system prompt), with block
//! contents derived from the block's identity so engines and clients agree
//! on tokens without sharing state.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Shape of the document pool.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub block_size: u32,
    pub docs: u64,
    pub families: u64,
    /// Blocks every document of a family shares.
    pub shared_blocks: u32,
    /// Longest document, in blocks.
    pub doc_blocks_max: u32,
}

/// A tiny xorshift generator: deterministic and dependency-free.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl Workload {
    /// A document, skewed towards low numbers (popular documents).
    pub fn pick_doc(&self, rng: &mut Rng) -> u64 {
        ((rng.unit().powi(3) * self.docs as f64) as u64).min(self.docs - 1)
    }

    /// How many blocks document `doc` has (at least the shared ones, at least 1).
    pub fn doc_len(&self, doc: u64) -> u32 {
        let span = (self.doc_blocks_max - self.shared_blocks).max(1) as u64;
        (self.shared_blocks + 1 + (xxh3_64_with_seed(&doc.to_le_bytes(), 7) % span) as u32).min(self.doc_blocks_max)
    }

    /// The identity of block `pos` of `doc`: shared by the family below `shared_blocks`.
    pub fn block_id(&self, doc: u64, pos: u32) -> u64 {
        let owner = if pos < self.shared_blocks { u64::MAX - doc % self.families } else { doc };
        let mut key = [0u8; 12];
        key[..8].copy_from_slice(&owner.to_le_bytes());
        key[8..].copy_from_slice(&pos.to_le_bytes());
        xxh3_64_with_seed(&key, 0x50a4)
    }

    /// The tokens of a block, from its identity.
    pub fn tokens_into(&self, block_id: u64, out: &mut Vec<u32>) {
        let mut rng = Rng::new(block_id);
        out.extend((0..self.block_size).map(|_| (rng.below(50_000)) as u32));
    }

    /// The tokens of the first `blocks` blocks of `doc`, plus a partial tail.
    pub fn prompt(&self, doc: u64, blocks: u32, tail: u32, out: &mut Vec<u32>) {
        out.clear();
        for pos in 0..blocks {
            self.tokens_into(self.block_id(doc, pos), out);
        }
        out.extend((0..tail.min(self.block_size - 1)).map(|i| 7 + i));
    }
}

//! The prefix hash that keys predictions: position-aware, computed from a
//! request's local block hashes, the same ones a query brings.
//!
//! `p[0] = next(START, local[0])`, `p[i] = next(p[i - 1], local[i])`, so
//! `p[i]` identifies the whole prefix up to block `i`, and with it the
//! position. Every step is a bijection of the local hash for a fixed
//! parent: two chunks under one parent never share a prefix hash; two
//! different prefixes collide with probability 2^-64. It never leaves the
//! daemon, so it is chosen for speed (two multiplies a block).

/// The parent of the first block.
const START: u64 = 0x243F_6A88_85A3_08D3;
const M1: u64 = 0x9FB2_1C65_1E98_DF25;
const M2: u64 = 0xC2B2_AE3D_27D4_EB4F;

/// The prefix hash of a block with local hash `local` under `parent`.
#[inline]
pub fn next(parent: u64, local: u64) -> u64 {
    let mut h = (parent.rotate_left(23) ^ local).wrapping_mul(M1);
    h ^= h >> 31;
    h = h.wrapping_mul(M2) ^ parent;
    h ^ (h >> 29)
}

/// Replaces `out` with the prefix hashes of the blocks whose local hashes are `locals`.
pub fn prefix_hashes_into(locals: &[u64], out: &mut Vec<u64>) {
    out.clear();
    out.reserve(locals.len());
    let mut p = START;
    for &l in locals {
        p = next(p, l);
        out.push(p);
    }
}

/// A query's prefix hashes, computed only as deep as a lookup asks.
pub struct LazyPrefixes<'a> {
    locals: &'a [u64],
    done: &'a mut Vec<u64>,
}

impl<'a> LazyPrefixes<'a> {
    /// Prefix hashes of `locals`, kept in `scratch` (cleared here).
    pub fn new(locals: &'a [u64], scratch: &'a mut Vec<u64>) -> Self {
        scratch.clear();
        LazyPrefixes { locals, done: scratch }
    }

    pub fn len(&self) -> usize {
        self.locals.len()
    }

    /// The prefix hash of block `i` (`i < len()`).
    pub fn at(&mut self, i: usize) -> u64 {
        while self.done.len() <= i {
            let parent = self.done.last().copied().unwrap_or(START);
            self.done.push(next(parent, self.locals[self.done.len()]));
        }
        self.done[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lazy_and_eager_agree_and_prefixes_depend_on_everything_before() {
        let locals = [5u64, 9, 5, 5, 1];
        let mut eager = Vec::new();
        prefix_hashes_into(&locals, &mut eager);
        let mut scratch = vec![77];
        let mut lazy = LazyPrefixes::new(&locals, &mut scratch);
        assert_eq!(lazy.at(3), eager[3]);
        assert_eq!((0..5).map(|i| lazy.at(i)).collect::<Vec<_>>(), eager);
        // One chunk at two positions, or under two parents: two hashes.
        assert_ne!(eager[2], eager[3]);
        let mut other = Vec::new();
        prefix_hashes_into(&[6, 9, 5], &mut other);
        assert_ne!(other[2], eager[2]);
        assert_eq!(other.len(), 3);
    }

    #[test]
    fn a_step_is_a_bijection_of_the_local_hash() {
        let mut seen = std::collections::HashSet::new();
        for l in 0..10_000u64 {
            assert!(seen.insert(next(12345, l)));
        }
    }
}

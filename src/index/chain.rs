//! The index's own prefix hash.
//!
//! A block's chain hash identifies its whole prefix: the block at position 0
//! has its local hash as chain, and every later block mixes its parent's
//! chain with its own local hash. It never leaves the index (queries bring
//! local hashes; dumps carry local and engine hashes), so it is chosen for
//! speed, not compatibility. Every step is a bijection of the local hash
//! for a fixed parent, so two different chunks under the same parent can
//! never share a chain; chains of different parents collide with
//! probability 2^-64.

/// The chain hash of a block with local hash `local` under a parent with chain `parent`.
#[inline]
pub(crate) fn next(parent: u64, local: u64) -> u64 {
    let mut h = (parent.rotate_left(25) ^ local).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^= h >> 32;
    h = h.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ parent.wrapping_mul(0xA076_1D64_78BD_642F);
    h ^= h >> 29;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^ (h >> 32)
}

/// The chain hashes of a query, computed only as far as the search looks.
pub(crate) struct Chains<'a> {
    locals: &'a [u64],
    chains: &'a mut Vec<u64>,
}

impl<'a> Chains<'a> {
    pub(crate) fn new(locals: &'a [u64], chains: &'a mut Vec<u64>) -> Self {
        chains.clear();
        Chains { locals, chains }
    }

    pub(crate) fn len(&self) -> usize {
        self.locals.len()
    }

    /// The chain hash at position `i` (< len).
    #[inline]
    pub(crate) fn at(&mut self, i: usize) -> u64 {
        while self.chains.len() <= i {
            let k = self.chains.len();
            let c = match k {
                0 => self.locals[0],
                _ => next(self.chains[k - 1], self.locals[k]),
            };
            self.chains.push(c);
        }
        self.chains[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siblings_never_collide() {
        // Bijective in `local` for a fixed parent: distinct inputs, distinct outputs.
        let mut seen = std::collections::HashSet::new();
        for local in 0..100_000u64 {
            assert!(seen.insert(next(42, local)));
        }
    }

    #[test]
    fn lazy_chains_match_eager_ones() {
        let locals = [5u64, 6, 7, 8];
        let mut buf = Vec::new();
        let mut c = Chains::new(&locals, &mut buf);
        let last = c.at(3);
        assert_eq!(c.at(0), 5);
        assert_eq!(last, next(next(next(5, 6), 7), 8));
    }
}

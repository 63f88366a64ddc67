//! The index's own prefix hash.
//!
//! A block's chain hash identifies its whole prefix: the block at position 0
//! has its local hash as chain, and every later block adds a strong mix of
//! its own local hash and its position to its parent's chain. It never
//! leaves the index (queries bring local hashes; dumps carry local and
//! engine hashes), so it is chosen for speed, not compatibility. Every step
//! is a bijection of the local hash for a fixed parent and position, so two
//! different chunks under the same parent can never share a chain, and one
//! of the parent's chain for a fixed block, so neither can one chunk under
//! two parents; any other two prefixes share a chain with probability
//! 2^-64 (the position in the mix keeps the same chunks in another order
//! apart). Every step can also be undone (`local_of`), so the index stores
//! chains alone and recovers local hashes for dumps.
//!
//! Only an add is on the path from block to block; the mixes depend on
//! their block alone and overlap. On a CPU with AVX-512's 64-bit vector
//! multiply (F, DQ, VL; detected at run time) a query works out the mixes
//! of eight blocks at a time in two 256-bit vectors (`extend`), and a test
//! holds them equal to the portable loop. Chains never leave the process,
//! so changing the function changes no format. Predictions key their
//! bookings by the same chains (`chains_into`, `Chains`).

/// The chain hash of the block at position `pos` (at least 1) with local
/// hash `local`, under a parent with chain `parent`.
///
/// Only an add is on the path from one block to the next (one cycle); the
/// mixes of the local hashes ahead depend on nothing but their block and
/// overlap, so a long prefix costs what its multiplies cost, two a block.
/// (A multiply of the parent's chain on that path made it four cycles a
/// block.)
#[inline]
pub(crate) fn next(parent: u64, local: u64, pos: u32) -> u64 {
    parent.wrapping_add(mix(local.wrapping_add(position_key(pos))))
}

/// What the position adds to a local hash before the mix.
#[inline]
fn position_key(pos: u32) -> u64 {
    u64::from(pos).wrapping_mul(K3)
}

/// A strong bijective mixer.
#[inline]
fn mix(x: u64) -> u64 {
    let mut h = x.wrapping_mul(K1);
    h ^= h >> 32;
    h = h.wrapping_mul(K2);
    h ^ (h >> 29)
}

const K1: u64 = 0x9E37_79B9_7F4A_7C15;
const K2: u64 = 0xD6E8_FEB8_6659_FD93;
const K3: u64 = 0xA076_1D64_78BD_642F;

/// The multiplicative inverse of an odd `k` modulo 2^64 (Newton's iteration).
const fn inverse(k: u64) -> u64 {
    let mut x = k;
    let mut i = 0;
    while i < 6 {
        x = x.wrapping_mul(2u64.wrapping_sub(k.wrapping_mul(x)));
        i += 1;
    }
    x
}

const K1_INV: u64 = inverse(K1);
const K2_INV: u64 = inverse(K2);

/// The local hash of the block at position `pos`, from its chain and its
/// parent's chain (None at position 0): `next` undone. The index keeps
/// chains only; dumps need local hashes back.
pub(crate) fn local_of(parent: Option<u64>, chain: u64, pos: u32) -> u64 {
    let Some(parent) = parent else { return chain };
    let h3 = chain.wrapping_sub(parent);
    // Undo `h ^ (h >> 29)`: each pass recovers 29 more high bits.
    let mut h2 = h3;
    for _ in 0..3 {
        h2 = h3 ^ (h2 >> 29);
    }
    let h1 = h2.wrapping_mul(K2_INV);
    let h0 = h1 ^ (h1 >> 32);
    h0.wrapping_mul(K1_INV).wrapping_sub(position_key(pos))
}

/// The chain hashes of a query, computed only as far as the search looks,
/// the latest of them kept in a ring.
///
/// The search never looks back more than a jump behind the furthest block
/// it reached, so a ring of a few jumps holds every chain it asks for
/// again; a walk that starts over (a retry) computes them anew. Nothing
/// is written per block but the ring: a query of thousands of blocks
/// would otherwise write 8 bytes a block to memory it last touched a
/// query ago.
pub(crate) struct Chains<'a> {
    locals: &'a [u64],
    ring: &'a mut Vec<u64>,
    /// Chains of positions below this have been computed.
    next: usize,
    /// The CPU has AVX-512F, DQ and VL (see `extend`).
    wide: bool,
}

impl<'a> Chains<'a> {
    /// `jump` is the farthest the search looks back (at least 1).
    pub(crate) fn new(locals: &'a [u64], ring: &'a mut Vec<u64>, jump: usize) -> Self {
        let len = (2 * jump + 2).next_power_of_two().max(64);
        ring.clear();
        ring.resize(len, 0);
        Chains { locals, ring, next: 0, wide: wide_mixes() }
    }

    pub(crate) fn len(&self) -> usize {
        self.locals.len()
    }

    /// The chain hash at position `i` (< len).
    #[inline]
    pub(crate) fn at(&mut self, i: usize) -> u64 {
        // The ring as a local slice: its address and length stay in
        // registers while the loop writes through it (behind the `Vec` they
        // were loaded again for every block, and checked).
        let ring = self.ring.as_mut_slice();
        let mask = ring.len() - 1;
        if i < self.next {
            if i + ring.len() >= self.next {
                return ring[i & mask];
            }
            self.next = 0;
        }
        // The chain so far stays in a register; the mixes of the locals
        // ahead are independent of it and overlap.
        let from = self.next;
        let c = match from {
            0 => self.locals[0],
            k => next(ring[(k - 1) & mask], self.locals[k], k as u32),
        };
        ring[from & mask] = c;
        let c = extend(ring, self.locals, from + 1, i + 1, c, self.wide);
        self.next = i + 1;
        c
    }
}

/// Replaces `out` with the chain hashes of a whole prefix whose local
/// hashes are `locals`.
pub(crate) fn chains_into(locals: &[u64], out: &mut Vec<u64>) {
    out.clear();
    let Some(&first) = locals.first() else { return };
    // `extend` writes a ring: one at least as long as the prefix keeps
    // every chain at its position.
    out.resize(locals.len().next_power_of_two(), 0);
    out[0] = first;
    extend(out, locals, 1, locals.len(), first, wide_mixes());
    out.truncate(locals.len());
}

/// Blocks whose mixes are worked out together before they are added along
/// the prefix.
const LANES: usize = 8;

/// The chains of positions `from..to` into `ring` (each at `position &
/// (ring.len() - 1)`), from `c`, the chain at `from - 1`; returns the
/// last. With `wide` (the CPU has AVX-512's 64-bit vector multiply) the
/// mixes of eight blocks are worked out in two vectors, and only the adds
/// along the prefix are left one a block.
#[inline]
fn extend(ring: &mut [u64], locals: &[u64], from: usize, to: usize, c: u64, wide: bool) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if wide {
        // SAFETY: `wide` is set only where the CPU has them (`wide_mixes`).
        return unsafe { wide::extend(ring, locals, from, to, c) };
    }
    let _ = wide;
    extend_lanes(ring, locals, from, to, c, mixes)
}

/// The mixes of eight consecutive blocks from the one whose position key
/// is `key`.
#[inline(always)]
fn mixes(locals: &[u64; LANES], key: u64) -> [u64; LANES] {
    std::array::from_fn(|j| mix(locals[j].wrapping_add(key.wrapping_add(K3.wrapping_mul(j as u64)))))
}

/// Whether the CPU has what `wide::extend` uses.
fn wide_mixes() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512dq")
        && std::is_x86_feature_detected!("avx512vl");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(target_arch = "x86_64")]
mod wide {
    use super::{extend_lanes, K1, K2, K3, LANES};
    use std::arch::x86_64::*;

    /// `super::extend` with the mixes in vectors.
    #[target_feature(enable = "avx512f,avx512dq,avx512vl")]
    pub(super) unsafe fn extend(ring: &mut [u64], locals: &[u64], from: usize, to: usize, c: u64) -> u64 {
        extend_lanes(ring, locals, from, to, c, |l, key| unsafe { mixes(l, key) })
    }

    /// `super::mixes`, four lanes to a 256-bit vector: AVX-512's 64-bit
    /// multiply on 256-bit vectors, which costs no clock speed on the
    /// CPUs that slow down for 512-bit ones (and is as fast where 512-bit
    /// vectors are run as two halves).
    #[inline(always)]
    unsafe fn mixes(locals: &[u64; LANES], key: u64) -> [u64; LANES] {
        let k3 = _mm256_set1_epi64x(K3 as i64);
        let (k1, k2) = (_mm256_set1_epi64x(K1 as i64), _mm256_set1_epi64x(K2 as i64));
        let low =
            _mm256_add_epi64(_mm256_set1_epi64x(key as i64), _mm256_mullo_epi64(_mm256_set_epi64x(3, 2, 1, 0), k3));
        let high = _mm256_add_epi64(low, _mm256_mullo_epi64(_mm256_set1_epi64x(4), k3));
        let mut out = [0u64; LANES];
        for (half, keys) in [low, high].into_iter().enumerate() {
            // SAFETY: lanes 4 * half .. 4 * half + 4 of the eight: 32 bytes
            // inside `locals` and `out`; unaligned loads and stores are allowed.
            let x = _mm256_add_epi64(_mm256_loadu_si256(locals.as_ptr().add(4 * half).cast()), keys);
            let h = _mm256_mullo_epi64(x, k1);
            let h = _mm256_xor_si256(h, _mm256_srli_epi64::<32>(h));
            let h = _mm256_mullo_epi64(h, k2);
            let h = _mm256_xor_si256(h, _mm256_srli_epi64::<29>(h));
            _mm256_storeu_si256(out.as_mut_ptr().add(4 * half).cast(), h);
        }
        out
    }
}

/// `extend`'s loop: the mixes of `LANES` blocks (`mixes`), which depend on
/// nothing but their blocks, then their adds.
#[inline(always)]
fn extend_lanes(
    ring: &mut [u64],
    locals: &[u64],
    from: usize,
    to: usize,
    mut c: u64,
    mixes: impl Fn(&[u64; LANES], u64) -> [u64; LANES],
) -> u64 {
    let mask = ring.len() - 1;
    let mut k = from;
    let (lanes, rest) = locals[from..to].as_chunks::<LANES>();
    for l in lanes {
        for (j, m) in mixes(l, position_key(k as u32)).iter().enumerate() {
            c = c.wrapping_add(*m);
            ring[(k + j) & mask] = c;
        }
        k += LANES;
    }
    for &local in rest {
        c = next(c, local, k as u32);
        ring[k & mask] = c;
        k += 1;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siblings_never_collide() {
        // Bijective in `local` for a fixed parent: distinct inputs, distinct outputs.
        let mut seen = std::collections::HashSet::new();
        for local in 0..100_000u64 {
            assert!(seen.insert(next(42, local, 7)));
        }
    }

    /// The same chunks in another order, or at other positions, end in
    /// other chains: a sum of mixes of the local hashes alone would not.
    #[test]
    fn reordered_prefixes_do_not_collide() {
        let chain_of = |locals: &[u64]| {
            let mut c = locals[0];
            for (i, &l) in locals.iter().enumerate().skip(1) {
                c = next(c, l, i as u32);
            }
            c
        };
        let mut seen = std::collections::HashSet::new();
        for a in 0..40u64 {
            for b in 0..40u64 {
                for c in 0..40u64 {
                    assert!(seen.insert(chain_of(&[1, a, b, c])), "[1, {a}, {b}, {c}]");
                }
            }
        }
        assert_ne!(chain_of(&[1, 2, 3]), chain_of(&[1, 3, 2]));
        assert_ne!(next(5, 6, 1), next(5, 6, 2));
    }

    #[test]
    fn local_hashes_come_back_from_chains() {
        let mut x = 0x1234_5678_9ABC_DEF0u64;
        for _ in 0..100_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let (parent, local, pos) = (x.rotate_left(17) ^ 0x55, x, (x >> 40) as u32 | 1);
            assert_eq!(local_of(Some(parent), next(parent, local, pos), pos), local);
        }
        assert_eq!(local_of(None, 42, 0), 42);
        assert_eq!(local_of(Some(1), next(1, 9, u32::MAX), u32::MAX), 9);
    }

    #[test]
    fn whole_prefix_chains_match_stepwise_ones() {
        let mut out = vec![7];
        chains_into(&[], &mut out);
        assert!(out.is_empty());
        for n in [1usize, 2, 8, 9, 100] {
            let locals: Vec<u64> = (0..n as u64).map(|i| i.wrapping_mul(K2) ^ 3).collect();
            chains_into(&locals, &mut out);
            let mut c = locals[0];
            assert_eq!(out[0], c);
            for i in 1..n {
                c = next(c, locals[i], i as u32);
                assert_eq!(out[i], c, "{n} blocks, position {i}");
            }
            assert_eq!(out.len(), n);
        }
    }

    #[test]
    fn lazy_chains_match_eager_ones() {
        let locals = [5u64, 6, 7, 8];
        let mut buf = Vec::new();
        let mut c = Chains::new(&locals, &mut buf, 1);
        let last = c.at(3);
        assert_eq!(c.at(0), 5);
        assert_eq!(last, next(next(next(5, 6, 1), 7, 2), 8, 3));
    }

    /// Positions asked in any order, far behind the furthest one too (a
    /// walk that starts over), give the chains computed eagerly.
    #[test]
    fn ring_chains_match_eager_ones_in_any_order() {
        let locals: Vec<u64> = (0..1000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 77).collect();
        let mut eager = vec![locals[0]];
        for (i, &l) in locals.iter().enumerate().skip(1) {
            eager.push(next(*eager.last().unwrap(), l, i as u32));
        }
        let mut buf = Vec::new();
        let mut c = Chains::new(&locals, &mut buf, 4);
        let mut x = 12345u64;
        for round in 0..5000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let i =
                if round % 7 == 0 { (x >> 33) as usize % locals.len() } else { (x >> 33) as usize % 40 + round % 900 };
            let i = i.min(locals.len() - 1);
            assert_eq!(c.at(i), eager[i], "position {i}");
        }
    }

    /// The vector path gives the portable loop's chains, at every length
    /// and start (on a CPU without AVX-512 both are the portable loop).
    #[test]
    fn wide_chains_match_portable_ones() {
        let locals: Vec<u64> = (0..300u64).map(|i| i.wrapping_mul(0xD6E8_FEB8_6659_FD93).rotate_left(7) ^ i).collect();
        let wide = wide_mixes();
        for from in [1usize, 2, 7, 8, 9, 100] {
            for to in from..from + 40 {
                let (mut a, mut b) = (vec![0u64; 64], vec![0u64; 64]);
                let ca = extend(&mut a, &locals, from, to, 99, wide);
                let cb = extend_lanes(&mut b, &locals, from, to, 99, mixes);
                assert_eq!((ca, &a), (cb, &b), "{from}..{to}");
                let mut c = 99;
                for (k, &l) in locals.iter().enumerate().take(to).skip(from) {
                    c = next(c, l, k as u32);
                }
                assert_eq!(ca, c, "{from}..{to}");
            }
        }
    }
}

//! A worker's blocks in one tier: engine hash to block id.
//!
//! This is the index's only per-(block, worker) structure, so it is made to
//! be small and to cost one or two cache lines per operation: a bucketized
//! cuckoo table (Fan et al., CoNEXT 2014) whose 64-byte buckets hold five
//! slots of an 8-byte engine hash and a 4-byte block id. A key lives in one
//! of its two buckets, so a lookup reads at most two lines, which a batch can
//! prefetch ahead of use; a remove clears a slot and moves nothing. Tables
//! run up to 92% full and grow by an eighth at a time (any bucket count:
//! buckets are picked by multiply-shift, not masks), so a pair costs about
//! 14 bytes at the steady state. Engine hashes are opaque and may be small
//! or sequential numbers, so they are mixed before use.

const EMPTY: u32 = u32::MAX;
const SLOTS: usize = 5;
/// Most slots in use, in 1/100ths of all slots, before the table grows.
const LOAD_MAX_PERCENT: usize = 92;
/// Growth step, in 1/100ths of the current size.
const GROW_PERCENT: usize = 112;
/// Displacements one insert may make before the table grows instead.
const KICKS_MAX: usize = 128;

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Bucket {
    keys: [u64; SLOTS],
    ids: [u32; SLOTS],
}

const EMPTY_BUCKET: Bucket = Bucket { keys: [0; SLOTS], ids: [EMPTY; SLOTS] };

#[inline]
fn mix(key: u64) -> u64 {
    let mut h = key ^ (key >> 31);
    h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ (h >> 29)
}

#[inline]
fn reduce(h: u64, n: usize) -> usize {
    ((h as u128 * n as u128) >> 64) as usize
}

/// Engine hash -> block id, for one worker and tier.
#[derive(Default)]
pub(crate) struct Records {
    buckets: Vec<Bucket>,
    len: usize,
    /// State of the displacement walk's choices (xorshift).
    rng: u64,
}

impl Records {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn bytes(&self) -> usize {
        self.buckets.capacity() * std::mem::size_of::<Bucket>()
    }

    #[inline]
    fn homes(&self, key: u64) -> (usize, usize) {
        let h = mix(key);
        let n = self.buckets.len();
        let a = reduce(h, n);
        let mut b = reduce(h.rotate_left(32).wrapping_mul(0xD6E8_FEB8_6659_FD93), n);
        if b == a && n > 1 {
            b = if a + 1 == n { 0 } else { a + 1 };
        }
        (a, b)
    }

    /// Asks the cache for `key`'s buckets ahead of a `get` or `remove`.
    #[inline]
    pub(crate) fn prefetch(&self, key: u64) {
        if self.buckets.is_empty() {
            return;
        }
        let (a, b) = self.homes(key);
        prefetch(&self.buckets[a]);
        prefetch(&self.buckets[b]);
    }

    #[inline]
    fn position(&self, key: u64) -> Option<(usize, usize)> {
        if self.len == 0 {
            return None;
        }
        let (a, b) = self.homes(key);
        for bi in [a, b] {
            let bucket = &self.buckets[bi];
            for s in 0..SLOTS {
                if bucket.keys[s] == key && bucket.ids[s] != EMPTY {
                    return Some((bi, s));
                }
            }
        }
        None
    }

    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<u32> {
        self.position(key).map(|(b, s)| self.buckets[b].ids[s])
    }

    /// Sets `key` to `id`, returning the previous id.
    pub(crate) fn insert(&mut self, key: u64, id: u32) -> Option<u32> {
        debug_assert!(id != EMPTY);
        if let Some((b, s)) = self.position(key) {
            return Some(std::mem::replace(&mut self.buckets[b].ids[s], id));
        }
        if (self.len + 1) * 100 > self.buckets.len() * SLOTS * LOAD_MAX_PERCENT {
            self.resize(self.len + 1);
        }
        let (mut key, mut id) = (key, id);
        loop {
            match self.place(key, id) {
                None => break,
                Some((k, i)) => {
                    // The walk gave up: more room, then place the one left over.
                    self.resize(self.len + 1);
                    (key, id) = (k, i);
                }
            }
        }
        self.len += 1;
        None
    }

    /// Places a key known to be absent; on failure returns the key left homeless.
    fn place(&mut self, mut key: u64, mut id: u32) -> Option<(u64, u32)> {
        let (a, b) = self.homes(key);
        for bi in [a, b] {
            if let Some(s) = self.buckets[bi].ids.iter().position(|&x| x == EMPTY) {
                self.buckets[bi].keys[s] = key;
                self.buckets[bi].ids[s] = id;
                return None;
            }
        }
        let mut bi = a;
        for _ in 0..KICKS_MAX {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let s = (self.rng % SLOTS as u64) as usize;
            std::mem::swap(&mut key, &mut self.buckets[bi].keys[s]);
            std::mem::swap(&mut id, &mut self.buckets[bi].ids[s]);
            let (x, y) = self.homes(key);
            bi = if x == bi { y } else { x };
            if let Some(s) = self.buckets[bi].ids.iter().position(|&x| x == EMPTY) {
                self.buckets[bi].keys[s] = key;
                self.buckets[bi].ids[s] = id;
                return None;
            }
        }
        Some((key, id))
    }

    /// Removes `key`, returning its id.
    pub(crate) fn remove(&mut self, key: u64) -> Option<u32> {
        let (b, s) = self.position(key)?;
        let id = std::mem::replace(&mut self.buckets[b].ids[s], EMPTY);
        self.len -= 1;
        if self.len == 0 {
            *self = Records { rng: self.rng, ..Records::default() };
        } else if self.buckets.len() > 4 && self.len * 100 < self.buckets.len() * SLOTS * 40 {
            self.resize(self.len);
        }
        Some(id)
    }

    /// Rebuilds for `len` keys at about 80% load.
    fn resize(&mut self, len: usize) {
        if self.rng == 0 {
            self.rng = 0x2545_F491_4F6C_DD1D;
        }
        let mut buckets = (len * 100).div_ceil(SLOTS * 80).max(2);
        if len > self.len {
            buckets = buckets.max(self.buckets.len() * GROW_PERCENT / 100 + 1);
        }
        loop {
            let old = std::mem::replace(&mut self.buckets, vec![EMPTY_BUCKET; buckets]);
            let mut ok = true;
            'all: for b in &old {
                for s in 0..SLOTS {
                    if b.ids[s] != EMPTY && self.place(b.keys[s], b.ids[s]).is_some() {
                        ok = false;
                        break 'all;
                    }
                }
            }
            if ok {
                return;
            }
            // Too tight to place everything (rare): keep the old table and try bigger.
            self.buckets = old;
            buckets = buckets * GROW_PERCENT / 100 + 1;
        }
    }

    /// Every (engine hash, block id).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.buckets.iter().flat_map(|b| (0..SLOTS).filter(|&s| b.ids[s] != EMPTY).map(move |s| (b.keys[s], b.ids[s])))
    }

    /// Empties the table, returning its contents.
    pub(crate) fn take(&mut self) -> Vec<(u64, u32)> {
        let out = self.iter().collect();
        *self = Records::default();
        out
    }
}

#[inline]
fn prefetch<T>(p: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint and never faults.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const T as *const i8, std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn behaves_like_a_map() {
        let mut r = Records::default();
        let mut model = HashMap::new();
        let mut x: u64 = 99;
        for step in 0..200_000u32 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            // Small sequential keys, and a growing then shrinking key space.
            let space = if step < 100_000 { 1 + step as u64 / 20 } else { 1 + (200_000 - step as u64) / 20 };
            let key = (x >> 33) % space;
            match x % 4 {
                0 => assert_eq!(r.remove(key), model.remove(&key)),
                _ => assert_eq!(r.insert(key, step), model.insert(key, step)),
            }
            assert_eq!(r.len(), model.len());
        }
        for (&k, &v) in &model {
            assert_eq!(r.get(k), Some(v));
        }
        let mut all = r.take();
        all.sort();
        let mut expected: Vec<_> = model.into_iter().collect();
        expected.sort();
        assert_eq!(all, expected);
        assert_eq!(r.bytes(), 0);
    }

    #[test]
    fn stays_well_filled() {
        let mut r = Records::default();
        for k in 0..16_384u64 {
            r.insert(k.wrapping_mul(0x9E37_79B9_7F4A_7C15), k as u32);
        }
        let per_pair = r.bytes() as f64 / r.len() as f64;
        assert!(per_pair < 16.0, "{per_pair:.1} bytes a pair");
        for k in 0..16_384u64 {
            assert_eq!(r.get(k.wrapping_mul(0x9E37_79B9_7F4A_7C15)), Some(k as u32));
        }
    }
}

//! A worker's blocks in one tier: engine hash to block id.
//!
//! This is the index's only per-(block, worker) structure, so it is made to
//! be small and to cost one bucket per operation: a bucketized cuckoo table
//! (Fan et al., CoNEXT 2014) whose 128-byte buckets hold ten slots of an
//! 8-byte engine hash and a 4-byte block id, filled from the front, and a
//! count. A key lives in one of its two buckets, so a lookup reads at most
//! two buckets, which a batch prefetches ahead of use; an insert goes to the
//! emptier bucket (read from the counts); a remove moves the bucket's last
//! slot into the hole. Tables run up to 92% full, grow by half while they
//! fill (any bucket count: buckets are picked by multiply-shift, not masks)
//! and are packed to 88% once they settle, so a pair costs about 14 bytes at
//! the steady state; a rebuild asks the cache for the new buckets of the
//! keys it moves a batch ahead, as lookups do. Engine hashes are opaque and
//! may be small or sequential numbers, so they are mixed before use.
//!
//! A hash is kept as its low and high halves in two arrays: the count and
//! the ten low halves fill the bucket's first cache line, and three SSE2
//! compares cover them; the high half is checked only where a low half
//! matched, so hashes that share a half cost extra checks, never a wrong
//! answer. New tables come from zeroed memory (an empty bucket is all
//! zeros), and a table shrinks below 40% full. Aliases (one block under two
//! engine hashes of one worker) are counted beside the table.

use super::prefetch;

const SLOTS: usize = 10;
/// Most slots in use, in 1/100ths of all slots, before the table grows.
const LOAD_MAX_PERCENT: usize = 92;
/// Growth step, in 1/100ths of the current size: large, so a table that
/// fills moves each key about three times in all.
const GROW_PERCENT: usize = 150;
/// A settled table is packed so that its peak fills this much (1/100ths).
const PACK_PERCENT: usize = 88;
/// A settled table whose peak fills less than this (1/100ths) is packed.
const LOOSE_PERCENT: usize = 80;
/// Below this load (1/100ths) a table shrinks.
const SHRINK_PERCENT: usize = 40;
/// Keys a rebuild works out ahead of placing them (`place_all`).
const REBUILD_AHEAD: usize = 16;
/// Displacements one insert may make before the table grows instead.
const KICKS_MAX: usize = 128;

/// Slots `0..len` are in use. All zeros is an empty bucket. A key is kept
/// as its low and high halves, in two arrays: a lookup compares the ten low
/// halves (and the count before them), all in the first cache line, in
/// three vector compares, and checks the high half only where a low one
/// matched.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Bucket {
    len: u32,
    lo: [u32; SLOTS],
    hi: [u32; SLOTS],
    ids: [u32; SLOTS],
    _pad: u32,
}

const _: () = assert!(std::mem::size_of::<Bucket>() == 128);
const _: () = assert!(std::mem::offset_of!(Bucket, lo) + 48 <= 64, "the compares read the first cache line only");
const _: () = assert!(std::mem::offset_of!(Bucket, ids) >= 64, "a set writes the second cache line only");

impl Bucket {
    /// The slot holding `key`, if one does.
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        let mut m = self.low_equal(key as u32) & ((1u32 << self.len) - 1);
        while m != 0 {
            let s = m.trailing_zeros() as usize;
            if self.hi[s] == (key >> 32) as u32 {
                return Some(s);
            }
            m &= m - 1;
        }
        None
    }

    /// Slots whose low half equals `low`, used or not, as a bit mask (bits
    /// beyond the slots are noise for `find` to mask): three 4-lane SSE2
    /// compares (every x86-64 has SSE2) over the low halves and the two high
    /// halves after them, packed into one mask.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    fn low_equal(&self, low: u32) -> u32 {
        use std::arch::x86_64::*;
        const _: () = assert!(SLOTS <= 12);
        // SAFETY: SSE2 is part of x86-64; the three unaligned 16-byte loads
        // start at `lo` and end 48 bytes later, inside the bucket (the
        // pointer is derived from the whole bucket, not from `lo`, whose
        // 40 bytes the last load passes).
        unsafe {
            let k = _mm_set1_epi32(low as i32);
            let bucket = self as *const Bucket as *const u8;
            let p = bucket.add(std::mem::offset_of!(Bucket, lo)) as *const __m128i;
            let e0 = _mm_cmpeq_epi32(_mm_loadu_si128(p), k);
            let e1 = _mm_cmpeq_epi32(_mm_loadu_si128(p.add(1)), k);
            let e2 = _mm_cmpeq_epi32(_mm_loadu_si128(p.add(2)), k);
            let bytes = _mm_packs_epi16(_mm_packs_epi32(e0, e1), _mm_packs_epi32(e2, e2));
            _mm_movemask_epi8(bytes) as u32 & 0xFFF
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[inline]
    fn low_equal(&self, low: u32) -> u32 {
        (0..SLOTS).fold(0, |m, s| m | ((self.lo[s] == low) as u32) << s)
    }

    #[inline]
    fn key(&self, s: usize) -> u64 {
        (self.hi[s] as u64) << 32 | self.lo[s] as u64
    }

    #[inline]
    fn set_key(&mut self, s: usize, key: u64) {
        self.lo[s] = key as u32;
        self.hi[s] = (key >> 32) as u32;
    }

    #[inline]
    fn full(&self) -> bool {
        self.len as usize == SLOTS
    }

    #[inline]
    fn push(&mut self, key: u64, id: u32) {
        let s = self.len as usize;
        self.set_key(s, key);
        self.ids[s] = id;
        self.len += 1;
    }
}

/// `n` empty buckets, from zeroed memory (which fresh pages already are).
fn empty_buckets(n: usize) -> Vec<Bucket> {
    if n == 0 {
        return Vec::new();
    }
    let layout = std::alloc::Layout::array::<Bucket>(n).expect("bucket count fits");
    // SAFETY: the layout is nonzero in size; a zeroed Bucket is a valid,
    // empty one (plain integers); the Vec takes ownership with the same
    // layout it will free with.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut Bucket;
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Vec::from_raw_parts(p, n, n)
    }
}

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

/// A key's two buckets in a table of `n` buckets, worked out ahead of use
/// (`prefetch`); a table of another size works them out again.
#[derive(Clone, Copy, Default)]
pub(crate) struct Homes {
    a: u32,
    b: u32,
    n: u32,
}

/// Where a key was put: valid until the table next moves keys.
#[derive(Clone, Copy)]
pub(crate) struct Spot {
    bucket: u32,
    slot: u32,
}

/// The id a claimed key names until its store sets it.
pub(crate) const CLAIMED: u32 = u32::MAX;

/// Engine hash -> block id, for one worker and tier.
#[derive(Default)]
pub(crate) struct Records {
    buckets: Vec<Bucket>,
    len: usize,
    /// Most keys held since the last rebuild.
    peak: usize,
    /// Inserts and removes since the last rebuild: a table that has seen as
    /// many as it holds keys has settled, and is packed if it is loose.
    churn: usize,
    /// State of the displacement walk's choices (xorshift).
    rng: u64,
    /// Keys held beyond which an insert grows the table.
    grow_above: usize,
    /// Keys held below which a remove shrinks the table.
    shrink_below: usize,
    /// Peak below which a settled table is packed.
    loose_below: usize,
}

impl Records {
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
        debug_assert!(n >= 2, "a table that holds keys has two buckets or more");
        let a = reduce(h, n);
        // One of the other `n - 1` buckets: no compare and fix-up after the fact.
        let b = reduce(h.rotate_left(32).wrapping_mul(0xD6E8_FEB8_6659_FD93), n - 1);
        (a, b + (b >= a) as usize)
    }

    /// Asks the cache for `key`'s buckets ahead of a `claim` or `remove`,
    /// and says which they are, so that the claim or remove need not work
    /// them out again.
    #[inline]
    pub(crate) fn prefetch(&self, key: u64) -> Homes {
        if self.buckets.is_empty() {
            return Homes::default();
        }
        let (a, b) = self.homes(key);
        for bi in [a, b] {
            let p = &self.buckets[bi] as *const Bucket as *const u8;
            prefetch(p);
            // A bucket is two cache lines; this is its second.
            prefetch(p.wrapping_add(64));
        }
        Homes { a: a as u32, b: b as u32, n: self.buckets.len() as u32 }
    }

    /// `key`'s buckets: `ahead` if the table has kept its size since.
    #[inline]
    fn homes_now(&self, key: u64, ahead: Homes) -> (usize, usize) {
        if ahead.n as usize == self.buckets.len() && ahead.n > 0 {
            (ahead.a as usize, ahead.b as usize)
        } else {
            self.homes(key)
        }
    }

    #[inline]
    fn position(&self, key: u64) -> Option<(usize, usize)> {
        if self.len == 0 {
            return None;
        }
        self.position_in(key, self.homes(key))
    }

    #[inline]
    fn position_in(&self, key: u64, (a, b): (usize, usize)) -> Option<(usize, usize)> {
        for bi in [a, b] {
            if let Some(s) = self.buckets[bi].find(key) {
                return Some((bi, s));
            }
        }
        None
    }

    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<u32> {
        self.position(key).map(|(b, s)| self.buckets[b].ids[s])
    }

    /// Sets `key` to `id`, returning the previous id.
    #[cfg(test)]
    pub(crate) fn insert(&mut self, key: u64, id: u32) -> Option<u32> {
        if let Some((b, s)) = self.position(key) {
            return Some(std::mem::replace(&mut self.buckets[b].ids[s], id));
        }
        self.insert_new_at(key, id, None);
        None
    }

    /// Adds `key`, which the caller knows is absent; returns where it went.
    /// `homes` are its buckets if the caller has them at hand.
    fn insert_new_at(&mut self, key: u64, id: u32, homes: Option<(usize, usize)>) -> Spot {
        debug_assert!(self.position(key).is_none());
        let moved = if self.len + 1 > self.grow_above {
            let grown = self.buckets.len() * GROW_PERCENT / 100;
            self.rebuild(grown.max(Self::buckets_for(self.len + 1, 80)));
            true
        } else {
            self.settle()
        };
        self.len += 1;
        self.peak = self.peak.max(self.len);
        let (a, b) = match homes {
            Some(h) if !moved => h,
            _ => self.homes(key),
        };
        // The emptier bucket: balanced buckets rarely both fill, so walks stay rare.
        let bi = if self.buckets[a].len <= self.buckets[b].len { a } else { b };
        if !self.buckets[bi].full() {
            self.buckets[bi].push(key, id);
            return Spot { bucket: bi as u32, slot: self.buckets[bi].len - 1 };
        }
        let (mut key_left, mut id_left) = (key, id);
        while let Some((k, i)) = self.place(key_left, id_left) {
            // The walk gave up: more room, then place the one left over.
            self.rebuild(self.buckets.len() + self.buckets.len() / 16 + 1);
            (key_left, id_left) = (k, i);
        }
        let (b, s) = self.position(key).expect("just placed");
        Spot { bucket: b as u32, slot: s as u32 }
    }

    /// Before a store changes the tree: the id `key` names now, if any
    /// (`CLAIMED` if an earlier block of the same store claimed it); either
    /// way it names `CLAIMED` from now on (a key new to the table is added),
    /// and `set` gives it its id once the store knows its block.
    #[inline]
    pub(crate) fn claim(&mut self, key: u64, ahead: Homes) -> (Option<u32>, Spot) {
        let homes = (self.len > 0).then(|| self.homes_now(key, ahead));
        if let Some((b, s)) = homes.and_then(|h| self.position_in(key, h)) {
            let old = std::mem::replace(&mut self.buckets[b].ids[s], CLAIMED);
            return (Some(old), Spot { bucket: b as u32, slot: s as u32 });
        }
        (None, self.insert_new_at(key, CLAIMED, homes))
    }

    /// Sets `key`, which is in the table, to `id`; `spot` is where `claim`
    /// found it, unless later inserts moved it.
    #[inline]
    pub(crate) fn set(&mut self, key: u64, spot: Spot, id: u32) {
        let (b, s) = (spot.bucket as usize, spot.slot as usize);
        if let Some(bucket) = self.buckets.get_mut(b) {
            if s < bucket.len as usize && bucket.key(s) == key {
                bucket.ids[s] = id;
                return;
            }
        }
        let (b, s) = self.position(key).expect("a claimed key stays");
        self.buckets[b].ids[s] = id;
    }

    /// Asks the cache for a `set` at `spot`.
    #[inline]
    pub(crate) fn prefetch_spot(&self, spot: Spot) {
        if let Some(bucket) = self.buckets.get(spot.bucket as usize) {
            // The ids are in the bucket's second line.
            prefetch((bucket as *const Bucket as *const u8).wrapping_add(64));
        }
    }

    /// Places a key known to be absent; on failure returns the key left homeless.
    fn place(&mut self, key: u64, id: u32) -> Option<(u64, u32)> {
        self.place_in(key, id, self.homes(key))
    }

    /// `place`, with the key's homes at hand.
    fn place_in(&mut self, mut key: u64, mut id: u32, (a, b): (usize, usize)) -> Option<(u64, u32)> {
        // The emptier bucket: balanced buckets rarely both fill, so walks stay rare.
        let bi = if self.buckets[a].len <= self.buckets[b].len { a } else { b };
        if !self.buckets[bi].full() {
            self.buckets[bi].push(key, id);
            return None;
        }
        let mut bi = a;
        for _ in 0..KICKS_MAX {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let s = (self.rng % SLOTS as u64) as usize;
            let bucket = &mut self.buckets[bi];
            let displaced = bucket.key(s);
            bucket.set_key(s, key);
            key = displaced;
            std::mem::swap(&mut id, &mut bucket.ids[s]);
            let (x, y) = self.homes(key);
            bi = if x == bi { y } else { x };
            if !self.buckets[bi].full() {
                self.buckets[bi].push(key, id);
                return None;
            }
        }
        Some((key, id))
    }

    /// Removes `key`, returning its id.
    pub(crate) fn remove(&mut self, key: u64) -> Option<u32> {
        self.remove_ahead(key, Homes::default())
    }

    /// Removes `key`, whose buckets `prefetch` said, returning its id.
    pub(crate) fn remove_ahead(&mut self, key: u64, ahead: Homes) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let (b, s) = self.position_in(key, self.homes_now(key, ahead))?;
        let bucket = &mut self.buckets[b];
        let id = bucket.ids[s];
        let last = bucket.len as usize - 1;
        bucket.set_key(s, bucket.key(last));
        bucket.ids[s] = bucket.ids[last];
        bucket.len -= 1;
        self.len -= 1;
        if self.len == 0 {
            *self = Records { rng: self.rng, ..Records::default() };
        } else if self.len < self.shrink_below {
            self.rebuild(Self::buckets_for(self.len, 80));
        } else {
            self.settle();
        }
        Some(id)
    }

    /// Packs a table once it has settled (seen as many changes as it holds
    /// keys since its last rebuild) if even its peak leaves it loose; true if
    /// it was (keys moved).
    #[inline]
    fn settle(&mut self) -> bool {
        self.churn += 1;
        let pack = self.churn > self.len.max(1024) && self.peak < self.loose_below;
        if pack {
            self.rebuild(Self::buckets_for(self.peak, PACK_PERCENT));
        }
        pack
    }

    /// Buckets that hold `len` keys at `load_percent`.
    fn buckets_for(len: usize, load_percent: usize) -> usize {
        (len * 100).div_ceil(SLOTS * load_percent).max(2)
    }

    /// Rebuilds with `buckets` buckets (more if the keys do not fit).
    fn rebuild(&mut self, mut buckets: usize) {
        if self.rng == 0 {
            self.rng = 0x2545_F491_4F6C_DD1D;
        }
        self.churn = 0;
        self.peak = self.len;
        loop {
            let old = std::mem::replace(&mut self.buckets, empty_buckets(buckets));
            if self.place_all(&old) {
                // The thresholds, worked out once per size: `len + 1 > n * SLOTS
                // * LOAD_MAX_PERCENT / 100` and the like, in integers.
                let slots = buckets * SLOTS;
                self.grow_above = slots * LOAD_MAX_PERCENT / 100;
                self.shrink_below = if buckets > 4 { (slots * SHRINK_PERCENT).div_ceil(100) } else { 0 };
                self.loose_below = (slots * LOOSE_PERCENT).div_ceil(100);
                return;
            }
            // Too tight to place everything (rare): keep the old table and try bigger.
            self.buckets = old;
            buckets += buckets / 16 + 1;
        }
    }

    /// Places every key of `old` in this table, which has none of them;
    /// false if one found no room. Each key's new homes are asked of the
    /// cache `REBUILD_AHEAD` keys before it is placed: a table being filled
    /// is written all over, so without that each key waits for its buckets.
    fn place_all(&mut self, old: &[Bucket]) -> bool {
        let mut ring = [(0u64, 0u32, (0usize, 0usize)); REBUILD_AHEAD];
        let mut seen = 0usize;
        for b in old {
            for s in 0..b.len as usize {
                let (key, id) = (b.key(s), b.ids[s]);
                let homes = self.homes(key);
                prefetch(&self.buckets[homes.0] as *const Bucket as *const u8);
                prefetch(&self.buckets[homes.1] as *const Bucket as *const u8);
                let slot = &mut ring[seen % REBUILD_AHEAD];
                let waiting = std::mem::replace(slot, (key, id, homes));
                if seen >= REBUILD_AHEAD && self.place_in(waiting.0, waiting.1, waiting.2).is_some() {
                    return false;
                }
                seen += 1;
            }
        }
        (seen.saturating_sub(REBUILD_AHEAD)..seen).all(|k| {
            let (key, id, homes) = ring[k % REBUILD_AHEAD];
            self.place_in(key, id, homes).is_none()
        })
    }

    /// Every (engine hash, block id).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.buckets.iter().flat_map(|b| (0..b.len as usize).map(move |s| (b.key(s), b.ids[s])))
    }

    /// Empties the table, returning its contents.
    pub(crate) fn take(&mut self) -> Vec<(u64, u32)> {
        let out = self.iter().collect();
        *self = Records::default();
        out
    }
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
    fn keys_that_share_a_half_stay_apart() {
        let mut r = Records::default();
        // Equal low halves (every compare of the low halves matches), then
        // equal high halves, side by side in the same table.
        let same_low = |k: u64| (k << 32) | 0xABCD;
        let same_high = |k: u64| (0xABCD << 32) | k;
        for k in 1..=3_000u64 {
            assert_eq!(r.insert(same_low(k), k as u32), None);
            assert_eq!(r.insert(same_high(k), 10_000 + k as u32), None);
        }
        for k in 1..=3_000u64 {
            assert_eq!(r.get(same_low(k)), Some(k as u32));
            assert_eq!(r.get(same_high(k)), Some(10_000 + k as u32));
        }
        assert_eq!(r.get(same_low(3_001)), None);
        assert_eq!(r.get(same_high(3_001)), None);
        for k in (1..=3_000u64).step_by(2) {
            assert_eq!(r.remove(same_low(k)), Some(k as u32));
        }
        for k in 1..=3_000u64 {
            let expected = (k % 2 == 0).then_some(k as u32);
            assert_eq!(r.get(same_low(k)), expected);
            assert_eq!(r.get(same_high(k)), Some(10_000 + k as u32));
        }
        assert_eq!(r.len(), 4_500);
    }

    #[test]
    fn claimed_keys_get_their_ids_even_after_the_table_moved_them() {
        let mut r = Records::default();
        let key = |k: u64| k.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 7;
        // Claimed in one batch, set after: the table grows (and moves every
        // key) many times in between.
        let claims: Vec<_> = (0..20_000u64).map(|k| r.claim(key(k), Homes::default())).collect();
        assert!(claims.iter().all(|(old, _)| old.is_none()));
        for (k, (_, spot)) in claims.iter().enumerate() {
            r.set(key(k as u64), *spot, k as u32 + 1);
        }
        for k in 0..20_000u64 {
            assert_eq!(r.get(key(k)), Some(k as u32 + 1));
        }
        // A claim of a key present says what it names and adds nothing.
        let (old, spot) = r.claim(key(5), Homes::default());
        assert_eq!(old, Some(6));
        r.set(key(5), spot, 99);
        assert_eq!((r.get(key(5)), r.len()), (Some(99), 20_000));
    }

    #[test]
    fn settles_well_filled() {
        let mut r = Records::default();
        let key = |k: u64| k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for k in 0..16_384u64 {
            r.insert(key(k), k as u32);
        }
        // An engine at its cache size: blocks evicted as others are stored.
        for k in 16_384..60_000u64 {
            r.remove(key(k - 16_384));
            r.insert(key(k), k as u32);
        }
        let per_pair = r.bytes() as f64 / r.len() as f64;
        assert!(per_pair < 15.0, "{per_pair:.1} bytes a pair");
        for k in 60_000 - 16_384..60_000u64 {
            assert_eq!(r.get(key(k)), Some(k as u32));
        }
    }
}

//! A worker's blocks in one tier: engine hash to entry id.
//!
//! This is the only per-(block, worker) structure of the index, so it is kept
//! small: an open-addressing table with keys and values in separate arrays
//! (12 bytes a slot, no padding), linear probing, backward-shift deletion,
//! growth at 3/4 load and shrinking below 1/8. Engine hashes are opaque and
//! may be small or sequential numbers, so they are mixed before probing.

const EMPTY: u32 = u32::MAX;
const MIN_CAPACITY: usize = 8;

#[inline]
fn home(key: u64, shift: u32) -> usize {
    ((key ^ (key >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9) >> shift) as usize
}

/// Engine hash -> entry id, for one worker and tier.
#[derive(Default)]
pub(crate) struct Records {
    keys: Vec<u64>,
    ids: Vec<u32>,
    len: usize,
    shift: u32,
}

impl Records {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn bytes(&self) -> usize {
        self.keys.capacity() * 8 + self.ids.capacity() * 4
    }

    pub(crate) fn get(&self, key: u64) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let mask = self.ids.len() - 1;
        let mut i = home(key, self.shift);
        loop {
            let id = self.ids[i];
            if id == EMPTY {
                return None;
            }
            if self.keys[i] == key {
                return Some(id);
            }
            i = (i + 1) & mask;
        }
    }

    /// Sets `key` to `id`, returning the previous id.
    pub(crate) fn insert(&mut self, key: u64, id: u32) -> Option<u32> {
        debug_assert!(id != EMPTY);
        if let Some(i) = self.position(key) {
            return Some(std::mem::replace(&mut self.ids[i], id));
        }
        if (self.len + 1) * 4 > self.ids.len() * 3 {
            self.resize((self.ids.len() * 2).max(MIN_CAPACITY));
        }
        self.place(key, id);
        self.len += 1;
        None
    }

    fn position(&self, key: u64) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.ids.len() - 1;
        let mut i = home(key, self.shift);
        loop {
            if self.ids[i] == EMPTY {
                return None;
            }
            if self.keys[i] == key {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    fn place(&mut self, key: u64, id: u32) {
        let mask = self.ids.len() - 1;
        let mut i = home(key, self.shift);
        while self.ids[i] != EMPTY {
            i = (i + 1) & mask;
        }
        self.keys[i] = key;
        self.ids[i] = id;
    }

    /// Removes `key`, returning its id.
    pub(crate) fn remove(&mut self, key: u64) -> Option<u32> {
        let i = self.position(key)?;
        let id = self.ids[i];
        let mask = self.ids.len() - 1;
        let mut hole = i;
        let mut j = (i + 1) & mask;
        while self.ids[j] != EMPTY {
            let h = home(self.keys[j], self.shift);
            let movable = if hole <= j { h <= hole || h > j } else { h <= hole && h > j };
            if movable {
                self.keys[hole] = self.keys[j];
                self.ids[hole] = self.ids[j];
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.ids[hole] = EMPTY;
        self.len -= 1;
        if self.len == 0 {
            *self = Records::default();
        } else if self.ids.len() > MIN_CAPACITY && self.len * 8 < self.ids.len() {
            self.resize((self.ids.len() / 4).max(MIN_CAPACITY));
        }
        Some(id)
    }

    fn resize(&mut self, capacity: usize) {
        let keys = std::mem::replace(&mut self.keys, vec![0; capacity]);
        let ids = std::mem::replace(&mut self.ids, vec![EMPTY; capacity]);
        self.shift = 64 - capacity.trailing_zeros();
        for (k, id) in keys.into_iter().zip(ids).filter(|(_, id)| *id != EMPTY) {
            self.place(k, id);
        }
    }

    /// Every (engine hash, entry id).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.keys.iter().zip(&self.ids).filter(|(_, id)| **id != EMPTY).map(|(k, id)| (*k, *id))
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
        for step in 0..50_000u32 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let key = (x >> 33) % 700; // small sequential keys
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
}

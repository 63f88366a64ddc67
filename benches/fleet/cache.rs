//! One engine's GPU block cache, small enough for 100 M blocks over a
//! fleet: an LRU list of slots in one vector (16 bytes a block) and a map
//! from a block's engine hash to its slot.
//!
//! A block is named by its engine hash alone: the hash chains over the
//! parent's hash and the block's tokens under the engine's seed, so it
//! identifies the whole prefix on that engine. A request is admitted and
//! released at once (the fleet bench runs each engine's requests one after
//! another): its blocks are looked up in order, missing ones stored (the
//! least recently used block evicted when full), then all of them touched
//! tail first, so a parent is always more recent than its child and the
//! cache stays prefix-closed, as vLLM's free queue keeps it.

use rustc_hash::FxHashMap;

const NIL: u32 = u32::MAX;

#[derive(Copy, Clone)]
struct Slot {
    hash: u64,
    prev: u32,
    next: u32,
}

pub struct LruCache {
    capacity: u32,
    slots: Vec<Slot>,
    map: FxHashMap<u64, u32>,
    /// Most recently used.
    head: u32,
    /// Least recently used: evicted first.
    tail: u32,
}

impl LruCache {
    pub fn new(capacity: u32) -> LruCache {
        LruCache { capacity: capacity.max(1), slots: Vec::new(), map: FxHashMap::default(), head: NIL, tail: NIL }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    fn unlink(&mut self, i: u32) {
        let Slot { prev, next, .. } = self.slots[i as usize];
        match prev {
            NIL => self.head = next,
            p => self.slots[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.slots[n as usize].prev = prev,
        }
    }

    fn push_front(&mut self, i: u32) {
        self.slots[i as usize].prev = NIL;
        self.slots[i as usize].next = self.head;
        match self.head {
            NIL => self.tail = i,
            h => self.slots[h as usize].prev = i,
        }
        self.head = i;
    }

    /// Makes `hash` the most recently used block, storing it if missing:
    /// whether it was cached, and the block evicted to make room. The
    /// request's own blocks, touched just before, are at the front, so
    /// they are never the one evicted while the request is shorter than
    /// the cache.
    pub fn touch_or_store(&mut self, hash: u64) -> (bool, Option<u64>) {
        if let Some(&i) = self.map.get(&hash) {
            self.unlink(i);
            self.push_front(i);
            return (true, None);
        }
        let mut evicted = None;
        let i = if self.map.len() as u32 >= self.capacity {
            let victim = self.tail;
            self.unlink(victim);
            let old = self.slots[victim as usize].hash;
            self.map.remove(&old);
            evicted = Some(old);
            self.slots[victim as usize].hash = hash;
            victim
        } else {
            self.slots.push(Slot { hash, prev: NIL, next: NIL });
            (self.slots.len() - 1) as u32
        };
        self.map.insert(hash, i);
        self.push_front(i);
        (false, evicted)
    }

    /// Touches `hashes` (held blocks) from the last to the first.
    pub fn release_tail_first(&mut self, hashes: &[u64]) {
        for h in hashes.iter().rev() {
            if let Some(&i) = self.map.get(h) {
                self.unlink(i);
                self.push_front(i);
            }
        }
    }
}

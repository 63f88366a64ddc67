//! A mock inference engine's GPU block cache, producing the KV events a real
//! engine would publish.
//!
//! The cache holds at most `capacity_blocks` blocks, each keyed by the
//! prefix it completes (a sequence hash over the request's local hashes, so
//! two requests share a block exactly when they share the whole prefix up
//! to it). A running request references its blocks; a released block stays
//! cached and joins an LRU list, and the least recently released block is
//! evicted when space is needed. Blocks of one request are released tail
//! first, so a parent is never older than its child and the cache stays
//! prefix-closed, as in vLLM's free queue.
//!
//! Engine hashes are opaque: a chain over the parent's engine hash and the
//! block's local hash under a per-engine random seed, like vLLM's default
//! per-process seed. The same content on two engines has two unrelated
//! engine hashes, and none follows the index's own chain formula.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// One block the engine stored: its opaque engine hash, the local hash of
/// its tokens, and the prefix key (sequence hash) that identifies it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct StoredRec {
    pub engine_hash: u64,
    pub local_hash: u64,
    pub seq_hash: u64,
}

/// One block the engine evicted.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RemovedRec {
    pub engine_hash: u64,
    pub seq_hash: u64,
}

/// A run of newly stored blocks: one Stored event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRun {
    /// Engine hash and prefix key of the block before the run (None: position 0).
    pub parent: Option<(u64, u64)>,
    pub blocks: Vec<StoredRec>,
}

/// What one admission did: evictions first (one Removed event), then stores.
#[derive(Default, Debug)]
pub struct Admission {
    pub removed: Vec<RemovedRec>,
    pub stored: Vec<StoredRun>,
    /// Leading blocks that were already cached.
    pub hit_blocks: usize,
    /// Blocks now referenced by the request (hits and new ones), a prefix of the input.
    pub held_blocks: usize,
    /// Blocks that could not be cached because every cached block was referenced.
    pub shortfall_blocks: usize,
}

struct Slot {
    engine_hash: u64,
    refs: u32,
    /// Key in `lru` while unreferenced.
    lru_tick: u64,
}

/// One engine's block cache.
pub struct MockEngine {
    capacity_blocks: usize,
    engine_seed: u64,
    blocks: FxHashMap<u64, Slot>,
    /// Unreferenced cached blocks by release tick: the first is evicted first.
    lru: BTreeMap<u64, u64>,
    tick: u64,
}

impl MockEngine {
    /// An empty cache of `capacity_blocks` blocks whose engine hashes use `engine_seed`.
    pub fn new(capacity_blocks: usize, engine_seed: u64) -> Self {
        assert!(capacity_blocks > 0, "capacity_blocks must be at least 1");
        Self { capacity_blocks, engine_seed, blocks: FxHashMap::default(), lru: BTreeMap::new(), tick: 0 }
    }

    /// Blocks cached now.
    pub fn cached_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Whether the block completing prefix `seq_hash` is cached.
    pub fn contains(&self, seq_hash: u64) -> bool {
        self.blocks.contains_key(&seq_hash)
    }

    /// Engine hash of a cached block.
    pub fn engine_hash(&self, seq_hash: u64) -> Option<u64> {
        self.blocks.get(&seq_hash).map(|s| s.engine_hash)
    }

    /// Number of leading `seq_hashes` cached (the prefix a query can reuse).
    pub fn cached_prefix(&self, seq_hashes: &[u64]) -> usize {
        seq_hashes.iter().take_while(|s| self.contains(**s)).count()
    }

    fn opaque_hash(&self, parent_engine: Option<u64>, local: u64) -> u64 {
        let mut bytes = [0u8; 17];
        if let Some(p) = parent_engine {
            bytes[0] = 1;
            bytes[1..9].copy_from_slice(&p.to_le_bytes());
        }
        bytes[9..].copy_from_slice(&local.to_le_bytes());
        xxh3_64_with_seed(&bytes, self.engine_seed)
    }

    /// Admits a sequence continuing the (held) block `parent` (None: from
    /// position 0): references cached blocks, stores missing ones, evicting
    /// unreferenced blocks when full. The caller must later `release` the
    /// first `held_blocks` of `seq_hashes`.
    pub fn admit(&mut self, parent: Option<u64>, locals: &[u64], seq_hashes: &[u64]) -> Admission {
        assert_eq!(locals.len(), seq_hashes.len());
        let mut out = Admission::default();
        let mut parent_engine = parent
            .map(|p| self.blocks.get(&p).expect("admit: the parent block must be held by the caller").engine_hash);
        let mut parent_key = parent;
        let mut run: Option<StoredRun> = None;
        let mut in_hit_prefix = true;
        for (i, (&local, &seq)) in locals.iter().zip(seq_hashes).enumerate() {
            if let Some(slot) = self.blocks.get_mut(&seq) {
                if slot.refs == 0 {
                    self.lru.remove(&slot.lru_tick);
                }
                slot.refs += 1;
                parent_engine = Some(slot.engine_hash);
                parent_key = Some(seq);
                if in_hit_prefix {
                    out.hit_blocks += 1;
                }
                // A cached block after a stored one ends the run (cannot
                // happen while the cache is prefix-closed; handled anyway).
                out.stored.extend(run.take());
                continue;
            }
            in_hit_prefix = false;
            if self.blocks.len() >= self.capacity_blocks {
                let Some((_, victim)) = self.lru.pop_first() else {
                    out.shortfall_blocks = locals.len() - i;
                    break;
                };
                let slot = self.blocks.remove(&victim).expect("lru entry is cached");
                out.removed.push(RemovedRec { engine_hash: slot.engine_hash, seq_hash: victim });
            }
            let engine_hash = self.opaque_hash(parent_engine, local);
            self.blocks.insert(seq, Slot { engine_hash, refs: 1, lru_tick: 0 });
            let rec = StoredRec { engine_hash, local_hash: local, seq_hash: seq };
            let parent_pair = parent_engine.zip(parent_key);
            run.get_or_insert_with(|| StoredRun { parent: parent_pair, blocks: Vec::new() }).blocks.push(rec);
            parent_engine = Some(engine_hash);
            parent_key = Some(seq);
        }
        out.stored.extend(run.take());
        out.held_blocks = locals.len() - out.shortfall_blocks;
        out
    }

    /// Drops one reference from each of `seq_hashes` (a held sequence, in
    /// order); blocks left unreferenced join the LRU list tail first.
    pub fn release(&mut self, seq_hashes: &[u64]) {
        for seq in seq_hashes.iter().rev() {
            let slot = self.blocks.get_mut(seq).expect("release: block must be held");
            assert!(slot.refs > 0, "release: block has no reference");
            slot.refs -= 1;
            if slot.refs == 0 {
                self.tick += 1;
                slot.lru_tick = self.tick;
                self.lru.insert(self.tick, *seq);
            }
        }
    }
}

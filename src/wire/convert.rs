//! Raw engine events to index events, for one worker.
//!
//! This is where policy lives: which events describe blocks this worker
//! really holds in its main cache group (the rest are skipped and counted in
//! [`SkipCounters`]), which tier they go to, and the local hash of every
//! block, computed from its tokens with `hash::seed_for(lora_name, salt)`.
//!
//! **Salts.** A store names its salt directly (SGLang `cache_salt`, or
//! Dynamo's tag in vLLM `extra_keys`), or not at all: vLLM names it only in a
//! request's first block. So a store without a salt inherits the salt of its
//! parent, looked up by engine hash in a per-worker table that holds only
//! salted blocks, with the tiers that still hold each one. Removes clear a
//! tier, and an entry goes when no tier holds it; `AllBlocksCleared` and
//! [`WorkerConverter::reset`] empty the table. The table is bounded by
//! [`SALTED_BLOCKS_MAX`]; when full, salted stores are skipped (counted)
//! rather than converted into chains whose children would lose the salt.
//!
//! **Block size.** An engine block of `k * B` tokens (B = the index's block
//! size, k <= [`SPLIT_FACTOR_MAX`]) becomes k index blocks. The last keeps
//! the engine's hash, so later stores naming it as parent link to it; the
//! first k-1 get [`split_block_hash`]`(engine hash, position)`. Removed
//! events name engine hashes only, so each is expanded to the same k hashes
//! using the factor learned from that tier's latest store: split blocks are
//! removed whole. Any other engine block size is skipped (counted). Until a
//! tier's first store the factor is unknown (a daemon restored from a
//! snapshot or a peer's dump holds blocks cut before it started), so a
//! remove takes every piece a block of any accepted size could have had
//! that the index holds (the caller's `retain_held` says which): keeping
//! one that the engine dropped would claim a block the worker does not hold.
//!
//! **Multimodal blocks.** vLLM's marked `extra_keys` hashes are appended
//! to a block's tokens before hashing; TensorRT-LLM's digest tokens and
//! `mm_keys` are turned into the tokens a router hashes
//! ([`super::multimodal`]), and a block that cannot be rebuilt is stored
//! under a hash no query meets (counted).
//!
//! **Cache groups.** Stores carrying `kv_cache_spec_kind` teach which group
//! index is which kind; non-main kinds (sliding window, mamba, ...) are
//! skipped. One main group is indexed per worker: the first one a store
//! names as main, or group 0 until one does. Events of any other group,
//! including removes that carry only `group_idx`, are skipped, except
//! before the worker's first store: then nothing is known yet (after a warm
//! start the index may hold blocks of a main group other than 0), and a
//! remove not marked non-main is applied, for the same reason.

use std::sync::Arc;

use rustc_hash::FxHashMap;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::medium::tier_for_medium;
use super::multimodal::{unmatchable_hash, MmResolver, Routing};
use super::raw::{RawEvent, RawRemoved, RawStored};
use super::skip::{SkipCounters, SkipReason};
use crate::event::{Event, StorageTier, StoredBlock, WorkerId};
use crate::hash;

/// Most salted engine blocks remembered per worker for salt inheritance.
pub const SALTED_BLOCKS_MAX: usize = 1 << 20;
/// Largest engine block accepted, in index blocks (engine block size / index block size).
pub const SPLIT_FACTOR_MAX: u32 = 64;
/// Cache group indexes whose kind is remembered; higher ones are never indexed.
pub const GROUPS_TRACKED_MAX: usize = 32;

/// Seed of [`split_block_hash`]; distinct from the block hash seeds so the
/// derived hashes form their own space.
const SPLIT_HASH_SEED: u64 = 0x6b76_2d73_706c_6974;

/// `kv_cache_spec_kind` values of attention that holds the whole prefix (vLLM's names).
const MAIN_KINDS: &[&str] = &["full_attention", "mla_attention", "sink_full_attention"];

/// The engine hash given to sub-block `position` (0-based, not the last) of a
/// split engine block.
pub fn split_block_hash(engine_hash: u64, position: u32) -> u64 {
    let mut bytes = [0u8; 12];
    bytes[..8].copy_from_slice(&engine_hash.to_le_bytes());
    bytes[8..].copy_from_slice(&position.to_le_bytes());
    xxh3_64_with_seed(&bytes, SPLIT_HASH_SEED)
}

struct SaltEntry {
    salt: Arc<str>,
    /// Bit per [`StorageTier`] still holding the block.
    tiers: u8,
}

fn tier_bit(tier: StorageTier) -> u8 {
    1 << tier.index()
}

/// Keeps in the list only the engine hashes the worker holds in the tier.
pub type RetainHeld<'a> = &'a dyn Fn(StorageTier, &mut Vec<u64>);

/// Per-worker conversion state (salt inheritance: engine hash -> salt seed for salted
/// chains, bounded; cleaned on remove/clear).
pub struct WorkerConverter {
    block_size: u32,
    /// Index blocks per engine block, per [`StorageTier`], from that tier's
    /// last store (None before its first): a remove names engine blocks of its
    /// own tier, whose size may differ from another tier's (an offloader's
    /// larger host blocks).
    split_factor: [Option<u32>; StorageTier::ALL.len()],
    salts: FxHashMap<u64, SaltEntry>,
    group_is_main: [Option<bool>; GROUPS_TRACKED_MAX],
    indexed_group: Option<u32>,
    mm: MmResolver,
    sort_scratch: Vec<u64>,
    bytes_scratch: Vec<u8>,
    pieces_scratch: Vec<u64>,
}

impl WorkerConverter {
    /// A converter for a worker whose index uses `block_size` tokens per block (at least 1).
    pub fn new(block_size: u32) -> Self {
        debug_assert!(block_size > 0, "index block size must be at least 1");
        Self {
            block_size: block_size.max(1),
            split_factor: [None; StorageTier::ALL.len()],
            salts: FxHashMap::default(),
            group_is_main: [None; GROUPS_TRACKED_MAX],
            indexed_group: None,
            mm: MmResolver::default(),
            sort_scratch: Vec::new(),
            bytes_scratch: Vec::new(),
            pieces_scratch: Vec::new(),
        }
    }

    /// The index block size this converter cuts blocks to.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Forgets everything learned about the worker: it was cleared or restarted.
    pub fn reset(&mut self) {
        *self = Self::new(self.block_size);
    }

    /// Appends the index events for `events` of `worker` to `out`, counting
    /// skips; `retain_held` answers from the index as it stands before them.
    pub fn convert(
        &mut self,
        worker: WorkerId,
        events: &[RawEvent],
        out: &mut Vec<Event>,
        skips: &SkipCounters,
        retain_held: RetainHeld<'_>,
    ) {
        for event in events {
            let result = match event {
                RawEvent::Stored(stored) => self.stored(worker, stored, out, skips),
                RawEvent::Removed(removed) => self.removed(worker, removed, out, retain_held),
                RawEvent::Cleared => {
                    self.reset();
                    out.push(Event::cleared(worker));
                    Ok(())
                }
                RawEvent::Unknown => Err(SkipReason::UnknownEventType),
                RawEvent::MalformedStore => Err(SkipReason::MalformedStore),
            };
            if let Err(reason) = result {
                skips.add(reason);
            }
        }
    }

    fn stored(
        &mut self,
        worker: WorkerId,
        s: &RawStored,
        out: &mut Vec<Event>,
        skips: &SkipCounters,
    ) -> Result<(), SkipReason> {
        check_placement(s.locality.as_deref(), s.ownership.as_deref())?;
        let tier = tier_for_medium(s.medium.as_deref()).ok_or(SkipReason::UnknownMedium)?;
        self.check_group(s.group_idx, s.kv_cache_spec_kind.as_deref(), true)?;
        let count = s.block_hashes.len();
        if count == 0 {
            return Err(SkipReason::EmptyEvent);
        }
        if s.block_size == 0 || s.token_ids.is_empty() {
            return Err(SkipReason::PlaceholderStore);
        }
        if s.lora_id.is_some() && s.lora_name.is_none() {
            return Err(SkipReason::LoraWithoutName);
        }
        if self.self_referencing(&s.block_hashes, s.parent_block_hash) {
            return Err(SkipReason::SelfReferencingStore);
        }
        if !s.block_size.is_multiple_of(self.block_size) || s.block_size / self.block_size > SPLIT_FACTOR_MAX {
            return Err(SkipReason::BlockSizeMismatch);
        }
        let split = s.block_size / self.block_size;
        let engine_block = s.block_size as usize;
        if s.token_ids.len() as u64 != count as u64 * u64::from(s.block_size) {
            return Err(SkipReason::TokenCountMismatch);
        }
        self.split_factor[tier.index()] = Some(split);

        let mut usable = s.opaque_extra_keys_from.map_or(count, |i| (i as usize).min(count));
        if split > 1 {
            // Multimodal hashes belong to an engine block, not to a piece of it.
            if let Some(first_mm) = s.block_mm_hashes.iter().position(|h| !h.is_empty()) {
                usable = usable.min(first_mm);
            }
        }
        if usable == 0 {
            return Err(SkipReason::OpaqueExtraKeys);
        }
        let salt = self.salt_for(s);
        if salt.is_some() && self.salts.len() + usable > SALTED_BLOCKS_MAX {
            return Err(SkipReason::SaltTableFull);
        }

        let seed = hash::seed_for(s.lora_name.as_deref(), salt.as_deref());
        let routing = self.mm.resolve(s, engine_block);
        let index_block = self.block_size as usize;
        let mut blocks = Vec::with_capacity(usable * split as usize);
        let mut unmatchable = false;
        for (i, &engine_hash) in s.block_hashes[..usable].iter().enumerate() {
            let range = i * engine_block..(i + 1) * engine_block;
            let mut tokens = &s.token_ids[range.clone()];
            let mut strings = Vec::new();
            let mut unresolved = false;
            match routing.as_ref().map(|r| &r[i]) {
                Some(Routing::Tokens(rewritten)) => tokens = rewritten,
                Some(Routing::Unresolved) => {
                    (unresolved, unmatchable) = (true, true);
                    let inside = |p: &&(u32, String)| range.contains(&(p.0 as usize));
                    let all = s.multimodal.iter().flat_map(|m| &m.string_tokens);
                    strings.extend(all.filter(inside).map(|(_, t)| t.as_str()));
                }
                Some(Routing::Text) | None => {}
            }
            let mm = s.block_mm_hashes.get(i).map_or(&[][..], Vec::as_slice);
            for (j, sub) in tokens.chunks_exact(index_block).enumerate() {
                let local_hash = if unresolved {
                    unmatchable_hash(sub, &strings, j as u32, seed, &mut self.bytes_scratch)
                } else if mm.is_empty() {
                    hash::local_hash(sub, seed)
                } else {
                    self.local_hash_with_mm(sub, mm, seed)
                };
                // j < split <= SPLIT_FACTOR_MAX, so it fits in u32.
                let position = j as u32;
                let engine_hash =
                    if position + 1 == split { engine_hash } else { split_block_hash(engine_hash, position) };
                blocks.push(StoredBlock { engine_hash, local_hash });
            }
        }
        if let Some(salt) = salt {
            for &engine_hash in &s.block_hashes[..usable] {
                let entry =
                    self.salts.entry(engine_hash).or_insert_with(|| SaltEntry { salt: Arc::clone(&salt), tiers: 0 });
                if *entry.salt != *salt {
                    entry.salt = Arc::clone(&salt);
                }
                entry.tiers |= tier_bit(tier);
            }
        }
        out.push(Event::stored(worker, tier, s.parent_block_hash, blocks));
        if usable < count {
            skips.add(SkipReason::OpaqueExtraKeys);
        }
        if unmatchable {
            skips.add(SkipReason::UnmatchableMultimodal);
        }
        Ok(())
    }

    fn removed(
        &mut self,
        worker: WorkerId,
        r: &RawRemoved,
        out: &mut Vec<Event>,
        retain_held: RetainHeld<'_>,
    ) -> Result<(), SkipReason> {
        check_placement(r.locality.as_deref(), r.ownership.as_deref())?;
        let tier = tier_for_medium(r.medium.as_deref()).ok_or(SkipReason::UnknownMedium)?;
        self.check_group(r.group_idx, r.kv_cache_spec_kind.as_deref(), false)?;
        if r.block_hashes.is_empty() {
            return Err(SkipReason::EmptyEvent);
        }
        let split = self.split_factor[tier.index()];
        let mut hashes = Vec::with_capacity(r.block_hashes.len() * split.unwrap_or(1) as usize);
        for &engine_hash in &r.block_hashes {
            let pieces = |k: u32| (0..k - 1).map(move |j| split_block_hash(engine_hash, j));
            match split {
                Some(k) => hashes.extend(pieces(k)),
                None => {
                    let held = &mut self.pieces_scratch;
                    held.clear();
                    held.extend(pieces(SPLIT_FACTOR_MAX));
                    retain_held(tier, held);
                    hashes.extend_from_slice(held);
                }
            }
            hashes.push(engine_hash);
            if let Some(entry) = self.salts.get_mut(&engine_hash) {
                entry.tiers &= !tier_bit(tier);
                if entry.tiers == 0 {
                    self.salts.remove(&engine_hash);
                }
            }
        }
        out.push(Event::removed(worker, tier, hashes));
        Ok(())
    }

    /// The salt of a store: its own, else its parent's if the parent is salted.
    fn salt_for(&self, s: &RawStored) -> Option<Arc<str>> {
        let parent = s.parent_block_hash.and_then(|p| self.salts.get(&p)).map(|e| &e.salt);
        match s.cache_salt.as_deref().or(s.extra_keys_salt.as_deref()) {
            // Share the parent's allocation when the chain keeps its salt.
            Some(own) => Some(match parent {
                Some(p) if **p == *own => Arc::clone(p),
                _ => Arc::from(own),
            }),
            None => parent.cloned(),
        }
    }

    /// Whether the group (and kind) of an event is the indexed main group;
    /// stores teach which groups are main.
    fn check_group(&mut self, group_idx: Option<u32>, kind: Option<&str>, learn: bool) -> Result<(), SkipReason> {
        if let Some(kind) = kind {
            let main = MAIN_KINDS.iter().any(|k| k.eq_ignore_ascii_case(kind));
            if let (true, Some(group)) = (learn, group_idx) {
                if let Some(slot) = self.group_is_main.get_mut(group as usize) {
                    *slot = Some(main);
                    if main && self.indexed_group.is_none() {
                        self.indexed_group = Some(group);
                    }
                }
            }
            if !main {
                return Err(SkipReason::NonMainAttention);
            }
        }
        let Some(group) = group_idx else {
            return Ok(());
        };
        if group == self.indexed_group.unwrap_or(0) {
            return Ok(());
        }
        let nothing_learned = self.indexed_group.is_none() && self.split_factor.iter().all(Option::is_none);
        match self.group_is_main.get(group as usize).copied().flatten() {
            Some(false) => Err(SkipReason::NonMainAttention),
            _ if nothing_learned && !learn => Ok(()),
            _ => Err(SkipReason::OtherKvGroup),
        }
    }

    fn self_referencing(&mut self, hashes: &[u64], parent: Option<u64>) -> bool {
        if parent.is_some_and(|p| hashes.contains(&p)) {
            return true;
        }
        // Small stores are the common case: compare directly, no sorting.
        if hashes.len() <= 16 {
            return (1..hashes.len()).any(|i| hashes[..i].contains(&hashes[i]));
        }
        self.sort_scratch.clear();
        self.sort_scratch.extend_from_slice(hashes);
        self.sort_scratch.sort_unstable();
        self.sort_scratch.windows(2).any(|w| w[0] == w[1])
    }

    /// Local hash of a block with multimodal content: its tokens, then its
    /// sorted multimodal hashes, all little-endian, under the same seed.
    fn local_hash_with_mm(&mut self, tokens: &[u32], mm_hashes: &[u64], seed: u64) -> u64 {
        let bytes = &mut self.bytes_scratch;
        bytes.clear();
        bytes.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
        bytes.extend(mm_hashes.iter().flat_map(|h| h.to_le_bytes()));
        xxh3_64_with_seed(bytes, seed)
    }
}

fn check_placement(locality: Option<&str>, ownership: Option<&str>) -> Result<(), SkipReason> {
    match locality {
        None => {}
        Some(l) if l.eq_ignore_ascii_case("LOCAL") => {}
        Some(l) if l.eq_ignore_ascii_case("REMOTE") => return Err(SkipReason::RemoteLocality),
        Some(_) => return Err(SkipReason::UnknownLocality),
    }
    match ownership {
        None => Ok(()),
        Some(o) if o.eq_ignore_ascii_case("kvcr") => Err(SkipReason::KvcrOwnership),
        Some(_) => Err(SkipReason::UnknownOwnership),
    }
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;

//! Block content: every indexed block's chain hash, kept once for all of
//! its holders, in chunks of `CHUNK_BLOCKS` consecutive blocks of one run.
//!
//! A block's id is `chunk * CHUNK_BLOCKS + slot`; ids never move while the
//! block lives, so a worker's record of an engine hash can name the block
//! in four bytes. Chunks live in pages (`pages`) that readers load without
//! locks. The writer-side allocator hands out the lowest free chunk, so
//! live chunks pack into the lowest pages, and a page whose chunks are all
//! free is released at once (through epochs).
//!
//! Only the chain hash is stored: the local hash of a block is recovered
//! from its chain and its parent's (`chain::local_of`).

use super::pages::{Pages, Writer, Zeroable};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};

/// Blocks per chunk.
pub(crate) const CHUNK_BLOCKS: usize = 16;
/// Chunks per page (64 KiB of chains).
const PAGE_CHUNKS: usize = 512;
/// Most chunks an index can hold: block ids stay below `NIL`.
pub(crate) const CHUNKS_MAX: u32 = (u32::MAX / CHUNK_BLOCKS as u32) - 1;
/// No block.
pub(crate) const NIL: u32 = u32::MAX;

/// The chains of one chunk.
pub(crate) struct Chunk {
    chains: [AtomicU64; CHUNK_BLOCKS],
}

// SAFETY: atomics only.
unsafe impl Zeroable for Chunk {}

// The bytes per pair in this module's parent doc (`index/mod.rs`) count on these: 8 bytes a block's
// chain, 8 bytes of owner per chunk of 16 blocks.
const _: () = assert!(std::mem::size_of::<Chunk>() == 8 * CHUNK_BLOCKS);

impl Chunk {
    #[inline]
    pub(crate) fn chain(&self, slot: usize) -> u64 {
        self.chains[slot].load(Ordering::Relaxed)
    }

    #[inline]
    pub(crate) fn set(&self, slot: usize, chain: u64) {
        self.chains[slot].store(chain, Ordering::Relaxed)
    }
}

/// The chunk pages, shared with readers.
pub(crate) type ChunkPages = Pages<Chunk, PAGE_CHUNKS>;

/// Which run a chunk belongs to, and where in it.
#[derive(Clone, Copy, Default)]
pub(crate) struct ChunkOwner {
    pub run: u32,
    /// The chunk's index in the run: its first block is at offset `index * CHUNK_BLOCKS`.
    pub index: u32,
}

const _: () = assert!(std::mem::size_of::<ChunkOwner>() == 8);

/// Writer side: which chunks are free, and whose the others are.
#[derive(Default)]
pub(crate) struct ChunkAlloc {
    owners: Vec<ChunkOwner>,
    /// Per page, live chunks.
    page_live: Vec<u16>,
    /// Per page, one bit per free chunk.
    page_free: Vec<[u64; PAGE_CHUNKS / 64]>,
    /// Pages with a free chunk (allocated or not), lowest first.
    with_free: BTreeSet<u32>,
    live: u64,
}

impl ChunkAlloc {
    /// A free chunk for `owner`, its page allocated; None when the index is full.
    pub(crate) fn alloc(&mut self, pages: &ChunkPages, writer: &Writer, owner: ChunkOwner) -> Option<u32> {
        let page = match self.with_free.first() {
            Some(&p) => p,
            None => {
                let p = self.page_live.len() as u32;
                if (p as u64 + 1) * PAGE_CHUNKS as u64 > CHUNKS_MAX as u64 {
                    return None;
                }
                self.page_live.push(0);
                self.page_free.push([u64::MAX; PAGE_CHUNKS / 64]);
                self.owners.resize(self.owners.len() + PAGE_CHUNKS, ChunkOwner::default());
                self.with_free.insert(p);
                p
            }
        };
        pages.ensure(page as usize, writer);
        let bits = &mut self.page_free[page as usize];
        let word = bits.iter().position(|&w| w != 0).expect("page listed with a free chunk");
        let bit = bits[word].trailing_zeros() as usize;
        bits[word] &= !(1u64 << bit);
        if bits.iter().all(|&w| w == 0) {
            self.with_free.remove(&page);
        }
        self.page_live[page as usize] += 1;
        self.live += 1;
        let chunk = page * PAGE_CHUNKS as u32 + (word * 64 + bit) as u32;
        self.owners[chunk as usize] = owner;
        Some(chunk)
    }

    /// Frees `chunk`; its page goes once it holds no live chunk.
    pub(crate) fn free(&mut self, pages: &ChunkPages, writer: &Writer, chunk: u32) {
        let page = chunk as usize / PAGE_CHUNKS;
        let k = chunk as usize % PAGE_CHUNKS;
        debug_assert!(self.page_free[page][k / 64] & (1 << (k % 64)) == 0, "chunk {chunk} freed twice");
        self.page_free[page][k / 64] |= 1 << (k % 64);
        self.with_free.insert(page as u32);
        self.page_live[page] -= 1;
        self.live -= 1;
        if self.page_live[page] == 0 {
            pages.release(page, writer);
        }
    }

    pub(crate) fn owner(&self, chunk: u32) -> ChunkOwner {
        self.owners[chunk as usize]
    }

    /// Live chunks.
    #[cfg(test)]
    pub(crate) fn live(&self) -> u64 {
        self.live
    }

    /// Bytes of the writer's bookkeeping.
    pub(crate) fn bytes(&self) -> usize {
        self.owners.capacity() * std::mem::size_of::<ChunkOwner>()
            + self.page_live.capacity() * 2
            + self.page_free.capacity() * (PAGE_CHUNKS / 8)
            + self.with_free.len() * 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_chunks_first_and_empty_pages_released() {
        let pages = ChunkPages::new();
        // SAFETY: this test is the pages' one writer.
        let w = unsafe { Writer::new() };
        let mut a = ChunkAlloc::default();
        let owner = |run| ChunkOwner { run, index: 0 };
        let ids: Vec<u32> = (0..PAGE_CHUNKS as u32 + 3).map(|r| a.alloc(&pages, &w, owner(r)).unwrap()).collect();
        assert_eq!(ids[0], 0);
        assert_eq!(ids[PAGE_CHUNKS], PAGE_CHUNKS as u32, "a second page once the first is full");
        assert!(pages.has(1));
        for &c in &ids[PAGE_CHUNKS..] {
            a.free(&pages, &w, c);
        }
        assert!(!pages.has(1), "an emptied page is released");
        a.free(&pages, &w, ids[7]);
        assert_eq!(a.alloc(&pages, &w, owner(99)).unwrap(), 7, "the lowest free chunk is reused");
        assert_eq!(a.owner(7).run, 99);
        assert_eq!(a.live(), PAGE_CHUNKS as u64);
    }
}

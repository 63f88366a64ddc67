//! Entry storage: what the writer knows about each indexed block.
//!
//! Entries live in fixed pages so their ids (u32) stay valid; ids are what
//! the per-worker records and the parent/children links hold. Free slots are
//! reused lowest page first, and a page whose entries are all freed is
//! released, so memory falls back when the index empties. Only the writer of
//! an index touches the slab.

use std::collections::BTreeSet;

/// "No entry": the parent of a position-0 block, the end of a list.
pub(crate) const NIL: u32 = u32::MAX;
const PAGE_BITS: u32 = 10;
const PAGE_LEN: usize = 1 << PAGE_BITS;

/// One indexed block in one tier and one worker group.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    /// The index's own prefix hash (Dynamo's sequence hash of the prefix).
    pub chain: u64,
    /// The block's local (chunk) hash, for dumps.
    pub local: u64,
    /// Workers of this group that hold the block (whether or not they hold its prefix).
    pub held: u64,
    pub parent: u32,
    pub level: u32,
    pub first_child: u32,
    pub next_sibling: u32,
    pub prev_sibling: u32,
    pub group: u16,
    pub tier: u8,
}

impl Entry {
    const VACANT: Entry = Entry {
        chain: 0,
        local: 0,
        held: 0,
        parent: NIL,
        level: 0,
        first_child: NIL,
        next_sibling: NIL,
        prev_sibling: NIL,
        group: 0,
        tier: VACANT_TIER,
    };
}

/// The tier value of a free slot.
const VACANT_TIER: u8 = u8::MAX;

struct Page {
    entries: Box<[Entry]>,
    free_head: u32,
    live: u32,
}

#[derive(Default)]
pub(crate) struct Slab {
    pages: Vec<Option<Page>>,
    with_room: BTreeSet<u32>,
    live: usize,
}

impl Slab {
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    pub(crate) fn bytes(&self) -> usize {
        let pages = self.pages.iter().flatten().count();
        pages * PAGE_LEN * std::mem::size_of::<Entry>() + self.pages.capacity() * std::mem::size_of::<Option<Page>>()
    }

    /// Stores `entry`, returning its id; None when the id space is exhausted.
    pub(crate) fn alloc(&mut self, entry: Entry) -> Option<u32> {
        let page_no = match self.with_room.first() {
            Some(&p) => p,
            None => self.new_page()?,
        };
        let page = self.pages[page_no as usize].as_mut().expect("page with room exists");
        let slot = page.free_head;
        page.free_head = page.entries[slot as usize].next_sibling;
        page.entries[slot as usize] = entry;
        page.live += 1;
        if page.free_head == NIL {
            self.with_room.remove(&page_no);
        }
        self.live += 1;
        Some((page_no << PAGE_BITS) | slot)
    }

    fn new_page(&mut self) -> Option<u32> {
        let page_no = match self.pages.iter().position(Option::is_none) {
            Some(p) => p,
            None => {
                if self.pages.len() >= (NIL as usize >> PAGE_BITS) {
                    return None;
                }
                self.pages.push(None);
                self.pages.len() - 1
            }
        };
        let mut entries = vec![Entry::VACANT; PAGE_LEN].into_boxed_slice();
        for (i, e) in entries.iter_mut().enumerate() {
            e.next_sibling = if i + 1 < PAGE_LEN { (i + 1) as u32 } else { NIL };
        }
        self.pages[page_no] = Some(Page { entries, free_head: 0, live: 0 });
        self.with_room.insert(page_no as u32);
        Some(page_no as u32)
    }

    pub(crate) fn free(&mut self, id: u32) {
        let page_no = id >> PAGE_BITS;
        let slot = id & (PAGE_LEN as u32 - 1);
        let page = self.pages[page_no as usize].as_mut().expect("freeing a live entry");
        page.entries[slot as usize] = Entry { next_sibling: page.free_head, ..Entry::VACANT };
        page.free_head = slot;
        page.live -= 1;
        self.live -= 1;
        if page.live == 0 {
            self.pages[page_no as usize] = None;
            self.with_room.remove(&page_no);
            while matches!(self.pages.last(), Some(None)) {
                self.pages.pop();
            }
            if self.pages.is_empty() {
                self.pages = Vec::new();
            }
        } else {
            self.with_room.insert(page_no);
        }
    }

    /// Whether `id` names a live entry.
    pub(crate) fn is_live(&self, id: u32) -> bool {
        match self.pages.get((id >> PAGE_BITS) as usize) {
            Some(Some(page)) => page.entries[(id & (PAGE_LEN as u32 - 1)) as usize].tier != VACANT_TIER,
            _ => false,
        }
    }

    #[inline]
    pub(crate) fn get(&self, id: u32) -> &Entry {
        let page = self.pages[(id >> PAGE_BITS) as usize].as_ref().expect("live entry");
        &page.entries[(id & (PAGE_LEN as u32 - 1)) as usize]
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, id: u32) -> &mut Entry {
        let page = self.pages[(id >> PAGE_BITS) as usize].as_mut().expect("live entry");
        &mut page.entries[(id & (PAGE_LEN as u32 - 1)) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_pages_are_released() {
        let mut slab = Slab::default();
        let ids: Vec<u32> = (0..5000u64).map(|i| slab.alloc(Entry { chain: i, ..Entry::VACANT }).unwrap()).collect();
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(slab.get(id).chain, i as u64);
        }
        for &id in ids.iter().step_by(2) {
            slab.free(id);
        }
        for (i, &id) in ids.iter().enumerate().skip(1).step_by(2) {
            assert_eq!(slab.get(id).chain, i as u64);
        }
        assert_eq!(slab.live(), 2500);
        for &id in ids.iter().skip(1).step_by(2) {
            slab.free(id);
        }
        assert_eq!(slab.live(), 0);
        assert_eq!(slab.bytes(), 0);
    }
}

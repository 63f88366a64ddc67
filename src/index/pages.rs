//! Arrays that never move, read without locks: fixed-size pages allocated
//! on demand behind a directory of page pointers.
//!
//! Elements are addressed by a dense `u32` index. Only the index's writer
//! allocates, grows or releases; readers load the directory and a page
//! pointer (two loads) under an epoch guard. A released page and an
//! outgrown directory are freed only once every reader pinned before the
//! change is gone (crossbeam epochs), so a reader never touches freed
//! memory. Pages come zeroed from the allocator, so their elements must be
//! valid when all their bytes are zero (atomics and raw pointers are).

use super::reclaim;
use crossbeam::epoch::{self, Atomic, Guard, Owned};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// Proof that its holder is the one writer of an index: it holds the
/// index's tree lock, because the only `Writer` of an index belongs to the
/// tree behind that lock. The methods that allocate, reach without a guard
/// or release pages take one, so who may call them is in their signature.
pub(crate) struct Writer(());

impl Writer {
    /// # Safety
    /// Only the value an index keeps behind its tree lock may own the one
    /// `Writer` made for that index's pages.
    pub(crate) unsafe fn new() -> Writer {
        Writer(())
    }
}

/// A type whose all-zero bit pattern is a valid value.
///
/// # Safety
/// Implement only for types made of atomics, integers and raw pointers.
pub(crate) unsafe trait Zeroable {}

struct Directory<T> {
    pages: Box<[AtomicPtr<T>]>,
}

/// Pages of `N` elements of `T`.
pub(crate) struct Pages<T: Zeroable, const N: usize> {
    dir: Atomic<Directory<T>>,
    /// Pages allocated now (writer-maintained).
    live: AtomicUsize,
    _owns: PhantomData<T>,
}

// SAFETY: elements are only reached through shared references to `Sync` data
// (atomics); pages are owned by this value and freed through epochs.
unsafe impl<T: Zeroable + Sync, const N: usize> Sync for Pages<T, N> {}
unsafe impl<T: Zeroable + Send, const N: usize> Send for Pages<T, N> {}

impl<T: Zeroable, const N: usize> Pages<T, N> {
    pub(crate) fn new() -> Self {
        Pages { dir: Atomic::null(), live: AtomicUsize::new(0), _owns: PhantomData }
    }

    fn layout() -> Layout {
        Layout::array::<T>(N).expect("page layout")
    }

    /// The element at `i`, if its page exists.
    #[inline]
    pub(crate) fn get<'g>(&self, i: u32, guard: &'g Guard) -> Option<&'g T> {
        let dir = self.dir.load(Ordering::Acquire, guard);
        // SAFETY: directories are freed through `reclaim` only.
        let dir = unsafe { dir.as_ref() }?;
        let page = dir.pages.get(i as usize / N)?.load(Ordering::Acquire);
        if page.is_null() {
            return None;
        }
        // SAFETY: a page pointer is live until deferred release, after which
        // no guard pinned before the release can still read it; zeroed `T`s are valid.
        Some(unsafe { &*page.add(i as usize % N) })
    }

    /// The element at `i`, whose page must exist.
    #[inline]
    pub(crate) fn at(&self, i: u32, _writer: &Writer) -> &T {
        // SAFETY: the writer is the only one that releases pages, and it is
        // the caller, so a page it allocated stays while it uses it; an
        // unprotected guard is enough.
        let guard = unsafe { epoch::unprotected() };
        let t: *const T = self.get(i, guard).expect("page exists");
        // SAFETY: as above; the reference lives as long as `self` is not mutated.
        unsafe { &*t }
    }

    /// Allocates page `page` (and a larger directory) if needed.
    pub(crate) fn ensure(&self, page: usize, _writer: &Writer) {
        let guard = epoch::pin();
        let dir = self.dir.load(Ordering::Acquire, &guard);
        // SAFETY: writer only.
        let have = unsafe { dir.as_ref() }.map_or(0, |d| d.pages.len());
        if page >= have {
            let len = (page + 1).next_power_of_two().max(4);
            let pages: Box<[AtomicPtr<T>]> = (0..len)
                .map(|p| {
                    // SAFETY: writer only; p < have means the old directory has it.
                    let old = unsafe { dir.as_ref() }.and_then(|d| d.pages.get(p));
                    AtomicPtr::new(old.map_or(std::ptr::null_mut(), |a| a.load(Ordering::Relaxed)))
                })
                .collect();
            let old = self.dir.swap(Owned::new(Directory { pages }), Ordering::AcqRel, &guard);
            // SAFETY: unreachable now; readers holding it are pinned.
            unsafe { reclaim::retire_shared(old, have * 8) };
        }
        let dir = self.dir.load(Ordering::Acquire, &guard);
        // SAFETY: just ensured non-null and long enough.
        let slot = unsafe { &dir.deref().pages[page] };
        if slot.load(Ordering::Relaxed).is_null() {
            // SAFETY: non-zero size; zeroed `T` is valid.
            let p = unsafe { alloc_zeroed(Self::layout()) } as *mut T;
            if p.is_null() {
                std::alloc::handle_alloc_error(Self::layout());
            }
            slot.store(p, Ordering::Release);
            self.live.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Frees page `page` once no reader can hold it.
    pub(crate) fn release(&self, page: usize, _writer: &Writer) {
        let guard = epoch::pin();
        let dir = self.dir.load(Ordering::Acquire, &guard);
        // SAFETY: writer only.
        let Some(slot) = unsafe { dir.as_ref() }.and_then(|d| d.pages.get(page)) else { return };
        let p = slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if p.is_null() {
            return;
        }
        self.live.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: the page is unreachable from the directory; readers that
        // loaded it are pinned, and it is freed after they unpin.
        unsafe { reclaim::retire(p as *mut u8, Self::free_page, Self::layout().size()) };
    }

    unsafe fn free_page(p: *mut u8) {
        // SAFETY: `release` passes a page from `alloc_zeroed` with this layout.
        unsafe { dealloc(p, Self::layout()) };
    }

    /// Whether page `page` is allocated (writer only).
    #[cfg(test)]
    pub(crate) fn has(&self, page: usize) -> bool {
        // SAFETY: writer only.
        let guard = unsafe { epoch::unprotected() };
        let dir = self.dir.load(Ordering::Acquire, guard);
        unsafe { dir.as_ref() }.and_then(|d| d.pages.get(page)).is_some_and(|s| !s.load(Ordering::Relaxed).is_null())
    }

    /// Bytes of pages and directory.
    pub(crate) fn bytes(&self) -> usize {
        // SAFETY: the directory is only replaced by the writer, who calls this
        // or holds the lock that callers take.
        let guard = unsafe { epoch::unprotected() };
        let dir = self.dir.load(Ordering::Acquire, guard);
        let dir_bytes = unsafe { dir.as_ref() }.map_or(0, |d| d.pages.len() * 8);
        self.live.load(Ordering::Relaxed) * Self::layout().size() + dir_bytes
    }
}

impl<T: Zeroable, const N: usize> Drop for Pages<T, N> {
    fn drop(&mut self) {
        // SAFETY: exclusive access: no reader can hold a page or the directory.
        unsafe {
            let dir = self.dir.load(Ordering::Relaxed, epoch::unprotected());
            if dir.is_null() {
                return;
            }
            let dir = dir.into_owned();
            for p in dir.pages.iter() {
                let p = p.load(Ordering::Relaxed);
                if !p.is_null() {
                    dealloc(p as *mut u8, Self::layout());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    unsafe impl Zeroable for AtomicU64 {}

    #[test]
    fn pages_come_zeroed_and_go_away() {
        let p: Pages<AtomicU64, 16> = Pages::new();
        let guard = epoch::pin();
        assert!(p.get(3, &guard).is_none());
        // SAFETY: this test is the pages' one writer.
        let writer = unsafe { Writer::new() };
        p.ensure(0, &writer);
        p.ensure(9, &writer);
        assert_eq!(p.get(3, &guard).unwrap().load(Ordering::Relaxed), 0);
        p.at(9 * 16 + 5, &writer).store(7, Ordering::Relaxed);
        assert_eq!(p.get(9 * 16 + 5, &guard).unwrap().load(Ordering::Relaxed), 7);
        assert!(p.get(5 * 16, &guard).is_none(), "pages between stay unallocated");
        assert_eq!(p.bytes(), 2 * 16 * 8 + 16 * 8);
        p.release(9, &writer);
        assert!(!p.has(9) && p.has(0));
        assert!(p.get(9 * 16 + 5, &guard).is_none());
    }
}

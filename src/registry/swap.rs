//! An index that can be replaced whole: startup recovery loads a peer's
//! dump into a fresh index nobody sees and puts it in place of the old one
//! only once the dump arrived whole (`IndexHandle::replace_index`).
//!
//! Readers pin an epoch (`IndexRef`), as the index's own readers do, and
//! read the current index through it: no lock and no shared counter on the
//! query path. Whoever holds an index for long (a streamed dump) takes an
//! `Arc` of it instead, so a pinned epoch never holds back the index's own
//! reclaiming. A replaced index goes once every reader that could still
//! see it is done.

use crate::index::Index;
use crossbeam::epoch::{self, Atomic, Guard, Owned};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The current index of a handle.
pub(super) struct IndexSlot(Atomic<Arc<Index>>);

/// The current index, for a short read (a query, an event).
pub struct IndexRef {
    index: *const Index,
    _guard: Guard,
}

impl std::ops::Deref for IndexRef {
    type Target = Index;
    fn deref(&self) -> &Index {
        // SAFETY: the Arc this points into is dropped only by `defer_destroy`
        // after it left the slot, which waits for every guard pinned before,
        // and `_guard` was pinned before the load.
        unsafe { &*self.index }
    }
}

impl IndexSlot {
    pub(super) fn new(index: Index) -> IndexSlot {
        IndexSlot(Atomic::new(Arc::new(index)))
    }

    pub(super) fn get(&self) -> IndexRef {
        let guard = epoch::pin();
        let current = self.0.load(Ordering::Acquire, &guard);
        // SAFETY: the slot always holds an index (set at creation, only swapped).
        let arc = unsafe { current.deref() };
        IndexRef { index: Arc::as_ptr(arc), _guard: guard }
    }

    pub(super) fn arc(&self) -> Arc<Index> {
        let guard = epoch::pin();
        // SAFETY: as in `get`.
        unsafe { self.0.load(Ordering::Acquire, &guard).deref() }.clone()
    }

    /// Puts `index` in place of the current one, which goes once no reader
    /// can see it.
    pub(super) fn replace(&self, index: Index) {
        let guard = epoch::pin();
        let old = self.0.swap(Owned::new(Arc::new(index)), Ordering::AcqRel, &guard);
        // SAFETY: `old` left the slot; readers pinned before may still use it.
        unsafe { guard.defer_destroy(old) };
        guard.flush();
    }
}

impl Drop for IndexSlot {
    fn drop(&mut self) {
        // SAFETY: no reader is left (`&mut self`), and the slot holds an index.
        unsafe { drop(self.0.load(Ordering::Relaxed, epoch::unprotected()).into_owned()) };
    }
}

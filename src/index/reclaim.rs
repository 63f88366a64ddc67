//! Freeing what writers unlinked, on writers' threads, never in a query.
//!
//! Writers unlink members, chunk lists, pages and tables that queries may
//! still be reading; crossbeam's epochs tell when none can. The collector
//! runs deferred work in whichever thread pins when it is due, a query's
//! too (one pin in 128 collects, up to 8 bags of 64 deferred items each),
//! and frees there cost a query microseconds: the memory was last written
//! on another core and belongs to another thread's malloc arena. So the
//! index gathers what it unlinks into batches and defers one step per
//! batch. A writer or the maintenance thread that runs the step frees the
//! batch; a query that runs it hands the batch back, for the next writer or
//! maintenance round to free.
//!
//! A batch is sealed once it holds `SEAL_ITEMS` items or `SEAL_BYTES`
//! bytes; what is left below that waits for more writes or for `reclaim`,
//! which the daemon's maintenance thread calls every second while memory
//! moves, up to every 16 s while it stays put (`alloc.rs`).

use crossbeam::epoch;
use parking_lot::Mutex;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Items that seal a batch.
const SEAL_ITEMS: usize = 64;
/// Bytes that seal a batch (a clear frees many large items at once).
const SEAL_BYTES: usize = 256 << 10;
/// Collection rounds per `reclaim`. A round advances the epoch if it can
/// and runs up to 8 sealed bags (crossbeam-epoch 0.9); a round with nothing
/// left costs well under a microsecond.
const RECLAIM_ROUNDS: usize = 64;

/// One unlinked allocation and the function that frees it.
struct Item {
    ptr: *mut u8,
    free: unsafe fn(*mut u8),
}

// SAFETY: an item is an owned allocation nothing else can reach, which
// `retire`'s caller allows any thread to free.
unsafe impl Send for Item {}

/// Unlinked allocations that are freed together.
struct Batch(Vec<Item>);

impl Drop for Batch {
    fn drop(&mut self) {
        for item in self.0.drain(..) {
            // SAFETY: `retire`'s caller gave the allocation away with its
            // matching free function, and readers are gone (see `seal`).
            unsafe { (item.free)(item.ptr) };
        }
    }
}

struct Pending {
    items: Vec<Item>,
    bytes: usize,
}

static PENDING: Mutex<Pending> = Mutex::new(Pending { items: Vec::new(), bytes: 0 });
/// Set when the pending batch is due to be sealed.
static DUE: AtomicBool = AtomicBool::new(false);
/// Batches whose readers are gone, handed back by queries.
static HANDED_BACK: Mutex<Vec<Batch>> = Mutex::new(Vec::new());
static ANY_HANDED_BACK: AtomicBool = AtomicBool::new(false);

thread_local! {
    static IN_QUERY: Cell<bool> = const { Cell::new(false) };
}

/// Frees `ptr` with `free` once no reader pinned now can hold it.
///
/// # Safety
/// `ptr` must be unreachable for readers that pin from now on, owned by
/// nothing else, and `free` must be the right way to free it, sound on any
/// thread at any later time.
pub(crate) unsafe fn retire(ptr: *mut u8, free: unsafe fn(*mut u8), bytes: usize) {
    let mut p = PENDING.lock();
    p.items.push(Item { ptr, free });
    p.bytes += bytes;
    if p.items.len() >= SEAL_ITEMS || p.bytes >= SEAL_BYTES {
        DUE.store(true, Ordering::Relaxed);
    }
}

unsafe fn free_box<T>(p: *mut u8) {
    // SAFETY: `retire_box` passes a pointer from `Box::into_raw`.
    drop(unsafe { Box::from_raw(p as *mut T) });
}

/// `retire` for a pointer from `Box::into_raw`; null is ignored.
///
/// # Safety
/// As `retire`.
pub(crate) unsafe fn retire_box<T>(p: *mut T, bytes: usize) {
    if !p.is_null() {
        // SAFETY: passed on from the caller.
        unsafe { retire(p as *mut u8, free_box::<T>, bytes) };
    }
}

/// `retire_box` for a pointer unlinked from a crossbeam `Atomic`.
///
/// # Safety
/// As `retire`.
pub(crate) unsafe fn retire_shared<T>(p: epoch::Shared<'_, T>, bytes: usize) {
    if !p.is_null() {
        // SAFETY: passed on from the caller; `Atomic`s hold boxed values.
        unsafe { retire_box(Box::into_raw(p.into_owned().into_box()), bytes) };
    }
}

/// After a write: seals the pending batch if it is due and frees what
/// queries handed back.
pub(crate) fn after_write() {
    if DUE.load(Ordering::Relaxed) {
        seal(false);
    }
    if ANY_HANDED_BACK.load(Ordering::Relaxed) {
        free_handed_back();
    }
}

/// Seals whatever is pending, runs what the epochs allow and frees it and
/// what queries handed back: for a maintenance thread, since an index that
/// stops receiving events would otherwise keep its last unlinked memory.
pub fn reclaim() {
    seal(true);
    for _ in 0..RECLAIM_ROUNDS {
        epoch::pin().flush();
    }
    free_handed_back();
}

/// Pins the calling thread for a query: what this pin's collection runs is
/// handed back, not freed here.
pub(crate) fn pin_for_query() -> epoch::Guard {
    IN_QUERY.with(|q| q.set(true));
    let guard = epoch::pin();
    IN_QUERY.with(|q| q.set(false));
    guard
}

fn seal(force: bool) {
    let batch = {
        let mut p = PENDING.lock();
        DUE.store(false, Ordering::Relaxed);
        if p.items.is_empty() || (!force && p.items.len() < SEAL_ITEMS && p.bytes < SEAL_BYTES) {
            return;
        }
        p.bytes = 0;
        Batch(std::mem::take(&mut p.items))
    };
    // Every item was unlinked before it was pushed, so before this defer:
    // the step runs once every guard pinned before now is gone.
    let guard = epoch::pin();
    guard.defer(move || step(batch));
    // To the global queue at once, where any thread's next collection finds
    // it, rather than in this thread's bag until 64 more.
    guard.flush();
}

/// The deferred step of a batch whose readers are gone.
fn step(batch: Batch) {
    // A thread whose locals are gone is not in a query.
    if IN_QUERY.try_with(|q| q.get()).unwrap_or(false) {
        HANDED_BACK.lock().push(batch);
        ANY_HANDED_BACK.store(true, Ordering::Release);
    } else {
        drop(batch);
    }
}

fn free_handed_back() {
    let batches = {
        let mut h = HANDED_BACK.lock();
        ANY_HANDED_BACK.store(false, Ordering::Relaxed);
        std::mem::take(&mut *h)
    };
    drop(batches);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    struct Counted(Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Retired items are freed only once a reader that could see them is
    /// gone, and `reclaim` frees them without further writes.
    #[test]
    fn retired_items_wait_for_readers_then_go() {
        let freed = Arc::new(AtomicUsize::new(0));
        let reader = epoch::pin();
        for _ in 0..3 {
            let p = Box::into_raw(Box::new(Counted(freed.clone())));
            // SAFETY: never published; owned by nobody else.
            unsafe { retire_box(p, 8) };
        }
        // Other tests of this binary retire too; only ours are counted.
        reclaim();
        assert_eq!(freed.load(Ordering::SeqCst), 0, "a pinned reader holds them");
        drop(reader);
        // Other tests' readers may hold the epoch back for a while.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while freed.load(Ordering::SeqCst) < 3 && std::time::Instant::now() < deadline {
            reclaim();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(freed.load(Ordering::SeqCst), 3);
    }

    /// A query's pin that runs a batch's step hands the batch back instead
    /// of freeing it; the next write frees it.
    #[test]
    fn a_query_hands_batches_back() {
        let freed = Arc::new(AtomicUsize::new(0));
        let batch = Batch(vec![Item {
            ptr: Box::into_raw(Box::new(Counted(freed.clone()))) as *mut u8,
            free: free_box::<Counted>,
        }]);
        IN_QUERY.with(|q| q.set(true));
        step(batch);
        IN_QUERY.with(|q| q.set(false));
        assert_eq!(freed.load(Ordering::SeqCst), 0, "not freed in the query");
        after_write();
        assert_eq!(freed.load(Ordering::SeqCst), 1, "freed by the writer");
    }
}

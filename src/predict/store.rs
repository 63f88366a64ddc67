//! One index's bookings, per worker.
//!
//! A booking is one routed request's predicted blocks for one worker: the
//! positions `start .. start + len` of the request, with their prefix
//! hashes and local hashes, and an expiry. Per worker, `positions` maps the
//! prefix hash of every predicted position to the booking that predicts it
//! and expires last, so a lookup finds the booking that continues a query
//! with one probe and then compares the booking's hashes in line.
//!
//! Invariants (held under the write lock, checked by `check` in tests):
//! every `positions` entry names a live booking of its worker that holds
//! that prefix hash; no booking is empty; `blocks` is the sum of the
//! bookings' lengths, and what this index took from the shared cap.
//! Expiries sit in a min-heap, one entry per booking (a renewed booking's
//! entry is pushed again when its old instant comes), so a sweep visits
//! only what is due.

use super::limits::PredictLimits;
use crate::event::{Event, EventKind, StorageTier, StoredBlock, WorkerId};
use crate::index::{chains_into, ApplyOutcome};
use parking_lot::RwLock;
use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Heap entries kept past the live bookings before the heap is rebuilt.
const HEAP_SLACK: usize = 1_024;

/// One routed request's predicted blocks for one worker.
pub(super) struct Booking {
    /// Position of the first predicted block.
    pub start: usize,
    /// Prefix hashes of positions `start..start + len`.
    pub prefixes: Vec<u64>,
    /// Local hashes of the same positions (for confirming by Stored events).
    pub locals: Vec<u64>,
    pub expires_ms: u64,
}

impl Booking {
    pub fn end(&self) -> usize {
        self.start + self.prefixes.len()
    }
}

/// One worker's bookings.
#[derive(Default)]
pub(super) struct WorkerBook {
    pub bookings: FxHashMap<u64, Booking>,
    /// Prefix hash of every predicted position -> the booking predicting it that expires last.
    pub positions: FxHashMap<u64, u64>,
}

impl WorkerBook {
    /// Removes booking `id`'s entries from `positions`, and the booking; its length.
    fn remove(&mut self, id: u64) -> u64 {
        let Some(b) = self.bookings.remove(&id) else { return 0 };
        for p in &b.prefixes {
            if self.positions.get(p) == Some(&id) {
                self.positions.remove(p);
            }
        }
        b.prefixes.len() as u64
    }
}

#[derive(Default)]
pub(super) struct Book {
    pub workers: FxHashMap<WorkerId, WorkerBook>,
    /// (expiry, worker, booking), soonest first.
    heap: BinaryHeap<Reverse<(u64, WorkerId, u64)>>,
    next_id: u64,
    /// Live predicted blocks of this index.
    blocks: u64,
    bookings: u64,
}

/// Why a booking was refused; nothing changed.
#[derive(Debug, PartialEq, Eq)]
pub enum RoutedError {
    /// 404: the instance or rank is not in the index.
    NotFound(String),
    /// 503: the cap on predicted blocks is reached; `asked` blocks were refused.
    Full { asked: u64, message: String },
}

/// The predictions beside one (model, tenant) index.
pub struct Predictions {
    pub(super) limits: Arc<PredictLimits>,
    /// Live bookings; 0 means the query path reads nothing else.
    pub(super) live_bookings: AtomicU64,
    /// Earliest expiry in the heap (ms); `u64::MAX`: none.
    sweep_due_ms: AtomicU64,
    pub(super) book: RwLock<Book>,
}

impl Predictions {
    pub fn new(limits: Arc<PredictLimits>) -> Self {
        Predictions {
            limits,
            live_bookings: AtomicU64::new(0),
            sweep_due_ms: AtomicU64::new(u64::MAX),
            book: RwLock::new(Book::default()),
        }
    }

    /// No live booking (one relaxed load: what the hot paths check first).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.live_bookings.load(Ordering::Relaxed) == 0
    }

    /// Live predicted blocks of this index (expired ones until swept).
    pub fn blocks(&self) -> u64 {
        self.book.read().blocks
    }

    /// Books `locals[from..]` (a request's blocks past the `from` the
    /// worker holds on its device) for `worker` until `now_ms + ttl_ms`.
    /// Returns the blocks predicted: 0 when the worker holds them all.
    pub fn book(
        &self,
        worker: WorkerId,
        locals: &[u64],
        from: usize,
        ttl_ms: u64,
        now_ms: u64,
    ) -> Result<u64, RoutedError> {
        let n = locals.len();
        if from >= n {
            return Ok(0);
        }
        let mut prefixes = Vec::new();
        chains_into(locals, &mut prefixes);
        let expires_ms = now_ms.saturating_add(ttl_ms);
        let k = (n - from) as u64;
        let mut book = self.book.write();
        self.sweep_locked(&mut book, now_ms);
        if let Some(wb) = book.workers.get_mut(&worker) {
            if renew_covering(wb, &prefixes, from, expires_ms) {
                self.limits.count(&self.limits.counters.renewed, k);
                return Ok(k);
            }
        }
        if !self.limits.take(k) {
            // The caller counts the refusal, once.
            let (live, max) = (self.limits.live(), self.limits.max_blocks);
            let message = format!(
                "predictions are full: {live} of --predict-max-blocks {max} blocks are live and this booking \
                 needs {k} more; nothing was booked. Raise --predict-max-blocks or book with a shorter ttl_ms"
            );
            return Err(RoutedError::Full { asked: k, message });
        }
        let id = book.next_id;
        book.next_id += 1;
        let booking =
            Booking { start: from, prefixes: prefixes.split_off(from), locals: locals[from..].to_vec(), expires_ms };
        let wb = book.workers.entry(worker).or_default();
        for &p in &booking.prefixes {
            match wb.positions.entry(p) {
                Entry::Vacant(v) => {
                    v.insert(id);
                }
                Entry::Occupied(mut o) => {
                    if wb.bookings.get(o.get()).is_none_or(|other| other.expires_ms <= expires_ms) {
                        o.insert(id);
                    }
                }
            }
        }
        wb.bookings.insert(id, booking);
        book.heap.push(Reverse((expires_ms, worker, id)));
        book.blocks += k;
        book.bookings += 1;
        self.live_bookings.store(book.bookings, Ordering::Relaxed);
        self.sweep_due_ms.fetch_min(expires_ms, Ordering::Relaxed);
        self.limits.count(&self.limits.counters.made, k);
        Ok(k)
    }

    /// What an event applied to the index does to its worker's bookings:
    /// a Cleared drops them, a device-tier Stored confirms those its
    /// applied blocks continue. `outcome` is the index's for this event.
    pub fn on_event(&self, event: &Event, outcome: &ApplyOutcome, now_ms: u64) {
        if self.is_empty() {
            return;
        }
        match &event.kind {
            EventKind::Cleared => {
                self.drop_worker(event.worker);
            }
            EventKind::Stored { parent, blocks } if event.tier == StorageTier::Device => {
                // The index applies a prefix of an event's blocks (the rest are refused).
                let applied = ((outcome.stored + outcome.duplicate) as usize).min(blocks.len());
                if applied > 0 {
                    self.confirm(event.worker, &blocks[..applied], parent.is_none(), now_ms);
                }
            }
            _ => {}
        }
    }

    /// Confirms `worker`'s bookings whose next blocks `stored` continues
    /// (at position 0 when `at_root`); returns the blocks confirmed.
    pub fn confirm(&self, worker: WorkerId, stored: &[StoredBlock], at_root: bool, now_ms: u64) -> u64 {
        let due = now_ms >= self.sweep_due_ms.load(Ordering::Relaxed);
        if !due && !self.book.read().workers.contains_key(&worker) {
            return 0;
        }
        let mut book = self.book.write();
        self.sweep_locked(&mut book, now_ms);
        let Some(wb) = book.workers.get_mut(&worker) else { return 0 };
        // Each booking's next local, sorted, then one pass over the event.
        let mut firsts: Vec<(u64, u64)> = wb.bookings.iter().map(|(&id, b)| (b.locals[0], id)).collect();
        firsts.sort_unstable();
        let mut hits: Vec<(u64, usize)> = Vec::new();
        for (j, s) in stored.iter().enumerate() {
            let lo = firsts.partition_point(|&(l, _)| l < s.local_hash);
            for &(l, id) in &firsts[lo..] {
                if l != s.local_hash {
                    break;
                }
                if !hits.iter().any(|&(h, _)| h == id) {
                    hits.push((id, j));
                }
            }
        }
        let mut confirmed = 0u64;
        let mut emptied = 0u64;
        for (id, j) in hits {
            let Some(b) = wb.bookings.get_mut(&id) else { continue };
            if at_root && b.start != j {
                continue;
            }
            let k = stored[j..].iter().zip(&b.locals).take_while(|(s, &l)| s.local_hash == l).count();
            for p in b.prefixes.drain(..k) {
                if wb.positions.get(&p) == Some(&id) {
                    wb.positions.remove(&p);
                }
            }
            b.locals.drain(..k);
            b.start += k;
            confirmed += k as u64;
            if b.prefixes.is_empty() {
                wb.bookings.remove(&id);
                emptied += 1;
            } else if b.prefixes.capacity() > 2 * b.prefixes.len() {
                b.prefixes.shrink_to_fit();
                b.locals.shrink_to_fit();
            }
        }
        if wb.bookings.is_empty() {
            book.workers.remove(&worker);
        }
        self.forget(&mut book, confirmed, emptied, &self.limits.counters.confirmed);
        confirmed
    }

    /// Drops every booking of `worker`; returns the blocks dropped.
    pub fn drop_worker(&self, worker: WorkerId) -> u64 {
        if self.is_empty() {
            return 0;
        }
        let mut book = self.book.write();
        let Some(wb) = book.workers.remove(&worker) else { return 0 };
        let n: u64 = wb.bookings.values().map(|b| b.prefixes.len() as u64).sum();
        self.forget(&mut book, n, wb.bookings.len() as u64, &self.limits.counters.dropped);
        n
    }

    /// Removes the bookings whose time is up at `now_ms`.
    pub fn sweep(&self, now_ms: u64) {
        if now_ms >= self.sweep_due_ms.load(Ordering::Relaxed) {
            self.sweep_locked(&mut self.book.write(), now_ms);
        }
    }

    fn sweep_locked(&self, book: &mut Book, now_ms: u64) {
        if now_ms < self.sweep_due_ms.load(Ordering::Relaxed) {
            return;
        }
        let (mut expired, mut gone) = (0u64, 0u64);
        while let Some(&Reverse((at, worker, id))) = book.heap.peek() {
            if at > now_ms {
                break;
            }
            book.heap.pop();
            let Some(wb) = book.workers.get_mut(&worker) else { continue };
            let Some(b) = wb.bookings.get(&id) else { continue };
            if b.expires_ms > at {
                // Renewed since: wait for its new instant.
                book.heap.push(Reverse((b.expires_ms, worker, id)));
                continue;
            }
            expired += wb.remove(id);
            gone += 1;
            if wb.bookings.is_empty() {
                book.workers.remove(&worker);
            }
        }
        self.forget(book, expired, gone, &self.limits.counters.expired);
        if book.heap.len() > 2 * book.bookings as usize + HEAP_SLACK {
            // Entries of confirmed and dropped bookings: keep one per live booking.
            let live =
                book.workers.iter().flat_map(|(&w, wb)| wb.bookings.iter().map(move |(&id, b)| (b.expires_ms, w, id)));
            book.heap = live.map(Reverse).collect();
        }
        let due = book.heap.peek().map_or(u64::MAX, |Reverse((at, _, _))| *at);
        self.sweep_due_ms.store(due, Ordering::Relaxed);
    }

    /// Takes `blocks` of `bookings` gone from the totals and gives them back
    /// to the shared cap, counted in `counter`.
    fn forget(&self, book: &mut Book, blocks: u64, bookings: u64, counter: &AtomicU64) {
        book.blocks -= blocks;
        book.bookings -= bookings;
        self.live_bookings.store(book.bookings, Ordering::Relaxed);
        self.limits.release(blocks);
        self.limits.count(counter, blocks);
    }
}

/// Renews the booking of `wb` of exactly `prefixes[from..]` (same path,
/// same positions), if any: it expires at `expires_ms` at the earliest, and
/// takes its positions from bookings that expire sooner.
fn renew_covering(wb: &mut WorkerBook, prefixes: &[u64], from: usize, expires_ms: u64) -> bool {
    let n = prefixes.len();
    let Some(&id) = wb.positions.get(&prefixes[from]) else { return false };
    let WorkerBook { bookings, positions } = wb;
    let Some(b) = bookings.get_mut(&id) else { return false };
    if !(b.start == from && b.end() == n && b.prefixes[n - 1 - b.start] == prefixes[n - 1]) {
        return false;
    }
    if expires_ms <= b.expires_ms {
        return true;
    }
    b.expires_ms = expires_ms;
    let b = &bookings[&id];
    for p in &b.prefixes {
        match positions.get_mut(p) {
            Some(owner) if *owner != id => {
                if bookings.get(owner).is_none_or(|o| o.expires_ms < expires_ms) {
                    *owner = id;
                }
            }
            Some(_) => {}
            None => {
                positions.insert(*p, id);
            }
        }
    }
    true
}

impl Drop for Predictions {
    fn drop(&mut self) {
        // An index that goes takes its predictions along: room for the others.
        let blocks = self.book.get_mut().blocks;
        self.limits.release(blocks);
        self.limits.count(&self.limits.counters.dropped, blocks);
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;

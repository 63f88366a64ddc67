//! Connection slots: at most `--http-connections-max` connections are open
//! at once, one thread each. A connection holds a `Slot` for its whole
//! life; the slot is given back when dropped, so every way out of a
//! connection thread (a return, an error, a panic, a thread that could not
//! start) frees it, and no sequence of requests can use the slots up for good.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::conn::Socket;

/// Every slot of one server, and the open connections, so a stop can close them.
pub struct Slots {
    max: usize,
    open: AtomicUsize,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Box<dyn Socket>>>,
}

/// One open connection's slot; given back when dropped.
pub struct Slot {
    slots: Arc<Slots>,
    id: u64,
}

impl Slots {
    pub fn new(max: usize) -> Arc<Slots> {
        Arc::new(Slots { max, open: AtomicUsize::new(0), next_id: AtomicU64::new(0), conns: Mutex::default() })
    }

    /// A free slot, or None when `max` are taken.
    pub fn take(self: &Arc<Self>) -> Option<Slot> {
        if self.open.fetch_add(1, Ordering::SeqCst) >= self.max {
            self.open.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Slot { slots: Arc::clone(self), id: self.next_id.fetch_add(1, Ordering::Relaxed) })
    }

    /// Connections open now.
    #[cfg(test)]
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Shuts every open connection down (their threads then see the end).
    pub fn close_all(&self) {
        for (_, c) in self.conns.lock().drain() {
            c.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Slot {
    /// Keeps a handle to the slot's connection, for `close_all`.
    pub fn watch(&self, conn: Box<dyn Socket>) {
        self.slots.conns.lock().insert(self.id, conn);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.conns.lock().remove(&self.id);
        self.slots.open.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_comes_back_on_every_way_out_of_its_thread() {
        let slots = Slots::new(2);
        let (a, b) = (slots.take().unwrap(), slots.take().unwrap());
        assert!(slots.take().is_none(), "the cap holds");
        assert_eq!(slots.open(), 2);
        drop(a);
        assert_eq!(slots.open(), 1);
        let panicked = std::thread::spawn(move || {
            let _slot = b;
            panic!("a connection thread fails");
        })
        .join();
        assert!(panicked.is_err());
        assert_eq!(slots.open(), 0, "a panic gave its slot back");
        // A thread that never ran drops its closure, slot included.
        let c = slots.take().unwrap();
        drop(move || drop(c));
        assert_eq!(slots.open(), 0);
        assert!(slots.take().is_some());
    }
}

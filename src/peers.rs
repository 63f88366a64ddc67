//! The peers this daemon may recover its state from: the `--peers` list
//! and those added over `/register_peer`, bounded by `PEERS_MAX`. Only a
//! list: fetching a peer's `/dump` is `recovery`'s.

use parking_lot::Mutex;

/// Most peers a daemon keeps (from `--peers` and `/register_peer`).
pub const PEERS_MAX: usize = 256;

/// Peers known to this daemon (for recovery; they do not sync live).
#[derive(Default)]
pub struct Peers {
    list: Mutex<Vec<String>>,
}

/// What `Peers::add` did.
#[derive(Debug, PartialEq, Eq)]
pub enum PeerAdded {
    Added,
    AlreadyKnown,
    /// `PEERS_MAX` peers are known already; nothing changed.
    Full,
}

impl Peers {
    /// The peers from the command line (`config` keeps them within `PEERS_MAX`).
    pub fn new(mut initial: Vec<String>) -> Peers {
        initial.truncate(PEERS_MAX);
        Peers { list: Mutex::new(initial) }
    }

    /// Adds a peer, unless known or `PEERS_MAX` are.
    pub fn add(&self, url: String) -> PeerAdded {
        let mut l = self.list.lock();
        if l.contains(&url) {
            return PeerAdded::AlreadyKnown;
        }
        if l.len() >= PEERS_MAX {
            return PeerAdded::Full;
        }
        l.push(url);
        PeerAdded::Added
    }

    /// Removes a peer; false if unknown.
    pub fn remove(&self, url: &str) -> bool {
        let mut l = self.list.lock();
        let before = l.len();
        l.retain(|p| p != url);
        l.len() != before
    }

    pub fn list(&self) -> Vec<String> {
        self.list.lock().clone()
    }
}

//! Predicted depths for a query: per worker with bookings, the longest
//! prefix of the query whose every block is within the worker's device
//! depth (from the index's answer) or predicted for it.
//!
//! From the worker's device depth `d`, one probe of its `positions` finds
//! the booking that predicts the query's block `d` (its prefix hash names
//! the whole prefix, so a hit means the booking is on the query's path);
//! the booking's hashes are then compared in line until they or the query
//! end or differ, and the next booking is probed from there. The query's
//! prefix hashes are computed only as deep as that walk goes.

use super::store::Predictions;
use crate::event::WorkerId;
use crate::index::{Chains, Matches};
use std::cell::RefCell;

/// One worker's predicted depth, in blocks: more than its device depth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Predicted {
    pub worker: WorkerId,
    pub blocks: u32,
}

thread_local! {
    static PREFIXES: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    static DEVICE: RefCell<Vec<(WorkerId, u32)>> = const { RefCell::new(Vec::new()) };
}

impl Predictions {
    /// The workers whose predicted depth for the query (`locals`, answered
    /// by the index with `matches`) passes their device depth at `now_ms`.
    /// Empty, after one relaxed load, when this index has no booking.
    pub fn lookup(&self, matches: &Matches, locals: &[u64], now_ms: u64) -> Vec<Predicted> {
        if self.is_empty() || locals.is_empty() {
            return Vec::new();
        }
        PREFIXES.with(|p| {
            DEVICE.with(|d| match (p.try_borrow_mut(), d.try_borrow_mut()) {
                // A ring as long as the query: the walk of each worker
                // starts over from its own device depth.
                (Ok(mut p), Ok(mut d)) => self.walk(matches, Chains::new(locals, &mut p, locals.len()), &mut d, now_ms),
                _ => self.walk(matches, Chains::new(locals, &mut Vec::new(), locals.len()), &mut Vec::new(), now_ms),
            })
        })
    }

    fn walk(
        &self,
        matches: &Matches,
        mut q: Chains<'_>,
        device: &mut Vec<(WorkerId, u32)>,
        now_ms: u64,
    ) -> Vec<Predicted> {
        let n = q.len();
        // Device depths by worker, for one binary search per booked worker.
        device.clear();
        device.extend(matches.workers.iter().filter(|m| m.device > 0).map(|m| (m.worker, m.device)));
        device.sort_unstable_by_key(|&(w, _)| w);
        let book = self.book.read();
        let mut out = Vec::new();
        for (&worker, wb) in &book.workers {
            let device = device.binary_search_by_key(&worker, |&(w, _)| w).map_or(0, |i| device[i].1 as usize);
            let mut d = device.min(n);
            while d < n {
                let Some(b) = wb.positions.get(&q.at(d)).and_then(|id| wb.bookings.get(id)) else { break };
                // The owner of a position expires last of those predicting it.
                if b.expires_ms <= now_ms || d < b.start {
                    break;
                }
                let end = b.end().min(n);
                d += 1;
                while d < end && q.at(d) == b.prefixes[d - b.start] {
                    d += 1;
                }
            }
            if d > device {
                out.push(Predicted { worker, blocks: d as u32 });
            }
        }
        out.sort_unstable_by_key(|p| p.worker);
        out
    }
}

//! A `/routed` request to a booking: hash the request as a query would,
//! check that the worker belongs to the index, ask the index how deep a
//! prefix the worker already holds, and book the rest.

use super::request::{RoutedHashes, RoutedRequest};
use super::store::{Predictions, RoutedError};
use crate::event::WorkerId;
use crate::hash::{local_hashes_into, seed_for};
use crate::index::Index;

/// What a booking did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Booked {
    /// Blocks now predicted for the worker (0: it holds the whole request).
    pub predicted_blocks: u64,
    pub ttl_ms: u64,
}

/// Books `req` for its worker in `index`'s `predictions` at `now_ms`.
/// `registered` are the index's registered workers; a worker the index
/// holds blocks of (a rank its engine's batches named) counts too.
pub fn book(
    req: &RoutedRequest,
    index: &Index,
    registered: &[WorkerId],
    predictions: &Predictions,
    now_ms: u64,
) -> Result<Booked, RoutedError> {
    let worker = WorkerId::new(req.instance_id, req.dp_rank.unwrap_or(0));
    if !registered.contains(&worker) && !index.workers().contains(&worker) {
        let known = registered.iter().any(|w| w.instance_id == req.instance_id);
        return Err(RoutedError::NotFound(if known {
            format!("instance {} has no dp_rank {} in this index", req.instance_id, worker.dp_rank)
        } else {
            format!("instance {} is not registered for this model and tenant", req.instance_id)
        }));
    }
    let mut hashed = Vec::new();
    let locals: &[u64] = match &req.hashes {
        RoutedHashes::Locals(h) => h,
        RoutedHashes::Tokens(t) => {
            let seed = seed_for(req.lora_name.as_deref(), req.cache_salt.as_deref());
            local_hashes_into(t, index.block_size() as usize, seed, &mut hashed);
            &hashed
        }
    };
    let ttl_ms = req.ttl_ms.unwrap_or(predictions.limits.ttl_ms_default);
    let held = index.find_matches(locals).workers.iter().find(|m| m.worker == worker).map_or(0, |m| m.device);
    let predicted_blocks = predictions.book(worker, locals, held as usize, ttl_ms, now_ms)?;
    Ok(Booked { predicted_blocks, ttl_ms })
}

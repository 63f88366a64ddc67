//! Predicted placements: what a router says it has just sent to a worker,
//! kept beside each (model, tenant) index until the worker's own events
//! catch up or the booking's time runs out.
//!
//! Between routing a request and the worker's Stored events for it lie its
//! queueing and prefill. Meanwhile the index still says the worker lacks
//! those blocks, so a burst sharing a new prefix is scattered or herded
//! blindly. `POST /routed` books the request's blocks for the worker
//! (`routed`); queries then report, beside what the engines said, how deep
//! a prefix each worker holds *or is predicted to hold* (`lookup`).
//!
//! Rules:
//! - A booking is the request's blocks past the worker's device depth at
//!   booking time, keyed by the index's chain hashes of the request's
//!   local hashes (`index::chain`), with an expiry instant. Nothing inside the
//!   index changes: predictions never appear as `gpu`, `cpu`, `disk`,
//!   `scores`, in `/dump` or in snapshots.
//! - A worker's predicted depth for a query is the longest prefix whose
//!   every block is within its device depth or predicted for it (`lookup`).
//! - A device-tier Stored of the worker confirms a booking's next blocks
//!   when its blocks continue with them (the event's parent engine hash is
//!   opaque, so the link is taken on the chunks' content; an event starting
//!   at position 0 must start where the booking does); confirmed blocks
//!   leave the booking. A Cleared (also an engine restart or a resync) and
//!   removing the worker drop all its bookings (`store`).
//! - Expiry is lazy: no timer per entry. A read ignores an expired booking;
//!   writes (bookings, the index's events) and scrapes sweep what is due,
//!   in order of expiry, one heap entry per booking.
//! - Bounded: live predicted blocks of every index together never pass
//!   `--predict-max-blocks` (`limits`); a booking that would is refused
//!   whole and counted. A request booked again for a worker that has a
//!   booking of exactly its blocks renews that booking instead of adding blocks.
//! - An index without a live booking costs a query one relaxed atomic load.
//!
//! Files: `limits` (the shared cap, TTLs and
//! counters, the clock), `store` (bookings per worker: book, confirm,
//! drop, sweep), `lookup` (predicted depths for a query), `request` (the
//! `/routed` body), `routed` (a request to a booking).

mod limits;
mod lookup;
mod request;
mod routed;
mod store;

pub use limits::{now_ms, PredictCounters, PredictLimits, MAX_BLOCKS_DEFAULT, TTL_MS_DEFAULT, TTL_MS_MAX};
pub use lookup::Predicted;
pub use request::{parse_routed, RoutedHashes, RoutedRequest, ROUTED_BODY_BYTES_MAX};
pub use routed::{book, Booked};
pub use store::{Predictions, RoutedError};

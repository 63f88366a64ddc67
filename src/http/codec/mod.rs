//! JSON request parsing and response writing for the HTTP API.
//!
//! Why it exists: a `/query` of 800 blocks carries 12,800 token ids, and
//! parsing them through serde, then building the response through maps,
//! costs more CPU than the index lookup itself. The two hot bodies, `/query`
//! and `/query_by_hash`, are read by a small strict scanner (`scan`) that
//! walks the top-level object once, decodes only the fields it knows and
//! appends the ids straight into a caller's reusable buffer (token arrays
//! of the usual shape through a mask-driven fast path, `fast`): 40 us for
//! the 800-block body against 173 us for the leanest serde derive
//! (borrowed strings; `cargo bench --bench http_codec`). Every other body
//! is cold and goes through serde derive (`control`). Responses are written
//! straight into a caller's `Vec<u8>` (`response`, `workers`, with
//! `crate::json`'s primitives). The `/dump` format is `crate::dump`'s.
//!
//! Files: `scan` (JSON grammar), `fast` (token arrays), `problems` (error
//! classes), `query` and `control` (request bodies), `response` and
//! `workers` (replies). Address syntax is checked by `crate::endpoint`.
//!
//! Rules every parser here follows:
//! - The body must be one well-formed JSON value (RFC 8259, UTF-8, no
//!   trailing bytes but whitespace, nesting at most [`NESTING_DEPTH_MAX`]);
//!   otherwise [`BodyError::Malformed`] (HTTP 400). Numbers too large for
//!   an f64 count as malformed, as in serde_json.
//! - Well-formed JSON with a missing field, a field of the wrong type or a
//!   known field given twice: [`BodyError::Unprocessable`] (HTTP 422).
//!   Duplicate known keys are refused rather than resolved (last-wins would
//!   let two layers of a proxy disagree on what was asked); unknown keys are
//!   skipped whatever their type, repeated or not.
//! - Well-formed and well-typed but an invalid value (an endpoint that is
//!   not `tcp://host:port`, `block_size` 0, two spellings of one field that
//!   disagree): [`BodyError::Invalid`] (HTTP 400).
//! - When a body has several problems, the class is decided in that order
//!   (malformed, then unprocessable, then invalid) so it never depends on
//!   field order; the message names the first problem of that class.
//! - `null` for an optional field means absent.
//! - Nothing panics on any input; every loop is bounded by the body length.
//!
//! Writers append to `out` and never clear it.

mod control;
mod fast;
mod problems;
mod query;
mod response;
mod scan;
mod workers;

pub use crate::endpoint::{validate_peer_url, validate_zmq_endpoint};
pub(crate) use crate::json::out::push_str;
pub use crate::json::BodyError;
pub use control::{parse_peer, parse_register, parse_unregister, PeerRequest, RegisterRequest, UnregisterRequest};
pub use query::{parse_query, parse_query_by_hash, QueryRequest};
pub use response::{write_error, write_query_response, write_query_response_predicted, write_status_ok};
pub use workers::{aggregate_status, write_peers, write_workers, WorkerInfo, WorkerListener};

/// Deepest nesting of arrays and objects accepted in a body; the top-level
/// object is level 1. Equal to serde_json's limit, so both agree on what is
/// well-formed.
pub const NESTING_DEPTH_MAX: usize = 127;

/// Largest `/query` or `/query_by_hash` body accepted (Dynamo's limit: about
/// a million tokens as JSON text). The server should refuse a longer body
/// with 413 before reading it; the parsers refuse it too.
pub const QUERY_BODY_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Largest body accepted by the small control endpoints (register,
/// unregister, peers).
pub const CONTROL_BODY_BYTES_MAX: usize = 64 * 1024;

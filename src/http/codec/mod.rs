//! JSON request parsing and response writing for the HTTP API.
//!
//! Why it exists: a `/query` of 800 blocks carries 12,800 token ids, and
//! parsing them through serde, then building the response through maps,
//! costs more CPU than the index lookup itself. So the ids of the two hot
//! bodies, `/query` and `/query_by_hash`, go straight into a caller's
//! reusable buffer through one small scanner (`ids`, token arrays of the
//! usual shape converted several at a time), while everything else in those
//! bodies (keys, names, unknown members, odd elements) is read by serde_json
//! one value at a time (`json`, `query`). `cargo bench --bench http_codec`
//! measures it against a typed serde parse, with and without a raw value
//! for the token list. Every other body is cold and goes through serde
//! derive (`control`). Responses are written straight into a caller's
//! `Vec<u8>` (`response`, with `crate::json`'s primitives). The `/dump`
//! format is `crate::dump`'s; address syntax is `crate::endpoint`'s.
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
#[cfg(test)]
mod fuzz_tests;
mod ids;
mod json;
mod query;
mod response;

use crate::json::check_size;
pub use crate::json::BodyError;
pub(crate) use control::{parse_peer, parse_register, parse_unregister};
pub use query::{parse_query, parse_query_by_hash, QueryRequest};
pub use response::{write_error, write_query_response};

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

/// Merges two spellings of one field: both given must agree, else Invalid
/// with `why(first, second)`.
fn merge<T: AsRef<str>>(
    first: Option<T>,
    second: Option<T>,
    why: impl FnOnce(&str, &str) -> String,
) -> Result<Option<T>, BodyError> {
    match (&first, &second) {
        (Some(a), Some(b)) if a.as_ref() != b.as_ref() => Err(BodyError::Invalid(why(a.as_ref(), b.as_ref()))),
        _ => Ok(first.or(second)),
    }
}

/// Merges the two spellings of the tenant.
fn tenant<T: AsRef<str>>(tenant_id: Option<T>, routing_group: Option<T>) -> Result<Option<T>, BodyError> {
    merge(tenant_id, routing_group, |t, g| {
        format!("`tenant_id` ({t:?}) and `routing_group` ({g:?}) name the same field and disagree; send one")
    })
}

//! `/query` and `/query_by_hash` bodies: the hot path.
//!
//! One walk over the body (`json`): the id array goes straight into the
//! caller's reusable buffer (`ids`), names borrow from the body. Field
//! rules follow Dynamo's request structs: `model_name` and the id array are
//! required; the tenant may be spelled `tenant_id` or `routing_group` (if
//! both are given they must agree); `lora_name` and `cache_salt` are
//! optional strings. `/query_by_hash` refuses a non-null `cache_salt` (400,
//! as Dynamo does: the hashes must already include it) and ignores
//! `lora_name`. `include_unmatched` (ours; a boolean, default false) asks
//! for every registered worker in the answer, with zeros where nothing
//! matched.

use super::ids::{read_ids, Id};
use super::json::{Json, Walk};
use super::{check_size, tenant, BodyError, QUERY_BODY_BYTES_MAX};
use std::borrow::Cow;

/// The names of a `/query` or `/query_by_hash` request; the ids go to the
/// caller's buffer. A `tenant_id` of None means the default tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryRequest<'a> {
    pub model_name: Cow<'a, str>,
    pub tenant_id: Option<Cow<'a, str>>,
    /// Always None for `/query_by_hash`.
    pub lora_name: Option<Cow<'a, str>>,
    /// Always None for `/query_by_hash`.
    pub cache_salt: Option<Cow<'a, str>>,
    /// List registered workers that matched nothing too (with zeros).
    pub include_unmatched: bool,
}

/// Parses a `/query` body. `token_ids` (each an integer in 0..=u32::MAX;
/// anything else is 422) are appended to `tokens`, which is cleared first
/// and holds no meaningful content if an error is returned.
pub fn parse_query<'a>(body: &'a [u8], tokens: &mut Vec<u32>) -> Result<QueryRequest<'a>, BodyError> {
    parse(body, tokens)
}

/// Parses a `/query_by_hash` body. `block_hashes` (each an integer in
/// [-2^63, 2^64); negatives are taken as two's complement) are appended to
/// `hashes`, which is cleared first.
pub fn parse_query_by_hash<'a>(body: &'a [u8], hashes: &mut Vec<u64>) -> Result<QueryRequest<'a>, BodyError> {
    parse(body, hashes)
}

/// The known fields, in the order of their bits in `seen`.
const FIELDS: [&str; 7] =
    ["model_name", "tenant_id", "routing_group", "lora_name", "cache_salt", "include_unmatched", "ids"];

/// Keeps the first problem found.
fn keep(first: &mut Option<String>, problem: impl FnOnce() -> String) {
    first.get_or_insert_with(problem);
}

fn parse<'a, T: Id>(body: &'a [u8], ids: &mut Vec<T>) -> Result<QueryRequest<'a>, BodyError> {
    ids.clear();
    check_size(body, QUERY_BODY_BYTES_MAX)?;
    let by_hash = T::FIELD == "block_hashes";
    // Type problems are kept, the first one reported, once the whole body
    // was read without a syntax error (which outranks them).
    let mut p: Option<String> = None;
    let mut seen = 0u32;
    let mut names: [Option<Cow<'a, str>>; 5] = Default::default();
    let mut include_unmatched = false;
    let mut walk = Walk { b: body, i: 0 };
    let object = walk
        .object(|w, key| {
            let field = match FIELDS.iter().position(|f| *f == key) {
                _ if key == T::FIELD => 6,
                Some(3) if by_hash => return w.value::<2>().map(drop),
                Some(f) if f < 6 => f,
                _ => return w.value::<2>().map(drop),
            };
            if seen & 1 << field != 0 {
                keep(&mut p, || format!("duplicate field `{key}`"));
                return w.value::<2>().map(drop);
            }
            seen |= 1 << field;
            if field == 6 {
                if w.peek() == Some(b'[') {
                    if let Err(m) = read_ids(w, ids)? {
                        keep(&mut p, || m);
                    }
                } else {
                    let found = w.value::<2>()?.kind();
                    keep(&mut p, || format!("`{key}` must be an array of {}, found {found}", T::RANGE));
                }
                return Ok(());
            }
            match (field, w.value::<2>()?) {
                (0..=4, Json::Str(s)) => names[field] = Some(s),
                (1..=4, Json::Null) => {}
                (5, Json::Bool(b)) => include_unmatched = b,
                (5, Json::Null) => {}
                (0, v) => keep(&mut p, || format!("`model_name` must be a string, found {}", v.kind())),
                (5, v) => keep(&mut p, || format!("`{key}` must be a boolean or null, found {}", v.kind())),
                (_, v) => keep(&mut p, || format!("`{key}` must be a string or null, found {}", v.kind())),
            }
            Ok(())
        })
        .map_err(BodyError::Malformed)?;
    let [model_name, tenant_id, routing_group, lora_name, mut cache_salt] = names;
    if !object {
        keep(&mut p, || format!("the body must be a JSON object ({}, model_name, ...)", T::FIELD));
    }
    if seen & 1 << 6 == 0 {
        keep(&mut p, || format!("missing field `{}` (an array of integers)", T::FIELD));
    }
    if seen & 1 == 0 {
        keep(&mut p, || "missing field `model_name` (a string)".to_string());
    }
    // A missing or mistyped model_name was recorded above.
    let (None, Some(model_name)) = (&p, model_name) else {
        return Err(BodyError::Unprocessable(p.unwrap_or_default()));
    };
    if by_hash && cache_salt.take().is_some() {
        return Err(BodyError::Invalid(
            "cache_salt is not accepted by /query_by_hash; block_hashes must already include the intended cache salt"
                .to_string(),
        ));
    }
    let tenant_id = tenant(tenant_id, routing_group)?;
    Ok(QueryRequest { model_name, tenant_id, lora_name, cache_salt, include_unmatched })
}

#[cfg(test)]
#[path = "query_tests.rs"]
mod tests;

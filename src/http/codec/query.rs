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
mod tests {
    use super::*;

    fn q(body: &str) -> Result<(QueryRequest<'_>, Vec<u32>), BodyError> {
        let mut t = vec![99];
        parse_query(body.as_bytes(), &mut t).map(|r| (r, t))
    }

    fn h(body: &str) -> Result<(QueryRequest<'_>, Vec<u64>), BodyError> {
        let mut t = vec![99];
        parse_query_by_hash(body.as_bytes(), &mut t).map(|r| (r, t))
    }

    fn class(r: Result<impl Sized, BodyError>) -> &'static str {
        match r {
            Ok(_) => "ok",
            Err(BodyError::Malformed(_)) => "malformed",
            Err(BodyError::Invalid(_)) => "invalid",
            Err(BodyError::Unprocessable(_)) => "unprocessable",
            Err(BodyError::TooLarge(_)) => "too large",
        }
    }

    #[test]
    fn parses_a_full_query() {
        let (r, t) = q(r#" {"token_ids": [1, 2 ,3,4294967295], "model_name": "m\u00e9",
            "tenant_id": "acme", "lora_name": "ad", "cache_salt": null, "extra": {"a": [1, "}"]}} "#)
        .unwrap();
        assert_eq!(t, vec![1, 2, 3, u32::MAX]);
        assert_eq!(r.model_name, "m\u{e9}");
        assert_eq!(r.tenant_id.as_deref(), Some("acme"));
        assert_eq!(r.lora_name.as_deref(), Some("ad"));
        assert_eq!(r.cache_salt, None);
    }

    #[test]
    fn names_borrow_from_the_body_unless_escaped() {
        let (r, _) = q(r#"{"token_ids":[],"model_name":"plain","routing_group":"g\"x"}"#).unwrap();
        assert!(matches!(r.model_name, Cow::Borrowed("plain")));
        assert!(matches!(r.tenant_id, Some(Cow::Owned(ref s)) if s == "g\"x"));
    }

    #[test]
    fn include_unmatched_is_an_optional_boolean() {
        let (r, _) = q(r#"{"token_ids":[],"model_name":"m"}"#).unwrap();
        assert!(!r.include_unmatched);
        let (r, _) = q(r#"{"token_ids":[],"model_name":"m","include_unmatched":true}"#).unwrap();
        assert!(r.include_unmatched);
        let (r, _) = h(r#"{"block_hashes":[],"model_name":"m","include_unmatched":null}"#).unwrap();
        assert!(!r.include_unmatched);
        for bad in ["1", "\"true\"", "[]"] {
            let body = format!(r#"{{"token_ids":[],"model_name":"m","include_unmatched":{bad}}}"#);
            assert_eq!(class(q(&body)), "unprocessable", "{bad}");
        }
        assert_eq!(class(q(r#"{"token_ids":[],"model_name":"m","include_unmatched":tru}"#)), "malformed");
    }

    #[test]
    fn tenant_spellings() {
        let (r, _) = q(r#"{"token_ids":[],"model_name":"m","routing_group":"g"}"#).unwrap();
        assert_eq!(r.tenant_id.as_deref(), Some("g"));
        let (r, _) = q(r#"{"token_ids":[],"model_name":"m","routing_group":"g","tenant_id":"g"}"#).unwrap();
        assert_eq!(r.tenant_id.as_deref(), Some("g"));
        let (r, _) = q(r#"{"token_ids":[],"model_name":"m","tenant_id":null}"#).unwrap();
        assert_eq!(r.tenant_id, None);
        assert_eq!(class(q(r#"{"token_ids":[],"model_name":"m","routing_group":"g","tenant_id":"h"}"#)), "invalid");
    }

    #[test]
    fn token_values_out_of_u32_are_unprocessable() {
        for bad in ["-1", "4294967296", "1.0", "1e2", "-0", "\"1\"", "null", "[1]", "true"] {
            let body = format!(r#"{{"token_ids":[1,{bad},3],"model_name":"m"}}"#);
            let err = q(&body).unwrap_err();
            assert_eq!(err.status(), 422, "{bad}: {err}");
            assert!(err.message().contains("token_ids[1]"), "{}", err.message());
        }
        let err = q(r#"{"token_ids":{"a":1},"model_name":"m"}"#).unwrap_err();
        assert_eq!(err.status(), 422);
        assert!(err.message().contains("an object"), "{}", err.message());
    }

    #[test]
    fn missing_duplicate_and_mistyped_fields_are_unprocessable() {
        for body in [
            r#"{"model_name":"m"}"#,
            r#"{"token_ids":[]}"#,
            r#"{"token_ids":[],"model_name":5}"#,
            r#"{"token_ids":[],"model_name":null}"#,
            r#"{"token_ids":[],"model_name":"m","lora_name":1}"#,
            r#"{"token_ids":[],"model_name":"m","tenant_id":[]}"#,
            r#"{"token_ids":[],"model_name":"m","model_name":"m"}"#,
            r#"{"token_ids":[],"token_ids":[],"model_name":"m"}"#,
            r#"{"token_ids":[],"model_name":"m","tenant_id":"a","tenant_id":"a"}"#,
            r#"[1,2]"#,
            r#""text""#,
            r#"{}"#,
        ] {
            assert_eq!(class(q(body)), "unprocessable", "{body}");
        }
        let err = q(r#"{"token_ids":[]}"#).unwrap_err();
        assert!(err.message().contains("model_name"), "{}", err.message());
    }

    #[test]
    fn unknown_fields_may_repeat_and_hold_anything() {
        let (_, t) =
            q(r#"{"x":1,"x":[{"y":"\\\""}],"block_hashes":"no","token_ids":[7],"model_name":"m","x":null}"#).unwrap();
        assert_eq!(t, vec![7]);
    }

    #[test]
    fn syntax_errors_are_malformed_even_after_a_type_error() {
        for body in [
            "",
            " ",
            "{",
            r#"{"token_ids":[1,2],"model_name":"m"} x"#,
            r#"{"token_ids":[1,2,],"model_name":"m"}"#,
            r#"{"token_ids":[01],"model_name":"m"}"#,
            r#"{"token_ids":[1],"model_name":"m",}"#,
            r#"{"token_ids":[-1],"model_name":"m","x":tru}"#,
            r#"{"token_ids":[1],"model_name":"m","x":1e400}"#,
            r#"{'token_ids':[1],"model_name":"m"}"#,
            "{\"token_ids\":[1],\"model_name\":\"\u{1}\"}",
        ] {
            assert_eq!(class(q(body)), "malformed", "{body:?}");
        }
        let err = q(r#"{"token_ids":[1,2,],"model_name":"m"}"#).unwrap_err();
        assert_eq!(err.status(), 400);
        assert!(err.message().contains("byte 18"), "{}", err.message());
    }

    #[test]
    fn nesting_is_bounded_like_serde_json() {
        let ok = format!(r#"{{"x":{}{},"token_ids":[],"model_name":"m"}}"#, "[".repeat(126), "]".repeat(126));
        assert_eq!(class(q(&ok)), "ok");
        assert!(serde_json::from_str::<serde_json::Value>(&ok).is_ok());
        let deep = format!(r#"{{"x":{}{},"token_ids":[],"model_name":"m"}}"#, "[".repeat(127), "]".repeat(127));
        assert_eq!(class(q(&deep)), "malformed");
        assert!(serde_json::from_str::<serde_json::Value>(&deep).is_err());
        // Far deeper than any stack would survive without the bound.
        let abyss = format!(r#"{{"x":{}"#, "[".repeat(1_000_000));
        assert_eq!(class(q(&abyss)), "malformed");
    }

    #[test]
    fn hashes_take_the_full_signed_and_unsigned_range() {
        let (r, v) = h(r#"{"block_hashes":[0,-1,18446744073709551615,-9223372036854775808,9223372036854775807],"model_name":"m","lora_name":5}"#)
            .unwrap();
        assert_eq!(v, vec![0, u64::MAX, u64::MAX, 1 << 63, (1 << 63) - 1]);
        assert_eq!(r.lora_name, None);
        for bad in ["18446744073709551616", "-9223372036854775809", "1.5", "-0"] {
            let body = format!(r#"{{"block_hashes":[{bad}],"model_name":"m"}}"#);
            assert_eq!(class(h(&body)), "unprocessable", "{bad}");
        }
    }

    #[test]
    fn query_by_hash_refuses_a_cache_salt() {
        assert_eq!(class(h(r#"{"block_hashes":[1],"model_name":"m","cache_salt":"s"}"#)), "invalid");
        assert_eq!(class(h(r#"{"block_hashes":[1],"model_name":"m","cache_salt":null}"#)), "ok");
        assert_eq!(class(h(r#"{"block_hashes":[1],"model_name":"m","cache_salt":3}"#)), "unprocessable");
        // Type errors outrank invalid values whatever the field order.
        assert_eq!(class(h(r#"{"cache_salt":"s","block_hashes":[1],"model_name":7}"#)), "unprocessable");
    }

    #[test]
    fn long_numbers_cross_the_eight_byte_chunks() {
        let ids: Vec<u32> = (0..200u32).map(|i| i.wrapping_mul(2654435761) >> (i % 32)).collect();
        let text: Vec<String> = ids.iter().map(|v| v.to_string()).collect();
        let body = format!(r#"{{"model_name":"m","token_ids":[{}]}}"#, text.join(","));
        assert_eq!(q(&body).unwrap().1, ids);
        // A number at the very end of the body, with fewer than 8 bytes left.
        let mut t = Vec::new();
        assert!(parse_query(br#"{"model_name":"m","token_ids":[12345]}"#, &mut t).is_ok());
        assert_eq!(t, vec![12345]);
    }

    #[test]
    fn oversized_bodies_are_refused() {
        let body = vec![b' '; QUERY_BODY_BYTES_MAX + 1];
        let mut t = Vec::new();
        assert_eq!(parse_query(&body, &mut t).err().map(|e| e.status()), Some(413));
    }
}

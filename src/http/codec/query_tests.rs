//! Unit tests of the `/query` and `/query_by_hash` body parsers.

use super::*;

fn q(body: &str) -> Result<(QueryRequest<'_>, Vec<u32>), BodyError> {
    let mut t = vec![99];
    parse_query(body.as_bytes(), &mut t).map(|r| (r, t))
}

fn h(body: &str) -> Result<(QueryRequest<'_>, Vec<u64>), BodyError> {
    let mut t = vec![99];
    parse_query_by_hash(body.as_bytes(), &mut t).map(|r| (r, t))
}

use crate::json::class;

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

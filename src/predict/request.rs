//! The `/routed` body: which tokens (or local block hashes) a router sent
//! to which worker, and for how long to predict them there.
//!
//! `{"model_name", "tenant_id"? (or "routing_group"), "token_ids" |
//! "block_hashes", "lora_name"?, "cache_salt"?, "instance_id",
//! "dp_rank"?, "ttl_ms"?}`. Read through serde derive, with the API's
//! classes of refusal: not well-formed JSON 400; a missing, duplicated or
//! mistyped field, or both or neither of `token_ids` and `block_hashes`,
//! 422; a `ttl_ms` of 0 or past `TTL_MS_MAX`, or two tenant spellings
//! that disagree, 400. `null` means absent; unknown fields are skipped.

use super::limits::TTL_MS_MAX;
use crate::hash::JsonHash;
use crate::json::{check_size, BodyError};
use serde::de::IgnoredAny;
use serde::Deserialize;

/// Largest `/routed` body: as large as a `/query` body may be.
pub const ROUTED_BODY_BYTES_MAX: usize = 8 * 1024 * 1024;

/// The request's blocks, as the router gave them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoutedHashes {
    /// Token ids, hashed with the index's block size and the LoRA and salt seed.
    Tokens(Vec<u32>),
    /// Local block hashes, as `/query_by_hash` takes them.
    Locals(Vec<u64>),
}

/// A checked `/routed` request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutedRequest {
    pub model_name: String,
    /// None: the default tenant.
    pub tenant_id: Option<String>,
    pub hashes: RoutedHashes,
    pub lora_name: Option<String>,
    pub cache_salt: Option<String>,
    pub instance_id: u64,
    /// None: rank 0.
    pub dp_rank: Option<u32>,
    /// In 1..=TTL_MS_MAX; None: `--predict-ttl-ms`.
    pub ttl_ms: Option<u64>,
}

#[derive(Deserialize)]
struct RoutedBody {
    model_name: String,
    tenant_id: Option<String>,
    routing_group: Option<String>,
    token_ids: Option<Vec<u32>>,
    block_hashes: Option<Vec<JsonHash>>,
    lora_name: Option<String>,
    cache_salt: Option<String>,
    instance_id: u64,
    dp_rank: Option<u32>,
    ttl_ms: Option<u64>,
}

/// Parses and checks a `/routed` body (see the module doc for the classes).
pub fn parse_routed(body: &[u8]) -> Result<RoutedRequest, BodyError> {
    check_size(body, ROUTED_BODY_BYTES_MAX)?;
    let text = std::str::from_utf8(body).map_err(|e| BodyError::Malformed(format!("the body is not UTF-8: {e}")))?;
    // Syntax first, so a type error early never hides malformed JSON later.
    serde_json::from_str::<IgnoredAny>(text).map_err(|e| BodyError::Malformed(e.to_string()))?;
    if !text.trim_start().starts_with('{') {
        return Err(BodyError::Unprocessable(
            "the body must be a JSON object (model_name, token_ids or block_hashes, instance_id, ...)".into(),
        ));
    }
    let b: RoutedBody = serde_json::from_str(text).map_err(|e| BodyError::Unprocessable(e.to_string()))?;
    let hashes = match (b.token_ids, b.block_hashes) {
        (Some(t), None) => RoutedHashes::Tokens(t),
        (None, Some(h)) => RoutedHashes::Locals(h.into_iter().map(|h| h.0).collect()),
        (Some(_), Some(_)) => {
            return Err(BodyError::Unprocessable("give `token_ids` or `block_hashes`, not both".into()))
        }
        (None, None) => return Err(BodyError::Unprocessable("missing field `token_ids` (or `block_hashes`)".into())),
    };
    let tenant_id = match (b.tenant_id, b.routing_group) {
        (Some(t), Some(g)) if t != g => {
            return Err(BodyError::Invalid(format!("`tenant_id` {t:?} and `routing_group` {g:?} disagree; give one")))
        }
        (t, g) => t.or(g),
    };
    if let Some(ttl) = b.ttl_ms.filter(|t| !(1..=TTL_MS_MAX).contains(t)) {
        return Err(BodyError::Invalid(format!("`ttl_ms` is {ttl}; it must be in 1..={TTL_MS_MAX}")));
    }
    Ok(RoutedRequest {
        model_name: b.model_name,
        tenant_id,
        hashes,
        lora_name: b.lora_name,
        cache_salt: b.cache_salt,
        instance_id: b.instance_id,
        dp_rank: b.dp_rank,
        ttl_ms: b.ttl_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(body: &str) -> u16 {
        parse_routed(body.as_bytes()).map_or_else(|e| e.status(), |_| 200)
    }

    #[test]
    fn a_full_body_and_a_minimal_one() {
        let r = parse_routed(
            br#"{"model_name":"m","routing_group":"t","token_ids":[1,2],"lora_name":"a","cache_salt":null,
                 "instance_id":3,"dp_rank":1,"ttl_ms":500,"extra":[{}]}"#,
        )
        .unwrap();
        assert_eq!(
            r,
            RoutedRequest {
                model_name: "m".into(),
                tenant_id: Some("t".into()),
                hashes: RoutedHashes::Tokens(vec![1, 2]),
                lora_name: Some("a".into()),
                cache_salt: None,
                instance_id: 3,
                dp_rank: Some(1),
                ttl_ms: Some(500),
            }
        );
        let r = parse_routed(br#"{"model_name":"m","block_hashes":[-1, 18446744073709551615, 0],"instance_id":0}"#)
            .unwrap();
        assert_eq!(r.hashes, RoutedHashes::Locals(vec![u64::MAX, u64::MAX, 0]));
        assert_eq!((r.tenant_id, r.dp_rank, r.ttl_ms), (None, None, None));
    }

    #[test]
    fn each_class_of_refusal() {
        let ok = r#""model_name":"m","instance_id":1"#;
        for (body, want) in [
            (format!("{{{ok},\"token_ids\":[1]"), 400),
            (format!("{{{ok},\"token_ids\":[1]}} x"), 400),
            ("[1]".to_string(), 422),
            (format!("{{{ok}}}"), 422),
            (format!("{{{ok},\"token_ids\":[1],\"block_hashes\":[1]}}"), 422),
            (r#"{"model_name":"m","token_ids":[1]}"#.to_string(), 422),
            (format!("{{{ok},\"token_ids\":[\"a\"]}}"), 422),
            (format!("{{{ok},\"token_ids\":[-1]}}"), 422),
            (format!("{{{ok},\"block_hashes\":[1.5]}}"), 422),
            (format!("{{{ok},\"token_ids\":[1],\"ttl_ms\":-5}}"), 422),
            (format!("{{{ok},\"token_ids\":[1],\"ttl_ms\":\"5\"}}"), 422),
            (format!("{{{ok},\"token_ids\":[1],\"instance_id\":2}}"), 422),
            (format!("{{{ok},\"token_ids\":[1],\"ttl_ms\":0}}"), 400),
            (format!("{{{ok},\"token_ids\":[1],\"ttl_ms\":{}}}", TTL_MS_MAX + 1), 400),
            (format!("{{{ok},\"token_ids\":[1],\"tenant_id\":\"a\",\"routing_group\":\"b\"}}"), 400),
            (format!("{{{ok},\"token_ids\":[1],\"ttl_ms\":{TTL_MS_MAX}}}"), 200),
            (format!("{{{ok},\"token_ids\":[1],\"tenant_id\":\"a\",\"routing_group\":\"a\"}}"), 200),
        ] {
            assert_eq!(status(&body), want, "{body}");
        }
        assert_eq!(status(&format!("{{\"pad\":\"{}\"}}", "x".repeat(ROUTED_BODY_BYTES_MAX))), 413);
    }
}

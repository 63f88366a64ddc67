//! Bodies of the control endpoints: `/register`, `/unregister`,
//! `/register_peer` and `/deregister_peer`.
//!
//! Cold paths, so read through serde derive, which refuses a known field
//! given twice, skips unknown ones and reads `null` as absent. The classes
//! of `codec`'s rules hold: the whole body is checked for syntax first, so
//! a type error early never hides malformed JSON later (400), then read
//! into its type (422), then its values are checked for sense (400:
//! endpoints, sizes, lengths, two spellings that disagree), so the registry
//! only ever sees requests it can act on. Field names and optionality
//! follow Dynamo's request structs.

use super::{check_size, merge, tenant, BodyError, CONTROL_BODY_BYTES_MAX};
use crate::endpoint::{validate_peer_url, validate_zmq_endpoint};
use crate::ingest::BLOCK_SIZE_MAX;
use crate::registry::{RegisterArgs, NAME_BYTES_MAX, TENANT_DEFAULT};
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// `POST /register`: one (instance, dp_rank) listener. Both spellings of
/// the tenant (`tenant_id`, `routing_group`) and of the salt
/// (`additional_salt`, `additionalsalt`, checked but not used) are read as
/// fields of their own, so that two that agree are accepted.
#[derive(Deserialize)]
struct RegisterRequest {
    instance_id: u64,
    endpoint: String,
    model_name: String,
    block_size: u32,
    tenant_id: Option<String>,
    dp_rank: Option<u32>,
    replay_endpoint: Option<String>,
    additional_salt: Option<String>,
    routing_group: Option<String>,
    additionalsalt: Option<String>,
}

/// `POST /unregister`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct UnregisterRequest {
    pub instance_id: u64,
    pub model_name: String,
    /// Also accepted as `routing_group`. None: every tenant.
    pub tenant_id: Option<String>,
    /// None: every rank.
    pub dp_rank: Option<u32>,
    routing_group: Option<String>,
}

/// `POST /register_peer` and `POST /deregister_peer`.
#[derive(Deserialize)]
struct PeerRequest {
    url: String,
}

/// Reads a control body into `T`, syntax first (see the module doc);
/// `what` names the fields expected when the body is not an object.
fn read<T: DeserializeOwned>(body: &[u8], what: &str) -> Result<T, BodyError> {
    check_size(body, CONTROL_BODY_BYTES_MAX)?;
    super::json::check(body).map_err(BodyError::Malformed)?;
    // A derived struct also reads a JSON array, positionally; only objects are bodies.
    if !body.trim_ascii_start().starts_with(b"{") {
        return Err(BodyError::Unprocessable(format!("the body must be a JSON object ({what})")));
    }
    serde_json::from_slice(body).map_err(|e| BodyError::Unprocessable(e.to_string()))
}

/// Parses a `/register` body into what the registry takes: the endpoints
/// validated (`tcp://host:port` or `ipc://path`), `block_size` in
/// 1..=`ingest::BLOCK_SIZE_MAX`, names at most `NAME_BYTES_MAX` bytes (else
/// Invalid, 400); no tenant is the default tenant, no rank rank 0.
pub fn parse_register(body: &[u8]) -> Result<RegisterArgs, BodyError> {
    let r: RegisterRequest = read(body, "instance_id, endpoint, model_name, block_size, ...")?;
    let invalid = |m| Err(BodyError::Invalid(m));
    if let Err(m) = validate_zmq_endpoint(&r.endpoint) {
        return invalid(m);
    }
    if let Some(Err(m)) = r.replay_endpoint.as_deref().map(validate_zmq_endpoint) {
        return invalid(format!("`replay_endpoint`: {m}"));
    }
    if r.block_size == 0 || r.block_size > BLOCK_SIZE_MAX {
        return invalid(format!("`block_size` must be in 1..={BLOCK_SIZE_MAX}, got {}", r.block_size));
    }
    let names = [Some(&r.model_name), r.tenant_id.as_ref(), r.routing_group.as_ref()];
    let salts = [r.additional_salt.as_ref(), r.additionalsalt.as_ref()];
    let labels = ["model_name", "tenant_id", "routing_group", "additional_salt", "additionalsalt"];
    let long = names.into_iter().chain(salts).zip(labels).find(|(v, _)| v.is_some_and(|v| v.len() > NAME_BYTES_MAX));
    if let Some((_, name)) = long {
        return invalid(format!("`{name}` is longer than {NAME_BYTES_MAX} bytes"));
    }
    merge(r.additional_salt, r.additionalsalt, |_, _| {
        "`additional_salt` and `additionalsalt` name the same field and disagree; send one".into()
    })?;
    Ok(RegisterArgs {
        instance_id: r.instance_id,
        dp_rank: r.dp_rank.unwrap_or(0),
        endpoint: r.endpoint,
        replay_endpoint: r.replay_endpoint,
        tenant_id: tenant(r.tenant_id, r.routing_group)?.unwrap_or_else(|| TENANT_DEFAULT.to_string()),
        model_name: r.model_name,
        block_size: r.block_size,
    })
}

/// Parses an `/unregister` body.
pub fn parse_unregister(body: &[u8]) -> Result<UnregisterRequest, BodyError> {
    let mut r: UnregisterRequest = read(body, "instance_id, model_name, ...")?;
    r.tenant_id = tenant(r.tenant_id, r.routing_group.take())?;
    Ok(r)
}

/// Parses a `/register_peer` or `/deregister_peer` body into its url,
/// which must be `http://host:port` (a trailing `/` is dropped).
pub fn parse_peer(body: &[u8]) -> Result<String, BodyError> {
    validate_peer_url(&read::<PeerRequest>(body, "url")?.url).map_err(BodyError::Invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::json::class;

    #[test]
    fn register_full_and_minimal() {
        let r = parse_register(
            br#"{"instance_id":18446744073709551615,"endpoint":"tcp://127.0.0.1:5557","model_name":"m",
                "block_size":16,"routing_group":"acme","dp_rank":3,"replay_endpoint":"tcp://127.0.0.1:5560",
                "additionalsalt":"s","unknown":[1,{"x":null}]}"#,
        )
        .unwrap();
        assert_eq!(
            r,
            RegisterArgs {
                instance_id: u64::MAX,
                endpoint: "tcp://127.0.0.1:5557".into(),
                model_name: "m".into(),
                block_size: 16,
                tenant_id: "acme".into(),
                dp_rank: 3,
                replay_endpoint: Some("tcp://127.0.0.1:5560".into()),
            }
        );
        let r = parse_register(
            br#"{"instance_id":1,"endpoint":"ipc:///tmp/x","model_name":"m","block_size":1,"dp_rank":null,"tenant_id":null}"#,
        )
        .unwrap();
        assert_eq!(r.tenant_id, TENANT_DEFAULT);
        assert_eq!(r.dp_rank, 0);
        assert_eq!(r.replay_endpoint, None);
    }

    #[test]
    fn register_errors() {
        let base = |extra: &str| {
            format!(r#"{{"instance_id":1,"endpoint":"tcp://h:1","model_name":"m","block_size":16{extra}}}"#)
        };
        let cases = [
            (base(""), "ok"),
            (base(r#","block_size":16"#), "unprocessable"),
            (base(r#","dp_rank":-1"#), "unprocessable"),
            (base(r#","dp_rank":4294967296"#), "unprocessable"),
            (base(r#","tenant_id":"a","routing_group":"b""#), "invalid"),
            (base(r#","tenant_id":"a","routing_group":"a""#), "ok"),
            (base(r#","additional_salt":"a","additionalsalt":"b""#), "invalid"),
            (base(r#","replay_endpoint":"tcp://*:5""#), "invalid"),
            (base(r#","replay_endpoint":5"#), "unprocessable"),
            // Unknown members are held to the same rules as the hot bodies.
            (base(r#","x":1e400"#), "malformed"),
            (base(r#","x":"\ud800""#), "malformed"),
            (base(&format!(r#","tenant_id":"{}""#, "t".repeat(NAME_BYTES_MAX + 1))), "invalid"),
            (r#"{"instance_id":1,"endpoint":"tcp://h:1","model_name":"m","block_size":0}"#.into(), "invalid"),
            (r#"{"instance_id":1,"endpoint":"tcp://h:1","model_name":"m","block_size":1048577}"#.into(), "invalid"),
            (r#"{"instance_id":1,"endpoint":"tcp://h","model_name":"m","block_size":4}"#.into(), "invalid"),
            (r#"{"instance_id":1,"endpoint":"tcp://h:1","model_name":"m"}"#.into(), "unprocessable"),
            (r#"{"instance_id":-1,"endpoint":"tcp://h:1","model_name":"m","block_size":4}"#.into(), "unprocessable"),
            (r#"{"instance_id":"1","endpoint":"tcp://h:1","model_name":"m","block_size":4}"#.into(), "unprocessable"),
            (r#"{"instance_id":1,"endpoint":"tcp://h:1","model_name":"m","block_size":4.0}"#.into(), "unprocessable"),
            // A type error outranks a bad endpoint.
            (r#"{"instance_id":1,"endpoint":"nope","model_name":5,"block_size":4}"#.into(), "unprocessable"),
            (r#"{"instance_id":1,"endpoint":"tcp://h:1","model_name":"m","block_size":4"#.into(), "malformed"),
            // Syntax outranks an earlier type error, so the class never depends on field order.
            (r#"{"instance_id":"1","endpoint":"tcp://h:1","model_name":"m","block_size":4,}"#.into(), "malformed"),
            // A derived struct would read an array positionally; a body is an object.
            (r#"[1,"tcp://h:1","m",4]"#.into(), "unprocessable"),
            (
                r#"{"instance_id":1,"instance_id":1,"endpoint":"tcp://h:1","model_name":"m","block_size":4}"#.into(),
                "unprocessable",
            ),
        ];
        for (body, want) in cases {
            assert_eq!(class(parse_register(body.as_bytes())), want, "{body}");
        }
        let not_utf8 = b"{\"instance_id\":1,\"endpoint\":\"tcp://h:1\",\"model_name\":\"m\xff\",\"block_size\":4}";
        assert_eq!(class(parse_register(not_utf8)), "malformed");
        let err = parse_register(br#"{"instance_id":1,"endpoint":"tcp://*:5557","model_name":"m","block_size":4}"#)
            .unwrap_err();
        assert_eq!(err.status(), 400);
        assert!(err.message().contains("tcp://*:5557"), "{}", err.message());
    }

    #[test]
    fn unregister_fields() {
        let r = parse_unregister(br#"{"instance_id":7,"model_name":"m"}"#).unwrap();
        let want = UnregisterRequest {
            instance_id: 7,
            model_name: "m".into(),
            tenant_id: None,
            dp_rank: None,
            routing_group: None,
        };
        assert_eq!(r, want);
        let r = parse_unregister(br#"{"instance_id":7,"model_name":"m","routing_group":"g","dp_rank":2}"#).unwrap();
        assert_eq!(r.tenant_id.as_deref(), Some("g"));
        assert_eq!(r.dp_rank, Some(2));
        assert_eq!(class(parse_unregister(br#"{"model_name":"m"}"#)), "unprocessable");
        assert_eq!(class(parse_unregister(br#"{"instance_id":7,"model_name":"m","dp_rank":"0"}"#)), "unprocessable");
        assert_eq!(class(parse_unregister(b"{\"instance_id\":7,\"model_name\":\"m\"")), "malformed");
    }

    #[test]
    fn peer_url() {
        assert_eq!(parse_peer(br#"{"url":"http://127.0.0.1:8091/"}"#).unwrap(), "http://127.0.0.1:8091");
        assert_eq!(class(parse_peer(br#"{"url":"ftp://x:1"}"#)), "invalid");
        assert_eq!(class(parse_peer(br#"{"url":null}"#)), "unprocessable");
        assert_eq!(class(parse_peer(br#"{}"#)), "unprocessable");
        assert_eq!(class(parse_peer(br#"{"url":"http://a:1","url":"http://a:1"}"#)), "unprocessable");
    }
}

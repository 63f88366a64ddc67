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

use super::{check_size, tenant, BodyError, Problems, CONTROL_BODY_BYTES_MAX};
use crate::endpoint::{validate_peer_url, validate_zmq_endpoint};
use crate::ingest::BLOCK_SIZE_MAX;
use crate::registry::NAME_BYTES_MAX;
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// `POST /register`: one (instance, dp_rank) listener. Both spellings of
/// the tenant and of the salt are read as fields of their own, so that two
/// that agree are accepted; `parse_register` merges them.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct RegisterRequest {
    pub instance_id: u64,
    /// A validated ZMQ endpoint (`tcp://host:port` or `ipc://path`).
    pub endpoint: String,
    pub model_name: String,
    /// Tokens per block, in 1..=`ingest::BLOCK_SIZE_MAX`.
    pub block_size: u32,
    /// Also accepted as `routing_group`. None: the default tenant.
    pub tenant_id: Option<String>,
    /// None: rank 0.
    pub dp_rank: Option<u32>,
    /// A validated ZMQ endpoint for gap replay.
    pub replay_endpoint: Option<String>,
    /// Also accepted as `additionalsalt`.
    pub additional_salt: Option<String>,
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
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct PeerRequest {
    /// `http://host:port`, without a trailing slash.
    pub url: String,
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

/// Parses a `/register` body. A `block_size` outside 1..=BLOCK_SIZE_MAX, a
/// bad endpoint or an over-long name is Invalid (400).
pub fn parse_register(body: &[u8]) -> Result<RegisterRequest, BodyError> {
    let mut r: RegisterRequest = read(body, "instance_id, endpoint, model_name, block_size, ...")?;
    let mut p = Problems::default();
    if let Err(m) = validate_zmq_endpoint(&r.endpoint) {
        p.invalid(|| m);
    }
    if let Some(Err(m)) = r.replay_endpoint.as_deref().map(validate_zmq_endpoint) {
        p.invalid(|| format!("`replay_endpoint`: {m}"));
    }
    if r.block_size == 0 || r.block_size > BLOCK_SIZE_MAX {
        p.invalid(|| format!("`block_size` must be in 1..={BLOCK_SIZE_MAX}, got {}", r.block_size));
    }
    let names = [Some(&r.model_name), r.tenant_id.as_ref(), r.routing_group.as_ref()];
    let salts = [r.additional_salt.as_ref(), r.additionalsalt.as_ref()];
    let labels = ["model_name", "tenant_id", "routing_group", "additional_salt", "additionalsalt"];
    for (value, name) in names.into_iter().chain(salts).zip(labels) {
        if value.is_some_and(|v| v.len() > NAME_BYTES_MAX) {
            p.invalid(|| format!("`{name}` is longer than {NAME_BYTES_MAX} bytes"));
        }
    }
    if let (Some(a), Some(c)) = (&r.additional_salt, &r.additionalsalt) {
        if a != c {
            p.invalid(|| "`additional_salt` and `additionalsalt` name the same field and disagree; send one".into());
        }
    }
    r.additional_salt = r.additional_salt.or(r.additionalsalt.take());
    r.tenant_id = tenant(r.tenant_id, r.routing_group.take(), &mut p);
    p.result()?;
    Ok(r)
}

/// Parses an `/unregister` body.
pub fn parse_unregister(body: &[u8]) -> Result<UnregisterRequest, BodyError> {
    let mut r: UnregisterRequest = read(body, "instance_id, model_name, ...")?;
    let mut p = Problems::default();
    r.tenant_id = tenant(r.tenant_id, r.routing_group.take(), &mut p);
    p.result()?;
    Ok(r)
}

/// Parses a `/register_peer` or `/deregister_peer` body; the url must be
/// `http://host:port` (a trailing `/` is dropped).
pub fn parse_peer(body: &[u8]) -> Result<PeerRequest, BodyError> {
    let r: PeerRequest = read(body, "url")?;
    Ok(PeerRequest { url: validate_peer_url(&r.url).map_err(BodyError::Invalid)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class<T>(r: Result<T, BodyError>) -> &'static str {
        match r {
            Ok(_) => "ok",
            Err(BodyError::Malformed(_)) => "malformed",
            Err(BodyError::Invalid(_)) => "invalid",
            Err(BodyError::Unprocessable(_)) => "unprocessable",
        }
    }

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
            RegisterRequest {
                instance_id: u64::MAX,
                endpoint: "tcp://127.0.0.1:5557".into(),
                model_name: "m".into(),
                block_size: 16,
                tenant_id: Some("acme".into()),
                dp_rank: Some(3),
                replay_endpoint: Some("tcp://127.0.0.1:5560".into()),
                additional_salt: Some("s".into()),
                routing_group: None,
                additionalsalt: None,
            }
        );
        let r = parse_register(
            br#"{"instance_id":1,"endpoint":"ipc:///tmp/x","model_name":"m","block_size":1,"dp_rank":null,"tenant_id":null}"#,
        )
        .unwrap();
        assert_eq!(r.tenant_id, None);
        assert_eq!(r.dp_rank, None);
        assert_eq!(r.replay_endpoint, None);
        assert_eq!(r.additional_salt, None);
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
        assert_eq!(parse_peer(br#"{"url":"http://127.0.0.1:8091/"}"#).unwrap().url, "http://127.0.0.1:8091");
        assert_eq!(class(parse_peer(br#"{"url":"ftp://x:1"}"#)), "invalid");
        assert_eq!(class(parse_peer(br#"{"url":null}"#)), "unprocessable");
        assert_eq!(class(parse_peer(br#"{}"#)), "unprocessable");
        assert_eq!(class(parse_peer(br#"{"url":"http://a:1","url":"http://a:1"}"#)), "unprocessable");
    }
}

//! Bodies of the control endpoints: `/register`, `/unregister`,
//! `/register_peer` and `/deregister_peer`.
//!
//! Cold paths, but they go through the same strict scanner as queries so
//! every endpoint has one set of JSON rules (see `codec`). Field names and
//! optionality follow Dynamo's request structs; values are also checked
//! for sense here (endpoints, sizes, lengths), so the registry only ever
//! sees requests it can act on.

use super::problems::{finish, tenant, Problems};
use super::scan::Scan;
use super::{BodyError, CONTROL_BODY_BYTES_MAX};
use crate::endpoint::{validate_peer_url, validate_zmq_endpoint};
use crate::ingest::BLOCK_SIZE_MAX;
use crate::registry::NAME_BYTES_MAX;
use std::borrow::Cow;

/// `POST /register`: one (instance, dp_rank) listener.
#[derive(Clone, Debug, PartialEq, Eq)]
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
}

/// `POST /unregister`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnregisterRequest {
    pub instance_id: u64,
    pub model_name: String,
    /// None: every tenant.
    pub tenant_id: Option<String>,
    /// None: every rank.
    pub dp_rank: Option<u32>,
}

/// `POST /register_peer` and `POST /deregister_peer`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerRequest {
    /// `http://host:port`, without a trailing slash.
    pub url: String,
}

/// A field's reader and its place in the seen-set.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    OptStr,
    U64,
    OptU32,
    U32,
}

#[derive(Clone, Copy)]
struct Field {
    name: &'static str,
    kind: Kind,
}

/// A field's value as read.
#[derive(Default)]
enum Value<'a> {
    #[default]
    Absent,
    Null,
    Str(Cow<'a, str>),
    Uint(u64),
}

/// Scans an object whose known fields are `fields`; returns their values in
/// that order. Problems with types and duplicates go to `problems`.
fn scan_fields<'a, const N: usize>(
    body: &'a [u8],
    fields: [Field; N],
    what: &str,
    problems: Problems,
    check: impl FnOnce(&mut [Value<'a>; N], &mut Problems),
) -> Result<[Value<'a>; N], BodyError> {
    let mut problems = problems;
    if body.len() > CONTROL_BODY_BYTES_MAX {
        return Err(BodyError::Invalid(format!(
            "request body is {} bytes; the limit is {CONTROL_BODY_BYTES_MAX}",
            body.len()
        )));
    }
    let mut values: [Value<'a>; N] = std::array::from_fn(|_| Value::Absent);
    let mut seen = 0u32;
    let mut scan = Scan::new(body);
    let scanned = scan.top_object(|s, key| {
        let Some(at) = fields.iter().position(|f| f.name == key) else {
            return s.skip();
        };
        let f = fields[at];
        if !problems.first(&mut seen, 1 << at, f.name) {
            return s.skip();
        }
        let read = match f.kind {
            Kind::Str => s.read_str()?.map(Value::Str),
            Kind::OptStr => s.read_opt_str()?.map(|v| v.map_or(Value::Null, Value::Str)),
            Kind::U64 => s.read_uint(u64::MAX)?.map(Value::Uint),
            Kind::U32 => s.read_uint(u64::from(u32::MAX))?.map(Value::Uint),
            Kind::OptU32 => s.read_opt_uint(u64::from(u32::MAX))?.map(|v| v.map_or(Value::Null, Value::Uint)),
        };
        match read {
            Ok(v) => values[at] = v,
            Err(found) => problems.unprocessable(|| {
                let expected = match f.kind {
                    Kind::Str => "a string",
                    Kind::OptStr => "a string or null",
                    Kind::U64 => "an integer in 0..=18446744073709551615",
                    Kind::U32 => "an integer in 0..=4294967295",
                    Kind::OptU32 => "an integer in 0..=4294967295 or null",
                };
                format!("`{}` must be {expected}, found {found}", f.name)
            }),
        }
        Ok(())
    });
    for (at, f) in fields.iter().enumerate() {
        let required = matches!(f.kind, Kind::Str | Kind::U64 | Kind::U32);
        if required && seen & (1 << at) == 0 {
            problems.unprocessable(|| format!("missing field `{}`", f.name));
        }
    }
    check(&mut values, &mut problems);
    finish(scanned, problems, what)?;
    Ok(values)
}

fn take_str(v: &mut Value<'_>) -> Option<String> {
    match std::mem::take(v) {
        Value::Str(s) => Some(s.into_owned()),
        _ => None,
    }
}

fn take_uint(v: &mut Value<'_>) -> Option<u64> {
    match std::mem::take(v) {
        Value::Uint(n) => Some(n),
        _ => None,
    }
}

fn as_str<'v>(v: &'v Value<'_>) -> Option<&'v str> {
    match v {
        Value::Str(s) => Some(s),
        _ => None,
    }
}

fn check_len(v: &Value<'_>, name: &str, problems: &mut Problems) {
    if let Some(s) = as_str(v) {
        if s.len() > NAME_BYTES_MAX {
            problems.invalid(|| format!("`{name}` is longer than {NAME_BYTES_MAX} bytes"));
        }
    }
}

/// Parses a `/register` body. A `block_size` outside 1..=BLOCK_SIZE_MAX, a
/// bad endpoint or an over-long name is Invalid (400).
pub fn parse_register(body: &[u8]) -> Result<RegisterRequest, BodyError> {
    const F: [Field; 9] = [
        Field { name: "instance_id", kind: Kind::U64 },
        Field { name: "endpoint", kind: Kind::Str },
        Field { name: "model_name", kind: Kind::Str },
        Field { name: "block_size", kind: Kind::U32 },
        Field { name: "tenant_id", kind: Kind::OptStr },
        Field { name: "routing_group", kind: Kind::OptStr },
        Field { name: "dp_rank", kind: Kind::OptU32 },
        Field { name: "replay_endpoint", kind: Kind::OptStr },
        Field { name: "additional_salt", kind: Kind::OptStr },
    ];
    // `additionalsalt` (Mooncake's spelling) is read as a tenth field below.
    const G: [Field; 10] =
        [F[0], F[1], F[2], F[3], F[4], F[5], F[6], F[7], F[8], Field { name: "additionalsalt", kind: Kind::OptStr }];
    let mut v =
        scan_fields(body, G, "instance_id, endpoint, model_name, block_size, ...", Problems::default(), |v, p| {
            if let Some(e) = as_str(&v[1]) {
                if let Err(m) = validate_zmq_endpoint(e) {
                    p.invalid(|| m);
                }
            }
            if let Some(e) = as_str(&v[7]) {
                if let Err(m) = validate_zmq_endpoint(e) {
                    p.invalid(|| format!("`replay_endpoint`: {m}"));
                }
            }
            if let Value::Uint(n) = v[3] {
                if n == 0 || n > u64::from(BLOCK_SIZE_MAX) {
                    p.invalid(|| format!("`block_size` must be in 1..={BLOCK_SIZE_MAX}, got {n}"));
                }
            }
            for (at, name) in [
                (2, "model_name"),
                (4, "tenant_id"),
                (5, "routing_group"),
                (8, "additional_salt"),
                (9, "additionalsalt"),
            ] {
                check_len(&v[at], name, p);
            }
            let salt = match (as_str(&v[8]), as_str(&v[9])) {
                (Some(a), Some(b)) if a != b => {
                    p.invalid(|| {
                        "`additional_salt` and `additionalsalt` name the same field and disagree; send one".to_string()
                    });
                    None
                }
                (a, b) => a.or(b).map(str::to_owned),
            };
            if let Some(s) = salt {
                v[8] = Value::Str(Cow::Owned(s));
            }
            let t = tenant(as_str(&v[4]), as_str(&v[5]), p).map(str::to_owned);
            v[4] = t.map_or(Value::Absent, |t| Value::Str(Cow::Owned(t)));
        })?;
    let bad = || BodyError::Unprocessable("missing field".to_string());
    Ok(RegisterRequest {
        instance_id: take_uint(&mut v[0]).ok_or_else(bad)?,
        endpoint: take_str(&mut v[1]).ok_or_else(bad)?,
        model_name: take_str(&mut v[2]).ok_or_else(bad)?,
        block_size: take_uint(&mut v[3]).and_then(|n| u32::try_from(n).ok()).ok_or_else(bad)?,
        tenant_id: take_str(&mut v[4]),
        dp_rank: take_uint(&mut v[6]).and_then(|n| u32::try_from(n).ok()),
        replay_endpoint: take_str(&mut v[7]),
        additional_salt: take_str(&mut v[8]),
    })
}

/// Parses an `/unregister` body.
pub fn parse_unregister(body: &[u8]) -> Result<UnregisterRequest, BodyError> {
    const F: [Field; 5] = [
        Field { name: "instance_id", kind: Kind::U64 },
        Field { name: "model_name", kind: Kind::Str },
        Field { name: "tenant_id", kind: Kind::OptStr },
        Field { name: "routing_group", kind: Kind::OptStr },
        Field { name: "dp_rank", kind: Kind::OptU32 },
    ];
    let mut v = scan_fields(body, F, "instance_id, model_name, ...", Problems::default(), |v, p| {
        let t = tenant(as_str(&v[2]), as_str(&v[3]), p).map(str::to_owned);
        v[2] = t.map_or(Value::Absent, |t| Value::Str(Cow::Owned(t)));
    })?;
    let bad = || BodyError::Unprocessable("missing field".to_string());
    Ok(UnregisterRequest {
        instance_id: take_uint(&mut v[0]).ok_or_else(bad)?,
        model_name: take_str(&mut v[1]).ok_or_else(bad)?,
        tenant_id: take_str(&mut v[2]),
        dp_rank: take_uint(&mut v[4]).and_then(|n| u32::try_from(n).ok()),
    })
}

/// Parses a `/register_peer` or `/deregister_peer` body; the url must be
/// `http://host:port` (a trailing `/` is dropped).
pub fn parse_peer(body: &[u8]) -> Result<PeerRequest, BodyError> {
    const F: [Field; 1] = [Field { name: "url", kind: Kind::Str }];
    let mut normalized = None;
    let mut v = scan_fields(body, F, "url", Problems::default(), |v, p| {
        if let Some(u) = as_str(&v[0]) {
            match validate_peer_url(u) {
                Ok(n) => normalized = Some(n),
                Err(m) => p.invalid(|| m),
            }
        }
    })?;
    let url = normalized
        .or_else(|| take_str(&mut v[0]))
        .ok_or_else(|| BodyError::Unprocessable("missing field `url`".to_string()))?;
    Ok(PeerRequest { url })
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
        ];
        for (body, want) in cases {
            assert_eq!(class(parse_register(body.as_bytes())), want, "{body}");
        }
        let err = parse_register(br#"{"instance_id":1,"endpoint":"tcp://*:5557","model_name":"m","block_size":4}"#)
            .unwrap_err();
        assert_eq!(err.status(), 400);
        assert!(err.message().contains("tcp://*:5557"), "{}", err.message());
    }

    #[test]
    fn unregister_fields() {
        let r = parse_unregister(br#"{"instance_id":7,"model_name":"m"}"#).unwrap();
        assert_eq!(r, UnregisterRequest { instance_id: 7, model_name: "m".into(), tenant_id: None, dp_rank: None });
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

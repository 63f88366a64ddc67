//! Property test of the query body parsers against a reference built on
//! serde_json.
//!
//! Bodies come from a structured generator (valid queries with random field
//! order, spellings, whitespace, escapes, unknown fields of every JSON type,
//! edge-case numbers), from mutations of those (byte flips, inserts,
//! deletes, splices, truncation) and from short random byte strings. For
//! every body, `parse_query` and `parse_query_by_hash` must not panic and
//! must agree with the reference: the same values when it accepts, the same
//! error class (400 malformed / 400 invalid / 422) when it refuses.
//!
//! Cases: 200,000 per parser by default; set `CODEC_FUZZ_CASES` for more,
//! `CODEC_FUZZ_SEED` to explore other inputs.

use super::{parse_query, parse_query_by_hash, BodyError, QueryRequest};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;
use std::fmt;

use crate::test_rng::RngStar as Rng;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Tokens,
    Hashes,
}

/// What a parser decided, in comparable form.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Ok {
        ids: Vec<u64>,
        model_name: String,
        tenant_id: Option<String>,
        lora_name: Option<String>,
        cache_salt: Option<String>,
    },
    Malformed,
    Invalid,
    Unprocessable,
    TooLarge,
}

fn outcome_of(r: Result<QueryRequest<'_>, BodyError>, ids: Vec<u64>) -> Outcome {
    match r {
        Ok(q) => Outcome::Ok {
            ids,
            model_name: q.model_name.into_owned(),
            tenant_id: q.tenant_id.map(|c| c.into_owned()),
            lora_name: q.lora_name.map(|c| c.into_owned()),
            cache_salt: q.cache_salt.map(|c| c.into_owned()),
        },
        Err(BodyError::Malformed(_)) => Outcome::Malformed,
        Err(BodyError::Invalid(_)) => Outcome::Invalid,
        Err(BodyError::Unprocessable(_)) => Outcome::Unprocessable,
        Err(BodyError::TooLarge(_)) => Outcome::TooLarge,
    }
}

fn ours(body: &[u8], mode: Mode) -> Outcome {
    match mode {
        Mode::Tokens => {
            let mut t = vec![7u32; 3];
            let r = parse_query(body, &mut t);
            outcome_of(r, t.into_iter().map(u64::from).collect())
        }
        Mode::Hashes => {
            let mut h = vec![7u64; 3];
            let r = parse_query_by_hash(body, &mut h);
            outcome_of(r, h)
        }
    }
}

/// The top-level object as its members in order, duplicates kept.
struct Pairs(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Pairs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Pairs;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Pairs, A::Error> {
                let mut v = Vec::new();
                while let Some(p) = m.next_entry::<String, Value>()? {
                    v.push(p);
                }
                Ok(Pairs(v))
            }
        }
        d.deserialize_map(V)
    }
}

/// The documented rules, evaluated over serde_json's view of the body.
fn reference(body: &[u8], mode: Mode) -> Outcome {
    let Ok(doc) = serde_json::from_slice::<Value>(body) else {
        return Outcome::Malformed;
    };
    if !doc.is_object() {
        return Outcome::Unprocessable;
    }
    let pairs: Pairs = serde_json::from_slice(body).expect("an object parses as pairs");
    let ids_name = match mode {
        Mode::Tokens => "token_ids",
        Mode::Hashes => "block_hashes",
    };
    let mut known: Vec<&str> = vec![ids_name, "model_name", "tenant_id", "routing_group", "cache_salt"];
    if mode == Mode::Tokens {
        known.push("lora_name");
    }
    let mut unprocessable = false;
    let mut invalid = false;
    let mut seen: Vec<&str> = Vec::new();
    let mut ids = None;
    let mut model_name = None;
    let (mut tenant_id, mut routing_group, mut lora_name, mut cache_salt) = (None, None, None, None);
    for (key, value) in &pairs.0 {
        let Some(&k) = known.iter().find(|k| **k == key) else {
            continue;
        };
        if seen.contains(&k) {
            unprocessable = true;
            continue;
        }
        seen.push(k);
        let opt_str = |v: &Value, bad: &mut bool| match v {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            _ => {
                *bad = true;
                None
            }
        };
        match k {
            "model_name" => match value {
                Value::String(s) => model_name = Some(s.clone()),
                _ => unprocessable = true,
            },
            "tenant_id" => tenant_id = opt_str(value, &mut unprocessable),
            "routing_group" => routing_group = opt_str(value, &mut unprocessable),
            "lora_name" => lora_name = opt_str(value, &mut unprocessable),
            "cache_salt" => {
                cache_salt = opt_str(value, &mut unprocessable);
                if mode == Mode::Hashes && cache_salt.is_some() {
                    invalid = true;
                    cache_salt = None;
                }
            }
            _ => {
                let Value::Array(items) = value else {
                    unprocessable = true;
                    continue;
                };
                let mut out = Vec::new();
                for item in items {
                    let v = match mode {
                        Mode::Tokens => item.as_u64().filter(|&v| v <= u64::from(u32::MAX)),
                        Mode::Hashes => item.as_u64().or_else(|| item.as_i64().map(|v| v as u64)),
                    };
                    match v {
                        Some(v) => out.push(v),
                        None => unprocessable = true,
                    }
                }
                ids = Some(out);
            }
        }
    }
    if ids.is_none() || model_name.is_none() {
        unprocessable = true;
    }
    if let (Some(t), Some(g)) = (&tenant_id, &routing_group) {
        if t != g {
            invalid = true;
        }
    }
    if unprocessable {
        return Outcome::Unprocessable;
    }
    if invalid {
        return Outcome::Invalid;
    }
    Outcome::Ok {
        ids: ids.unwrap_or_default(),
        model_name: model_name.unwrap_or_default(),
        tenant_id: tenant_id.or(routing_group),
        lora_name,
        cache_salt,
    }
}

// ---- generation ----

fn ws(r: &mut Rng, out: &mut String) {
    if r.chance(3) {
        for _ in 0..r.below(3) {
            out.push(r.pick(&[' ', '\n', '\t', '\r']));
        }
    }
}

fn json_string(r: &mut Rng, out: &mut String) {
    out.push('"');
    for _ in 0..r.below(8) {
        match r.below(12) {
            0 => out.push_str(r.pick(&["\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t"])),
            1 => out.push_str(&format!("\\u{:04x}", r.below(0xd800))),
            2 => out.push_str(r.pick(&["\\ud83e\\udd80", "\\uD834\\uDD1E", "\\u00e9"])),
            3 => out.push(r.pick(&['é', '漢', '🦀', '\u{7f}'])),
            4 => out.push(r.pick(&['{', '}', '[', ']', ',', ':'])),
            _ => out.push((b'a' + r.below(26) as u8) as char),
        }
    }
    out.push('"');
}

fn name(r: &mut Rng, out: &mut String) {
    if r.chance(4) {
        json_string(r, out);
    } else {
        out.push_str(r.pick(&["\"m\"", "\"llama-3\"", "\"default\"", "\"acme\"", "\"\""]));
    }
}

fn number(r: &mut Rng, mode: Mode, out: &mut String) {
    let edge: &[&str] = &[
        "0",
        "-0",
        "1",
        "-1",
        "4294967295",
        "4294967296",
        "9223372036854775807",
        "9223372036854775808",
        "-9223372036854775808",
        "-9223372036854775809",
        "18446744073709551615",
        "18446744073709551616",
        "1.0",
        "1e2",
        "1E-2",
        "0.5",
        "-0.0",
        "12345678901234567890123",
    ];
    match r.below(20) {
        0 => out.push_str(r.pick(edge)),
        1 => out.push_str(&r.next().to_string()),
        2 => out.push_str(&(r.next() as i64).to_string()),
        _ => {
            let v = match mode {
                Mode::Tokens => r.below(200_000),
                Mode::Hashes => r.next(),
            };
            out.push_str(&v.to_string());
        }
    }
}

fn any_value(r: &mut Rng, depth: u32, mode: Mode, out: &mut String) {
    let k = if depth > 3 { r.below(5) } else { r.below(7) };
    match k {
        0 => number(r, mode, out),
        1 => json_string(r, out),
        2 => out.push_str(r.pick(&["true", "false", "null"])),
        3 => number(r, mode, out),
        4 => out.push_str(r.pick(&["[]", "{}", "\"\""])),
        5 => {
            out.push('[');
            for i in 0..r.below(4) {
                if i > 0 {
                    out.push(',');
                }
                ws(r, out);
                any_value(r, depth + 1, mode, out);
                ws(r, out);
            }
            out.push(']');
        }
        _ => {
            out.push('{');
            for i in 0..r.below(4) {
                if i > 0 {
                    out.push(',');
                }
                ws(r, out);
                json_string(r, out);
                out.push(':');
                any_value(r, depth + 1, mode, out);
            }
            out.push('}');
        }
    }
}

fn id_array(r: &mut Rng, mode: Mode, out: &mut String) {
    out.push('[');
    ws(r, out);
    let n = if r.chance(10) { r.below(600) } else { r.below(40) };
    // Half the arrays have the plain shape the token fast path takes whole
    // (small ids, "," or ", " separators), so mutations land inside it.
    let plain = r.chance(2);
    let separator = if r.chance(2) { "," } else { ", " };
    for i in 0..n {
        if i > 0 {
            if plain {
                out.push_str(separator);
            } else {
                out.push(',');
                ws(r, out);
            }
        }
        if plain && !r.chance(300) {
            let digits = 1 + r.below(7) as u32;
            out.push_str(&r.below(10u64.pow(digits)).to_string());
            continue;
        }
        if r.chance(500) {
            any_value(r, 2, mode, out);
        } else if r.chance(50) {
            number(r, mode, out);
        } else {
            let v = match mode {
                Mode::Tokens => {
                    let bits = r.below(33);
                    r.below(1 << bits)
                }
                Mode::Hashes => r.next() >> r.below(64),
            };
            out.push_str(&v.to_string());
        }
    }
    ws(r, out);
    out.push(']');
}

/// A body that is usually a valid request, sometimes with field-level mistakes.
fn gen_body(r: &mut Rng, mode: Mode) -> String {
    let ids_name = match mode {
        Mode::Tokens => "token_ids",
        Mode::Hashes => "block_hashes",
    };
    let mut fields: Vec<String> = Vec::new();
    let mut push = |r: &mut Rng, key: &str, value: String| {
        let mut f = String::new();
        if r.chance(30) {
            // The same key, spelled with an escape.
            f.push('"');
            for c in key.chars() {
                if r.chance(3) {
                    f.push_str(&format!("\\u{:04x}", c as u32));
                } else {
                    f.push(c);
                }
            }
            f.push('"');
        } else {
            f.push_str(&format!("\"{key}\""));
        }
        ws(r, &mut f);
        f.push(':');
        ws(r, &mut f);
        f.push_str(&value);
        fields.push(f);
    };
    let value_or_mistake = |r: &mut Rng, good: &dyn Fn(&mut Rng, &mut String)| {
        let mut v = String::new();
        if r.chance(25) {
            any_value(r, 2, mode, &mut v);
        } else {
            good(r, &mut v);
        }
        v
    };
    if !r.chance(40) {
        let v = value_or_mistake(r, &|r, o| id_array(r, mode, o));
        push(r, ids_name, v);
    }
    if !r.chance(40) {
        let v = value_or_mistake(r, &name);
        push(r, "model_name", v);
    }
    for key in ["tenant_id", "routing_group", "lora_name", "cache_salt"] {
        if r.chance(3) {
            let v = value_or_mistake(r, &|r, o| {
                if r.chance(3) {
                    o.push_str("null");
                } else {
                    name(r, o);
                }
            });
            push(r, key, v);
        }
    }
    for _ in 0..r.below(3) {
        let mut key = String::new();
        json_string(r, &mut key);
        let key = key.trim_matches('"').to_string();
        let mut v = String::new();
        any_value(r, 2, mode, &mut v);
        push(r, &key, v);
    }
    if r.chance(20) && !fields.is_empty() {
        let dup = fields[r.below(fields.len() as u64) as usize].clone();
        fields.push(dup);
    }
    // Shuffle.
    for i in (1..fields.len()).rev() {
        let j = r.below(i as u64 + 1) as usize;
        fields.swap(i, j);
    }
    let mut body = String::new();
    ws(r, &mut body);
    body.push('{');
    for (i, f) in fields.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        ws(r, &mut body);
        body.push_str(f);
        ws(r, &mut body);
    }
    body.push('}');
    ws(r, &mut body);
    body
}

const INTERESTING: &[u8] = b"{}[],:\"\\-+.eE0123456789 \t\nutfnl/\x00\x1f\x7f\x80\xbf\xc3\xe9\xf0\xff";

fn mutate(r: &mut Rng, body: &mut Vec<u8>) {
    for _ in 0..1 + r.below(3) {
        let len = body.len() as u64;
        match r.below(6) {
            0 if len > 0 => {
                let i = r.below(len) as usize;
                body[i] = r.pick(INTERESTING);
            }
            1 => {
                let i = r.below(len + 1) as usize;
                body.insert(i, r.pick(INTERESTING));
            }
            2 if len > 0 => {
                let i = r.below(len) as usize;
                body.remove(i);
            }
            3 if len > 1 => {
                let a = r.below(len) as usize;
                let b = (a + 1 + r.below(16) as usize).min(body.len());
                let piece = body[a..b].to_vec();
                let at = r.below(body.len() as u64 + 1) as usize;
                body.splice(at..at, piece);
            }
            4 if len > 0 => {
                let n = r.below(len) as usize;
                body.truncate(n);
            }
            _ => {
                let i = r.below(len + 1) as usize;
                body.insert(i, r.next() as u8);
            }
        }
    }
}

fn check(body: &[u8], mode: Mode, stats: &mut [u64; 4]) {
    let want = reference(body, mode);
    let got = ours(body, mode);
    assert_eq!(got, want, "{mode:?} disagrees on body {:?}", String::from_utf8_lossy(body));
    let slot = match want {
        Outcome::Ok { .. } => 0,
        Outcome::Malformed => 1,
        Outcome::Invalid => 2,
        Outcome::Unprocessable => 3,
        Outcome::TooLarge => unreachable!("the reference has no size limit; fuzzed bodies are far below ours"),
    };
    stats[slot] += 1;
}

fn run(mode: Mode) {
    let cases: u64 = std::env::var("CODEC_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000);
    let seed: u64 = std::env::var("CODEC_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x5eed_c0de);
    let mut r = Rng(seed | 1);
    let mut stats = [0u64; 4];
    for _ in 0..cases {
        match r.below(10) {
            0..=3 => check(gen_body(&mut r, mode).as_bytes(), mode, &mut stats),
            4..=8 => {
                let mut body = gen_body(&mut r, mode).into_bytes();
                mutate(&mut r, &mut body);
                check(&body, mode, &mut stats);
            }
            _ => {
                let n = r.below(24) as usize;
                let body: Vec<u8> = (0..n).map(|_| r.pick(INTERESTING)).collect();
                check(&body, mode, &mut stats);
            }
        }
    }
    eprintln!("{mode:?} stats {stats:?}");
    // Every class must have been exercised, or the generator has gone blind.
    for (slot, name) in ["ok", "malformed", "invalid", "unprocessable"].iter().enumerate() {
        assert!(stats[slot] >= cases / 1000, "{mode:?}: only {} {name} cases out of {cases}: {stats:?}", stats[slot]);
    }
}

#[test]
fn parse_query_agrees_with_reference() {
    run(Mode::Tokens);
}

#[test]
fn parse_query_by_hash_agrees_with_reference() {
    run(Mode::Hashes);
}

#[test]
fn deep_nesting_agrees_with_reference() {
    for mode in [Mode::Tokens, Mode::Hashes] {
        for depth in [120, 126, 127, 128, 200] {
            for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
                let body = format!(
                    "{{\"token_ids\":[],\"block_hashes\":[],\"model_name\":\"m\",\"x\":{}1{}}}",
                    open.repeat(depth),
                    close.repeat(depth)
                );
                assert_eq!(ours(body.as_bytes(), mode), reference(body.as_bytes(), mode), "{mode:?} depth {depth}");
            }
        }
    }
}

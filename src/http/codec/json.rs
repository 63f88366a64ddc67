//! The walk over a hot body: the top-level object's punctuation by hand,
//! each key and member value through serde_json, one value at a time.
//!
//! Only the id array is left to `ids`; every other value goes to
//! serde_json's own parser (`Walk::value`), which checks it as strictly as
//! it checks a whole document (UTF-8, escapes and surrogates, numbers that
//! fit an f64) and reports where it ended. Scalars are kept, arrays and
//! objects are checked to their end and dropped, nesting is counted from
//! the top-level object so the limit is the same as for a whole document.

use super::NESTING_DEPTH_MAX;
use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

/// One JSON value, as much of it as a request field needs.
#[derive(Debug, PartialEq)]
pub(super) enum Json<'a> {
    Null,
    Bool(bool),
    /// An integer in 0..2^64.
    U64(u64),
    /// A negative integer in -2^63..0.
    I64(i64),
    /// Any other number (a fraction, an exponent, `-0`, a larger integer).
    Float,
    /// Borrowed from the body unless it had escapes.
    Str(Cow<'a, str>),
    Array,
    Object,
}

impl Json<'_> {
    /// What the value is, for "expected X, found Y" messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::U64(_) | Json::I64(_) | Json::Float => "a number",
            Json::Str(_) => "a string",
            Json::Array => "an array",
            Json::Object => "an object",
        }
    }
}

/// Reads one value whose arrays and objects open nesting level `.0`.
#[derive(Clone, Copy)]
struct Level(usize);

impl<'de> DeserializeSeed<'de> for Level {
    type Value = Json<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Json<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

impl Level {
    fn open<E: de::Error>(self) -> Result<Level, E> {
        if self.0 > NESTING_DEPTH_MAX {
            return Err(E::custom("arrays and objects nested too deep"));
        }
        Ok(Level(self.0 + 1))
    }
}

impl<'de> Visitor<'de> for Level {
    type Value = Json<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Json<'de>, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Json<'de>, E> {
        Ok(Json::Bool(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json<'de>, E> {
        Ok(Json::U64(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json<'de>, E> {
        Ok(if v < 0 { Json::I64(v) } else { Json::U64(v as u64) })
    }
    fn visit_f64<E>(self, _: f64) -> Result<Json<'de>, E> {
        Ok(Json::Float)
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Json<'de>, E> {
        Ok(Json::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Json<'de>, E> {
        Ok(Json::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Json<'de>, A::Error> {
        let inner = self.open()?;
        while a.next_element_seed(inner)?.is_some() {}
        Ok(Json::Array)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Json<'de>, A::Error> {
        let inner = self.open()?;
        while a.next_key_seed(inner)?.is_some() {
            a.next_value_seed(inner)?;
        }
        Ok(Json::Object)
    }
}

/// A value read at nesting level `L`, for serde_json's stream reader.
struct At<'a, const L: usize>(Json<'a>);

impl<'de, const L: usize> Deserialize<'de> for At<'de, L> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Level(L).deserialize(d).map(At)
    }
}

/// A syntax error's message (the body is malformed).
pub(super) type Syntax = String;

/// A body and a cursor into it.
pub(super) struct Walk<'a> {
    pub b: &'a [u8],
    pub i: usize,
}

/// Checks that `body` is one well-formed JSON value, by the same rules as
/// the hot bodies (nesting, numbers, strings).
pub(super) fn check(body: &[u8]) -> Result<(), Syntax> {
    let mut w = Walk { b: body, i: 0 };
    w.value::<1>()?;
    w.end()
}

impl<'a> Walk<'a> {
    pub fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    pub fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.peek() {
            self.i += 1;
        }
    }

    pub fn err<T>(&self, what: &str) -> Result<T, Syntax> {
        Err(format!("malformed JSON at byte {}: {what}", self.i))
    }

    /// Reads the value at the cursor through serde_json; its arrays and
    /// objects open nesting level `L`.
    pub fn value<const L: usize>(&mut self) -> Result<Json<'a>, Syntax> {
        let mut stream = serde_json::Deserializer::from_slice(self.b.get(self.i..).unwrap_or_default()).into_iter();
        match stream.next() {
            Some(Ok(At::<L>(v))) => {
                self.i += stream.byte_offset();
                Ok(v)
            }
            Some(Err(e)) => self.err(&format!("{e} (counted from there)")),
            None => self.err("unexpected end of body; expected a value"),
        }
    }

    /// A plain integer at the cursor, below 2^64: no sign, fraction,
    /// exponent or leading zero. None, the cursor unmoved, for anything
    /// else, which `value` then reads.
    pub fn plain_int(&mut self) -> Option<u64> {
        let rest = self.b.get(self.i..)?;
        let n = rest.iter().take(21).take_while(|c| c.is_ascii_digit()).count();
        if n == 0 || (n > 1 && rest[0] == b'0') || matches!(rest.get(n), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        let v = rest[..n].iter().try_fold(0u64, |v, &d| v.checked_mul(10)?.checked_add(u64::from(d - b'0')))?;
        self.i += n;
        Some(v)
    }

    /// The source text from `start` to the cursor, shortened, for messages.
    pub fn text(&self, start: usize) -> String {
        let raw = self.b.get(start..self.i).unwrap_or_default();
        let mut s = String::from_utf8_lossy(&raw[..raw.len().min(40)]).into_owned();
        if raw.len() > 40 {
            s.push_str("...");
        }
        s
    }

    /// Walks the top-level value. If it is an object, calls `member` with
    /// each key, the cursor on the member's value, which `member` must
    /// consume. Returns whether the top level was an object; any other
    /// well-formed value is read and gives `false`.
    pub fn object(
        &mut self,
        mut member: impl FnMut(&mut Self, Cow<'a, str>) -> Result<(), Syntax>,
    ) -> Result<bool, Syntax> {
        self.ws();
        if self.peek() != Some(b'{') {
            self.value::<1>()?;
            return self.end().map(|()| false);
        }
        self.i += 1;
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return self.end().map(|()| true);
        }
        loop {
            if self.peek() != Some(b'"') {
                return self.err("expected a string key in the object");
            }
            let Json::Str(key) = self.value::<2>()? else { return self.err("expected a string key") };
            self.ws();
            if self.peek() != Some(b':') {
                return self.err("expected ':' after the key");
            }
            self.i += 1;
            self.ws();
            member(self, key)?;
            if !self.next(b'}', "expected ',' or '}' after a value in the object")? {
                return self.end().map(|()| true);
            }
        }
    }

    /// After a member or element: a `,` (consumed, with the space after
    /// it: true, another follows) or `close` (consumed: false).
    pub fn next(&mut self, close: u8, expected: &str) -> Result<bool, Syntax> {
        self.ws();
        match self.peek() {
            Some(b',') => {
                self.i += 1;
                self.ws();
                Ok(true)
            }
            Some(c) if c == close => {
                self.i += 1;
                Ok(false)
            }
            _ => self.err(expected),
        }
    }

    /// Only whitespace may follow the top-level value.
    fn end(&mut self) -> Result<(), Syntax> {
        self.ws();
        if self.i == self.b.len() {
            Ok(())
        } else {
            self.err("unexpected bytes after the JSON value")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Result<(Json<'_>, usize), Syntax> {
        let mut w = Walk { b: text.as_bytes(), i: 0 };
        w.value::<2>().map(|v| (v, w.i))
    }

    #[test]
    fn values_follow_the_json_data_model_and_say_where_they_end() {
        assert_eq!(one("18446744073709551615,").unwrap(), (Json::U64(u64::MAX), 20));
        assert_eq!(one("-9223372036854775808]").unwrap(), (Json::I64(i64::MIN), 20));
        for float in ["-0", "1.5", "1e3", "18446744073709551616", "-9223372036854775809"] {
            assert_eq!(one(float).unwrap().0, Json::Float, "{float}");
        }
        assert!(matches!(one(r#""plain" "#).unwrap(), (Json::Str(Cow::Borrowed("plain")), 7)));
        assert!(matches!(one(r#""\u00e9""#).unwrap().0, Json::Str(Cow::Owned(ref s)) if s == "\u{e9}"));
        assert_eq!(one(r#"{"a":[1,{"b":null}]}x"#).unwrap(), (Json::Object, 20));
        for bad in ["1e400", "01", "tru", r#""\ud800""#, "\"\u{1}\"", "[1,]", "", "1x"] {
            assert!(one(bad).is_err(), "{bad:?}");
        }
        assert!(Walk { b: b"\"\xff\"", i: 0 }.value::<2>().is_err());
    }

    #[test]
    fn nesting_counts_from_the_top_level_object() {
        let nest = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(one(&nest(126)).is_ok());
        assert!(one(&nest(127)).is_err());
    }

    #[test]
    fn plain_integers_and_what_is_left_to_serde() {
        for (text, want) in [("0,", Some(0)), ("123]", Some(123)), ("18446744073709551615", Some(u64::MAX))] {
            assert_eq!(Walk { b: text.as_bytes(), i: 0 }.plain_int(), want, "{text}");
        }
        for text in ["01", "1.5", "1e2", "-1", "18446744073709551616", "x", ""] {
            let mut w = Walk { b: text.as_bytes(), i: 0 };
            assert_eq!((w.plain_int(), w.i), (None, 0), "{text}");
        }
    }
}

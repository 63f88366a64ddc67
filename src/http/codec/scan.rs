//! A strict, single-pass JSON scanner for request bodies.
//!
//! It walks the top-level object, hands each key to the endpoint's parser,
//! and offers typed readers for the values the endpoints know (strings,
//! unsigned integers, integer arrays). Every other value is skipped, but
//! still checked for well-formedness, so a body is accepted only if it is
//! one valid JSON document: strings are UTF-8 with valid escapes and paired
//! surrogates, numbers follow the JSON grammar and fit an f64, nesting is at
//! most `NESTING_DEPTH_MAX`. No tree is built; keys and string values borrow
//! from the body unless they contain escapes.
//!
//! A typed reader that meets a value of another type skips that value and
//! says what it found; the endpoint records the problem and keeps scanning,
//! so a later syntax error still wins (see the module rules in `codec`).
//!
//! Integers are read eight digits at a time (SWAR): one unaligned 8-byte
//! load finds the run of digits and converts it with three multiplies.

use super::NESTING_DEPTH_MAX;
use std::borrow::Cow;

/// A syntax error: the byte offset where the body stopped being JSON, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Syntax {
    pub at: usize,
    pub what: &'static str,
}

impl Syntax {
    pub fn message(self) -> String {
        format!("malformed JSON at byte {}: {}", self.at, self.what)
    }
}

pub(super) type SResult<T> = Result<T, Syntax>;

/// A number as the JSON data model sees it, following serde_json: integers
/// in [-2^63, 2^64) are integers; everything else (a fraction, an exponent,
/// `-0`, a larger integer) is a float.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Num {
    Unsigned(u64),
    /// Always negative.
    Negative(i64),
    Float,
}

/// 10^n for n in 0..=8: the scale of an n-digit chunk.
const POW10: [u64; 9] = [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000];

/// Number of leading ASCII digits in the 8 bytes of `x` (little-endian, so
/// the first byte is the lowest).
#[inline(always)]
pub(super) fn digit_run(x: u64) -> usize {
    const HIGH: u64 = 0xF0F0_F0F0_F0F0_F0F0;
    const THREES: u64 = 0x3030_3030_3030_3030;
    // A byte is a digit iff its high nibble is 3 and stays 3 after adding 6.
    // Carries from a non-digit byte only corrupt later bytes, which are past
    // the first non-digit and so do not matter.
    let bad = ((x & HIGH) ^ THREES) | ((x.wrapping_add(0x0606_0606_0606_0606) & HIGH) ^ THREES);
    (bad.trailing_zeros() / 8) as usize
}

/// The value of the first `n` (1..=8) digits of `x`.
#[inline(always)]
pub(super) fn chunk_value(x: u64, n: usize) -> u64 {
    // Shift the digits to the top so the missing leading positions read as
    // zeros; bytes past the digits (and their borrows) are shifted out.
    let v = x.wrapping_sub(0x3030_3030_3030_3030) << (8 * (8 - n));
    let v = (v.wrapping_mul(10).wrapping_add(v >> 8)) & 0x00FF_00FF_00FF_00FF;
    let v = (v.wrapping_mul(100).wrapping_add(v >> 16)) & 0x0000_FFFF_0000_FFFF;
    (v.wrapping_mul(10_000).wrapping_add(v >> 32)) & 0xFFFF_FFFF
}

/// The scanner: a body and a cursor into it.
pub(super) struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scan<'a> {
    pub fn new(body: &'a [u8]) -> Self {
        Scan { b: body, i: 0 }
    }

    fn err<T>(&self, what: &'static str) -> SResult<T> {
        Err(Syntax { at: self.i, what })
    }

    #[inline(always)]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline(always)]
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.peek() {
            self.i += 1;
        }
    }

    /// Walks the top-level value. If it is an object, calls `field` with each
    /// key, the cursor on the member's value, which `field` must consume
    /// (with a reader or `skip`). Returns whether the top level was an object;
    /// any other well-formed value is skipped and gives `false`.
    pub fn top_object(&mut self, mut field: impl FnMut(&mut Self, Cow<'a, str>) -> SResult<()>) -> SResult<bool> {
        self.ws();
        match self.peek() {
            Some(b'{') => {}
            Some(_) => {
                self.skip_value(1)?;
                self.end()?;
                return Ok(false);
            }
            None => return self.err("empty body; expected a JSON object"),
        }
        self.i += 1;
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            self.end()?;
            return Ok(true);
        }
        loop {
            if self.peek() != Some(b'"') {
                return self.err("expected a string key in the object");
            }
            let key = self.string()?;
            self.ws();
            if self.peek() != Some(b':') {
                return self.err("expected ':' after the key");
            }
            self.i += 1;
            self.ws();
            field(self, key)?;
            self.ws();
            match self.peek() {
                Some(b',') => {
                    self.i += 1;
                    self.ws();
                }
                Some(b'}') => {
                    self.i += 1;
                    break;
                }
                _ => return self.err("expected ',' or '}' after a value in the object"),
            }
        }
        self.end()?;
        Ok(true)
    }

    /// Only whitespace may follow the top-level value.
    fn end(&mut self) -> SResult<()> {
        self.ws();
        if self.i == self.b.len() {
            Ok(())
        } else {
            self.err("unexpected bytes after the JSON value")
        }
    }

    /// Skips one member value of the top-level object.
    pub fn skip(&mut self) -> SResult<()> {
        self.skip_value(2)
    }

    /// Skips the value at the cursor; `level` is the nesting level it would
    /// open if it is an array or object.
    fn skip_value(&mut self, level: usize) -> SResult<()> {
        match self.peek() {
            Some(b'"') => {
                self.i += 1;
                self.string_body(None).map(|_| ())
            }
            Some(b'{') => self.skip_object(level),
            Some(b'[') => self.skip_array(level),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => self.number().map(|_| ()),
            Some(_) => self.err("expected a JSON value"),
            None => self.err("unexpected end of body; expected a value"),
        }
    }

    fn skip_array(&mut self, level: usize) -> SResult<()> {
        if level > NESTING_DEPTH_MAX {
            return self.err("arrays and objects nested too deep");
        }
        self.i += 1;
        self.ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(());
        }
        loop {
            self.skip_value(level + 1)?;
            self.ws();
            match self.peek() {
                Some(b',') => {
                    self.i += 1;
                    self.ws();
                }
                Some(b']') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return self.err("expected ',' or ']' after a value in an array"),
            }
        }
    }

    fn skip_object(&mut self, level: usize) -> SResult<()> {
        if level > NESTING_DEPTH_MAX {
            return self.err("arrays and objects nested too deep");
        }
        self.i += 1;
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(());
        }
        loop {
            if self.peek() != Some(b'"') {
                return self.err("expected a string key in an object");
            }
            self.i += 1;
            self.string_body(None)?;
            self.ws();
            if self.peek() != Some(b':') {
                return self.err("expected ':' after the key");
            }
            self.i += 1;
            self.ws();
            self.skip_value(level + 1)?;
            self.ws();
            match self.peek() {
                Some(b',') => {
                    self.i += 1;
                    self.ws();
                }
                Some(b'}') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return self.err("expected ',' or '}' after a value in an object"),
            }
        }
    }

    fn literal(&mut self, word: &'static [u8]) -> SResult<()> {
        if self.b.get(self.i..self.i + word.len()) == Some(word) {
            self.i += word.len();
            Ok(())
        } else {
            self.err("invalid literal; expected true, false or null")
        }
    }

    /// What the value at the cursor is, for "expected X, found Y" messages.
    fn found(&self) -> &'static str {
        match self.peek() {
            Some(b'"') => "a string",
            Some(b'{') => "an object",
            Some(b'[') => "an array",
            Some(b't' | b'f') => "a boolean",
            Some(b'n') => "null",
            _ => "a number",
        }
    }

    /// Reads a string value; anything else is skipped and described.
    pub fn read_str(&mut self) -> SResult<Result<Cow<'a, str>, String>> {
        if self.peek() == Some(b'"') {
            return self.string().map(Ok);
        }
        let found = self.found();
        self.skip()?;
        Ok(Err(found.to_string()))
    }

    /// Reads a string or null (None).
    pub fn read_opt_str(&mut self) -> SResult<Result<Option<Cow<'a, str>>, String>> {
        if self.peek() == Some(b'n') {
            self.literal(b"null")?;
            return Ok(Ok(None));
        }
        Ok(self.read_str()?.map(Some))
    }

    /// Reads a boolean or null (None); anything else is skipped and described.
    pub fn read_opt_bool(&mut self) -> SResult<Result<Option<bool>, String>> {
        match self.peek() {
            Some(b'n') => self.literal(b"null").map(|()| Ok(None)),
            Some(b't') => self.literal(b"true").map(|()| Ok(Some(true))),
            Some(b'f') => self.literal(b"false").map(|()| Ok(Some(false))),
            _ => {
                let found = self.found();
                self.skip()?;
                Ok(Err(found.to_string()))
            }
        }
    }

    /// The source text from `start` to the cursor, shortened, for messages.
    fn text(&self, start: usize) -> String {
        const SHOWN_BYTES_MAX: usize = 40;
        let raw = self.b.get(start..self.i).unwrap_or_default();
        let shown = &raw[..raw.len().min(SHOWN_BYTES_MAX)];
        let mut s = String::from_utf8_lossy(shown).into_owned();
        if raw.len() > SHOWN_BYTES_MAX {
            s.push_str("...");
        }
        s
    }

    /// Reads an array of integers, converting each with `conv` (None: not
    /// acceptable) and appending to `out`. Returns `Err((index, found))` for
    /// the first element refused (or index `usize::MAX` if the value is not
    /// an array); the rest of the value is still checked. Elements after a
    /// refused one are not appended.
    ///
    /// `prefix` may consume leading elements first (see `fast`): given the
    /// body, the first element's position and `out`, it returns how many it
    /// consumed and where the last one ended.
    #[inline]
    pub fn read_int_array<T>(
        &mut self,
        out: &mut Vec<T>,
        conv: impl Fn(Num) -> Option<T>,
        prefix: impl FnOnce(&'a [u8], usize, &mut Vec<T>) -> (usize, usize),
    ) -> SResult<Result<(), (usize, String)>> {
        if self.peek() != Some(b'[') {
            let found = self.found();
            self.skip()?;
            return Ok(Err((usize::MAX, found.to_string())));
        }
        self.i += 1;
        self.ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(Ok(()));
        }
        let mut refused: Option<(usize, String)> = None;
        let (mut index, end) = prefix(self.b, self.i, out);
        // After a consumed prefix, resume between elements.
        // After a consumed prefix, resume between elements.
        let mut between = index > 0;
        if between {
            self.i = end;
        }
        loop {
            if !between {
                let start = self.i;
                let value = match self.peek() {
                    Some(b'-' | b'0'..=b'9') => conv(self.number()?),
                    _ => {
                        // Member arrays are level 2, so their elements open level 3.
                        let found = self.found();
                        self.skip_value(3)?;
                        if refused.is_none() {
                            refused = Some((index, found.to_string()));
                        }
                        None
                    }
                };
                match value {
                    Some(v) if refused.is_none() => out.push(v),
                    Some(_) => {}
                    None => {
                        if refused.is_none() {
                            refused = Some((index, self.text(start)));
                        }
                    }
                }
                index += 1;
            }
            between = false;
            self.ws();
            match self.peek() {
                Some(b',') => {
                    self.i += 1;
                    self.ws();
                }
                Some(b']') => {
                    self.i += 1;
                    break;
                }
                _ => return self.err("expected ',' or ']' after a value in an array"),
            }
        }
        Ok(match refused {
            None => Ok(()),
            Some(r) => Err(r),
        })
    }

    /// Reads the digits at the cursor (at least one is there) as a u64;
    /// `true` if they overflowed it.
    #[inline(always)]
    fn digits(&mut self) -> (u64, bool) {
        let mut v: u64 = 0;
        let mut overflow = false;
        while let Some(chunk) = self.b.get(self.i..self.i + 8) {
            let x = match <[u8; 8]>::try_from(chunk) {
                Ok(a) => u64::from_le_bytes(a),
                Err(_) => break,
            };
            let n = digit_run(x);
            if n == 0 {
                return (v, overflow);
            }
            match v.checked_mul(POW10[n]).and_then(|m| m.checked_add(chunk_value(x, n))) {
                Some(m) => v = m,
                None => overflow = true,
            }
            self.i += n;
            if n < 8 {
                return (v, overflow);
            }
        }
        // Fewer than 8 bytes left in the body.
        while let Some(c @ b'0'..=b'9') = self.peek() {
            match v.checked_mul(10).and_then(|m| m.checked_add(u64::from(c - b'0'))) {
                Some(m) => v = m,
                None => overflow = true,
            }
            self.i += 1;
        }
        (v, overflow)
    }

    /// Reads a number (the cursor is on '-' or a digit).
    #[inline(always)]
    fn number(&mut self) -> SResult<Num> {
        let start = self.i;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.i += 1;
        }
        let (magnitude, overflow) = match self.peek() {
            Some(b'0') => {
                self.i += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return self.err("leading zero in a number");
                }
                (0, false)
            }
            Some(b'1'..=b'9') => self.digits(),
            _ => return self.err("expected a digit in the number"),
        };
        match self.peek() {
            Some(b'.' | b'e' | b'E') => {}
            _ if !overflow => {
                if !negative {
                    return Ok(Num::Unsigned(magnitude));
                }
                if magnitude != 0 && magnitude <= 1 << 63 {
                    // 2^63 wraps to i64::MIN, which is exactly -2^63.
                    return Ok(Num::Negative((magnitude as i64).wrapping_neg()));
                }
            }
            _ => {}
        }
        self.float_tail(start)
    }

    /// Finishes a number that is a float to the JSON data model: its
    /// fraction and exponent, then refuses it if an f64 cannot hold it.
    #[cold]
    fn float_tail(&mut self, start: usize) -> SResult<Num> {
        if self.peek() == Some(b'.') {
            self.i += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return self.err("expected a digit after the decimal point");
            }
            while let Some(b'0'..=b'9') = self.peek() {
                self.i += 1;
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return self.err("expected a digit in the exponent");
            }
            while let Some(b'0'..=b'9') = self.peek() {
                self.i += 1;
            }
        }
        // The text is ASCII JSON number syntax, which Rust's float parser accepts.
        let finite = std::str::from_utf8(self.b.get(start..self.i).unwrap_or_default())
            .ok()
            .and_then(|t| t.parse::<f64>().ok())
            .is_some_and(f64::is_finite);
        if !finite {
            return Err(Syntax { at: start, what: "number out of range" });
        }
        Ok(Num::Float)
    }

    /// Reads a string (the cursor is on its opening quote), decoding escapes.
    /// Borrows from the body unless the string has escapes.
    pub fn string(&mut self) -> SResult<Cow<'a, str>> {
        self.i += 1;
        let start = self.i;
        // Fast path: printable ASCII without escapes.
        while let Some(&c) = self.b.get(self.i) {
            match c {
                b'"' => {
                    let raw = self.b.get(start..self.i).unwrap_or_default();
                    self.i += 1;
                    return match std::str::from_utf8(raw) {
                        Ok(s) => Ok(Cow::Borrowed(s)),
                        Err(_) => Err(Syntax { at: start, what: "invalid UTF-8 in a string" }),
                    };
                }
                0x20..=0x7f if c != b'\\' => self.i += 1,
                _ => break,
            }
        }
        self.i = start;
        let mut decoded = Vec::new();
        let escaped = self.string_body(Some(&mut decoded))?;
        if !escaped {
            // Validated by string_body; borrow rather than keep the copy.
            let raw = self.b.get(start..self.i - 1).unwrap_or_default();
            if let Ok(s) = std::str::from_utf8(raw) {
                return Ok(Cow::Borrowed(s));
            }
        }
        match String::from_utf8(decoded) {
            Ok(s) => Ok(Cow::Owned(s)),
            Err(_) => Err(Syntax { at: start, what: "invalid UTF-8 in a string" }),
        }
    }

    /// Checks (and with `out`, decodes) a string from just after its opening
    /// quote through its closing quote. Returns whether it had escapes.
    fn string_body(&mut self, mut out: Option<&mut Vec<u8>>) -> SResult<bool> {
        let mut segment = self.i;
        let mut segment_ascii = true;
        let mut escaped = false;
        loop {
            let Some(&c) = self.b.get(self.i) else {
                return self.err("unterminated string");
            };
            match c {
                b'"' => {
                    self.flush(segment, segment_ascii, &mut out)?;
                    self.i += 1;
                    return Ok(escaped);
                }
                b'\\' => {
                    self.flush(segment, segment_ascii, &mut out)?;
                    escaped = true;
                    self.i += 1;
                    self.escape(&mut out)?;
                    segment = self.i;
                    segment_ascii = true;
                }
                0x00..=0x1f => return self.err("control character in a string; escape it"),
                0x80..=0xff => {
                    segment_ascii = false;
                    self.i += 1;
                }
                _ => self.i += 1,
            }
        }
    }

    /// Ends a run of raw string bytes at the cursor: checks it is UTF-8 (an
    /// escape is ASCII, so it never splits a UTF-8 sequence) and copies it.
    fn flush(&self, from: usize, ascii: bool, out: &mut Option<&mut Vec<u8>>) -> SResult<()> {
        let raw = self.b.get(from..self.i).unwrap_or_default();
        if !ascii && std::str::from_utf8(raw).is_err() {
            return Err(Syntax { at: from, what: "invalid UTF-8 in a string" });
        }
        if let Some(o) = out {
            o.extend_from_slice(raw);
        }
        Ok(())
    }

    /// Decodes the escape after a backslash.
    fn escape(&mut self, out: &mut Option<&mut Vec<u8>>) -> SResult<()> {
        let Some(c) = self.peek() else {
            return self.err("unterminated string");
        };
        let byte = match c {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                self.i += 1;
                let ch = self.unicode_escape()?;
                if let Some(o) = out {
                    let mut buf = [0u8; 4];
                    o.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                return Ok(());
            }
            _ => return self.err("invalid escape in a string"),
        };
        self.i += 1;
        if let Some(o) = out {
            o.push(byte);
        }
        Ok(())
    }

    /// Decodes `XXXX` after `\u`, and a second `\uXXXX` if the first is a
    /// high surrogate. Unpaired surrogates are refused: they are not text.
    fn unicode_escape(&mut self) -> SResult<char> {
        let first = self.hex4()?;
        let code = match first {
            0xDC00..=0xDFFF => return self.err("unpaired surrogate in a \\u escape"),
            0xD800..=0xDBFF => {
                if self.b.get(self.i..self.i + 2) != Some(b"\\u") {
                    return self.err("unpaired surrogate in a \\u escape");
                }
                self.i += 2;
                let second = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return self.err("unpaired surrogate in a \\u escape");
                }
                0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
            }
            _ => first,
        };
        match char::from_u32(code) {
            Some(ch) => Ok(ch),
            None => self.err("invalid \\u escape"),
        }
    }

    fn hex4(&mut self) -> SResult<u32> {
        let mut v = 0u32;
        for _ in 0..4 {
            let d = match self.peek() {
                Some(c @ b'0'..=b'9') => c - b'0',
                Some(c @ b'a'..=b'f') => c - b'a' + 10,
                Some(c @ b'A'..=b'F') => c - b'A' + 10,
                _ => return self.err("expected four hex digits in a \\u escape"),
            };
            v = v << 4 | u32::from(d);
            self.i += 1;
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(text: &str) -> SResult<Num> {
        let mut s = Scan::new(text.as_bytes());
        let n = s.number()?;
        assert_eq!(s.i, text.len(), "{text} not fully consumed");
        Ok(n)
    }

    #[test]
    fn swar_digit_runs_and_values() {
        for text in ["1", "12", "123", "1234567", "12345678", "9", "40000000", "00000001"] {
            let mut bytes = text.as_bytes().to_vec();
            bytes.resize(8, b',');
            let x = u64::from_le_bytes(bytes.try_into().unwrap());
            let n = digit_run(x);
            assert_eq!(n, text.len());
            assert_eq!(chunk_value(x, n), text.parse::<u64>().unwrap());
        }
        // Bytes next to '0' and '9' in ASCII, and high bytes, are not digits.
        for stop in [b'/', b':', 0xff, 0xfa, 0x00, b' ', b']'] {
            let x = u64::from_le_bytes([b'7', b'7', stop, b'1', b'1', b'1', b'1', b'1']);
            assert_eq!(digit_run(x), 2, "stop byte {stop:#x}");
        }
    }

    #[test]
    fn numbers_follow_the_json_data_model() {
        assert_eq!(num("0"), Ok(Num::Unsigned(0)));
        assert_eq!(num("4294967295"), Ok(Num::Unsigned(4294967295)));
        assert_eq!(num("18446744073709551615"), Ok(Num::Unsigned(u64::MAX)));
        assert_eq!(num("18446744073709551616"), Ok(Num::Float));
        assert_eq!(num("-1"), Ok(Num::Negative(-1)));
        assert_eq!(num("-9223372036854775808"), Ok(Num::Negative(i64::MIN)));
        assert_eq!(num("-9223372036854775809"), Ok(Num::Float));
        assert_eq!(num("-0"), Ok(Num::Float));
        assert_eq!(num("1.5"), Ok(Num::Float));
        assert_eq!(num("1e3"), Ok(Num::Float));
        assert_eq!(num("1E+3"), Ok(Num::Float));
        assert_eq!(num("0.0e-999"), Ok(Num::Float));
        assert_eq!(num("1e308"), Ok(Num::Float));
        assert!(num("1e309").is_err());
        assert!(num(&"9".repeat(400)).is_err());
        for bad in ["01", "-", "-a", "1.", "1.e3", "1e", "1e+", "-01"] {
            let mut s = Scan::new(bad.as_bytes());
            let r = s.number();
            assert!(r.is_err() || s.i < bad.len(), "{bad} accepted");
        }
    }

    #[test]
    fn strings_decode_escapes_and_borrow_when_plain() {
        let mut s = Scan::new(br#""plain""#);
        assert!(matches!(s.string(), Ok(Cow::Borrowed("plain"))));
        let mut s = Scan::new("\"caf\u{e9}\"".as_bytes());
        assert!(matches!(s.string(), Ok(Cow::Borrowed("caf\u{e9}"))));
        let mut s = Scan::new(br#""a\"b\\c\/d\b\f\n\r\t\u00e9\ud83e\udd80""#);
        assert_eq!(s.string().unwrap(), "a\"b\\c/d\u{8}\u{c}\n\r\t\u{e9}\u{1f980}");
        for bad in [
            &br#""\ud800""#[..],
            br#""\udc00""#,
            br#""\ud800\u0041""#,
            br#""\x""#,
            br#""\u12""#,
            b"\"a\x01\"",
            b"\"\xff\"",
            b"\"\xc3\"",
            b"\"abc",
        ] {
            let mut s = Scan::new(bad);
            assert!(s.string().is_err(), "{:?} accepted", String::from_utf8_lossy(bad));
        }
    }
}

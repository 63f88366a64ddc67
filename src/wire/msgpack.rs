//! A bounded msgpack pull reader over one payload slice.
//!
//! Engines encode with msgspec, whose choice of header width (fixmap or
//! map16, uint8 or uint64, ...) depends on the value, so every reader here is
//! generic over widths. The reader classifies markers with `rmp::Marker` and
//! reads everything else straight from the slice: nothing is copied or
//! allocated, strings and binaries are borrowed from the payload.
//!
//! Untrusted lengths are checked before use: an array header may not claim
//! more elements than there are bytes left (every element takes at least one
//! byte), a map header not more than half of them, and a string or binary
//! not more bytes than remain. Skipping nested values stops at
//! [`DEPTH_MAX`] levels, so a hostile payload cannot exhaust the stack.

use rmp::Marker;

use super::error::WireError;

/// Deepest nesting of arrays and maps skipped inside an unknown value.
/// Engine events nest at most four levels (batch, events, event, extra keys).
pub const DEPTH_MAX: usize = 32;

/// One msgpack item: a scalar, or the header of a container whose elements follow.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Item<'a> {
    Nil,
    Bool(bool),
    /// Any unsigned encoding (positive fixint, uint8 to uint64).
    Uint(u64),
    /// Any signed encoding (negative fixint, int8 to int64); may be non-negative.
    Int(i64),
    Float(f64),
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Array(u32),
    Map(u32),
    Ext,
}

impl Item<'_> {
    /// The msgpack type name, for error messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Item::Nil => "nil",
            Item::Bool(_) => "bool",
            Item::Uint(_) | Item::Int(_) => "int",
            Item::Float(_) => "float",
            Item::Str(_) => "str",
            Item::Bin(_) => "bin",
            Item::Array(_) => "array",
            Item::Map(_) => "map",
            Item::Ext => "ext",
        }
    }
}

/// A cursor over a msgpack payload.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Offset of the next unread byte.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Goes back to `pos`, an offset this reader already passed (to skip a
    /// value whose decoding failed halfway).
    pub(crate) fn rewind(&mut self, pos: usize) {
        debug_assert!(pos <= self.pos, "rewind forward from {} to {pos}", self.pos);
        self.pos = pos.min(self.pos);
    }

    /// A second reader over the same bytes, at this one's offset.
    pub(crate) fn fork(&self) -> Reader<'a> {
        Reader { buf: self.buf, pos: self.pos }
    }

    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// An error at the current offset.
    pub(crate) fn error(&self, message: impl Into<String>) -> WireError {
        WireError::at(self.pos, message)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.remaining() {
            return Err(self.error(format!("truncated: needs {n} more bytes, {} left", self.remaining())));
        }
        let bytes = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// A length of `width` bytes, big-endian.
    fn len(&mut self, width: usize) -> Result<usize, WireError> {
        let len = self.take(width)?.iter().fold(0u64, |acc, &b| acc << 8 | u64::from(b));
        usize::try_from(len).map_err(|_| self.error("length does not fit this platform"))
    }

    /// A string or binary whose length takes `width` bytes.
    fn sized(&mut self, width: usize) -> Result<&'a [u8], WireError> {
        let n = self.len(width)?;
        self.take(n)
    }

    /// A container header of `len` elements taking `per_element` items each.
    fn container(&mut self, len: usize, per_element: usize) -> Result<u32, WireError> {
        // Every element takes at least one byte: a longer claim is a lie.
        if len.saturating_mul(per_element) > self.remaining() {
            return Err(
                self.error(format!("container claims {len} elements but only {} bytes remain", self.remaining()))
            );
        }
        u32::try_from(len).map_err(|_| self.error("container length over u32"))
    }

    /// Reads the next item; for a container, only its header.
    pub(crate) fn next(&mut self) -> Result<Item<'a>, WireError> {
        let start = self.pos;
        let byte = self.be::<1>()?[0];
        let item = match Marker::from_u8(byte) {
            Marker::FixPos(v) => Item::Uint(u64::from(v)),
            Marker::FixNeg(v) => Item::Int(i64::from(v)),
            Marker::Null => Item::Nil,
            Marker::False => Item::Bool(false),
            Marker::True => Item::Bool(true),
            Marker::U8 => Item::Uint(u64::from(self.be::<1>()?[0])),
            Marker::U16 => Item::Uint(u64::from(u16::from_be_bytes(self.be()?))),
            Marker::U32 => Item::Uint(u64::from(u32::from_be_bytes(self.be()?))),
            Marker::U64 => Item::Uint(u64::from_be_bytes(self.be()?)),
            Marker::I8 => Item::Int(i64::from(i8::from_be_bytes(self.be()?))),
            Marker::I16 => Item::Int(i64::from(i16::from_be_bytes(self.be()?))),
            Marker::I32 => Item::Int(i64::from(i32::from_be_bytes(self.be()?))),
            Marker::I64 => Item::Int(i64::from_be_bytes(self.be()?)),
            Marker::F32 => Item::Float(f64::from(f32::from_be_bytes(self.be()?))),
            Marker::F64 => Item::Float(f64::from_be_bytes(self.be()?)),
            Marker::FixStr(n) => Item::Str(self.take(usize::from(n))?),
            Marker::Str8 => Item::Str(self.sized(1)?),
            Marker::Str16 => Item::Str(self.sized(2)?),
            Marker::Str32 => Item::Str(self.sized(4)?),
            Marker::Bin8 => Item::Bin(self.sized(1)?),
            Marker::Bin16 => Item::Bin(self.sized(2)?),
            Marker::Bin32 => Item::Bin(self.sized(4)?),
            Marker::FixArray(n) => Item::Array(self.container(usize::from(n), 1)?),
            Marker::Array16 => Item::Array(self.len(2).and_then(|n| self.container(n, 1))?),
            Marker::Array32 => Item::Array(self.len(4).and_then(|n| self.container(n, 1))?),
            Marker::FixMap(n) => Item::Map(self.container(usize::from(n), 2)?),
            Marker::Map16 => Item::Map(self.len(2).and_then(|n| self.container(n, 2))?),
            Marker::Map32 => Item::Map(self.len(4).and_then(|n| self.container(n, 2))?),
            // One type byte, then the data.
            Marker::FixExt1 => self.ext(1)?,
            Marker::FixExt2 => self.ext(2)?,
            Marker::FixExt4 => self.ext(4)?,
            Marker::FixExt8 => self.ext(8)?,
            Marker::FixExt16 => self.ext(16)?,
            Marker::Ext8 => self.len(1).and_then(|n| self.ext(n))?,
            Marker::Ext16 => self.len(2).and_then(|n| self.ext(n))?,
            Marker::Ext32 => self.len(4).and_then(|n| self.ext(n))?,
            Marker::Reserved => return Err(WireError::at(start, "reserved msgpack marker 0xc1")),
        };
        Ok(item)
    }

    fn ext(&mut self, data_len: usize) -> Result<Item<'a>, WireError> {
        self.take(data_len.saturating_add(1))?;
        Ok(Item::Ext)
    }

    /// The next item's bytes if it is a string of at most 255 bytes (a map
    /// key, almost always), advancing past it; None, not advancing, for
    /// anything else, so the caller falls back to [`Self::next`]. Read
    /// straight from the buffer: no [`Item`] passes through memory.
    #[inline]
    pub(crate) fn short_str_fast(&mut self) -> Option<&'a [u8]> {
        let rest = &self.buf[self.pos..];
        let (head, len) = match *rest.first()? {
            b @ 0xa0..=0xbf => (1, usize::from(b & 0x1f)),
            0xd9 => (2, usize::from(*rest.get(1)?)),
            _ => return None,
        };
        let bytes = rest.get(head..head + len)?;
        self.pos += head + len;
        Some(bytes)
    }

    /// Reads an unsigned integer if the next item is one, without the
    /// general dispatch; leaves the cursor alone (None) for anything else,
    /// including truncated input, so the caller falls back to [`Self::next`].
    /// Token and hash arrays are almost all such integers.
    #[inline]
    pub(crate) fn uint_fast(&mut self) -> Option<u64> {
        let rest = &self.buf[self.pos..];
        let (value, used) = match *rest.first()? {
            b @ 0x00..=0x7f => (u64::from(b), 1),
            0xcc => (u64::from(*rest.get(1)?), 2),
            0xcd => (u64::from(u16::from_be_bytes(rest.get(1..3)?.try_into().ok()?)), 3),
            0xce => (u64::from(u32::from_be_bytes(rest.get(1..5)?.try_into().ok()?)), 5),
            0xcf => (u64::from_be_bytes(rest.get(1..9)?.try_into().ok()?), 9),
            _ => return None,
        };
        self.pos += used;
        Some(value)
    }

    /// Appends up to `count` unsigned integers that fit in u32 to `out`,
    /// stopping (cursor on it) at the first item that is anything else.
    /// Returns how many were read. This is the hot loop of token decoding.
    pub(crate) fn u32s_fast(&mut self, count: usize, out: &mut Vec<u32>) -> usize {
        let buf = self.buf;
        let mut pos = self.pos;
        let mut done = 0;
        while done < count {
            let Some(&marker) = buf.get(pos) else { break };
            let (value, used) = match marker {
                0x00..=0x7f => (u32::from(marker), 1),
                0xcc => match buf.get(pos + 1) {
                    Some(&b) => (u32::from(b), 2),
                    None => break,
                },
                0xcd => match buf.get(pos + 1..pos + 3) {
                    Some(b) => (u32::from(u16::from_be_bytes([b[0], b[1]])), 3),
                    None => break,
                },
                0xce => match buf.get(pos + 1..pos + 5) {
                    Some(b) => (u32::from_be_bytes([b[0], b[1], b[2], b[3]]), 5),
                    None => break,
                },
                _ => break,
            };
            out.push(value);
            pos += used;
            done += 1;
        }
        self.pos = pos;
        done
    }

    /// Skips one whole value of any type, nested at most [`DEPTH_MAX`] deep.
    pub(crate) fn skip(&mut self) -> Result<(), WireError> {
        self.skip_at(0)
    }

    fn skip_at(&mut self, depth: usize) -> Result<(), WireError> {
        let item = self.next()?;
        self.skip_children(item, depth)
    }

    /// Skips the elements of `item` if it is a container header just read.
    pub(crate) fn skip_children(&mut self, item: Item<'a>, depth: usize) -> Result<(), WireError> {
        let children = match item {
            Item::Array(n) => u64::from(n),
            Item::Map(n) => 2 * u64::from(n),
            _ => return Ok(()),
        };
        if depth >= DEPTH_MAX {
            return Err(self.error(format!("nesting deeper than {DEPTH_MAX} levels")));
        }
        for _ in 0..children {
            self.skip_at(depth + 1)?;
        }
        Ok(())
    }

    /// Reads an array header; `what` names the field for the error message.
    pub(crate) fn array(&mut self, what: &str) -> Result<u32, WireError> {
        let start = self.pos;
        match self.next()? {
            Item::Array(n) => Ok(n),
            other => Err(WireError::at(start, format!("{what}: expected an array, found {}", other.kind()))),
        }
    }

    /// Reads an array header or nil (None).
    pub(crate) fn array_or_nil(&mut self, what: &str) -> Result<Option<u32>, WireError> {
        let start = self.pos;
        match self.next()? {
            Item::Array(n) => Ok(Some(n)),
            Item::Nil => Ok(None),
            other => Err(WireError::at(start, format!("{what}: expected an array or nil, found {}", other.kind()))),
        }
    }

    /// Reads a UTF-8 string or nil, at most `len_max` bytes long.
    pub(crate) fn str_or_nil(&mut self, what: &str, len_max: usize) -> Result<Option<&'a str>, WireError> {
        let start = self.pos;
        match self.next()? {
            Item::Nil => Ok(None),
            Item::Str(bytes) => Ok(Some(self.utf8(start, what, bytes, len_max)?)),
            other => Err(WireError::at(start, format!("{what}: expected a string or nil, found {}", other.kind()))),
        }
    }

    /// Checks that `bytes` (read at `start`) is UTF-8 of at most `len_max` bytes.
    pub(crate) fn utf8(&self, start: usize, what: &str, bytes: &'a [u8], len_max: usize) -> Result<&'a str, WireError> {
        if bytes.len() > len_max {
            return Err(WireError::at(start, format!("{what}: string of {} bytes, limit {len_max}", bytes.len())));
        }
        std::str::from_utf8(bytes).map_err(|_| WireError::at(start, format!("{what}: string is not UTF-8")))
    }

    /// Reads a non-negative integer of any width that fits in u32.
    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, WireError> {
        let start = self.pos;
        let item = self.next()?;
        u32_at(start, item, what)
    }

    /// Reads a non-negative integer of any width that fits in u32, or nil.
    pub(crate) fn u32_or_nil(&mut self, what: &str) -> Result<Option<u32>, WireError> {
        let start = self.pos;
        match self.next()? {
            Item::Nil => Ok(None),
            item => u32_at(start, item, what).map(Some),
        }
    }
}

/// `item`, read at `start`, as a non-negative integer that fits in u32.
pub(crate) fn u32_at(start: usize, item: Item<'_>, what: &str) -> Result<u32, WireError> {
    let value = match item {
        Item::Uint(v) => u32::try_from(v).ok(),
        Item::Int(v) => u32::try_from(v).ok(),
        _ => None,
    };
    value.ok_or_else(|| {
        let found = match item {
            Item::Uint(v) => v.to_string(),
            Item::Int(v) => v.to_string(),
            other => other.kind().to_string(),
        };
        WireError::at(start, format!("{what}: expected an integer in 0..=u32::MAX, found {found}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(bytes: &[u8]) -> Result<Vec<Item<'_>>, WireError> {
        let mut r = Reader::new(bytes);
        let mut out = Vec::new();
        while r.remaining() > 0 {
            out.push(r.next()?);
        }
        Ok(out)
    }

    #[test]
    fn integers_of_every_width() {
        let bytes = [
            0x05, // fixint
            0xe0, // negative fixint -32
            0xcc, 0xff, // uint8
            0xcd, 0x01, 0x00, // uint16
            0xce, 0x00, 0x01, 0x00, 0x00, // uint32
            0xcf, 0xf0, 0, 0, 0, 0, 0, 0, 0x01, // uint64 >= 2^63
            0xd0, 0x80, // int8 -128
            0xd1, 0x80, 0x00, // int16
            0xd2, 0x80, 0, 0, 0, // int32
            0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0, // int64 min
        ];
        assert_eq!(
            items(&bytes).unwrap(),
            vec![
                Item::Uint(5),
                Item::Int(-32),
                Item::Uint(255),
                Item::Uint(256),
                Item::Uint(65536),
                Item::Uint(0xf000_0000_0000_0001),
                Item::Int(-128),
                Item::Int(-32768),
                Item::Int(i64::from(i32::MIN)),
                Item::Int(i64::MIN),
            ]
        );
    }

    #[test]
    fn floats_strings_binaries_and_headers() {
        let mut bytes = vec![0xca];
        bytes.extend(1.5f32.to_be_bytes());
        bytes.push(0xcb);
        bytes.extend(2.25f64.to_be_bytes());
        bytes.extend([0xa2, b'h', b'i', 0xd9, 1, b'x', 0xda, 0, 1, b'y', 0xdb, 0, 0, 0, 1, b'z']);
        bytes.extend([0xc4, 2, 7, 8, 0xc5, 0, 1, 9, 0xc6, 0, 0, 0, 0]);
        bytes.extend([0x91, 0xc0, 0xdc, 0, 1, 0xc2, 0xdd, 0, 0, 0, 1, 0xc3]);
        bytes.extend([0x81, 0xc0, 0xc0, 0xde, 0, 1, 0xc0, 0xc0, 0xdf, 0, 0, 0, 1, 0xc0, 0xc0]);
        let got = items(&bytes).unwrap();
        assert_eq!(got[0], Item::Float(1.5));
        assert_eq!(got[1], Item::Float(2.25));
        assert_eq!(&got[2..6], &[Item::Str(b"hi"), Item::Str(b"x"), Item::Str(b"y"), Item::Str(b"z")]);
        assert_eq!(&got[6..9], &[Item::Bin(&[7, 8]), Item::Bin(&[9]), Item::Bin(&[])]);
        assert_eq!(got[9], Item::Array(1));
        assert_eq!(got[11], Item::Array(1));
        assert_eq!(got[13], Item::Array(1));
        assert_eq!(got[15], Item::Map(1));
        assert_eq!(got[18], Item::Map(1));
        assert_eq!(got[21], Item::Map(1));
    }

    #[test]
    fn lengths_beyond_the_payload_are_rejected_before_use() {
        // array32 claiming 4 billion elements, map16 claiming 100 pairs, str32 claiming 1 GB
        for bytes in [
            &[0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0][..],
            &[0xde, 0x00, 0x64, 0xc0, 0xc0],
            &[0xdb, 0x40, 0, 0, 0, b'a'],
            &[0xc6, 0xff, 0xff, 0xff, 0xff],
            &[0xc9, 0xff, 0xff, 0xff, 0xff, 1],
        ] {
            let err = Reader::new(bytes).next().unwrap_err();
            assert!(err.to_string().contains("at byte"), "{err}");
        }
    }

    #[test]
    fn truncated_scalars_and_reserved_marker_fail() {
        for bytes in [&[0xcf, 0, 0][..], &[0xcb, 1], &[0xd3], &[0xc1], &[]] {
            assert!(Reader::new(bytes).next().is_err(), "{bytes:?}");
        }
    }

    #[test]
    fn uint_fast_agrees_with_next_and_leaves_other_items() {
        let bytes = [0x05, 0xcc, 0xff, 0xcd, 1, 0, 0xce, 0, 1, 0, 0, 0xcf, 0xff, 0, 0, 0, 0, 0, 0, 1];
        let mut fast = Reader::new(&bytes);
        let mut slow = Reader::new(&bytes);
        while slow.remaining() > 0 {
            let Item::Uint(v) = slow.next().unwrap() else { panic!() };
            assert_eq!(fast.uint_fast(), Some(v));
            assert_eq!(fast.pos(), slow.pos());
        }
        let mut tokens = Vec::new();
        let mut r = Reader::new(&bytes);
        assert_eq!(r.u32s_fast(10, &mut tokens), 4, "stops at the uint64");
        assert_eq!(tokens, vec![5, 255, 256, 65536]);
        assert_eq!(r.pos(), 11);
        assert_eq!(Reader::new(&bytes).u32s_fast(2, &mut tokens), 2, "stops at the count");
        for other in [&[0xd0, 0x80][..], &[0xc0], &[0xcd, 1], &[0xcf, 0, 0], &[]] {
            assert_eq!(Reader::new(other).u32s_fast(1, &mut tokens), 0);
            let mut r = Reader::new(other);
            assert_eq!(r.uint_fast(), None);
            assert_eq!(r.pos(), 0);
        }
    }

    #[test]
    fn short_str_fast_agrees_with_next_and_leaves_other_items() {
        let long = [&[0xd9, 40][..], &[b'x'; 40]].concat();
        let bytes = [&[0xa0][..], &[0xa3, b'G', b'P', b'U'], &long].concat();
        let (mut fast, mut slow) = (Reader::new(&bytes), Reader::new(&bytes));
        while slow.remaining() > 0 {
            let Item::Str(v) = slow.next().unwrap() else { panic!() };
            assert_eq!(fast.short_str_fast(), Some(v));
            assert_eq!(fast.pos(), slow.pos());
        }
        // Other items, longer headers and truncated strings: not taken, not advanced.
        for other in [&[0xda, 0, 1, b'a'][..], &[0xc0], &[0x91, 0xa0], &[0xa3, b'G'], &[0xd9], &[0xd9, 2, b'a'], &[]] {
            let mut r = Reader::new(other);
            assert_eq!(r.short_str_fast(), None, "{other:?}");
            assert_eq!(r.pos(), 0);
        }
    }

    #[test]
    fn u32s_fast_reads_what_it_should_at_every_cut() {
        // Items of every width the fast path takes, and others, cut at every length.
        let mut rng = 0x9E37_79B9_7F4A_7C15_u64;
        for _ in 0..300 {
            // Each item's bytes, and its value if the fast path takes it.
            let mut items: Vec<(Vec<u8>, Option<u32>)> = Vec::new();
            for _ in 0..12 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let v = (rng >> 8) as u32;
                items.push(match rng % 7 {
                    0 => (vec![(v & 0x7f) as u8], Some(v & 0x7f)),
                    1 => (vec![0xcc, v as u8], Some(v & 0xff)),
                    2 => (vec![0xcd, (v >> 8) as u8, v as u8], Some(v & 0xffff)),
                    3 | 4 => ([&[0xce][..], &v.to_be_bytes()].concat(), Some(v)),
                    5 => (vec![0xcf, 0, 0, 0, 0, 0, 0, 0, 1], None),
                    _ => (vec![0xd0, 0x80], None),
                });
            }
            let bytes = items.iter().flat_map(|(b, _)| b.clone()).collect::<Vec<u8>>();
            for cut in 0..=bytes.len() {
                let part = &bytes[..cut];
                // The whole items before the cut, up to the first the fast path leaves.
                let (mut want, mut end) = (Vec::new(), 0);
                for (b, v) in &items {
                    match v {
                        Some(v) if end + b.len() <= cut => want.push(*v),
                        _ => break,
                    }
                    end += b.len();
                }
                for count in [want.len(), want.len() + 3, 1] {
                    let mut r = Reader::new(part);
                    let mut got = vec![7];
                    let n = r.u32s_fast(count, &mut got);
                    let k = count.min(want.len());
                    assert_eq!((n, &got[1..]), (k, &want[..k]), "{part:x?} count {count}");
                    let at: usize = items[..k].iter().map(|(b, _)| b.len()).sum();
                    assert_eq!(r.pos(), at, "cursor after {k} values of {part:x?}");
                }
            }
        }
    }

    #[test]
    fn skip_passes_over_nested_values_and_ext() {
        // [ {"a": [1, ext]}, "s" ] then 7
        let bytes = [0x92, 0x81, 0xa1, b'a', 0x92, 0x01, 0xd4, 0x01, 0xff, 0xa1, b's', 0x07];
        let mut r = Reader::new(&bytes);
        r.skip().unwrap();
        assert_eq!(r.next().unwrap(), Item::Uint(7));
    }

    #[test]
    fn skip_stops_at_the_depth_limit() {
        let mut bytes = vec![0x91; DEPTH_MAX + 1];
        bytes.push(0xc0);
        assert!(Reader::new(&bytes).skip().is_err());
        let mut ok = vec![0x91; DEPTH_MAX];
        ok.push(0xc0);
        assert!(Reader::new(&ok).skip().is_ok());
    }
}

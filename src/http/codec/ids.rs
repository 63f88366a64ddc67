//! The id arrays of the hot bodies, straight into the caller's buffer.
//!
//! Elements are read one by one (`read_ids`): a plain integer by hand,
//! anything else through serde_json (`Walk::value`), so what is accepted
//! and refused is serde_json's. Token arrays of the common shape,
//! `[12, 345,6, ...`, first go through a fast path (`plain_prefix`): the
//! array is classified 64 bytes at a time into bit masks (digits, commas,
//! zeros, everything else); a window runs up to its last comma, and if its
//! bytes are only digits, spaces and commas, numbers and commas alternate,
//! and every number has 1-7 digits and no leading zero, its numbers are
//! located from the masks and converted several at a time (SSE4.1 where
//! the CPU has it). At the first window it does not take, the element loop
//! goes on from the last comma taken.

use super::json::{Json, Syntax, Walk};

/// An id type: what an element may be, and how a run of them is read fast.
pub(super) trait Id: Copy + Default {
    const FIELD: &'static str;
    const RANGE: &'static str;
    fn of(v: &Json) -> Option<Self>;
    /// Consumes leading elements of the common shape at `at` (see
    /// `plain_prefix`): how many, and the position after the last.
    fn fast(_b: &[u8], at: usize, _out: &mut Vec<Self>) -> (usize, usize) {
        (0, at)
    }
}

impl Id for u32 {
    const FIELD: &'static str = "token_ids";
    const RANGE: &'static str = "integers in 0..=4294967295";
    fn of(v: &Json) -> Option<u32> {
        match *v {
            Json::U64(v) => u32::try_from(v).ok(),
            _ => None,
        }
    }
    fn fast(b: &[u8], at: usize, out: &mut Vec<u32>) -> (usize, usize) {
        plain_prefix(b, at, out)
    }
}

impl Id for u64 {
    const FIELD: &'static str = "block_hashes";
    const RANGE: &'static str = "integers in [-2^63, 2^64)";
    fn of(v: &Json) -> Option<u64> {
        match *v {
            Json::U64(v) => Some(v),
            // Two's complement, as an engine's signed hash.
            Json::I64(v) => Some(v as u64),
            _ => None,
        }
    }
}

/// Reads the array at the cursor (on `[`), appending its elements to `out`.
/// `Ok(Err(message))` names the first element refused (no later element is
/// appended); the rest of the array is still checked.
pub(super) fn read_ids<T: Id>(w: &mut Walk<'_>, out: &mut Vec<T>) -> Result<Result<(), String>, Syntax> {
    w.i += 1;
    w.ws();
    if w.peek() == Some(b']') {
        w.i += 1;
        return Ok(Ok(()));
    }
    let (mut index, end) = T::fast(w.b, w.i, out);
    let mut after_value = index > 0;
    if after_value {
        w.i = end;
    }
    let mut refused = None;
    loop {
        if !after_value {
            let start = w.i;
            // Member arrays are level 2, so their elements open level 3.
            let v = match w.plain_int() {
                Some(v) => Json::U64(v),
                None => w.value::<3>()?,
            };
            match T::of(&v) {
                Some(id) if refused.is_none() => out.push(id),
                Some(_) => {}
                None if refused.is_none() => {
                    let found = match v {
                        Json::U64(_) | Json::I64(_) | Json::Float => w.text(start),
                        _ => v.kind().to_string(),
                    };
                    refused = Some(format!("`{}[{index}]` must be one of {}, found {found}", T::FIELD, T::RANGE));
                }
                None => {}
            }
            index += 1;
        }
        after_value = false;
        w.ws();
        match w.peek() {
            Some(b',') => {
                w.i += 1;
                w.ws();
            }
            Some(b']') => {
                w.i += 1;
                return Ok(refused.map_or(Ok(()), Err));
            }
            _ => return w.err("expected ',' or ']' after a value in an array"),
        }
    }
}

/// Classes of the 64 bytes of a window, one bit per byte (bit k = byte k).
struct Masks {
    digits: u64,
    commas: u64,
    zeros: u64,
    /// Neither a digit, a comma nor a space.
    other: u64,
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn classify(w: &[u8; 64]) -> Masks {
    use std::arch::x86_64::*;
    let mut m = Masks { digits: 0, commas: 0, zeros: 0, other: 0 };
    // SSE2 is part of the x86_64 baseline, so these are always available.
    // SAFETY: each load reads 16 bytes at offset 16*k of a 64-byte array
    // (k < 4), in bounds; `loadu` has no alignment requirement.
    unsafe {
        for k in 0..4 {
            let v = _mm_loadu_si128(w.as_ptr().add(16 * k).cast::<__m128i>());
            let shifted = _mm_sub_epi8(v, _mm_set1_epi8(b'0' as i8));
            let digit = _mm_cmpeq_epi8(_mm_min_epu8(shifted, _mm_set1_epi8(9)), shifted);
            let comma = _mm_cmpeq_epi8(v, _mm_set1_epi8(b',' as i8));
            let space = _mm_cmpeq_epi8(v, _mm_set1_epi8(b' ' as i8));
            let zero = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'0' as i8));
            let known = _mm_or_si128(_mm_or_si128(digit, comma), space);
            let bits = |x| u64::from(_mm_movemask_epi8(x) as u16) << (16 * k);
            m.digits |= bits(digit);
            m.commas |= bits(comma);
            m.zeros |= bits(zero);
            m.other |= !bits(known) & (0xFFFF << (16 * k));
        }
    }
    m
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn classify(w: &[u8; 64]) -> Masks {
    classify_scalar(w)
}

/// Portable classification; the reference the SIMD version is tested against.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn classify_scalar(w: &[u8; 64]) -> Masks {
    let mut m = Masks { digits: 0, commas: 0, zeros: 0, other: 0 };
    for (k, &b) in w.iter().enumerate() {
        match b {
            b'0'..=b'9' => m.digits |= 1 << k,
            b',' => m.commas |= 1 << k,
            b' ' => {}
            _ => m.other |= 1 << k,
        }
        if b == b'0' {
            m.zeros |= 1 << k;
        }
    }
    m
}

/// Parity prefix: bit j of the result is the XOR of bits 0..=j of `x`.
#[inline(always)]
fn prefix_xor(mut x: u64) -> u64 {
    for shift in [1, 2, 4, 8, 16, 32] {
        x ^= x << shift;
    }
    x
}

/// A number's digits: at most 7, shifted to the top of a little-endian
/// word, zero bytes below.
type Word = u64;

/// The value of a `Word`, by halves, quarters and pairs of digits (SWAR).
#[inline(always)]
fn word_value(x: Word) -> u32 {
    // The zero bytes below the digits stay zero: subtract '0' only above them.
    let v = x.wrapping_sub(0x3030_3030_3030_3030 << (x.trailing_zeros() & 0x38));
    let v = (v.wrapping_mul(10).wrapping_add(v >> 8)) & 0x00FF_00FF_00FF_00FF;
    let v = (v.wrapping_mul(100).wrapping_add(v >> 16)) & 0x0000_FFFF_0000_FFFF;
    ((v.wrapping_mul(10_000).wrapping_add(v >> 32)) & 0xFFFF_FFFF) as u32
}

fn convert_scalar(words: &[Word; 32], out: &mut [u32; 32], n: usize) {
    for (o, &x) in out.iter_mut().zip(words).take(n) {
        *o = word_value(x);
    }
}

/// As `convert_scalar`, four words per step: bytes less '0' (zeros stay
/// zero), then digit pairs, quads and halves summed by multiply-adds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.1")]
unsafe fn convert_sse41(words: &[Word; 32], out: &mut [u32; 32], n: usize) {
    use std::arch::x86_64::*;
    let zeros = _mm_set1_epi8(b'0' as i8);
    let tens = _mm_set1_epi16(0x010A);
    let hundreds = _mm_set1_epi32(0x0001_0064);
    let ten_thousands = _mm_set1_epi32(0x0001_2710);
    for g in 0..n.div_ceil(4).min(8) {
        // SAFETY: g < 8, so words 4g..4g+4 and out 4g..4g+4 are in bounds.
        let (a, b) = (words.as_ptr().add(4 * g).cast::<__m128i>(), words.as_ptr().add(4 * g + 2).cast::<__m128i>());
        let a = _mm_madd_epi16(_mm_maddubs_epi16(_mm_subs_epu8(_mm_loadu_si128(a), zeros), tens), hundreds);
        let b = _mm_madd_epi16(_mm_maddubs_epi16(_mm_subs_epu8(_mm_loadu_si128(b), zeros), tens), hundreds);
        let v = _mm_madd_epi16(_mm_packus_epi32(a, b), ten_thousands);
        _mm_storeu_si128(out.as_mut_ptr().add(4 * g).cast::<__m128i>(), v);
    }
}

/// Consumes the leading elements of a token array that have the common
/// shape, appending them to `out`. `start` is the first element. Returns
/// how many were consumed and where the element loop goes on (a comma
/// after the last one; `start` if none).
fn plain_prefix(b: &[u8], start: usize, out: &mut Vec<u32>) -> (usize, usize) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("sse4.1") {
        // SAFETY: the CPU has SSE4.1, just checked.
        return unsafe { plain_prefix_sse41(b, start, out) };
    }
    windows(b, start, out, convert_scalar)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.1")]
unsafe fn plain_prefix_sse41(b: &[u8], start: usize, out: &mut Vec<u32>) -> (usize, usize) {
    // SAFETY: only called where the CPU has SSE4.1.
    windows(b, start, out, |w, o, n| unsafe { convert_sse41(w, o, n) })
}

#[inline(always)]
fn windows(
    b: &[u8],
    start: usize,
    out: &mut Vec<u32>,
    convert: impl Fn(&[Word; 32], &mut [u32; 32], usize),
) -> (usize, usize) {
    // Numbers are converted into room made ahead of them, a window's worth
    // of slots at least; the excess is cut at the end.
    const GROW_SLOTS: usize = 1024;
    let first = out.len();
    let (mut count, mut base) = (0, start);
    let mut words = [0; 32];
    // Whether the window starts on a comma (every window but the first).
    let mut at_comma = false;
    // A window plus the 8 bytes a number loaded from near its end may need.
    while let Some(w) = b.get(base..).and_then(|s| s.first_chunk::<72>()) {
        let Some(head) = w.first_chunk::<64>() else { break };
        let m = classify(head);
        if m.commas >> 1 == 0 {
            break;
        }
        let last = 63 - m.commas.leading_zeros();
        let keep = u64::MAX >> (63 - last);
        let (digits, commas) = (m.digits & keep, m.commas & keep);
        let starts = digits & !(digits << 1);
        let ends = digits & !(digits >> 1);
        let events = starts | commas;
        // Numbers and commas alternate: from a number, the commas are the
        // events at even places; from a comma, at odd ones.
        let parity = prefix_xor(events);
        let comma_places = if at_comma { parity } else { !parity };
        // Bit j: bytes j..j+8 are all digits (runs of 2, 4, then 8).
        let long = [1, 2, 4].iter().fold(digits, |l, &s| l & (l >> s));
        if m.other & keep != 0 || events & comma_places != commas || long != 0 || starts & m.zeros & !ends != 0 {
            break;
        }
        let n = starts.count_ones() as usize;
        let (mut s_bits, mut e_bits) = (starts, ends);
        for word in words.iter_mut().take(n) {
            let (s, e) = (s_bits.trailing_zeros() as usize & 63, e_bits.trailing_zeros() as usize & 63);
            s_bits &= s_bits.wrapping_sub(1);
            e_bits &= e_bits.wrapping_sub(1);
            let x = w.get(s..s + 8).and_then(|c| c.first_chunk::<8>()).map_or(0, |c| u64::from_le_bytes(*c));
            *word = x.wrapping_shl(8 * (7 - (e.wrapping_sub(s) as u32 & 7)));
        }
        if out.len() < first + count + 32 {
            out.resize(first + count + GROW_SLOTS, 0);
        }
        let Some(slots) = out.get_mut(first + count..).and_then(|s| s.first_chunk_mut::<32>()) else { break };
        convert(&words, slots, n);
        count += n;
        base += last as usize;
        at_comma = true;
    }
    out.truncate(first + count);
    (count, if count > 0 { base } else { start })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn simd_and_scalar_agree() {
        let mut r = Rng(0x1234_5678_9abc_def1);
        let alphabet = b"0123456789, ,]-.\n\x00\xff/:";
        for _ in 0..2000 {
            let mut w = [0u8; 64];
            for b in w.iter_mut() {
                let x = r.next();
                *b = if x % 5 == 0 { x as u8 } else { alphabet[(x >> 8) as usize % alphabet.len()] };
            }
            let (a, s) = (classify(&w), classify_scalar(&w));
            assert_eq!((a.digits, a.commas, a.zeros, a.other), (s.digits, s.commas, s.zeros, s.other));
            let x = r.next();
            let p = prefix_xor(x);
            for j in 0..64 {
                assert_eq!((p >> j) & 1, u64::from((x & (u64::MAX >> (63 - j))).count_ones() % 2));
            }
            let mut words = [0; 32];
            let mut want = [0u32; 32];
            for (word, v) in words.iter_mut().zip(want.iter_mut()) {
                *v = (r.next() % 10_000_000) as u32 >> (r.next() % 24);
                let text = v.to_string();
                let mut bytes = [0u8; 8];
                bytes[8 - text.len()..].copy_from_slice(text.as_bytes());
                *word = u64::from_le_bytes(bytes);
            }
            let mut got = [0u32; 32];
            convert_scalar(&words, &mut got, 32);
            assert_eq!(got, want);
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("sse4.1") {
                let mut got = [0u32; 32];
                unsafe { convert_sse41(&words, &mut got, 32) };
                assert_eq!(got, want);
            }
        }
    }

    fn prefix(text: &str) -> (Vec<u32>, usize, usize) {
        let mut out = Vec::new();
        let (n, end) = plain_prefix(text.as_bytes(), 0, &mut out);
        assert_eq!(out.len(), n);
        (out, n, end)
    }

    #[test]
    fn stops_before_anything_unusual() {
        let tail = " ".repeat(80);
        let many: Vec<String> = (0..40).map(|i| (i * 7919 % 1_000_000).to_string()).collect();
        let body = format!("{}]{tail}", many.join(", "));
        let (v, n, end) = prefix(&body);
        assert!(n > 20, "{n}");
        let want: Vec<u32> = many[..n].iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(v, want);
        assert_eq!(body.as_bytes()[end], b',');
        let filler = "1, ".repeat(30);
        for bad in ["4.5", "-4", "04", ",", "3 4", "12345678", "3e1", "\"1\"", "\n1"] {
            let body = format!("{filler}{bad}, 6{tail}");
            let (_, n, end) = prefix(&body);
            assert!(n < 31 && body[end..].starts_with(','), "{bad}: {n} {end}");
        }
        // A leading comma is not an element.
        assert_eq!(prefix(&format!(",1, 2{tail}")).1, 0);
    }

    #[test]
    fn numbers_across_window_edges() {
        for shift in 0..16 {
            let ids: Vec<u32> = (0..200u32).map(|i| (i.wrapping_mul(2654435761) % 10_000_000) >> (i % 20)).collect();
            let text: Vec<String> = ids.iter().map(|v| v.to_string()).collect();
            let body = format!("{}{}]{}", "7,".repeat(shift), text.join(","), " ".repeat(70));
            let (v, n, _) = prefix(&body);
            assert!(n >= 150 + shift, "{n}");
            assert_eq!(v[shift..], ids[..n - shift]);
        }
    }
}

//! The id arrays of the hot bodies, straight into the caller's buffer.
//!
//! Elements are read one by one (`read_ids`): a plain integer by hand,
//! anything else through serde_json (`Walk::value`), so what is accepted
//! and refused is serde_json's. Token arrays of the common shape,
//! `[12, 345,6, ...`, first go through a fast path (`plain_prefix`): the
//! array is classified 64 bytes at a time into bit masks (digits, commas,
//! zeros, everything else); a window runs up to its last comma, and if its
//! bytes are only digits, spaces and commas, numbers and commas alternate,
//! and every number has 1-7 digits and no leading zero (`take`), its
//! numbers are located from the masks and converted. One loop (`scan`)
//! serves both ways of doing it: with AVX2 (`avx2`) a window is classified
//! 32 bytes at a time and eight numbers are converted per step, each loaded
//! as the 8 bytes that end at its last digit; elsewhere byte by byte and
//! one number at a time (`plain_prefix_portable`, the reference the AVX2
//! path is tested against). At the first window it does not take, the
//! element loop goes on from the last comma taken.

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
    // Nothing taken leaves the cursor where it was.
    let (mut index, end) = T::fast(w.b, w.i, out);
    w.i = end;
    let mut after_value = index > 0;
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
                _ if refused.is_some() => {}
                Some(id) => out.push(id),
                None => {
                    let found = match v {
                        Json::U64(_) | Json::I64(_) | Json::Float => w.text(start),
                        _ => v.kind().to_string(),
                    };
                    refused = Some(format!("`{}[{index}]` must be one of {}, found {found}", T::FIELD, T::RANGE));
                }
            }
            index += 1;
        }
        after_value = false;
        if !w.next(b']', "expected ',' or ']' after a value in an array")? {
            return Ok(refused.map_or(Ok(()), Err));
        }
    }
}

/// Bytes before the first element the fast path may read: the array is a
/// member value, so at least `{"":[` precedes it in any body that gets here.
const BEFORE_FIRST_BYTES: usize = 7;

/// What one window reads: the 7 bytes before it (a number loaded as the 8
/// bytes ending at its last digit may reach back there), its 64, and past
/// its end the 8 a number loaded near the end may touch.
type Span = [u8; SPAN_BYTES];
const SPAN_BYTES: usize = BEFORE_FIRST_BYTES + 64 + 8;

/// Consumes the leading elements of a token array that have the common
/// shape, appending them to `out`. `start` is the first element. Returns
/// how many were consumed and where the element loop goes on (a comma
/// after the last one; `start` if none).
fn plain_prefix(b: &[u8], start: usize, out: &mut Vec<u32>) -> (usize, usize) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("pclmulqdq") {
        // SAFETY: the CPU has AVX2 and PCLMULQDQ, just checked.
        return unsafe { avx2::plain_prefix(b, start, out) };
    }
    plain_prefix_portable(b, start, out)
}

/// Classes of the 64 bytes of a window, one bit per byte (bit k = byte k).
#[derive(Debug, PartialEq, Eq)]
struct Masks {
    digits: u64,
    commas: u64,
    zeros: u64,
    /// Neither a digit, a comma nor a space.
    other: u64,
}

/// A window of the common shape: where its numbers start and end, and its
/// last comma, where the next window starts.
struct Take {
    starts: u64,
    ends: u64,
    last: usize,
}

/// Whether the window of masks `m` is taken, up to its last comma: only
/// digits, spaces and commas, numbers and commas alternating (from a number
/// if the window is the first, `at_comma` false; from a comma otherwise),
/// every number 1-7 digits without a leading zero. `prefix_xor(x)`: bit j
/// is the XOR of bits 0..=j of `x`.
#[inline(always)]
fn take(m: &Masks, at_comma: bool, prefix_xor: impl Fn(u64) -> u64) -> Option<Take> {
    if m.commas >> 1 == 0 {
        return None;
    }
    let last = 63 - m.commas.leading_zeros();
    let keep = u64::MAX >> (63 - last);
    let (digits, commas) = (m.digits & keep, m.commas & keep);
    let starts = digits & !(digits << 1);
    let ends = digits & !(digits >> 1);
    let events = starts | commas;
    // From a number, the commas are the events at even places; from a
    // comma, at odd ones.
    let parity = prefix_xor(events);
    let comma_places = if at_comma { parity } else { !parity };
    // Bit j: bytes j..j+8 are all digits (runs of 2, 4, then 8).
    let long = [1, 2, 4].iter().fold(digits, |l, &s| l & (l >> s));
    if m.other & keep != 0 || events & comma_places != commas || long != 0 || starts & m.zeros & !ends != 0 {
        return None;
    }
    Some(Take { starts, ends, last: last as usize })
}

/// Numbers are converted into room made ahead of them, a window's worth of
/// slots at least; the excess is cut at the end.
const GROW_SLOTS: usize = 1024;

/// The fast path's one loop: each window from `start` on is classified,
/// taken or not, and its numbers (at most 32: each is followed by a comma)
/// converted into room after those of the windows before.
#[inline(always)]
fn scan(
    b: &[u8],
    start: usize,
    out: &mut Vec<u32>,
    classify: impl Fn(&Span) -> Masks,
    prefix_xor: impl Fn(u64) -> u64 + Copy,
    mut convert: impl FnMut(&Span, &Take, &mut [u32; 32]) -> usize,
) -> (usize, usize) {
    if start < BEFORE_FIRST_BYTES {
        return (0, start);
    }
    let first = out.len();
    let (mut filled, mut base, mut at_comma) = (first, start, false);
    while let Some(span) = b.get(base - BEFORE_FIRST_BYTES..).and_then(|s| s.first_chunk::<SPAN_BYTES>()) {
        let Some(t) = take(&classify(span), at_comma, prefix_xor) else { break };
        if out.len() < filled + 32 {
            out.resize(filled + GROW_SLOTS, 0);
        }
        let Some(slots) = out.get_mut(filled..).and_then(|s| s.first_chunk_mut::<32>()) else { break };
        filled += convert(span, &t, slots);
        base += t.last;
        at_comma = true;
    }
    out.truncate(filled);
    (filled - first, if filled > first { base } else { start })
}

/// Portable classification of the window at byte `BEFORE_FIRST_BYTES` of
/// `span`; the reference the SIMD one is tested against.
fn classify_scalar(span: &Span) -> Masks {
    let mut m = Masks { digits: 0, commas: 0, zeros: 0, other: 0 };
    for (k, &b) in span[BEFORE_FIRST_BYTES..][..64].iter().enumerate() {
        match b {
            b'0'..=b'9' => m.digits |= 1 << k,
            b',' => m.commas |= 1 << k,
            b' ' => {}
            _ => m.other |= 1 << k,
        }
        m.zeros |= u64::from(b == b'0') << k;
    }
    m
}

/// Parity prefix by shifts: bit j of the result is the XOR of bits 0..=j of `x`.
#[inline(always)]
fn prefix_xor(mut x: u64) -> u64 {
    for shift in [1, 2, 4, 8, 16, 32] {
        x ^= x << shift;
    }
    x
}

/// The value of a number's digits (at most 7) shifted to the top of a
/// little-endian word, zero bytes below: by halves, quarters and pairs of
/// digits (SWAR).
#[inline(always)]
fn word_value(x: u64) -> u32 {
    // The zero bytes below the digits stay zero: subtract '0' only above them.
    let v = x.wrapping_sub(0x3030_3030_3030_3030 << (x.trailing_zeros() & 0x38));
    let v = (v.wrapping_mul(10).wrapping_add(v >> 8)) & 0x00FF_00FF_00FF_00FF;
    let v = (v.wrapping_mul(100).wrapping_add(v >> 16)) & 0x0000_FFFF_0000_FFFF;
    ((v.wrapping_mul(10_000).wrapping_add(v >> 32)) & 0xFFFF_FFFF) as u32
}

/// The fast path on any CPU: windows classified a byte at a time, numbers
/// converted one at a time, each loaded from its first digit and shifted
/// to the top of the word. The reference the AVX2 path is tested against.
fn plain_prefix_portable(b: &[u8], start: usize, out: &mut Vec<u32>) -> (usize, usize) {
    scan(b, start, out, classify_scalar, prefix_xor, |span, t, slots| {
        let (mut starts, mut ends, n) = (t.starts, t.ends, t.ends.count_ones() as usize);
        for slot in slots.iter_mut().take(n) {
            let (s, e) = (starts.trailing_zeros() as usize, ends.trailing_zeros() as usize);
            starts &= starts.wrapping_sub(1);
            ends &= ends.wrapping_sub(1);
            // Window byte s is span byte s + 7.
            let x = span
                .get(s + BEFORE_FIRST_BYTES..)
                .and_then(|c| c.first_chunk::<8>())
                .map_or(0, |c| u64::from_le_bytes(*c));
            *slot = word_value(x.wrapping_shl(8 * (7 - (e.wrapping_sub(s) as u32 & 7))));
        }
        n
    })
}

/// The fast path with AVX2: a window classified 32 bytes at a time, its
/// parity prefix by one carry-less multiply, and each number loaded as the
/// 8 bytes that end at its last digit, eight numbers to a register: the
/// bytes below the number (from the highest non-digit down) are cleared,
/// and digit pairs, quads and halves are summed by multiply-adds.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{scan, Masks, Span, Take, BEFORE_FIRST_BYTES};
    use std::arch::x86_64::*;

    /// See `super::plain_prefix`.
    #[target_feature(enable = "avx2,pclmulqdq")]
    pub(super) unsafe fn plain_prefix(b: &[u8], start: usize, out: &mut Vec<u32>) -> (usize, usize) {
        let convert = |span: &Span, t: &Take, slots: &mut [u32; 32]| {
            let (mut ends, n) = (t.ends, t.ends.count_ones() as usize);
            for g in 0..n.div_ceil(8).min(4) {
                // SAFETY: g < 4, so slots 8g..8g+8 are in the 32.
                unsafe { _mm256_storeu_si256(slots.as_mut_ptr().add(8 * g).cast(), eight(span, &mut ends)) };
            }
            n
        };
        // SAFETY: the closures run only here, on a CPU with AVX2 and PCLMULQDQ.
        scan(b, start, out, |s| unsafe { classify(s) }, |x| unsafe { prefix_xor(x) }, convert)
    }

    /// The masks of the window at byte `BEFORE_FIRST_BYTES` of `span`.
    #[inline(always)]
    pub(super) unsafe fn classify(span: &Span) -> Masks {
        let mut m = Masks { digits: 0, commas: 0, zeros: 0, other: 0 };
        for k in 0..2 {
            // SAFETY: bytes 7+32k..7+32k+32 (k < 2) are within the 79.
            let v = _mm256_loadu_si256(span.as_ptr().add(BEFORE_FIRST_BYTES + 32 * k).cast());
            let shifted = _mm256_sub_epi8(v, _mm256_set1_epi8(b'0' as i8));
            let digit = _mm256_cmpeq_epi8(_mm256_min_epu8(shifted, _mm256_set1_epi8(9)), shifted);
            let comma = _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b',' as i8));
            let space = _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b' ' as i8));
            let zero = _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'0' as i8));
            let known = _mm256_or_si256(_mm256_or_si256(digit, comma), space);
            let bits = |x| u64::from(_mm256_movemask_epi8(x) as u32) << (32 * k);
            m.digits |= bits(digit);
            m.commas |= bits(comma);
            m.zeros |= bits(zero);
            m.other |= !bits(known) & (0xFFFF_FFFF << (32 * k));
        }
        m
    }

    #[inline(always)]
    unsafe fn prefix_xor(x: u64) -> u64 {
        let v = _mm_clmulepi64_si128(_mm_set_epi64x(0, x as i64), _mm_set1_epi8(-1), 0);
        _mm_cvtsi128_si64(v) as u64
    }

    /// Two numbers, each the 8 bytes ending at its last digit (the next
    /// two bits of `ends`, window bits).
    #[inline(always)]
    unsafe fn pair(span: &Span, ends: &mut u64) -> __m128i {
        let mut next = || {
            // An empty mask gives 64, masked to 0: a lane no one counts.
            let e = ends.trailing_zeros() as usize & 63;
            *ends &= ends.wrapping_sub(1);
            // SAFETY: e <= 63, so bytes e..e+8 of the 79 are in bounds;
            // window byte e is span byte e + 7, the load's last.
            span.as_ptr().add(e)
        };
        let lo = _mm_loadl_epi64(next().cast());
        _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(lo), next().cast()))
    }

    /// Four numbers' digits as two u32 halves per lane (high digits first).
    #[inline(always)]
    unsafe fn four(span: &Span, ends: &mut u64) -> __m256i {
        let lo = pair(span, ends);
        let v = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), pair(span, ends), 1);
        // Each lane reversed: the last digit in byte 0, its run of digits
        // upwards from there; the lowest run of ones of a digit mask is
        // m & !(m + 1).
        let reverse = _mm256_set_epi64x(
            0x0809_0A0B_0C0D_0E0F,
            0x0001_0203_0405_0607,
            0x0809_0A0B_0C0D_0E0F,
            0x0001_0203_0405_0607,
        );
        let v = _mm256_sub_epi8(_mm256_shuffle_epi8(v, reverse), _mm256_set1_epi8(b'0' as i8));
        let digit = _mm256_cmpeq_epi8(_mm256_min_epu8(v, _mm256_set1_epi8(9)), v);
        let run = _mm256_andnot_si256(_mm256_sub_epi64(digit, _mm256_set1_epi64x(-1)), digit);
        let v = _mm256_and_si256(run, v);
        let v = _mm256_maddubs_epi16(v, _mm256_set1_epi16(0x0A01));
        let v = _mm256_madd_epi16(v, _mm256_set1_epi32(0x0064_0001));
        // Low u32 the four low digits: swap so the high four come first.
        _mm256_shuffle_epi32(v, 0b10_11_00_01)
    }

    /// The values of the next eight numbers of `ends`.
    #[inline(always)]
    unsafe fn eight(span: &Span, ends: &mut u64) -> __m256i {
        let a = four(span, ends);
        let b = four(span, ends);
        let v = _mm256_madd_epi16(_mm256_packus_epi32(a, b), _mm256_set1_epi32(0x0001_2710));
        // packus interleaves a's and b's halves within each 128-bit lane.
        _mm256_permute4x64_epi64(v, 0b11_01_10_00)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_rng::Rng;

    #[test]
    fn classification_parity_and_words() {
        let mut r = Rng(0x1234_5678_9abc_def1);
        let alphabet = b"0123456789, ,]-.\n\x00\xff/:";
        for _ in 0..2000 {
            let mut w = [0u8; SPAN_BYTES];
            for b in w.iter_mut() {
                let x = r.next();
                *b = if x.is_multiple_of(5) { x as u8 } else { alphabet[(x >> 8) as usize % alphabet.len()] };
            }
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2, just checked.
                assert_eq!(unsafe { avx2::classify(&w) }, classify_scalar(&w));
            }
            let x = r.next();
            let p = prefix_xor(x);
            for j in 0..64 {
                assert_eq!((p >> j) & 1, u64::from((x & (u64::MAX >> (63 - j))).count_ones() % 2));
            }
            let v = (r.next() % 10_000_000) as u32 >> (r.next() % 24);
            let text = v.to_string();
            let mut bytes = [0u8; 8];
            bytes[8 - text.len()..].copy_from_slice(text.as_bytes());
            assert_eq!(word_value(u64::from_le_bytes(bytes)), v);
        }
    }

    /// What precedes the array's first element in the tests' bodies.
    const HEAD: &str = "{\"t\":[ ";

    /// The fast path on `HEAD` + `text`: the ids, how many, and where the
    /// element loop goes on, counted from the start of `text`.
    fn prefix(text: &str) -> (Vec<u32>, usize, usize) {
        let body = format!("{HEAD}{text}");
        let mut out = Vec::new();
        let (n, end) = plain_prefix(body.as_bytes(), HEAD.len(), &mut out);
        assert_eq!(out.len(), n);
        (out, n, end - HEAD.len())
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
        // Too close to the body's start for the bytes before it to be read.
        let body = format!("[{}]{tail}", many.join(","));
        assert_eq!(plain_prefix(body.as_bytes(), 1, &mut Vec::new()), (0, 1));
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

    /// A token array of random shape: numbers of every length (some with
    /// leading zeros, signs, fractions), separators with spaces and other
    /// whitespace, sometimes a stray byte, then `]` and a random tail.
    fn random_array(r: &mut Rng) -> String {
        let mut s = String::new();
        let odd_one_in = [20, 200, 5000][r.below(3) as usize];
        let max_digits = [3, 6, 7, 10][r.below(4) as usize];
        for i in 0..r.below(120) {
            if i > 0 {
                let kinds = if r.below(9) == 0 { 7 } else { 3 };
                s.push_str([",", ", ", " ,", " , ", ",  ", ",\n", ",\t"][r.below(kinds) as usize]);
            }
            let digits = 1 + r.below(max_digits) as u32;
            let v = r.next() % 10u64.pow(digits);
            let mut num = v.to_string();
            if r.below(odd_one_in) == 0 {
                let odd = ["0", "-", ".5", "e1", "\"", "]", "x", "", "\u{e9}", "00"][r.below(10) as usize];
                num = if r.below(2) == 0 { format!("{odd}{num}") } else { format!("{num}{odd}") };
            }
            s.push_str(&num);
        }
        s.push(']');
        s.push_str(&" ".repeat(r.below(90) as usize));
        s
    }

    /// Every shape of array: both paths agree, and what they take is the
    /// array's text up to a comma, read as plain integers.
    #[test]
    fn paths_agree_on_random_arrays() {
        let mut r = Rng(0x0bad_cafe_dead_beef);
        let mut taken = 0;
        for _ in 0..20_000 {
            let text = random_array(&mut r);
            let body = format!("{HEAD}{text}");
            let mut portable = vec![7];
            let got = plain_prefix_portable(body.as_bytes(), HEAD.len(), &mut portable);
            let mut dispatched = vec![7];
            assert_eq!(plain_prefix(body.as_bytes(), HEAD.len(), &mut dispatched), got, "{text}");
            assert_eq!(dispatched, portable, "{text}");
            let (n, end) = got;
            assert_eq!(portable.len(), 1 + n);
            if n == 0 {
                assert_eq!(end, HEAD.len());
                continue;
            }
            assert_eq!(body.as_bytes()[end], b',', "{text}");
            let want: Vec<u32> =
                body[HEAD.len()..end].split(',').map(|t| t.trim_matches(' ').parse().unwrap()).collect();
            assert_eq!(portable[1..], want, "{text}");
            taken += n;
        }
        assert!(taken > 200_000, "{taken}");
    }
}

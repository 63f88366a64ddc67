//! The fast path for `token_ids`: plain arrays of small integers.
//!
//! Why: a byte-at-a-time scanner must finish reading one number before it
//! knows where the next begins, so every token costs a chain of dependent
//! loads. Here the array is classified 64 bytes at a time into bit masks
//! (digits, commas, everything else); number starts come from the masks, so
//! the numbers of a window are independent and the CPU overlaps them.
//!
//! It only consumes the common shape, `[12, 345,6, ...`: integers of 1-7
//! digits (tokens below 10^7) separated by one comma and any spaces. At the
//! first thing it does not handle (a newline, a sign, a fraction, a long
//! number, an unexpected comma, the closing `]`, the last 64 bytes of the
//! body) it stops after the last number it accepted and the general scanner
//! takes over from there, so what is accepted and refused does not change.

/// Classes of the 64 bytes of a window, one bit per byte (bit k = byte k).
struct Masks {
    digits: u64,
    commas: u64,
    /// Neither a digit, a comma nor a space.
    other: u64,
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn classify(w: &[u8; 64]) -> Masks {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
        _mm_sub_epi8,
    };
    let mut m = Masks { digits: 0, commas: 0, other: 0 };
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
            let known = _mm_or_si128(_mm_or_si128(digit, comma), space);
            let bits = |x| u64::from(_mm_movemask_epi8(x) as u16) << (16 * k);
            m.digits |= bits(digit);
            m.commas |= bits(comma);
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
    let mut m = Masks { digits: 0, commas: 0, other: 0 };
    for (k, &b) in w.iter().enumerate() {
        match b {
            b'0'..=b'9' => m.digits |= 1 << k,
            b',' => m.commas |= 1 << k,
            b' ' => {}
            _ => m.other |= 1 << k,
        }
    }
    m
}

/// Parity prefix: bit j of the result is the XOR of bits 0..=j of `x`.
#[inline(always)]
fn prefix_xor(mut x: u64) -> u64 {
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= x << 32;
    x
}

/// Reads 8 bytes at `at` as a little-endian word, if the body has them.
#[inline(always)]
fn word_at(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8).and_then(|c| <[u8; 8]>::try_from(c).ok()).map(u64::from_le_bytes)
}

/// Consumes the leading elements of an integer array that have the common
/// shape, appending them to `out`. `start` is the first element (after `[`
/// and whitespace). Returns how many were consumed and the position just
/// after the last one (`start` if none); the general scanner resumes there,
/// expecting `,` or `]`. Kept out of line: inlined into the caller, its
/// loop state spills to the stack.
#[inline(never)]
pub(super) fn plain_u32_prefix(b: &[u8], start: usize, out: &mut Vec<u32>) -> (usize, usize) {
    // Numbers are stored by index into room made ahead of them, GROW_SLOTS
    // at a time, so each is one plain store; the excess is cut at the end.
    const GROW_SLOTS: usize = 1024;
    let first = out.len();
    let mut count = 0usize;
    let mut end = start;
    let mut base = start;
    // Whether byte base-1 is a digit of a number already handled.
    let mut carry = 0u64;
    // All ones if an odd number of numbers and commas lie in [start, base).
    let mut parity = 0u64;
    // A window plus the 8 bytes a number starting at its end may need.
    while let Some(ext) = b.get(base..base + 72) {
        let Ok(ext) = <&[u8; 72]>::try_from(ext) else {
            break;
        };
        let Ok(w) = <&[u8; 64]>::try_from(&ext[..64]) else {
            break;
        };
        let m = classify(w);
        let starts = m.digits & !((m.digits << 1) | carry);
        // Numbers and commas must alternate, a number first: then the commas
        // are exactly the events at odd places in the sequence.
        let events = starts | m.commas;
        let odd_place = prefix_xor(events) ^ parity;
        if m.other != 0 || events & !odd_place != m.commas {
            out.truncate(first + count);
            // Alternation so far: one comma after each number but the last
            // when the count of events is odd.
            let commas_before = count - (parity & 1) as usize;
            let (n, e) = careful_window(b, base, &m, starts, count, commas_before, out);
            return if n > 0 { (count + n, e) } else { (count, end) };
        }
        // A clean window: only digits, spaces and well-placed commas; at
        // most 32 numbers start in it.
        if out.len() < first + count + 32 {
            out.resize(first + count + GROW_SLOTS, 0);
        }
        let slots = &mut out[first + count..];
        let mut k = 0usize;
        let mut rest = starts;
        while rest != 0 {
            let s = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            let Some(x) = ext.get(s..s + 8).and_then(|c| <[u8; 8]>::try_from(c).ok()).map(u64::from_le_bytes) else {
                out.truncate(first + count + k);
                return (count + k, end);
            };
            let mut n = (!(m.digits >> s)).trailing_zeros() as usize;
            if s + n == 64 {
                // The run reaches into the next window, which is not checked
                // yet: look at the bytes themselves.
                n = super::scan::digit_run(x);
                let after = (x >> (8 * n.min(7))) as u8;
                if n == 8 || (after != b',' && after != b' ') {
                    out.truncate(first + count + k);
                    return (count + k, end);
                }
            }
            if n > 7 || (n > 1 && x as u8 == b'0') {
                out.truncate(first + count + k);
                return (count + k, end);
            }
            if let Some(slot) = slots.get_mut(k) {
                *slot = super::scan::chunk_value(x, n) as u32;
            }
            k += 1;
            end = base + s + n;
        }
        count += k;
        carry = m.digits >> 63;
        parity = ((odd_place >> 63) as i64).wrapping_neg() as u64;
        base += 64;
    }
    out.truncate(first + count);
    (count, end)
}

/// The numbers of a window that is not clean, one by one, up to the first
/// that cannot be accepted. `count` numbers and `commas_before` commas
/// precede the window. Returns how many were appended and where the last
/// one ended.
#[cold]
fn careful_window(
    b: &[u8],
    base: usize,
    m: &Masks,
    starts: u64,
    count: usize,
    commas_before: usize,
    out: &mut Vec<u32>,
) -> (usize, usize) {
    let limit = m.other.trailing_zeros();
    let mut rest = starts;
    if limit < 64 {
        rest &= (1u64 << limit) - 1;
    }
    let mut taken = 0usize;
    let mut end = 0usize;
    while rest != 0 {
        let s = rest.trailing_zeros() as usize;
        rest &= rest - 1;
        let at = base + s;
        let Some(x) = word_at(b, at) else {
            break;
        };
        let n = super::scan::digit_run(x);
        // The byte after the number must be a separator (not '.', 'e', ']',
        // ...); no leading zeros; exactly one comma since the previous number.
        let after = (x >> (8 * n.min(7))) as u8;
        let commas = commas_before + (m.commas & ((1u64 << s) - 1)).count_ones() as usize;
        if n > 7 || (after != b',' && after != b' ') || (n > 1 && x as u8 == b'0') || commas != count + taken {
            break;
        }
        out.push(super::scan::chunk_value(x, n) as u32);
        taken += 1;
        end = at + n;
    }
    (taken, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_and_scalar_classification_agree() {
        let mut x = 0x1234_5678_9abc_def1u64;
        let alphabet = b"0123456789, ,]-.\n\x00\xff/:";
        for _ in 0..2000 {
            let mut w = [0u8; 64];
            for b in w.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = if x % 5 == 0 { x as u8 } else { alphabet[(x >> 8) as usize % alphabet.len()] };
            }
            let (a, s) = (classify(&w), classify_scalar(&w));
            assert_eq!((a.digits, a.commas, a.other), (s.digits, s.commas, s.other));
            let p = prefix_xor(x);
            for j in 0..64 {
                assert_eq!((p >> j) & 1, u64::from((x & (u64::MAX >> (63 - j))).count_ones() % 2));
            }
        }
    }

    fn prefix(text: &str) -> (Vec<u32>, usize, usize) {
        let mut out = Vec::new();
        let (n, end) = plain_u32_prefix(text.as_bytes(), 0, &mut out);
        assert_eq!(out.len(), n);
        (out, n, end)
    }

    #[test]
    fn stops_before_anything_unusual() {
        let tail = " ".repeat(80);
        let many: Vec<String> = (0..40).map(|i| (i * 7919 % 1_000_000).to_string()).collect();
        let body = format!("{}]{tail}", many.join(", "));
        let (v, n, end) = prefix(&body);
        // Stops at a window holding ']' and resumes right after a number.
        assert!(n > 20, "{n}");
        let want: Vec<u32> = many[..n].iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(v, want);
        assert!(body.as_bytes()[end] == b',');

        for (bad, at) in [
            ("1, 2, 3, 4.5, 6", 3),
            ("1, 2, 3, -4, 6", 3),
            ("1, 2, 3, 04, 6", 3),
            ("1, 2, 3,, 4, 6", 3),
            ("1, 2, 3 4, 6", 3),
            ("1, 2, 12345678, 6", 2),
            ("1, 2, 3e1, 6", 2),
        ] {
            let body = format!("{bad}{tail}");
            let (_, n, _) = prefix(&body);
            assert_eq!(n, at, "{bad}");
        }
        // A leading comma is not an element.
        assert_eq!(prefix(&format!(",1, 2{tail}")).1, 0);
    }

    #[test]
    fn numbers_across_window_edges() {
        // Numbers of every length straddle the 64-byte boundaries.
        for shift in 0..16 {
            let ids: Vec<u32> = (0..200u32).map(|i| (i.wrapping_mul(2654435761) % 10_000_000) >> (i % 20)).collect();
            let text: Vec<String> = ids.iter().map(|v| v.to_string()).collect();
            let body = format!("{}{}]{}", " ".repeat(shift), text.join(","), " ".repeat(70));
            let (v, n, _) = prefix(&body);
            assert!(n >= 150, "{n}");
            assert_eq!(v[..], ids[..n]);
        }
    }
}

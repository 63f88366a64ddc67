//! Small JSON writing primitives: decimal integers and escaped strings
//! appended straight to a byte buffer, so response writers need no
//! formatter, no intermediate `String` and no serializer.

/// Two ASCII digits for every value 0..100, for writing integers two digits at a time.
const DIGIT_PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Appends `v` in decimal.
#[inline]
pub(crate) fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    // u64::MAX has 20 digits.
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    while v >= 100 {
        let pair = (v % 100) as usize * 2;
        v /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    }
    if v >= 10 {
        let pair = v as usize * 2;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + v as u8;
    }
    // Byte pushes: the numbers are short, and a variable-length copy would
    // be a memcpy call each.
    out.reserve(buf.len() - i);
    for &d in &buf[i..] {
        out.push(d);
    }
}

/// Appends `v` in decimal between double quotes, as a JSON object key.
#[inline]
pub(crate) fn push_u64_key(out: &mut Vec<u8>, v: u64) {
    out.push(b'"');
    push_u64(out, v);
    out.extend_from_slice(b"\":");
}

/// Appends `s` as a JSON string: quoted, with `"`, `\` and control
/// characters escaped. Everything else is copied as UTF-8.
pub(crate) fn push_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut plain_from = 0;
    for (i, &c) in bytes.iter().enumerate() {
        let short: &[u8] = match c {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[plain_from..i]);
        plain_from = i + 1;
        if short.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(c >> 4) as usize]);
            out.push(HEX[(c & 0xf) as usize]);
        } else {
            out.extend_from_slice(short);
        }
    }
    out.extend_from_slice(&bytes[plain_from..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_match_std_formatting() {
        let mut cases = vec![0u64, 1, 9, 10, 99, 100, 101, 999, 1000, 65535, u64::MAX];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            cases.push(x >> (x % 64));
        }
        for v in cases {
            let mut out = Vec::new();
            push_u64(&mut out, v);
            assert_eq!(out, v.to_string().as_bytes());
        }
    }

    #[test]
    fn strings_round_trip_through_serde_json() {
        let cases = [
            "",
            "plain",
            "quote \" and backslash \\",
            "ctl \u{0} \u{1} \u{8} \u{c} \n \r \t \u{1f} \u{7f}",
            "unicode é ü 漢字 🦀 \u{2028}",
            "/slash/",
        ];
        for s in cases {
            let mut out = Vec::new();
            push_str(&mut out, s);
            let back: String = serde_json::from_slice(&out).expect("valid JSON string");
            assert_eq!(back, s);
            assert!(!out[1..out.len() - 1].iter().any(|&b| b < 0x20));
        }
    }
}

//! HTTP/1.1 request bodies, bytes in: by Content-Length or chunked, at
//! most `limit` bytes, the whole body within one deadline. Every size from
//! the wire is a u64 checked against the limit before any allocation or
//! slice, so no length a client sends can overflow or panic. `httparse`
//! parses chunk-size lines (hex digits, extensions); chunk-size lines and
//! trailers of one body share one `HEAD_BYTES_MAX` budget, and trailers
//! count against `HEADERS_MAX`.

use std::io::{BufRead, BufReader, Write};
use std::time::Instant;

use super::request::{fill, read_by, Head, ReadError, ReadTimeout, HEADERS_MAX, HEAD_BYTES_MAX};

/// Reads the body `head` announces into `body` (cleared first), at most
/// `limit` bytes, all of it before `deadline`; sends `100 Continue` first
/// when the client asked for it. `line` is scratch.
pub fn read_body<R: ReadTimeout, W: Write>(
    r: &mut BufReader<R>,
    w: &mut W,
    head: &Head,
    limit: usize,
    deadline: Instant,
    body: &mut Vec<u8>,
    line: &mut Vec<u8>,
) -> Result<(), ReadError> {
    body.clear();
    let limit = limit as u64;
    if head.content_length.is_some_and(|n| n > limit) {
        return Err(ReadError::BodyTooLarge);
    }
    if head.expect_continue && (head.chunked || head.content_length.is_some_and(|n| n > 0)) {
        w.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").map_err(ReadError::Io)?;
        w.flush().map_err(ReadError::Io)?;
    }
    if let Some(n) = head.content_length {
        // n <= limit, a usize.
        return read_exact(r, body, n as usize, deadline);
    }
    if head.chunked {
        return read_chunked(r, body, limit, deadline, line);
    }
    Ok(())
}

/// Appends exactly `n` more bytes to `body`.
fn read_exact<R: ReadTimeout>(
    r: &mut BufReader<R>,
    body: &mut Vec<u8>,
    n: usize,
    deadline: Instant,
) -> Result<(), ReadError> {
    let mut start = body.len();
    body.resize(start + n, 0);
    while start < body.len() {
        match read_by(r, &mut body[start..], deadline)? {
            0 => return Err(ReadError::Bad("connection closed inside the body")),
            n => start += n,
        }
    }
    Ok(())
}

/// Reads one line, LF included, into `line`, charging `budget`.
fn read_line<R: ReadTimeout>(
    r: &mut BufReader<R>,
    line: &mut Vec<u8>,
    budget: &mut usize,
    deadline: Instant,
) -> Result<(), ReadError> {
    line.clear();
    loop {
        let avail = fill(r, deadline)?;
        if avail.is_empty() {
            return Err(ReadError::Bad("connection closed inside a chunked body"));
        }
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (avail.len(), false),
        };
        if take > *budget {
            return Err(ReadError::Bad("chunk sizes and trailers over 64 KiB"));
        }
        *budget -= take;
        line.extend_from_slice(&avail[..take]);
        r.consume(take);
        if done {
            return Ok(());
        }
    }
}

fn read_chunked<R: ReadTimeout>(
    r: &mut BufReader<R>,
    body: &mut Vec<u8>,
    limit: u64,
    deadline: Instant,
    line: &mut Vec<u8>,
) -> Result<(), ReadError> {
    let mut budget = HEAD_BYTES_MAX;
    loop {
        read_line(r, line, &mut budget, deadline)?;
        // httparse takes an empty size as 0: insist on a digit.
        if !line.first().is_some_and(u8::is_ascii_hexdigit) {
            return Err(ReadError::Bad("invalid chunk size"));
        }
        let size = match httparse::parse_chunk_size(line) {
            Ok(httparse::Status::Complete((n, size))) if n == line.len() => size,
            _ => return Err(ReadError::Bad("invalid chunk size")),
        };
        if size == 0 {
            return read_trailers(r, line, &mut budget, deadline);
        }
        match (body.len() as u64).checked_add(size) {
            // At most `limit`, so a usize.
            Some(total) if total <= limit => read_exact(r, body, size as usize, deadline)?,
            _ => return Err(ReadError::BodyTooLarge),
        }
        read_line(r, line, &mut budget, deadline)?;
        if !matches!(line.as_slice(), b"\r\n" | b"\n") {
            return Err(ReadError::Bad("chunk not followed by CRLF"));
        }
    }
}

/// Trailer fields after the last chunk, then the blank line: read and dropped.
fn read_trailers<R: ReadTimeout>(
    r: &mut BufReader<R>,
    line: &mut Vec<u8>,
    budget: &mut usize,
    deadline: Instant,
) -> Result<(), ReadError> {
    for _ in 0..=HEADERS_MAX {
        read_line(r, line, budget, deadline)?;
        if matches!(line.as_slice(), b"\r\n" | b"\n") {
            return Ok(());
        }
        if !line.contains(&b':') {
            return Err(ReadError::Bad("malformed trailer"));
        }
    }
    Err(ReadError::HeadTooLarge)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::request::read_head;
    use std::time::Duration;

    /// Head and body of `raw`, and what was written back.
    fn parse(raw: &[u8], limit: usize) -> Result<(Head, Vec<u8>, Vec<u8>), ReadError> {
        let mut r = BufReader::new(raw);
        let (mut line, mut body, mut sent) = (Vec::new(), Vec::new(), Vec::new());
        let second = Duration::from_secs(1);
        let head = read_head(&mut r, &mut line, second, second)?;
        read_body(&mut r, &mut sent, &head, limit, Instant::now() + second, &mut body, &mut line)?;
        Ok((head, body, sent))
    }

    fn bad(raw: &[u8]) -> &'static str {
        match parse(raw, 100) {
            Err(ReadError::Bad(why)) => why,
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(raw)),
        }
    }

    #[test]
    fn bodies_by_length_and_chunked() {
        let (_, b, sent) =
            parse(b"POST / HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello", 100).unwrap();
        assert_eq!((b.as_slice(), sent.as_slice()), (&b"hello"[..], &b"HTTP/1.1 100 Continue\r\n\r\n"[..]));
        let raw = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y ; z=\"q\"\r\nde\r\nA \r\n0123456789\r\n0\r\nT: 1\r\nU: 2\r\n\r\n";
        assert_eq!(parse(raw, 100).unwrap().1, b"abcde0123456789");
        // A body of exactly the limit is taken.
        assert_eq!(parse(b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", 3).unwrap().1, b"abc");
        assert_eq!(
            parse(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 3).unwrap().1,
            b"abc"
        );
    }

    #[test]
    fn sizes_past_the_limit_are_413_whatever_they_add_up_to() {
        for raw in [
            &b"POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcd"[..],
            b"POST / HTTP/1.1\r\nContent-Length: 18446744073709551615\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n",
            // Sizes whose sum wraps a u64 (and so a usize).
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\nffffffffffffffff\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\nFFFFFFFFFFFFFFFF\r\n",
        ] {
            assert!(matches!(parse(raw, 3), Err(ReadError::BodyTooLarge)), "{:?}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn malformed_chunked_bodies_are_refused_by_name() {
        let te = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        for (rest, why) in [
            ("zz\r\n", "invalid chunk size"),
            ("\r\n", "invalid chunk size"),
            (";x\r\n", "invalid chunk size"),
            ("10000000000000000\r\n", "invalid chunk size"),
            ("3 4\r\nabc\r\n", "invalid chunk size"),
            ("3\nabc\r\n", "invalid chunk size"),
            ("3\r\nabcd\r\n", "chunk not followed by CRLF"),
            ("3\r\nab", "connection closed inside the body"),
            ("3\r\nabc\r\n", "connection closed inside a chunked body"),
            ("0\r\nno colon\r\n\r\n", "malformed trailer"),
        ] {
            assert_eq!(bad(format!("{te}{rest}").as_bytes()), why, "{rest:?}");
        }
        let long_ext = format!("{te}1;{}\r\na\r\n0\r\n\r\n", "x".repeat(HEAD_BYTES_MAX));
        assert_eq!(bad(long_ext.as_bytes()), "chunk sizes and trailers over 64 KiB");
        let many = format!("{te}0\r\n{}\r\n", "T: 1\r\n".repeat(HEADERS_MAX + 1));
        assert!(matches!(parse(many.as_bytes(), 100), Err(ReadError::HeadTooLarge)));
        assert_eq!(bad(b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nabc"), "connection closed inside the body");
    }
}

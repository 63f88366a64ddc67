//! HTTP/1.1 request framing, bytes in: the request line, headers, and a
//! body by Content-Length or chunked encoding. Every length is bounded, and
//! anything malformed is an error that names what was wrong; the server
//! answers it and closes the connection. No sockets here beyond the reader.

use std::io::{self, BufRead, Write};

/// Most bytes of request line plus headers.
pub const HEAD_BYTES_MAX: usize = 64 * 1024;
/// Most header lines in one request.
pub const HEADERS_MAX: usize = 128;

/// The parts of a request head the server uses.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Head {
    pub method: String,
    pub target: String,
    /// HTTP/1.1 (keep-alive by default) rather than 1.0.
    pub http11: bool,
    pub content_length: Option<usize>,
    pub chunked: bool,
    /// `Connection: close` (or 1.0 without keep-alive).
    pub close: bool,
    pub expect_continue: bool,
    pub authorization: Option<String>,
}

/// Why a request could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The peer closed (or went idle past the timeout) between requests.
    Closed,
    Io(io::Error),
    /// Malformed: answer 400 and close.
    Bad(&'static str),
    /// Headers past `HEAD_BYTES_MAX` or `HEADERS_MAX`: answer 431 and close.
    HeadTooLarge,
    /// Body past the limit: answer 413 and close.
    BodyTooLarge,
}

fn read_line<R: BufRead>(r: &mut R, line: &mut Vec<u8>, budget: &mut usize) -> Result<bool, ReadError> {
    line.clear();
    loop {
        let avail = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ReadError::Io(e)),
        };
        if avail.is_empty() {
            return Ok(false);
        }
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (avail.len(), false),
        };
        if take > *budget {
            return Err(ReadError::HeadTooLarge);
        }
        *budget -= take;
        line.extend_from_slice(&avail[..take]);
        r.consume(take);
        if done {
            while matches!(line.last(), Some(b'\n' | b'\r')) {
                line.pop();
            }
            return Ok(true);
        }
    }
}

/// Reads one request head. `Closed` if the peer closed before sending a byte.
pub fn read_head<R: BufRead>(r: &mut R, line: &mut Vec<u8>) -> Result<Head, ReadError> {
    let mut budget = HEAD_BYTES_MAX;
    // Tolerate blank lines between requests (RFC 9112 2.2).
    let first = loop {
        match read_line(r, line, &mut budget) {
            Ok(false) => return Err(ReadError::Closed),
            Ok(true) if line.is_empty() => continue,
            Ok(true) => {
                break std::str::from_utf8(line).map_err(|_| ReadError::Bad("request line is not UTF-8"))?.to_string()
            }
            Err(ReadError::Io(e)) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(ReadError::Closed)
            }
            Err(e) => return Err(e),
        }
    };
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ReadError::Bad("malformed request line"));
    };
    let http11 = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        _ => return Err(ReadError::Bad("unsupported HTTP version")),
    };
    if method.is_empty() || !target.starts_with('/') {
        return Err(ReadError::Bad("malformed request line"));
    }
    let mut head =
        Head { method: method.to_string(), target: target.to_string(), http11, close: !http11, ..Head::default() };
    for _ in 0..=HEADERS_MAX {
        if !read_line(r, line, &mut budget)? {
            return Err(ReadError::Bad("connection closed inside the headers"));
        }
        if line.is_empty() {
            if head.chunked && head.content_length.is_some() {
                return Err(ReadError::Bad("both Content-Length and chunked"));
            }
            return Ok(head);
        }
        let text = std::str::from_utf8(line).map_err(|_| ReadError::Bad("header is not UTF-8"))?;
        let (name, value) = text.split_once(':').ok_or(ReadError::Bad("malformed header"))?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n = value.parse::<usize>().map_err(|_| ReadError::Bad("invalid Content-Length"))?;
            if head.content_length.is_some_and(|m| m != n) {
                return Err(ReadError::Bad("conflicting Content-Length headers"));
            }
            head.content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            if value.eq_ignore_ascii_case("chunked") {
                head.chunked = true;
            } else if !value.eq_ignore_ascii_case("identity") {
                return Err(ReadError::Bad("unsupported Transfer-Encoding"));
            }
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    head.close = true;
                } else if token.eq_ignore_ascii_case("keep-alive") && !http11 {
                    head.close = false;
                }
            }
        } else if name.eq_ignore_ascii_case("expect") {
            head.expect_continue = value.eq_ignore_ascii_case("100-continue");
        } else if name.eq_ignore_ascii_case("authorization") {
            head.authorization = Some(value.to_string());
        }
    }
    Err(ReadError::HeadTooLarge)
}

/// Reads the body `head` announces into `body` (cleared first), at most
/// `limit` bytes; sends `100 Continue` first when the client asked for it.
pub fn read_body<R: BufRead, W: Write>(
    r: &mut R,
    w: &mut W,
    head: &Head,
    limit: usize,
    body: &mut Vec<u8>,
    line: &mut Vec<u8>,
) -> Result<(), ReadError> {
    body.clear();
    if head.content_length.is_some_and(|n| n > limit) {
        return Err(ReadError::BodyTooLarge);
    }
    if head.expect_continue && (head.chunked || head.content_length.is_some_and(|n| n > 0)) {
        w.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").map_err(ReadError::Io)?;
        w.flush().map_err(ReadError::Io)?;
    }
    if let Some(n) = head.content_length {
        body.resize(n, 0);
        r.read_exact(body).map_err(ReadError::Io)?;
        return Ok(());
    }
    if !head.chunked {
        return Ok(());
    }
    let mut budget = HEAD_BYTES_MAX;
    loop {
        if !read_line(r, line, &mut budget)? {
            return Err(ReadError::Bad("connection closed inside a chunked body"));
        }
        let size_text = std::str::from_utf8(line).map_err(|_| ReadError::Bad("invalid chunk size"))?;
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| ReadError::Bad("invalid chunk size"))?;
        if size == 0 {
            // Trailers, then the blank line.
            loop {
                if !read_line(r, line, &mut budget)? || line.is_empty() {
                    return Ok(());
                }
            }
        }
        if body.len() + size > limit {
            return Err(ReadError::BodyTooLarge);
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..]).map_err(ReadError::Io)?;
        if !read_line(r, line, &mut budget)? || !line.is_empty() {
            return Err(ReadError::Bad("chunk not followed by CRLF"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str, limit: usize) -> Result<(Head, Vec<u8>, Vec<u8>), ReadError> {
        let mut r = std::io::BufReader::new(raw.as_bytes());
        let mut line = Vec::new();
        let head = read_head(&mut r, &mut line)?;
        let (mut body, mut sent) = (Vec::new(), Vec::new());
        read_body(&mut r, &mut sent, &head, limit, &mut body, &mut line)?;
        Ok((head, body, sent))
    }

    #[test]
    fn content_length_chunked_and_continue() {
        let (h, b, sent) =
            parse("POST /query?x=1 HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello", 100).unwrap();
        assert_eq!((h.method.as_str(), h.target.as_str(), h.close), ("POST", "/query?x=1", false));
        assert_eq!(b, b"hello");
        assert_eq!(sent, b"HTTP/1.1 100 Continue\r\n\r\n");
        let (_, b, _) = parse(
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nT: 1\r\n\r\n",
            100,
        )
        .unwrap();
        assert_eq!(b, b"abcde");
        let (h, _, _) = parse("GET /health HTTP/1.0\r\n\r\n", 10).unwrap();
        assert!(h.close);
        let (h, _, _) =
            parse("GET /health HTTP/1.1\r\nConnection: close\r\nAuthorization: Bearer t\r\n\r\n", 10).unwrap();
        assert!(h.close);
        assert_eq!(h.authorization.as_deref(), Some("Bearer t"));
    }

    #[test]
    fn limits_and_malformed_input() {
        assert!(matches!(
            parse("POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\nhello world", 10),
            Err(ReadError::BodyTooLarge)
        ));
        assert!(matches!(
            parse("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nb\r\nhello world\r\n0\r\n\r\n", 10),
            Err(ReadError::BodyTooLarge)
        ));
        assert!(matches!(parse("", 10), Err(ReadError::Closed)));
        for bad in [
            "GET\r\n\r\n",
            "GET / HTTP/2\r\n\r\n",
            "GET x HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nNoColon\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        ] {
            assert!(matches!(parse(bad, 10), Err(ReadError::Bad(_))), "{bad:?}");
        }
        let huge = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(HEAD_BYTES_MAX));
        assert!(matches!(parse(&huge, 10), Err(ReadError::HeadTooLarge)));
        let many = format!("GET / HTTP/1.1\r\n{}\r\n", "X: 1\r\n".repeat(HEADERS_MAX + 1));
        assert!(matches!(parse(&many, 10), Err(ReadError::HeadTooLarge)));
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x: u64 = 42;
        for _ in 0..20_000 {
            let n = (x % 200) as usize;
            let raw: Vec<u8> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    b"GET /\r\n: 0123456789abcdef;HTTP/1.1 chunkedContent-Length"[(x % 52) as usize]
                })
                .collect();
            let mut r = std::io::BufReader::new(&raw[..]);
            let mut line = Vec::new();
            if let Ok(h) = read_head(&mut r, &mut line) {
                let _ = read_body(&mut r, &mut Vec::new(), &h, 64, &mut Vec::new(), &mut line);
            }
        }
    }
}

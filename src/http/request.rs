//! HTTP/1.1 request heads, bytes in. `httparse` parses the request line and
//! headers; this module bounds what it is given (bytes, header count, time)
//! and reads the few headers the server reacts to, refusing every value it
//! cannot honour exactly: a Content-Length that is not plain digits or does
//! not fit in 64 bits, conflicting lengths, a transfer coding other than
//! chunked, chunked twice, or chunked together with a length (the pairs
//! that let two parsers disagree on where a request ends). Bodies are in
//! `body.rs`. Anything malformed is an error that names what was wrong; the
//! server answers it and closes the connection.
//!
//! # Time
//!
//! A connection waits for the first byte of a head at most `first_byte`
//! (the idle timeout between requests); from that byte on, the whole head
//! must arrive within `head_timeout` or the request is refused with 408.
//! Every blocking read is given only the time left, so a client sending one
//! byte a second cannot hold its connection past the deadline.

use std::io::{self, BufRead, BufReader, Read};
use std::time::{Duration, Instant};

/// Most bytes of request line plus headers.
pub const HEAD_BYTES_MAX: usize = 64 * 1024;
/// Most header lines in one request (and trailer lines in one chunked body).
pub const HEADERS_MAX: usize = 128;

/// The parts of a request head the server uses.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Head {
    pub method: String,
    pub target: String,
    /// HTTP/1.1 (keep-alive by default) rather than 1.0.
    pub http11: bool,
    pub content_length: Option<u64>,
    pub chunked: bool,
    /// `Connection: close` (or 1.0 without keep-alive).
    pub close: bool,
    pub expect_continue: bool,
    pub authorization: Option<String>,
    /// The value of the access log's trace id header, if asked for and sent.
    pub trace_id: Option<String>,
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
    /// The head or body did not arrive by its deadline: answer 408 and close.
    TimedOut,
}

/// A byte stream whose blocking reads can be bounded in time: a socket;
/// in tests, bytes in memory, which never block.
pub trait ReadTimeout: Read {
    /// Bounds each later blocking read by `timeout` (never zero).
    fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()>;
}

impl ReadTimeout for &[u8] {
    fn set_read_timeout(&mut self, _: Duration) -> io::Result<()> {
        Ok(())
    }
}

/// Reads from `r` into `out` (through its buffer, or straight past it for
/// large reads), the read bounded by `deadline`; 0 at end of stream.
pub(super) fn read_by<R: ReadTimeout>(
    r: &mut BufReader<R>,
    out: &mut [u8],
    deadline: Instant,
) -> Result<usize, ReadError> {
    arm(r, deadline.saturating_duration_since(Instant::now()))?;
    loop {
        match r.read(out) {
            Ok(n) => return Ok(n),
            Err(e) => check(e)?,
        }
    }
}

/// What `r` has buffered, reading more if it has nothing, within `deadline`.
/// Empty at end of stream.
pub(super) fn fill<R: ReadTimeout>(r: &mut BufReader<R>, deadline: Instant) -> Result<&[u8], ReadError> {
    fill_within(r, deadline.saturating_duration_since(Instant::now()))
}

/// What `r` has buffered, reading more if it has nothing, within `timeout`.
fn fill_within<R: ReadTimeout>(r: &mut BufReader<R>, timeout: Duration) -> Result<&[u8], ReadError> {
    arm(r, timeout)?;
    loop {
        match r.fill_buf() {
            Ok(_) => break,
            Err(e) => check(e)?,
        }
    }
    Ok(r.buffer())
}

/// Gives the next read of `r`, if it will block, `timeout` (the time left).
fn arm<R: ReadTimeout>(r: &mut BufReader<R>, timeout: Duration) -> Result<(), ReadError> {
    if r.buffer().is_empty() {
        if timeout.is_zero() {
            return Err(ReadError::TimedOut);
        }
        r.get_mut().set_read_timeout(timeout).map_err(ReadError::Io)?;
    }
    Ok(())
}

/// Ok for an interrupted read (to retry it); the error otherwise.
fn check(e: io::Error) -> Result<(), ReadError> {
    match e.kind() {
        io::ErrorKind::Interrupted => Ok(()),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Err(ReadError::TimedOut),
        _ => Err(ReadError::Io(e)),
    }
}

/// Where the head in `buf` ends (just past its blank line), looking only at
/// what may have changed since `from` bytes were scanned.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let start = from.saturating_sub(2);
    buf[start..].iter().enumerate().filter(|&(_, &b)| b == b'\n').find_map(|(i, _)| match &buf[start + i + 1..] {
        [b'\n', ..] => Some(start + i + 2),
        [b'\r', b'\n', ..] => Some(start + i + 3),
        _ => None,
    })
}

/// Reads one request head into `buf` (scratch, cleared first) and parses
/// it. `Closed` if the peer closed, or sent nothing within `first_byte`,
/// before the first byte; `TimedOut` if the head was not complete within
/// `head_timeout` of that byte.
pub fn read_head<R: ReadTimeout>(
    r: &mut BufReader<R>,
    buf: &mut Vec<u8>,
    first_byte: Duration,
    head_timeout: Duration,
) -> Result<Head, ReadError> {
    read_head_traced(r, buf, first_byte, head_timeout, None)
}

/// As `read_head`, also keeping the value of header `trace_header`
/// (lowercase) in `Head::trace_id`.
pub fn read_head_traced<R: ReadTimeout>(
    r: &mut BufReader<R>,
    buf: &mut Vec<u8>,
    first_byte: Duration,
    head_timeout: Duration,
    trace_header: Option<&str>,
) -> Result<Head, ReadError> {
    buf.clear();
    // The same wait before every request: the socket's timeout is set once.
    let first = match fill_within(r, first_byte) {
        Ok([]) | Err(ReadError::TimedOut) => return Err(ReadError::Closed),
        Ok(_) => Instant::now(),
        Err(e) => return Err(e),
    };
    let deadline = first + head_timeout;
    // Blank lines before a request are tolerated (RFC 9112 2.2); they count
    // against the budget like head bytes.
    let mut skipped = 0usize;
    loop {
        let avail = fill(r, deadline)?;
        if avail.is_empty() {
            return Err(ReadError::Bad("connection closed inside the request head"));
        }
        let mut take = avail.len().min(HEAD_BYTES_MAX + 1 - buf.len() - skipped);
        let mut start = 0;
        if buf.is_empty() {
            start = avail[..take].iter().take_while(|&&b| b == b'\r' || b == b'\n').count();
            skipped += start;
        }
        let scanned = buf.len();
        buf.extend_from_slice(&avail[start..take]);
        if let Some(end) = head_end(buf, scanned) {
            // Leave what follows the head (a body, a pipelined request) unread.
            take = start + end - scanned;
            buf.truncate(end);
            r.consume(take);
            return parse_head(buf, trace_header);
        }
        r.consume(take);
        if buf.len() + skipped > HEAD_BYTES_MAX {
            return Err(ReadError::HeadTooLarge);
        }
    }
}

/// Parses a complete head (ending with its blank line).
fn parse_head(buf: &[u8], trace_header: Option<&str>) -> Result<Head, ReadError> {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n == buf.len() => {}
        Ok(_) => return Err(ReadError::Bad("malformed request head")),
        Err(httparse::Error::TooManyHeaders) => return Err(ReadError::HeadTooLarge),
        Err(httparse::Error::Version) => return Err(ReadError::Bad("unsupported HTTP version")),
        Err(httparse::Error::Token | httparse::Error::Status) => return Err(ReadError::Bad("malformed request line")),
        Err(_) => return Err(ReadError::Bad("malformed header")),
    }
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Err(ReadError::Bad("malformed request line"));
    };
    if !target.starts_with('/') {
        return Err(ReadError::Bad("request target must start with /"));
    }
    let http11 = version == 1;
    let mut head =
        Head { method: method.to_string(), target: target.to_string(), http11, close: !http11, ..Head::default() };
    for h in req.headers.iter() {
        apply_header(&mut head, h.name, h.value)?;
        if trace_header.is_some_and(|t| h.name.eq_ignore_ascii_case(t)) {
            // A value that is not text is left out rather than refused: it
            // only feeds the log.
            head.trace_id = std::str::from_utf8(h.value).ok().map(|v| v.trim().to_string());
        }
    }
    if head.chunked && head.content_length.is_some() {
        return Err(ReadError::Bad("both Content-Length and chunked"));
    }
    Ok(head)
}

/// Comma-separated list items of a header value, trimmed, as ASCII text.
fn items(value: &[u8]) -> Result<impl Iterator<Item = &str>, ReadError> {
    let text = std::str::from_utf8(value).map_err(|_| ReadError::Bad("header value is not UTF-8"))?;
    Ok(text.split(',').map(|t| t.trim_matches([' ', '\t'])))
}

/// Takes in one header the server reacts to; ignores the rest.
fn apply_header(head: &mut Head, name: &str, value: &[u8]) -> Result<(), ReadError> {
    if name.eq_ignore_ascii_case("content-length") {
        let digits = value.trim_ascii();
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Err(ReadError::Bad("invalid Content-Length"));
        }
        let n = digits
            .iter()
            .try_fold(0u64, |n, &d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
            .ok_or(ReadError::BodyTooLarge)?;
        if head.content_length.is_some_and(|m| m != n) {
            return Err(ReadError::Bad("conflicting Content-Length headers"));
        }
        head.content_length = Some(n);
    } else if name.eq_ignore_ascii_case("transfer-encoding") {
        for coding in items(value)? {
            if !head.chunked && coding.eq_ignore_ascii_case("chunked") {
                head.chunked = true;
            } else if head.chunked || !coding.eq_ignore_ascii_case("identity") {
                // Only chunked, once and last, is a body we can frame.
                return Err(ReadError::Bad("unsupported Transfer-Encoding"));
            }
        }
    } else if name.eq_ignore_ascii_case("connection") {
        for token in items(value)? {
            if token.eq_ignore_ascii_case("close") {
                head.close = true;
            } else if token.eq_ignore_ascii_case("keep-alive") && !head.http11 {
                head.close = false;
            }
        }
    } else if name.eq_ignore_ascii_case("expect") {
        head.expect_continue = value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
    } else if name.eq_ignore_ascii_case("authorization") {
        let text = std::str::from_utf8(value).map_err(|_| ReadError::Bad("Authorization is not UTF-8"))?;
        head.authorization = Some(text.trim().to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    pub(crate) fn head(raw: &[u8]) -> Result<Head, ReadError> {
        read_head(&mut BufReader::new(raw), &mut Vec::new(), SECOND, SECOND)
    }

    #[test]
    fn the_headers_the_server_reacts_to() {
        let h = head(b"POST /query?x=1 HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n").unwrap();
        assert_eq!((h.method.as_str(), h.target.as_str(), h.close), ("POST", "/query?x=1", false));
        assert_eq!((h.content_length, h.expect_continue, h.chunked), (Some(5), true, false));
        let h = head(b"POST / HTTP/1.1\r\ntransfer-encoding: identity, Chunked\r\n\r\n").unwrap();
        assert!(h.chunked);
        assert!(head(b"GET /health HTTP/1.0\r\n\r\n").unwrap().close);
        assert!(!head(b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").unwrap().close);
        let h = head(b"GET /health HTTP/1.1\r\nConnection: x, close\r\nAuthorization:  Bearer t \r\n\r\n").unwrap();
        assert!(h.close);
        assert_eq!(h.authorization.as_deref(), Some("Bearer t"));
        // Blank lines before a request, bare LF line ends, equal repeated lengths.
        let h = head(b"\r\n\nGET / HTTP/1.1\nContent-Length: 0\nContent-Length: 0\n\n").unwrap();
        assert_eq!(h.content_length, Some(0));
    }

    #[test]
    fn the_trace_header_is_kept_when_asked_for() {
        let raw = b"GET /health HTTP/1.1\r\nX-Trace-Id:  abc-1 \r\n\r\n";
        let h = read_head_traced(&mut BufReader::new(&raw[..]), &mut Vec::new(), SECOND, SECOND, Some("x-trace-id"));
        assert_eq!(h.unwrap().trace_id.as_deref(), Some("abc-1"));
        assert_eq!(head(raw).unwrap().trace_id, None);
    }

    #[test]
    fn the_head_ends_at_its_blank_line_and_leaves_the_rest() {
        let raw = b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiGET / HTTP/1.1\r\n\r\n";
        let mut r = BufReader::new(&raw[..]);
        let mut buf = Vec::new();
        assert_eq!(read_head(&mut r, &mut buf, SECOND, SECOND).unwrap().content_length, Some(2));
        assert_eq!(r.buffer(), b"hiGET / HTTP/1.1\r\n\r\n");
        // Fed one byte at a time, the same head ends at the same byte.
        let mut r = BufReader::with_capacity(1, &raw[..]);
        assert_eq!(read_head(&mut r, &mut buf, SECOND, SECOND).unwrap().content_length, Some(2));
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"hiGET / HTTP/1.1\r\n\r\n");
    }

    #[test]
    fn malformed_heads_are_refused_by_name() {
        for (raw, why) in [
            (&b"GET\r\n\r\n"[..], "malformed request line"),
            (b"GET / HTTP/2\r\n\r\n", "unsupported HTTP version"),
            (b"GET x HTTP/1.1\r\n\r\n", "request target must start with /"),
            (b"GET / HTTP/1.1\r\nNoColon\r\n\r\n", "malformed header"),
            (b"GET / HTTP/1.1\r\nX : 1\r\n\r\n", "malformed header"),
            (b"GET / HTTP/1.1\r\nX: 1\r\n folded\r\n\r\n", "malformed header"),
            (b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", "invalid Content-Length"),
            (b"POST / HTTP/1.1\r\nContent-Length: +1\r\n\r\n", "invalid Content-Length"),
            (b"POST / HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\n", "invalid Content-Length"),
            (b"POST / HTTP/1.1\r\nContent-Length:\r\n\r\n", "invalid Content-Length"),
            (
                b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                "conflicting Content-Length headers",
            ),
            (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", "unsupported Transfer-Encoding"),
            (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", "unsupported Transfer-Encoding"),
            (
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                "unsupported Transfer-Encoding",
            ),
            (
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
                "both Content-Length and chunked",
            ),
            (b"GET / HTTP/1.1\r\nAuthorization: \xff\r\n\r\n", "Authorization is not UTF-8"),
            (b"GET / HTTP/1.1\r\nX: 1\r\n", "connection closed inside the request head"),
        ] {
            match head(raw) {
                Err(ReadError::Bad(got)) => assert_eq!(got, why, "{:?}", String::from_utf8_lossy(raw)),
                other => panic!("{:?}: {other:?}", String::from_utf8_lossy(raw)),
            }
        }
        assert!(matches!(head(b""), Err(ReadError::Closed)));
        // A length past u64 is too large, not malformed.
        let huge = b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n";
        assert!(matches!(head(huge), Err(ReadError::BodyTooLarge)));
    }

    #[test]
    fn heads_past_their_limits_are_431() {
        let long = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(HEAD_BYTES_MAX));
        assert!(matches!(head(long.as_bytes()), Err(ReadError::HeadTooLarge)));
        let blank = "\r\n".repeat(HEAD_BYTES_MAX);
        assert!(matches!(head(blank.as_bytes()), Err(ReadError::HeadTooLarge)));
        let many = format!("GET / HTTP/1.1\r\n{}\r\n", "X: 1\r\n".repeat(HEADERS_MAX + 1));
        assert!(matches!(head(many.as_bytes()), Err(ReadError::HeadTooLarge)));
        let most = format!("GET / HTTP/1.1\r\n{}\r\n", "X: 1\r\n".repeat(HEADERS_MAX));
        assert!(head(most.as_bytes()).is_ok());
    }
}

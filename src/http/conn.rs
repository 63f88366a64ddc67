//! One connection's bytes in: request heads and bodies, read into one
//! buffer per connection, bounded in bytes, count and time.
//!
//! `httparse` parses the request line and headers; this module bounds what
//! it is given and reads the few headers the server reacts to, refusing
//! every value it cannot honour exactly: a Content-Length that is not plain
//! digits or does not fit in 64 bits, conflicting lengths, a transfer coding
//! other than chunked, chunked twice, or chunked together with a length
//! (the pairs that let two parsers disagree on where a request ends).
//! Bodies come by Content-Length (read in place, in as few reads as the
//! socket allows) or chunked (`httparse` parses the size lines; size lines
//! and trailers of one body share one `HEAD_BYTES_MAX` budget, trailers
//! count against `HEADERS_MAX`). Every size from the wire is a u64 checked
//! against the limit before anything is allocated. Anything malformed is an
//! error that names what was wrong; the server answers it and closes.
//!
//! Time: a connection waits for the first byte of a head at most
//! `first_byte`; from that byte on the head must arrive within
//! `head_timeout`, and the body by its deadline, or the request is refused
//! with 408. Every blocking read is given at most the time left, so a
//! client sending one byte a second cannot hold its connection past the
//! deadline; the socket's timeout is only set when it must shrink.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::ops::Range;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Most bytes of request line plus headers (blank lines before it included).
pub const HEAD_BYTES_MAX: usize = 64 * 1024;
/// Most header lines in one request (and trailer lines in one chunked body).
pub const HEADERS_MAX: usize = 128;
/// A connection's buffer to start with; it grows to hold the largest
/// request (head and body), and one past `BUF_KEPT_BYTES` is dropped after it
/// (so is a decoded chunked body's), so an idle keep-alive connection holds
/// no more than that whatever it once sent.
const BUF_BYTES: usize = 16 * 1024;
const BUF_KEPT_BYTES: usize = 1 << 20;
/// After a refusal, what the client still sends is read and dropped for at
/// most this long and this many bytes before the close, so the close does
/// not reset the connection before the client has read the refusal.
const LINGER_MS: u64 = 500;
const LINGER_BYTES_MAX: usize = 64 * 1024;

/// A byte stream the server reads requests from and writes replies to: a
/// TCP or Unix socket; in tests, bytes in memory.
pub trait Socket: Read + Write + Send {
    /// Bounds each later blocking read by `timeout` (never zero).
    fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()>;
    fn shutdown(&self, how: Shutdown);
}

macro_rules! socket {
    ($($t:ty),*) => {$(
        impl Socket for $t {
            fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()> {
                <$t>::set_read_timeout(self, Some(timeout))
            }
            fn shutdown(&self, how: Shutdown) {
                let _ = <$t>::shutdown(self, how);
            }
        }
    )*};
}
socket!(TcpStream, UnixStream);

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
    /// An `Accept` header lists the compact dump format (and not with q=0).
    pub accepts_compact_dump: bool,
    /// The value of the access log's trace id header, if asked for and sent.
    pub trace_id: Option<String>,
}

/// Why a request could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The peer closed (or went idle past the timeout) between requests.
    Closed,
    /// Reading or writing the socket failed.
    Io,
    /// Malformed: answer 400 and close.
    Bad(&'static str),
    /// Headers past `HEAD_BYTES_MAX` or `HEADERS_MAX`: answer 431 and close.
    HeadTooLarge,
    /// Body past the limit: answer 413 and close.
    BodyTooLarge,
    /// The head or body did not arrive by its deadline: answer 408 and close.
    TimedOut,
}

/// A connection: its socket and the bytes read from it, `buf[start..end]`
/// not yet consumed (the rest of a request, or pipelined ones).
pub struct Conn<S> {
    pub sock: S,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The read timeout last set on the socket.
    timeout: Option<Duration>,
    /// A chunked body, decoded.
    chunked: Vec<u8>,
}

impl<S: Socket> Conn<S> {
    pub fn new(sock: S) -> Conn<S> {
        Conn { sock, buf: vec![0; BUF_BYTES], start: 0, end: 0, timeout: None, chunked: Vec::new() }
    }

    /// Makes room for at least `free` more bytes after `end`.
    fn room(&mut self, free: usize) {
        if self.buf.len() - self.end >= free {
            return;
        }
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
        if self.buf.len() - self.end < free {
            self.buf.resize(self.end + free, 0);
        }
    }

    /// Reads what the socket has (at most one read that returns data)
    /// before `deadline`; 0 at the end of the stream.
    fn fill(&mut self, deadline: Instant) -> Result<usize, ReadError> {
        self.room(BUF_BYTES / 4);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ReadError::TimedOut);
            }
            if self.timeout.is_none_or(|t| t > left) {
                self.sock.set_read_timeout(left).map_err(|_| ReadError::Io)?;
                self.timeout = Some(left);
            }
            match self.sock.read(&mut self.buf[self.end..]) {
                Ok(n) => {
                    self.end += n;
                    return Ok(n);
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock) => {}
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                Err(_) => return Err(ReadError::Io),
            }
        }
    }

    /// Reads until `n` unconsumed bytes are buffered.
    fn need(&mut self, n: usize, deadline: Instant, closed: &'static str) -> Result<(), ReadError> {
        while self.end - self.start < n {
            self.room(n - (self.end - self.start));
            if self.fill(deadline)? == 0 {
                return Err(ReadError::Bad(closed));
            }
        }
        Ok(())
    }

    /// Reads one request head and parses it; `trace_header` (lowercase) is
    /// kept in `Head::trace_id`. `Closed` if the peer closed, or sent
    /// nothing within `first_byte`, before the first byte; `TimedOut` if the
    /// head was not complete within `head_timeout` of that byte.
    pub fn read_head(
        &mut self,
        first_byte: Duration,
        head_timeout: Duration,
        trace_header: Option<&str>,
    ) -> Result<Head, ReadError> {
        if self.chunked.capacity() > BUF_KEPT_BYTES {
            self.chunked = Vec::new();
        }
        if self.start == self.end {
            if self.buf.len() > BUF_KEPT_BYTES {
                self.buf = vec![0; BUF_BYTES];
            }
            (self.start, self.end) = (0, 0);
            match self.fill(Instant::now() + first_byte) {
                Ok(0) | Err(ReadError::TimedOut) => return Err(ReadError::Closed),
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        let deadline = Instant::now() + head_timeout;
        let (mut skipped, mut scanned) = (0, 0);
        loop {
            if scanned == 0 {
                // Blank lines before a request are tolerated (RFC 9112 2.2).
                let blank = self.buf[self.start..self.end].iter().take_while(|&&b| b == b'\r' || b == b'\n').count();
                self.start += blank;
                skipped += blank;
            }
            let data = &self.buf[self.start..self.end];
            if let Some(len) = head_end(data, scanned).filter(|len| len + skipped <= HEAD_BYTES_MAX) {
                let head = parse_head(&data[..len], trace_header)?;
                self.start += len;
                return Ok(head);
            }
            scanned = data.len();
            if scanned + skipped > HEAD_BYTES_MAX {
                return Err(ReadError::HeadTooLarge);
            }
            if self.fill(deadline)? == 0 {
                return Err(ReadError::Bad("connection closed inside the request head"));
            }
        }
    }

    /// Reads the body `head` announces, at most `limit` bytes, all of it
    /// before `deadline`; sends `100 Continue` first when the client asked.
    pub fn read_body(&mut self, head: &Head, limit: usize, deadline: Instant) -> Result<&[u8], ReadError> {
        if head.content_length.is_some_and(|n| n > limit as u64) {
            return Err(ReadError::BodyTooLarge);
        }
        if head.expect_continue && (head.chunked || head.content_length.is_some_and(|n| n > 0)) {
            self.sock.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").map_err(|_| ReadError::Io)?;
        }
        if head.chunked {
            self.read_chunked(limit as u64, deadline)?;
            return Ok(&self.chunked);
        }
        // At most `limit`, so a usize.
        let n = head.content_length.unwrap_or(0) as usize;
        self.need(n, deadline, "connection closed inside the body")?;
        self.start += n;
        Ok(&self.buf[self.start - n..self.start])
    }

    fn read_chunked(&mut self, limit: u64, deadline: Instant) -> Result<(), ReadError> {
        self.chunked.clear();
        let mut budget = HEAD_BYTES_MAX;
        loop {
            let line = self.line(&mut budget, deadline)?;
            let line = &self.buf[line];
            // httparse takes an empty size as 0: insist on a digit.
            let size = match httparse::parse_chunk_size(line) {
                Ok(httparse::Status::Complete((n, size))) if n == line.len() && line[0].is_ascii_hexdigit() => size,
                _ => return Err(ReadError::Bad("invalid chunk size")),
            };
            if size == 0 {
                break;
            }
            if (self.chunked.len() as u64).checked_add(size).is_none_or(|total| total > limit) {
                return Err(ReadError::BodyTooLarge);
            }
            // At most `limit`, so a usize.
            let size = size as usize;
            self.need(size, deadline, "connection closed inside the body")?;
            self.chunked.extend_from_slice(&self.buf[self.start..self.start + size]);
            self.start += size;
            let line = self.line(&mut budget, deadline)?;
            if !matches!(&self.buf[line], b"\r\n" | b"\n") {
                return Err(ReadError::Bad("chunk not followed by CRLF"));
            }
        }
        // Trailer fields, then the blank line: read and dropped.
        for _ in 0..=HEADERS_MAX {
            let line = self.line(&mut budget, deadline)?;
            match &self.buf[line] {
                b"\r\n" | b"\n" => return Ok(()),
                t if !t.contains(&b':') => return Err(ReadError::Bad("malformed trailer")),
                _ => {}
            }
        }
        Err(ReadError::HeadTooLarge)
    }

    /// Consumes one line, LF included, charging `budget`.
    fn line(&mut self, budget: &mut usize, deadline: Instant) -> Result<Range<usize>, ReadError> {
        let mut scanned = 0;
        loop {
            let data = &self.buf[self.start..self.end];
            if let Some(i) = data[scanned..].iter().position(|&b| b == b'\n') {
                let take = scanned + i + 1;
                if take > *budget {
                    break;
                }
                *budget -= take;
                self.start += take;
                return Ok(self.start - take..self.start);
            }
            scanned = data.len();
            if scanned > *budget {
                break;
            }
            if self.fill(deadline)? == 0 {
                return Err(ReadError::Bad("connection closed inside a chunked body"));
            }
        }
        Err(ReadError::Bad("chunk sizes and trailers over 64 KiB"))
    }

    /// Ends a refused connection: no more writes, then whatever the client
    /// still sends (bounded) is read and dropped until it closes.
    pub fn linger(&mut self) {
        self.sock.shutdown(Shutdown::Write);
        let deadline = Instant::now() + Duration::from_millis(LINGER_MS);
        let mut left = LINGER_BYTES_MAX;
        while left > 0 {
            (self.start, self.end) = (0, 0);
            match self.fill(deadline) {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    }
}

/// Where the head in `buf` ends (just past its blank line), looking only at
/// what may have changed since `from` bytes were scanned.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let start = from.saturating_sub(2);
    let at = |i: usize| buf.get(i).copied();
    (start..buf.len()).filter(|&i| buf[i] == b'\n').find_map(|i| match (at(i + 1), at(i + 2)) {
        (Some(b'\n'), _) => Some(i + 2),
        (Some(b'\r'), Some(b'\n')) => Some(i + 3),
        _ => None,
    })
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
    let is = |n: &str| name.eq_ignore_ascii_case(n);
    if is("content-length") {
        let digits = value.trim_ascii();
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Err(ReadError::Bad("invalid Content-Length"));
        }
        // All digits, so parsing fails only past u64.
        let n = std::str::from_utf8(digits).ok().and_then(|d| d.parse().ok()).ok_or(ReadError::BodyTooLarge)?;
        if head.content_length.is_some_and(|m| m != n) {
            return Err(ReadError::Bad("conflicting Content-Length headers"));
        }
        head.content_length = Some(n);
    } else if is("transfer-encoding") {
        for coding in items(value)? {
            if !head.chunked && coding.eq_ignore_ascii_case("chunked") {
                head.chunked = true;
            } else if head.chunked || !coding.eq_ignore_ascii_case("identity") {
                // Only chunked, once and last, is a body we can frame.
                return Err(ReadError::Bad("unsupported Transfer-Encoding"));
            }
        }
    } else if is("connection") {
        for token in items(value)? {
            if token.eq_ignore_ascii_case("close") {
                head.close = true;
            } else if token.eq_ignore_ascii_case("keep-alive") && !head.http11 {
                head.close = false;
            }
        }
    } else if is("expect") {
        head.expect_continue = value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
    } else if is("accept") {
        head.accepts_compact_dump |= accepts(value, crate::dump::binary::MEDIA_TYPE);
    } else if is("authorization") {
        let text = std::str::from_utf8(value).map_err(|_| ReadError::Bad("Authorization is not UTF-8"))?;
        if head.authorization.is_some() {
            // Which one counts would be a guess another hop may make the other way.
            return Err(ReadError::Bad("more than one Authorization header"));
        }
        head.authorization = Some(text.trim().to_string());
    }
    Ok(())
}

/// Whether an `Accept` value lists `media` with a nonzero quality.
fn accepts(value: &[u8], media: &str) -> bool {
    let Ok(text) = std::str::from_utf8(value) else { return false };
    text.split(',').any(|item| {
        let mut parts = item.split(';').map(str::trim);
        let named = parts.next().is_some_and(|m| m.eq_ignore_ascii_case(media));
        let zero = parts.any(|p| {
            let p = p.replace(' ', "");
            p.strip_prefix("q=").is_some_and(|q| q.parse::<f32>().is_ok_and(|q| q == 0.0))
        });
        named && !zero
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    /// Bytes in memory, handed out at most `cap` per read; writes kept.
    pub(crate) struct Mem<'a> {
        pub data: &'a [u8],
        pub cap: usize,
        pub sent: Vec<u8>,
    }

    impl Read for Mem<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(self.cap).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    impl Write for Mem<'_> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.sent.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Socket for Mem<'_> {
        fn set_read_timeout(&mut self, _: Duration) -> io::Result<()> {
            Ok(())
        }
        fn shutdown(&self, _: Shutdown) {}
    }

    fn conn(raw: &[u8], cap: usize) -> Conn<Mem<'_>> {
        Conn::new(Mem { data: raw, cap, sent: Vec::new() })
    }

    fn head(raw: &[u8]) -> Result<Head, ReadError> {
        conn(raw, usize::MAX).read_head(SECOND, SECOND, None)
    }

    #[test]
    fn a_huge_chunked_body_is_not_kept_for_the_next_request() {
        let size = BUF_KEPT_BYTES + 1;
        let mut raw = format!("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{size:x}\r\n").into_bytes();
        raw.resize(raw.len() + size, b'a');
        raw.extend_from_slice(b"\r\n0\r\n\r\nGET /health HTTP/1.1\r\n\r\n");
        let mut c = conn(&raw, usize::MAX);
        let h = c.read_head(SECOND, SECOND, None).unwrap();
        assert_eq!(c.read_body(&h, usize::MAX, Instant::now() + SECOND).unwrap().len(), size);
        let h = c.read_head(SECOND, SECOND, None).unwrap();
        assert_eq!(h.target, "/health");
        assert_eq!(c.chunked.capacity(), 0);
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
        let twice = head(b"GET /health HTTP/1.1\r\nAuthorization: Bearer a\r\nauthorization: Bearer b\r\n\r\n");
        assert!(matches!(twice, Err(ReadError::Bad("more than one Authorization header"))));
        // Blank lines before a request, bare LF line ends, equal repeated lengths.
        let h = head(b"\r\n\nGET / HTTP/1.1\nContent-Length: 0\nContent-Length: 0\n\n").unwrap();
        assert_eq!(h.content_length, Some(0));
    }

    #[test]
    fn the_trace_header_is_kept_when_asked_for() {
        let raw = b"GET /health HTTP/1.1\r\nX-Trace-Id:  abc-1 \r\n\r\n";
        let h = conn(raw, 100).read_head(SECOND, SECOND, Some("x-trace-id"));
        assert_eq!(h.unwrap().trace_id.as_deref(), Some("abc-1"));
        assert_eq!(head(raw).unwrap().trace_id, None);
    }

    #[test]
    fn requests_end_where_they_say_whatever_the_reads() {
        let raw = b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiGET / HTTP/1.1\r\n\r\n";
        for cap in [1, 2, 3, 7, 100] {
            let mut c = conn(raw, cap);
            let h = c.read_head(SECOND, SECOND, None).unwrap();
            assert_eq!(c.read_body(&h, 100, Instant::now() + SECOND).unwrap(), b"hi");
            let h = c.read_head(SECOND, SECOND, None).unwrap();
            assert_eq!((h.method.as_str(), h.content_length), ("GET", None));
            assert!(matches!(c.read_head(SECOND, SECOND, None), Err(ReadError::Closed)), "{cap}");
        }
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
    fn the_compact_dump_is_asked_for_only_by_name_and_not_at_q_0() {
        let media = crate::dump::binary::MEDIA_TYPE;
        for (value, asked) in [
            (format!("{media}, application/json;q=0.5"), true),
            (format!("application/json, {}", media.to_uppercase()), true),
            (format!("{media} ; q=0.9"), true),
            (format!("{media};q=0"), false),
            (format!("{media}; q = 0.0"), false),
            ("application/json".to_string(), false),
            ("*/*".to_string(), false),
            (format!("{media}x"), false),
        ] {
            assert_eq!(accepts(value.as_bytes(), media), asked, "{value}");
        }
        let raw = format!("GET /dump HTTP/1.1\r\nAccept: application/json\r\nAccept: {media}\r\n\r\n");
        assert!(head(raw.as_bytes()).unwrap().accepts_compact_dump, "any of several Accept headers");
        assert!(!head(b"GET /dump HTTP/1.1\r\n\r\n").unwrap().accepts_compact_dump);
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

    /// The body of `raw` (read `cap` bytes at a time) and what was written back.
    fn parse(raw: &[u8], limit: usize, cap: usize) -> Result<(Vec<u8>, Vec<u8>), ReadError> {
        let mut c = conn(raw, cap);
        let head = c.read_head(SECOND, SECOND, None)?;
        let body = c.read_body(&head, limit, Instant::now() + SECOND)?.to_vec();
        Ok((body, c.sock.sent))
    }

    fn bad(raw: &[u8]) -> &'static str {
        match parse(raw, 100, 3) {
            Err(ReadError::Bad(why)) => why,
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(raw)),
        }
    }

    #[test]
    fn bodies_by_length_and_chunked() {
        let (b, sent) =
            parse(b"POST / HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello", 100, 2).unwrap();
        assert_eq!((b.as_slice(), sent.as_slice()), (&b"hello"[..], &b"HTTP/1.1 100 Continue\r\n\r\n"[..]));
        let raw = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y ; z=\"q\"\r\nde\r\nA \r\n0123456789\r\n0\r\nT: 1\r\nU: 2\r\n\r\n";
        for cap in [1, 5, 1000] {
            assert_eq!(parse(raw, 100, cap).unwrap().0, b"abcde0123456789");
        }
        // A body of exactly the limit is taken.
        assert_eq!(parse(b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", 3, 9).unwrap().0, b"abc");
        let raw = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        assert_eq!(parse(raw, 3, 9).unwrap().0, b"abc");
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
            assert!(matches!(parse(raw, 3, 7), Err(ReadError::BodyTooLarge)), "{:?}", String::from_utf8_lossy(raw));
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
        assert!(matches!(parse(many.as_bytes(), 100, 64), Err(ReadError::HeadTooLarge)));
        assert_eq!(bad(b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nabc"), "connection closed inside the body");
    }
}

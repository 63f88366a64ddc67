//! A small HTTP/1.1 client over std `TcpStream`, written by hand so the
//! load generator costs little next to the server it measures.
//!
//! `call` is a blocking one-off request (setup, checks). `drive` keeps `n`
//! keep-alive connections busy from one thread: every connection sends its
//! next request as soon as the last reply is complete (a closed loop), and
//! one `poll(2)` watches them all, so 64 clients cost one thread, not 64.
//! Replies are framed by Content-Length or chunked encoding.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Largest reply accepted, in bytes (a whole /dump of the bench state fits).
pub const REPLY_MAX_BYTES: usize = 1 << 30;
/// Header block limit, in bytes.
const HEADER_MAX_BYTES: usize = 16 << 10;
/// Latency samples kept per run; later completions are counted, not sampled.
pub const SAMPLES_MAX: usize = 20_000_000;
/// Connection failures tolerated in one run before it is abandoned.
pub const CONN_ERRORS_MAX: u64 = 1_000;
/// How long a blocking call may wait for its reply.
const CALL_TIMEOUT_MS: u64 = 120_000;

/// A complete reply: status and body.
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Builds the bytes of one request with a Content-Length body.
pub fn request_bytes(method: &str, path: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// Where a reply ends, once `buf` holds all of it.
enum Framing {
    Incomplete,
    Complete { status: u16, body: Vec<u8>, consumed: usize },
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Parses a reply from the front of `buf`.
fn frame(buf: &[u8]) -> Result<Framing, String> {
    let Some(head_end) = find(&buf[..buf.len().min(HEADER_MAX_BYTES)], b"\r\n\r\n") else {
        return if buf.len() >= HEADER_MAX_BYTES {
            Err("reply header too long".into())
        } else {
            Ok(Framing::Incomplete)
        };
    };
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| "reply header is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(value.trim().parse::<usize>().map_err(|_| format!("bad Content-Length {value:?}"))?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") && value.to_ascii_lowercase().contains("chunked") {
            chunked = true;
        }
    }
    let start = head_end + 4;
    if chunked {
        return unchunk(buf, start, status);
    }
    let length = length.ok_or("reply has neither Content-Length nor chunked encoding")?;
    if length > REPLY_MAX_BYTES {
        return Err(format!("reply of {length} bytes is over {REPLY_MAX_BYTES}"));
    }
    if buf.len() < start + length {
        return Ok(Framing::Incomplete);
    }
    Ok(Framing::Complete { status, body: buf[start..start + length].to_vec(), consumed: start + length })
}

fn unchunk(buf: &[u8], mut at: usize, status: u16) -> Result<Framing, String> {
    let mut body = Vec::new();
    loop {
        let Some(line_end) = find(&buf[at..], b"\r\n") else { return Ok(Framing::Incomplete) };
        let size_text = std::str::from_utf8(&buf[at..at + line_end]).map_err(|_| "bad chunk size")?;
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| format!("bad chunk size {size_text:?}"))?;
        if body.len() + size > REPLY_MAX_BYTES {
            return Err("chunked reply too long".into());
        }
        at += line_end + 2;
        if size == 0 {
            // No trailers are expected: the terminating CRLF follows.
            if buf.len() < at + 2 {
                return Ok(Framing::Incomplete);
            }
            return Ok(Framing::Complete { status, body, consumed: at + 2 });
        }
        if buf.len() < at + size + 2 {
            return Ok(Framing::Incomplete);
        }
        body.extend_from_slice(&buf[at..at + size]);
        at += size + 2;
    }
}

/// One blocking request on a fresh connection.
pub fn call(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Result<Reply, String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    stream.set_nodelay(true).ok();
    stream.set_read_timeout(Some(Duration::from_millis(CALL_TIMEOUT_MS))).ok();
    stream.write_all(&request_bytes(method, path, body)).map_err(|e| format!("{method} {path}: {e}"))?;
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        if let Framing::Complete { status, body, .. } = frame(&buf)? {
            return Ok(Reply { status, body });
        }
        let n = stream.read(&mut chunk).map_err(|e| format!("{method} {path}: {e}"))?;
        if n == 0 {
            return Err(format!("{method} {path}: connection closed before the reply ended"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// One keep-alive connection for blocking requests one after another (a
/// poller that must not pay a TCP handshake per request).
pub struct KeepAlive {
    stream: TcpStream,
    buf: Vec<u8>,
    chunk: Vec<u8>,
}

impl KeepAlive {
    pub fn connect(addr: SocketAddr) -> Result<KeepAlive, String> {
        let stream = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        stream.set_nodelay(true).ok();
        stream.set_read_timeout(Some(Duration::from_millis(CALL_TIMEOUT_MS))).ok();
        Ok(KeepAlive { stream, buf: Vec::new(), chunk: vec![0u8; 1 << 16] })
    }

    /// Sends `request` (full request bytes) and waits for its reply.
    pub fn call(&mut self, request: &[u8]) -> Result<Reply, String> {
        self.stream.write_all(request).map_err(|e| format!("write: {e}"))?;
        loop {
            if let Framing::Complete { status, body, consumed } = frame(&self.buf)? {
                self.buf.drain(..consumed);
                return Ok(Reply { status, body });
            }
            let n = self.stream.read(&mut self.chunk).map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err("connection closed before the reply ended".into());
            }
            self.buf.extend_from_slice(&self.chunk[..n]);
        }
    }
}

/// A blocking JSON call that must answer `want`; returns the parsed body.
pub fn call_json(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    want: u16,
) -> Result<serde_json::Value, String> {
    let reply = call(addr, method, path, body.as_bytes())?;
    let text = String::from_utf8_lossy(&reply.body);
    if reply.status != want {
        return Err(format!("{method} {path} answered {} (wanted {want}): {text}", reply.status));
    }
    serde_json::from_str(&text).map_err(|e| format!("{method} {path}: not JSON ({e}): {text}"))
}

/// What one `drive` run measured.
#[derive(Default)]
pub struct RunStats {
    pub completed: u64,
    /// Replies that were not 200, or connections that failed.
    pub errors: u64,
    pub elapsed: Duration,
    /// Sorted per-request latencies in nanoseconds.
    pub latencies_ns: Vec<u64>,
    /// CPU time of the driving thread over the window.
    pub client_cpu: Duration,
}

impl RunStats {
    pub fn queries_per_s(&self) -> f64 {
        self.completed as f64 / self.elapsed.as_secs_f64()
    }
    /// The `p`-th percentile latency in microseconds.
    pub fn percentile_us(&self, p: f64) -> f64 {
        if self.latencies_ns.is_empty() {
            return f64::NAN;
        }
        let i = ((self.latencies_ns.len() as f64 * p / 100.0).ceil() as usize).clamp(1, self.latencies_ns.len());
        self.latencies_ns[i - 1] as f64 / 1_000.0
    }
}

struct Conn {
    stream: TcpStream,
    next: usize,
    /// Bytes of the current request still to write.
    written: usize,
    buf: Vec<u8>,
    sent_at: Instant,
}

impl Conn {
    fn open(addr: SocketAddr, next: usize) -> Result<Conn, String> {
        let stream = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        stream.set_nodelay(true).ok();
        stream.set_nonblocking(true).map_err(|e| e.to_string())?;
        Ok(Conn { stream, next, written: 0, buf: Vec::with_capacity(1 << 16), sent_at: Instant::now() })
    }

    /// Writes what the socket takes; true once the whole request is out.
    fn pump_write(&mut self, request: &[u8]) -> Result<bool, String> {
        while self.written < request.len() {
            match self.stream.write(&request[self.written..]) {
                Ok(0) => return Err("connection closed while writing".into()),
                Ok(n) => self.written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(true)
    }

    /// Reads what is there; the reply's status once it is complete.
    fn pump_read(&mut self, scratch: &mut [u8]) -> Result<Option<u16>, String> {
        loop {
            match self.stream.read(scratch) {
                Ok(0) => return Err("connection closed by the server".into()),
                Ok(n) => self.buf.extend_from_slice(&scratch[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        match frame(&self.buf)? {
            Framing::Incomplete => Ok(None),
            Framing::Complete { status, consumed, .. } => {
                self.buf.drain(..consumed);
                Ok(Some(status))
            }
        }
    }
}

fn thread_cpu() -> Duration {
    // SAFETY: getrusage fills the struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1_000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Runs `conns` closed-loop keep-alive clients sending `requests` (full
/// request bytes, cycled) for `warmup` and then `window`; calls `on_window`
/// when the measured window opens and again when it closes (the caller
/// samples server CPU there). Only replies completed inside the window count.
pub fn drive(
    addr: SocketAddr,
    requests: &[Vec<u8>],
    conns: usize,
    warmup: Duration,
    window: Duration,
    mut on_window: impl FnMut(),
) -> Result<RunStats, String> {
    assert!(!requests.is_empty() && conns > 0);
    let stride = (requests.len() / conns).max(1);
    let mut clients = Vec::with_capacity(conns);
    for c in 0..conns {
        clients.push(Conn::open(addr, (c * stride) % requests.len())?);
    }
    let mut stats = RunStats::default();
    let mut scratch = vec![0u8; 1 << 16];
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(conns);
    let started = Instant::now();
    let (window_start, window_end) = (started + warmup, started + warmup + window);
    let mut in_window = false;
    let mut cpu_at_start = Duration::ZERO;
    for c in clients.iter_mut() {
        c.sent_at = Instant::now();
        c.pump_write(&requests[c.next]).map_err(|e| format!("first request: {e}"))?;
    }
    loop {
        let now = Instant::now();
        if !in_window && now >= window_start {
            in_window = true;
            on_window();
            cpu_at_start = thread_cpu();
        }
        if now >= window_end {
            break;
        }
        fds.clear();
        for c in &clients {
            let writing = c.written < requests[c.next].len();
            let events = if writing { libc::POLLOUT } else { libc::POLLIN };
            fds.push(libc::pollfd { fd: c.stream.as_raw_fd(), events, revents: 0 });
        }
        // SAFETY: `fds` is a live array of `fds.len()` pollfd structs.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 50) };
        if ready < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("poll: {e}"));
        }
        for (i, fd) in fds.iter().enumerate() {
            if fd.revents == 0 {
                continue;
            }
            let c = &mut clients[i];
            let outcome = if c.written < requests[c.next].len() {
                c.pump_write(&requests[c.next]).map(|_| None)
            } else {
                c.pump_read(&mut scratch)
            };
            match outcome {
                Ok(None) => {}
                Ok(Some(status)) => {
                    let done = Instant::now();
                    if in_window && done < window_end {
                        stats.completed += 1;
                        if status != 200 {
                            stats.errors += 1;
                        }
                        if stats.latencies_ns.len() < SAMPLES_MAX {
                            stats.latencies_ns.push((done - c.sent_at).as_nanos() as u64);
                        }
                    }
                    c.next = (c.next + 1) % requests.len();
                    c.written = 0;
                    c.sent_at = Instant::now();
                    let request = &requests[c.next];
                    if let Err(e) = c.pump_write(request) {
                        return Err(format!("write: {e}"));
                    }
                }
                Err(e) => {
                    stats.errors += 1;
                    if stats.errors > CONN_ERRORS_MAX {
                        return Err(format!("too many connection errors, last: {e}"));
                    }
                    // Start over on a fresh connection with the next request.
                    let next = (c.next + 1) % requests.len();
                    *c = Conn::open(addr, next)?;
                    c.pump_write(&requests[c.next])?;
                }
            }
        }
    }
    on_window();
    stats.client_cpu = thread_cpu().saturating_sub(cpu_at_start);
    stats.elapsed = window;
    stats.latencies_ns.sort_unstable();
    Ok(stats)
}

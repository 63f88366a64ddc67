//! The blocking HTTP/1.1 front, on TCP and optionally a Unix socket.
//!
//! One accept thread per socket; each connection gets its own thread and a
//! slot (up to `--http-connections-max`, past which a new connection is
//! answered 503 and closed; `slots.rs`), which reads requests in turn
//! (keep-alive; `conn.rs`), hands each to the `Api`, and writes the
//! reply in one write, or a streamed one (`/dump`) a piece at a time,
//! chunked, each piece made only once the last was written, so a slow
//! reader holds one piece and the socket's write timeout
//! (`IDLE_TIMEOUT_MS`) ends a stalled one. Time bounds every connection: it waits for a request
//! at most `IDLE_TIMEOUT_MS` (a new one at most the head timeout), a request
//! head must arrive within `--http-head-timeout-s` of its first byte and its
//! body within `--http-body-timeout-s` of the head, else 408 and close: a
//! slow or silent client cannot keep a slot. Each connection keeps its own
//! buffers, so a hot request allocates nothing once warm. A panic in a
//! handler becomes a 500 and is logged.

use super::access_log::Record;
use super::conn::{Conn, Head, ReadError, Socket};
use super::endpoints::{self, Route};
use super::routes::{Api, Incoming, Reply, Scratch};
use super::slots::Slots;
use crate::ingest::LogLimiter;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// A connection with no request for this long is closed.
pub const IDLE_TIMEOUT_MS: u64 = 60_000;
/// Stack of a connection thread (handlers are shallow).
const CONNECTION_STACK_BYTES: usize = 256 * 1024;

/// What bounds the HTTP front.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Most open connections (one thread each; default 1024); more are
    /// answered 503 and closed.
    pub connections_max: usize,
    /// Largest request body (default 16 MiB; a 1M-token /query is ~8 MB).
    pub body_limit_bytes: usize,
    /// Seconds from a head's first byte (a new connection: from accept) to its end (default 10).
    pub head_timeout_s: u64,
    /// Seconds from the end of a head to the end of its body (default 60).
    pub body_timeout_s: u64,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits { connections_max: 1024, body_limit_bytes: 16 << 20, head_timeout_s: 10, body_timeout_s: 60 }
    }
}

/// What connection threads share.
struct Shared {
    api: Arc<Api>,
    limits: HttpLimits,
    stop: AtomicBool,
    slots: Arc<Slots>,
    /// Says that connections are being refused at the cap, at most once a second.
    refusing_log: parking_lot::Mutex<LogLimiter>,
}

/// The running HTTP front.
pub struct HttpServer {
    shared: Arc<Shared>,
    accepters: Vec<JoinHandle<()>>,
    /// The bound TCP address (its port is the one asked for, or the one
    /// the system chose for port 0).
    pub tcp_addr: std::net::SocketAddr,
    unix_path: Option<PathBuf>,
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// Writes a reply announcing `length` body bytes, then `body`, in one write.
fn write_reply(w: &mut dyn Write, reply: &Reply, length: usize, body: &[u8], close: bool, buf: &mut Vec<u8>) -> bool {
    buf.clear();
    let (status, kind) = (reply.status, reply.content_type);
    let _ = write!(buf, "HTTP/1.1 {status} {}\r\nContent-Type: {kind}\r\nContent-Length: {length}\r\n", reason(status));
    if let Some(h) = &reply.header {
        let _ = write!(buf, "{h}\r\n");
    }
    buf.extend_from_slice(if close { b"Connection: close\r\n\r\n" } else { b"\r\n" });
    buf.extend_from_slice(body);
    w.write_all(buf).is_ok()
}

/// Writes a reply whose body comes in pieces from `stream`: chunked on
/// HTTP/1.1, until the connection closes on 1.0. Each piece goes out
/// before the next is made, so a slow reader holds one piece, and the
/// socket's write timeout ends a stalled one. False if the client went
/// away (or the dump could not be sent whole): the connection closes.
fn write_streamed(
    w: &mut dyn Write,
    reply: &mut Reply,
    head_only: bool,
    http11: bool,
    close: bool,
    piece: &mut Vec<u8>,
    buf: &mut Vec<u8>,
) -> bool {
    buf.clear();
    let (status, kind) = (reply.status, reply.content_type);
    let _ = write!(buf, "HTTP/1.1 {status} {}\r\nContent-Type: {kind}\r\n", reason(status));
    if http11 {
        buf.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
    }
    if let Some(h) = &reply.header {
        let _ = write!(buf, "{h}\r\n");
    }
    buf.extend_from_slice(if close || !http11 { b"Connection: close\r\n\r\n" } else { b"\r\n" });
    if w.write_all(buf).is_err() {
        return false;
    }
    let Some(stream) = reply.stream.as_mut().filter(|_| !head_only) else { return true };
    loop {
        piece.clear();
        let more = stream.fill(piece);
        if !piece.is_empty() {
            buf.clear();
            if http11 {
                let _ = write!(buf, "{:x}\r\n", piece.len());
            }
            if w.write_all(buf).is_err() || w.write_all(piece).is_err() || (http11 && w.write_all(b"\r\n").is_err()) {
                return false;
            }
        }
        if !more {
            return !http11 || w.write_all(b"0\r\n\r\n").is_ok();
        }
    }
}

impl HttpServer {
    /// Binds `host:port` (and `unix_socket`) and starts serving.
    pub fn start(
        host: &str,
        port: u16,
        unix_socket: Option<&Path>,
        limits: HttpLimits,
        api: Arc<Api>,
    ) -> Result<HttpServer, String> {
        let addr = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let cannot = |e: std::io::Error| format!("cannot listen on {addr}: {e}");
        let tcp = TcpListener::bind(&addr).map_err(cannot)?;
        let tcp_addr = tcp.local_addr().map_err(cannot)?;
        let slots = Slots::new(limits.connections_max);
        let refusing_log = Default::default();
        let s = Arc::new(Shared { api, limits, stop: AtomicBool::new(false), slots, refusing_log });
        let s2 = s.clone();
        let mut accepters = vec![spawn("http-accept", move || {
            accept(&s2, tcp.incoming(), |c: &TcpStream| {
                c.set_nodelay(true)?;
                c.set_write_timeout(Some(Duration::from_millis(IDLE_TIMEOUT_MS)))?;
                c.try_clone()
            })
        })?];
        if let Some(path) = unix_socket {
            // A stale socket file from an earlier run would make bind fail.
            if std::fs::symlink_metadata(path).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
            {
                let _ = std::fs::remove_file(path);
            }
            let unix = UnixListener::bind(path)
                .map_err(|e| format!("cannot listen on unix socket {}: {e}", path.display()))?;
            let s2 = s.clone();
            accepters.push(spawn("http-accept-unix", move || {
                accept(&s2, unix.incoming(), |c: &UnixStream| {
                    c.set_write_timeout(Some(Duration::from_millis(IDLE_TIMEOUT_MS)))?;
                    c.try_clone()
                })
            })?);
        }
        let unix_path = unix_socket.map(Path::to_path_buf);
        Ok(HttpServer { shared: s, accepters, tcp_addr, unix_path })
    }

    /// Stops accepting, closes every connection, and joins the accept threads.
    pub fn stop(self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocked accepts.
        let _ = TcpStream::connect_timeout(&self.tcp_addr, Duration::from_millis(200));
        if let Some(p) = &self.unix_path {
            let _ = UnixStream::connect(p);
        }
        self.shared.slots.close_all();
        for t in self.accepters {
            let _ = t.join();
        }
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, String> {
    std::thread::Builder::new().name(name.into()).spawn(f).map_err(|e| format!("cannot start {name}: {e}"))
}

/// Accepts connections until the server stops; `setup` prepares one and
/// returns the handle `Slots::close_all` shuts down.
fn accept<S: Socket + 'static>(
    s: &Arc<Shared>,
    incoming: impl Iterator<Item = std::io::Result<S>>,
    setup: impl Fn(&S) -> std::io::Result<S>,
) {
    for conn in incoming {
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        match conn.and_then(|c| setup(&c).map(|watch| (c, watch))) {
            Ok((c, watch)) => admit(s, c, watch),
            Err(e) => {
                // Out of file descriptors and the like: say so, back off, keep serving.
                crate::warn!("accepting an HTTP connection failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Starts a connection thread, or refuses the connection when too many are open.
fn admit<S: Socket + 'static>(s: &Arc<Shared>, mut conn: S, watch: S) {
    let Some(slot) = s.slots.take() else {
        let mut out = Vec::new();
        let reply = Reply::error(&mut out, 503, "too many open connections; retry later");
        write_reply(&mut conn, &reply, out.len(), &out, true, &mut Vec::new());
        let refused = s.api.metrics.record_connection_refused();
        s.refusing_log.lock().warn(|| {
            format!(
                "refusing HTTP connections: {} are open (--http-connections-max); {refused} refused so far",
                s.limits.connections_max
            )
        });
        return;
    };
    slot.watch(Box::new(watch));
    let s2 = s.clone();
    let started =
        std::thread::Builder::new().name("http-conn".into()).stack_size(CONNECTION_STACK_BYTES).spawn(move || {
            // Dropped however the thread ends: the slot comes back.
            let _slot = slot;
            serve(&s2, Conn::new(conn));
        });
    if let Err(e) = started {
        // The closure, slot included, is dropped with the error.
        crate::warn!("cannot start an HTTP connection thread: {e}");
    }
}

/// Serves one connection until it closes, errs, times out, or the server stops.
fn serve<S: Socket>(s: &Shared, mut conn: Conn<S>) {
    let idle = Duration::from_millis(IDLE_TIMEOUT_MS);
    let head_timeout = Duration::from_secs(s.limits.head_timeout_s);
    let body_timeout = Duration::from_secs(s.limits.body_timeout_s);
    let mut scratch = Scratch::default();
    let mut head_buf = Vec::new();
    // A new connection must start its first request within the head timeout.
    let mut first_byte = head_timeout;
    let trace_header = s.api.access_log.as_ref().map(|l| l.trace_id_header.as_str());
    while !s.stop.load(Ordering::Relaxed) {
        let mut head = match conn.read_head(first_byte, head_timeout, trace_header) {
            Ok(h) => h,
            Err(ReadError::Closed | ReadError::Io) => return,
            Err(e) => {
                let status = refuse(&mut conn.sock, &e, &mut scratch, &mut head_buf);
                s.api.metrics.record_head_refused(status);
                return conn.linger();
            }
        };
        first_byte = idle;
        let started = Instant::now();
        let wall = s.api.access_log.as_ref().map(|_| SystemTime::now());
        scratch.has_model = false;
        let target = std::mem::take(&mut head.target);
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let route = endpoints::route_of(path);
        let body = match conn.read_body(&head, s.limits.body_limit_bytes, started + body_timeout) {
            Ok(body) => body,
            Err(ReadError::Io) => return,
            Err(e) => {
                let status = refuse(&mut conn.sock, &e, &mut scratch, &mut head_buf);
                finish(s, wall, &mut head, route, None, status, started);
                return conn.linger();
            }
        };
        let authorization = head.authorization.as_deref();
        let accepts_compact_dump = head.accepts_compact_dump;
        let incoming = Incoming { route, method: &head.method, path, query, body, authorization, accepts_compact_dump };
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.api.handle(&incoming, &mut scratch)));
        let mut reply = run.unwrap_or_else(|_| {
            crate::error!("internal error handling {} {path}; the request was refused", head.method);
            scratch = Scratch::default();
            Reply::error(&mut scratch.out, 500, "internal error")
        });
        let close = head.close || s.stop.load(Ordering::Relaxed);
        let head_only = head.method == "HEAD";
        let written = if reply.stream.is_some() {
            let (sock, out) = (&mut conn.sock, &mut scratch.out);
            let sent = write_streamed(sock, &mut reply, head_only, head.http11, close, out, &mut head_buf);
            // A 1.0 client reads the body to the connection's end.
            sent && head.http11
        } else {
            // A reply to HEAD announces its body's length but sends none.
            let sent = if head_only { &[][..] } else { &scratch.out[..] };
            write_reply(&mut conn.sock, &reply, scratch.out.len(), sent, close, &mut head_buf)
        };
        drop(reply.stream.take());
        finish(s, wall, &mut head, route, scratch.has_model.then_some(scratch.model.as_str()), reply.status, started);
        scratch.release_large();
        if !written || close {
            return;
        }
    }
}

/// Counts an answered request and queues its access log line, if any.
fn finish(
    s: &Shared,
    wall: Option<SystemTime>,
    head: &mut Head,
    route: Option<Route>,
    model: Option<&str>,
    status: u16,
    started: Instant,
) {
    s.api.metrics.record(route, &head.method, status, started.elapsed());
    let (Some(log), Some(at)) = (&s.api.access_log, wall) else { return };
    log.record(Record {
        at,
        trace_id: head.trace_id.take(),
        method: std::mem::take(&mut head.method),
        // Dynamo logs an unknown path as "unknown".
        path: route.map_or("unknown", |r| r.spec().path),
        model: model.map(str::to_string),
        status,
        duration: started.elapsed(),
    });
}

/// Answers a request that could not be read, and returns its status.
fn refuse(w: &mut dyn Write, e: &ReadError, scratch: &mut Scratch, head_buf: &mut Vec<u8>) -> u16 {
    let (status, message) = match e {
        ReadError::Bad(why) => (400, format!("malformed HTTP request: {why}")),
        ReadError::HeadTooLarge => (431, "request headers too large".to_string()),
        ReadError::BodyTooLarge => (413, "request body over the limit (--body-limit-bytes)".to_string()),
        ReadError::TimedOut => (
            408,
            "request not received in time (--http-head-timeout-s for the head, --http-body-timeout-s for the body)"
                .to_string(),
        ),
        ReadError::Closed | ReadError::Io => return 0,
    };
    let reply = Reply::error(&mut scratch.out, status, &message);
    write_reply(w, &reply, scratch.out.len(), &scratch.out, true, head_buf);
    status
}

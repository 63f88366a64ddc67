//! The blocking HTTP/1.1 front, on TCP and optionally a Unix socket.
//!
//! One accept thread per socket; each connection gets its own thread (up to
//! `--http-connections-max`, past which a new connection is answered 503 and
//! closed), which reads requests in turn (keep-alive), hands each to the
//! `Handler`, and writes the reply. A connection idle past
//! `IDLE_TIMEOUT_MS` is closed, so idle clients cannot pin threads forever.
//! Each connection keeps its own scratch buffers, so a hot request
//! allocates little. A panic in a handler becomes a 500 and is logged.
//!
//! This replaces tiny_http, whose worker pool could leave a connection
//! unserved until another closed when several arrived at once, and whose
//! accept thread ended on the first accept error.

use super::request::{read_body, read_head, ReadError};
use crate::metrics::{Endpoint, HttpMetrics};
use parking_lot::Mutex;
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Default most open connections; more are answered 503 and closed.
pub const CONNECTIONS_MAX: usize = 1024;
/// A connection with no request for this long is closed.
pub const IDLE_TIMEOUT_MS: u64 = 60_000;
/// Stack of a connection thread (handlers are shallow).
const CONNECTION_STACK_BYTES: usize = 256 * 1024;

/// Per-thread buffers a handler may reuse across requests.
#[derive(Default)]
pub struct Scratch {
    pub tokens: Vec<u32>,
    pub hashes: Vec<u64>,
    pub out: Vec<u8>,
}

/// What to send back. The body is in `Scratch::out`.
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    /// A `WWW-Authenticate` challenge (with a 401).
    pub www_authenticate: Option<&'static str>,
    /// The methods an endpoint takes, as the `Allow` header (with a 405).
    pub allow: Option<&'static str>,
}

impl Reply {
    pub const fn json(status: u16) -> Reply {
        Reply { status, content_type: "application/json", www_authenticate: None, allow: None }
    }
}

/// What a handler sees of a request.
pub struct Incoming<'a> {
    pub method: &'a str,
    pub path: &'a str,
    /// The query string, without `?`.
    pub query: &'a str,
    /// Complete and within the body limit.
    pub body: &'a [u8],
    /// The `Authorization` header, if any.
    pub authorization: Option<&'a str>,
}

/// Routes a request.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, req: &Incoming<'_>, scratch: &mut Scratch) -> Reply;
}

/// A connected stream of either kind.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn try_clone(&self) -> std::io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    fn set_timeouts(&self, t: Duration) {
        let _ = match self {
            Stream::Tcp(s) => s.set_read_timeout(Some(t)).and_then(|_| s.set_write_timeout(Some(t))),
            Stream::Unix(s) => s.set_read_timeout(Some(t)).and_then(|_| s.set_write_timeout(Some(t))),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

/// What connection threads share.
struct Shared {
    handler: Arc<dyn Handler>,
    metrics: Arc<HttpMetrics>,
    body_limit_bytes: usize,
    connections_max: usize,
    stop: AtomicBool,
    open: AtomicUsize,
    next_id: AtomicU64,
    /// Open connections, so a stop can close them at once.
    conns: Mutex<std::collections::HashMap<u64, Stream>>,
}

/// The running HTTP front.
pub struct HttpServer {
    shared: Arc<Shared>,
    accepters: Vec<JoinHandle<()>>,
    tcp_addr: std::net::SocketAddr,
    unix_path: Option<PathBuf>,
    pub local_port: Option<u16>,
}

/// Writes `{"error": message}` into `out`.
pub fn error_body(out: &mut Vec<u8>, message: &str) {
    out.clear();
    super::codec::write_error(out, message);
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

fn write_reply(w: &mut Stream, reply: &Reply, body: &[u8], close: bool, head_buf: &mut Vec<u8>) -> std::io::Result<()> {
    head_buf.clear();
    let _ = write!(
        head_buf,
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n",
        reply.status,
        reason(reply.status),
        reply.content_type,
        body.len()
    );
    if let Some(challenge) = reply.www_authenticate {
        let _ = write!(head_buf, "WWW-Authenticate: {challenge}\r\n");
    }
    if let Some(methods) = reply.allow {
        let _ = write!(head_buf, "Allow: {methods}\r\n");
    }
    head_buf.extend_from_slice(if close { b"Connection: close\r\n\r\n" } else { b"\r\n" });
    // One write for small replies: no delayed second segment.
    if body.len() <= 64 * 1024 {
        head_buf.extend_from_slice(body);
        w.write_all(head_buf)?;
    } else {
        w.write_all(head_buf)?;
        w.write_all(body)?;
    }
    w.flush()
}

impl HttpServer {
    /// Binds `host:port` (and `unix_socket`) and starts serving.
    pub fn start(
        host: &str,
        port: u16,
        unix_socket: Option<&Path>,
        connections_max: usize,
        body_limit_bytes: usize,
        handler: Arc<dyn Handler>,
        metrics: Arc<HttpMetrics>,
    ) -> Result<HttpServer, String> {
        let addr = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let tcp = TcpListener::bind(&addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let tcp_addr = tcp.local_addr().map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let unix = match unix_socket {
            Some(path) => {
                // A stale socket file from an earlier run would make bind fail.
                if std::fs::symlink_metadata(path).is_ok_and(|m| {
                    use std::os::unix::fs::FileTypeExt;
                    m.file_type().is_socket()
                }) {
                    let _ = std::fs::remove_file(path);
                }
                Some(
                    UnixListener::bind(path)
                        .map_err(|e| format!("cannot listen on unix socket {}: {e}", path.display()))?,
                )
            }
            None => None,
        };
        let shared = Arc::new(Shared {
            handler,
            metrics,
            body_limit_bytes,
            connections_max,
            stop: AtomicBool::new(false),
            open: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            conns: Mutex::new(Default::default()),
        });
        let mut accepters = Vec::new();
        let s = shared.clone();
        accepters.push(spawn("http-accept", move || {
            for conn in tcp.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    return;
                }
                match conn {
                    Ok(c) => {
                        let _ = c.set_nodelay(true);
                        admit(&s, Stream::Tcp(c));
                    }
                    Err(e) => accept_failed(&e),
                }
            }
        })?);
        if let Some(unix) = unix {
            let s = shared.clone();
            accepters.push(spawn("http-accept-unix", move || {
                for conn in unix.incoming() {
                    if s.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    match conn {
                        Ok(c) => admit(&s, Stream::Unix(c)),
                        Err(e) => accept_failed(&e),
                    }
                }
            })?);
        }
        Ok(HttpServer {
            shared,
            accepters,
            tcp_addr,
            unix_path: unix_socket.map(Path::to_path_buf),
            local_port: Some(tcp_addr.port()),
        })
    }

    /// Stops accepting, closes every connection, and joins the accept threads.
    pub fn stop(self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocked accepts.
        let _ = TcpStream::connect_timeout(&self.tcp_addr, Duration::from_millis(200));
        if let Some(p) = &self.unix_path {
            let _ = UnixStream::connect(p);
        }
        for (_, c) in self.shared.conns.lock().drain() {
            c.shutdown();
        }
        for t in self.accepters {
            let _ = t.join();
        }
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, String> {
    std::thread::Builder::new().name(name.into()).spawn(f).map_err(|e| format!("cannot start {name}: {e}"))
}

fn accept_failed(e: &std::io::Error) {
    // Out of file descriptors and the like: say so, back off, keep serving.
    crate::warn!("accepting an HTTP connection failed: {e}");
    std::thread::sleep(Duration::from_millis(50));
}

/// Starts a connection thread, or refuses the connection when too many are open.
fn admit(s: &Arc<Shared>, mut conn: Stream) {
    if s.open.fetch_add(1, Ordering::SeqCst) >= s.connections_max {
        s.open.fetch_sub(1, Ordering::SeqCst);
        conn.set_timeouts(Duration::from_millis(100));
        let mut out = Vec::new();
        error_body(&mut out, "too many open connections; retry later");
        let _ = write_reply(&mut conn, &Reply::json(503), &out, true, &mut Vec::new());
        return;
    }
    let id = s.next_id.fetch_add(1, Ordering::Relaxed);
    if let Ok(c) = conn.try_clone() {
        s.conns.lock().insert(id, c);
    }
    let s2 = s.clone();
    let started =
        std::thread::Builder::new().name("http-conn".into()).stack_size(CONNECTION_STACK_BYTES).spawn(move || {
            serve(&s2, conn);
            s2.conns.lock().remove(&id);
            s2.open.fetch_sub(1, Ordering::SeqCst);
        });
    if let Err(e) = started {
        crate::warn!("cannot start an HTTP connection thread: {e}");
        s.conns.lock().remove(&id);
        s.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves one connection until it closes, errs, idles out, or the server stops.
fn serve(s: &Shared, conn: Stream) {
    conn.set_timeouts(Duration::from_millis(IDLE_TIMEOUT_MS));
    let Ok(mut writer) = conn.try_clone() else { return };
    let mut reader = BufReader::with_capacity(16 * 1024, conn);
    let mut scratch = Scratch::default();
    let (mut body, mut line, mut head_buf) = (Vec::new(), Vec::new(), Vec::new());
    while !s.stop.load(Ordering::Relaxed) {
        let head = match read_head(&mut reader, &mut line) {
            Ok(h) => h,
            Err(ReadError::Closed) | Err(ReadError::Io(_)) => return,
            Err(e) => {
                refuse(&mut writer, &e, &mut scratch, &mut head_buf);
                return;
            }
        };
        let started = Instant::now();
        let (path, query) = head.target.split_once('?').unwrap_or((head.target.as_str(), ""));
        let endpoint = Endpoint::of_path(path);
        if let Err(e) = read_body(&mut reader, &mut writer, &head, s.body_limit_bytes, &mut body, &mut line) {
            if let ReadError::Io(_) = e {
                return;
            }
            let status = refuse(&mut writer, &e, &mut scratch, &mut head_buf);
            s.metrics.record(endpoint, &head.method, status, started.elapsed());
            return;
        }
        let incoming =
            Incoming { method: &head.method, path, query, body: &body, authorization: head.authorization.as_deref() };
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.handler.handle(&incoming, &mut scratch)));
        let reply = match run {
            Ok(r) => r,
            Err(_) => {
                crate::error!("internal error handling {} {path}; the request was refused", head.method);
                scratch = Scratch::default();
                error_body(&mut scratch.out, "internal error");
                Reply::json(500)
            }
        };
        let close = head.close || s.stop.load(Ordering::Relaxed);
        let written = write_reply(&mut writer, &reply, &scratch.out, close, &mut head_buf);
        s.metrics.record(endpoint, &head.method, reply.status, started.elapsed());
        // Keep one huge reply (a dump) from pinning memory in this thread.
        if scratch.out.capacity() > 1 << 20 {
            scratch.out = Vec::new();
        }
        if body.capacity() > 1 << 20 {
            body = Vec::new();
        }
        if written.is_err() || close {
            return;
        }
    }
}

/// Answers a request that could not be read, and returns its status.
fn refuse(w: &mut Stream, e: &ReadError, scratch: &mut Scratch, head_buf: &mut Vec<u8>) -> u16 {
    let (status, message) = match e {
        ReadError::Bad(why) => (400, format!("malformed HTTP request: {why}")),
        ReadError::HeadTooLarge => (431, "request headers too large".to_string()),
        ReadError::BodyTooLarge => (413, "request body over the limit (--body-limit-bytes)".to_string()),
        ReadError::Closed | ReadError::Io(_) => return 0,
    };
    error_body(&mut scratch.out, &message);
    let _ = write_reply(w, &Reply::json(status), &scratch.out, true, head_buf);
    status
}

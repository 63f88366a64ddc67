//! The blocking HTTP front: a few threads take requests from tiny_http
//! (on TCP and, optionally, a Unix socket), read the body within the
//! configured limit, hand it to the `Handler`, and write the reply. Each
//! thread keeps its own scratch buffers, so a hot request allocates little.
//! Request handling never panics the daemon: a panic in a handler becomes a
//! 500 and is logged.

use crate::metrics::{Endpoint, HttpMetrics};
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;
use tiny_http::{Header, Response, Server, StatusCode};

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
}

impl Reply {
    pub const fn json(status: u16) -> Reply {
        Reply { status, content_type: "application/json" }
    }
}

/// Routes a request. `body` is complete and within the limit.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, method: &str, path: &str, query: &str, body: &[u8], scratch: &mut Scratch) -> Reply;
}

/// The running HTTP front.
pub struct HttpServer {
    servers: Vec<Arc<Server>>,
    threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    pub local_port: Option<u16>,
}

/// Writes `{"error": message}` into `out`.
pub fn error_body(out: &mut Vec<u8>, message: &str) {
    out.clear();
    super::codec::write_error(out, message);
}

impl HttpServer {
    /// Binds `host:port` (and `unix_socket`) and starts `threads` handler threads per socket.
    pub fn start(
        host: &str,
        port: u16,
        unix_socket: Option<&std::path::Path>,
        threads: usize,
        body_limit_bytes: usize,
        handler: Arc<dyn Handler>,
        metrics: Arc<HttpMetrics>,
    ) -> Result<HttpServer, String> {
        let addr = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let tcp = Server::http(&addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let local_port = tcp.server_addr().to_ip().map(|a| a.port());
        let mut servers = vec![Arc::new(tcp)];
        if let Some(path) = unix_socket {
            // A stale socket file from an earlier run would make bind fail.
            if std::fs::symlink_metadata(path).is_ok_and(|m| {
                use std::os::unix::fs::FileTypeExt;
                m.file_type().is_socket()
            }) {
                let _ = std::fs::remove_file(path);
            }
            let unix =
                Server::http_unix(path).map_err(|e| format!("cannot listen on unix socket {}: {e}", path.display()))?;
            servers.push(Arc::new(unix));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for server in &servers {
            for i in 0..threads.max(1) {
                let (server, handler, metrics, stop) = (server.clone(), handler.clone(), metrics.clone(), stop.clone());
                let h = std::thread::Builder::new()
                    .name(format!("http-{i}"))
                    .spawn(move || serve(&server, &*handler, &metrics, body_limit_bytes, &stop))
                    .map_err(|e| format!("cannot start HTTP threads: {e}"))?;
                handles.push(h);
            }
        }
        Ok(HttpServer { servers, threads: handles, stop, local_port })
    }

    /// Stops accepting and joins the handler threads.
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for s in &self.servers {
            for _ in 0..self.threads.len() {
                s.unblock();
            }
        }
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn serve(server: &Server, handler: &dyn Handler, metrics: &HttpMetrics, body_limit_bytes: usize, stop: &AtomicBool) {
    let mut scratch = Scratch::default();
    let mut body = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let mut req = match server.recv() {
            Ok(r) => r,
            Err(_) => continue,
        };
        let started = Instant::now();
        let method = req.method().as_str().to_string();
        let url = req.url().to_string();
        let (path, query) = url.split_once('?').unwrap_or((url.as_str(), ""));
        let endpoint = Endpoint::of_path(path);
        body.clear();
        let too_big = req.body_length().is_some_and(|n| n > body_limit_bytes);
        let reply = if too_big {
            error_body(
                &mut scratch.out,
                &format!("request body over the {body_limit_bytes}-byte limit (--body-limit-bytes)"),
            );
            Reply::json(413)
        } else {
            match req.as_reader().take(body_limit_bytes as u64 + 1).read_to_end(&mut body) {
                Err(e) => {
                    error_body(&mut scratch.out, &format!("could not read the request body: {e}"));
                    Reply::json(400)
                }
                Ok(_) if body.len() > body_limit_bytes => {
                    error_body(
                        &mut scratch.out,
                        &format!("request body over the {body_limit_bytes}-byte limit (--body-limit-bytes)"),
                    );
                    Reply::json(413)
                }
                Ok(_) => {
                    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        handler.handle(&method, path, query, &body, &mut scratch)
                    }));
                    match run {
                        Ok(r) => r,
                        Err(_) => {
                            crate::error!("internal error handling {method} {path}; the request was refused");
                            scratch = Scratch::default();
                            error_body(&mut scratch.out, "internal error");
                            Reply::json(500)
                        }
                    }
                }
            }
        };
        let header = Header::from_bytes(&b"Content-Type"[..], reply.content_type.as_bytes()).expect("static header");
        let response = Response::new(
            StatusCode(reply.status),
            vec![header],
            scratch.out.as_slice(),
            Some(scratch.out.len()),
            None,
        );
        let _ = req.respond(response);
        metrics.record(endpoint, &method, reply.status, started.elapsed());
        // Keep one huge reply (a dump) from pinning memory in this thread.
        if scratch.out.capacity() > 1 << 20 {
            scratch.out = Vec::new();
        }
        if body.capacity() > 1 << 20 {
            body = Vec::new();
        }
    }
}

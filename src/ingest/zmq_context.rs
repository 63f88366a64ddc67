//! The ZMQ context the listeners' sockets come from, with room for
//! thousands of workers.
//!
//! libzmq caps a context at 1,023 sockets unless told otherwise, and a
//! worker takes three (its SUB socket and the two PAIR ends of its
//! monitor; a fourth while a replay runs), so a daemon on a default context
//! refused the 342nd worker with "Too many open files" whatever the
//! process's file limit. The `zmq` crate sets only a context's I/O threads,
//! so the context is made here through `zmq-sys` with [`SOCKETS_MAX`], and
//! its sockets are the crate's own (`zmq::Socket::from_raw`), each holding
//! the context until it is closed, as the crate's sockets do.

use super::config::LISTENERS_MAX;
use std::ops::Deref;
use std::sync::Arc;

/// Most sockets open at once: four for each of `LISTENERS_MAX` listeners
/// (SUB, the monitor's two ends, a replay in flight) and a few for
/// registrations' endpoint probes. Each costs libzmq 12 bytes up front.
pub(crate) const SOCKETS_MAX: i32 = 4 * LISTENERS_MAX as i32 + 64;

/// The name ZMQ's own threads (I/O and reaper) carry.
pub(crate) const THREAD_NAME: &str = "kvi-zmq";

struct Raw(*mut std::ffi::c_void);

// SAFETY: a libzmq context is thread-safe; only sockets are not, and those
// are owned by `ZmqSocket`s.
unsafe impl Send for Raw {}
unsafe impl Sync for Raw {}

impl Drop for Raw {
    fn drop(&mut self) {
        // Every socket holds the context, so none is left open here; term
        // returns EINTR only if a signal interrupted it.
        // SAFETY: the pointer came from zmq_ctx_new and is terminated once.
        while unsafe { zmq_sys::zmq_ctx_term(self.0) } != 0 && unsafe { zmq_sys::zmq_errno() } == libc::EINTR {}
    }
}

/// A ZMQ context allowing [`SOCKETS_MAX`] sockets.
#[derive(Clone)]
pub(crate) struct ZmqContext(Arc<Raw>);

impl ZmqContext {
    pub(crate) fn new() -> Result<ZmqContext, String> {
        // SAFETY: plain libzmq calls; the pointer is checked before use and
        // owned by `Raw` from then on.
        let ctx = unsafe {
            let raw = zmq_sys::zmq_ctx_new();
            if raw.is_null() {
                return Err(format!("cannot create a ZMQ context: {}", zmq::Error::from_raw(zmq_sys::zmq_errno())));
            }
            let ctx = ZmqContext(Arc::new(Raw(raw)));
            if zmq_sys::zmq_ctx_set(raw, zmq_sys::ZMQ_MAX_SOCKETS as i32, SOCKETS_MAX) != 0 {
                let e = zmq::Error::from_raw(zmq_sys::zmq_errno());
                return Err(format!("cannot raise the ZMQ socket limit to {SOCKETS_MAX}: {e}"));
            }
            ctx
        };
        ctx.start_threads()?;
        Ok(ctx)
    }

    /// libzmq starts its I/O and reaper threads with a context's first
    /// socket, and they keep the name of the thread that made it: left to
    /// the first `/register`, ZMQ's I/O (nearly half of ingest's CPU)
    /// showed as an `http-conn` thread. Made here, from a thread of their
    /// own name, they show as `THREAD_NAME`.
    fn start_threads(&self) -> Result<(), String> {
        let ctx = self.clone();
        std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || ctx.socket(zmq::PAIR).map(drop))
            .map_err(|e| format!("cannot start ZMQ's threads: {e}"))?
            .join()
            .map_err(|_| "cannot start ZMQ's threads".to_string())?
            .map_err(|e| format!("cannot start ZMQ's threads: {e}"))
    }

    pub(crate) fn socket(&self, kind: zmq::SocketType) -> zmq::Result<ZmqSocket> {
        // SAFETY: the context is alive (held by `self`); a non-null socket
        // is handed to `from_raw`, which owns and closes it.
        unsafe {
            let sock = zmq_sys::zmq_socket(self.0 .0, raw_type(kind) as i32);
            if sock.is_null() {
                return Err(zmq::Error::from_raw(zmq_sys::zmq_errno()));
            }
            Ok(ZmqSocket { socket: zmq::Socket::from_raw(sock), _context: self.clone() })
        }
    }
}

fn raw_type(kind: zmq::SocketType) -> u32 {
    use zmq::SocketType::*;
    match kind {
        PAIR => zmq_sys::ZMQ_PAIR,
        PUB => zmq_sys::ZMQ_PUB,
        SUB => zmq_sys::ZMQ_SUB,
        REQ => zmq_sys::ZMQ_REQ,
        REP => zmq_sys::ZMQ_REP,
        DEALER => zmq_sys::ZMQ_DEALER,
        ROUTER => zmq_sys::ZMQ_ROUTER,
        PULL => zmq_sys::ZMQ_PULL,
        PUSH => zmq_sys::ZMQ_PUSH,
        XPUB => zmq_sys::ZMQ_XPUB,
        XSUB => zmq_sys::ZMQ_XSUB,
        STREAM => zmq_sys::ZMQ_STREAM,
    }
}

/// A socket of a [`ZmqContext`]; used as a `zmq::Socket`.
pub(crate) struct ZmqSocket {
    /// Declared first: closed before the context can end.
    socket: zmq::Socket,
    _context: ZmqContext,
}

impl ZmqSocket {
    /// Stops the socket's monitor, if any: from now on no event is sent to
    /// it. libzmq's I/O thread sends monitor events with a blocking send,
    /// so one sent once the reading end is gone (a socket still ending its
    /// connection after its reader was closed) would stop that thread, and
    /// with it every connection of the context, for good.
    pub(crate) fn stop_monitor(&mut self) {
        // SAFETY: a live socket of ours; a null endpoint is libzmq's way
        // to stop monitoring (it closes the monitor's own socket).
        unsafe {
            zmq_sys::zmq_socket_monitor(self.socket.as_mut_ptr(), std::ptr::null(), 0);
        }
    }
}

impl Deref for ZmqSocket {
    type Target = zmq::Socket;
    fn deref(&self) -> &zmq::Socket {
        &self.socket
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_sockets_than_a_default_context_allows() {
        // A socket is two descriptors (its mailbox's socket pair): the
        // usual soft limit of 1,024 would stop this test before libzmq's
        // cap does.
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit and setrlimit read and write only `lim`.
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
            lim.rlim_cur = lim.rlim_max;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
        let ctx = ZmqContext::new().unwrap();
        let sockets: Vec<_> = (0..1_100).map(|_| ctx.socket(zmq::PAIR).unwrap()).collect();
        // They work: one pair talks over inproc.
        sockets[0].bind("inproc://zmq-context-test").unwrap();
        sockets[1_099].connect("inproc://zmq-context-test").unwrap();
        sockets[1_099].send("x", 0).unwrap();
        assert_eq!(sockets[0].recv_bytes(0).unwrap(), b"x");
        drop(ctx);
        // The sockets hold the context: closing them all ends it.
        drop(sockets);
    }

    #[test]
    fn zmq_threads_carry_their_own_name() {
        let names = || -> Vec<String> {
            std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|n| n.trim_end().to_string())
                .collect()
        };
        let ctx = ZmqContext::new().unwrap();
        // Two threads: an I/O thread and the reaper (other tests' contexts
        // may add more). A scan of /proc/self/task can skip entries while
        // other tests' threads come and go, so one scan may see fewer.
        let ours = || names().iter().filter(|n| *n == THREAD_NAME).count();
        let seen = (0..200).any(|_| {
            let both = ours() >= 2;
            if !both {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            both
        });
        assert!(seen, "{:?}", names());
        drop(ctx);
    }
}

//! A loopback TCP relay that can blackhole a host: the daemon connects to
//! the relay, which forwards bytes both ways to an upstream endpoint (a
//! test engine or its fault proxy). Blackholed, it stops forwarding and
//! reading in both directions but closes nothing, as when a host vanishes
//! (power loss, a cut link) and no TCP reset ever comes. Connections that
//! arrive meanwhile are accepted (the
//! kernel completes the TCP handshake anyway) and wait, unanswered. When the
//! host is back, every connection still open is forwarded again, the waiting
//! ones through a new upstream connection.
//!
//! The kernel still answers for the relay (TCP keepalive probes, the
//! handshake): only in a test's private network (`netns.rs`), where each
//! relay has a loopback address of its own, does a blackhole also drop
//! every packet sent to it, as a vanished host's network does.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a pump waits for bytes, and a blackholed pump between looks.
const TICK_MS: u64 = 5;

/// Relays of this process so far: each listens on a loopback address of
/// its own, 127.0.2.N.
static RELAYS: AtomicU32 = AtomicU32::new(0);

/// A running relay; stopped (and its connections closed) when dropped.
pub struct TcpRelay {
    /// What the daemon connects to, `tcp://127.0.2.N:port`.
    pub endpoint: String,
    /// Its address, 127.0.2.N.
    addr: String,
    blackholed: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl TcpRelay {
    /// Relays a free loopback port to `upstream` (`tcp://host:port`).
    pub fn start(upstream: &str) -> TcpRelay {
        let upstream = upstream.strip_prefix("tcp://").expect("a tcp:// endpoint").to_string();
        let n = RELAYS.fetch_add(1, Ordering::Relaxed) + 1;
        assert!(n < 255, "one address each: at most 254 relays a process");
        let addr = format!("127.0.2.{n}");
        let listener = TcpListener::bind(format!("{addr}:0")).unwrap();
        listener.set_nonblocking(true).unwrap();
        let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
        let blackholed = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (b, s, a) = (blackholed.clone(), stop.clone(), accepted.clone());
        let thread = std::thread::spawn(move || accept_loop(listener, &upstream, &b, &s, &a));
        TcpRelay { endpoint, addr, blackholed, stop, accepted, thread: Some(thread) }
    }

    /// Stops (true) or resumes (false) all traffic, closing nothing; in a
    /// private network, what is sent to the relay is dropped too.
    pub fn blackhole(&self, on: bool) {
        if on != self.blackholed.swap(on, Ordering::AcqRel) && super::netns::inside() {
            super::netns::vanish(&self.addr, on);
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Acquire)
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    upstream: &str,
    blackholed: &Arc<AtomicBool>,
    stop: &Arc<AtomicBool>,
    accepted: &AtomicUsize,
) {
    let mut pumps: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((down, _)) => {
                down.set_nonblocking(false).unwrap();
                accepted.fetch_add(1, Ordering::AcqRel);
                let (upstream, blackholed, stop) = (upstream.to_string(), blackholed.clone(), stop.clone());
                pumps.push(std::thread::spawn(move || relay(down, &upstream, &blackholed, &stop)));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(TICK_MS)),
            Err(e) => panic!("relay accept: {e}"),
        }
    }
    pumps.into_iter().for_each(|p| {
        let _ = p.join();
    });
}

/// One connection: waits while blackholed, connects upstream, then pumps
/// both ways until either side closes or the relay stops.
fn relay(down: TcpStream, upstream: &str, blackholed: &Arc<AtomicBool>, stop: &Arc<AtomicBool>) {
    while blackholed.load(Ordering::Acquire) {
        if stop.load(Ordering::Acquire) {
            return;
        }
        std::thread::sleep(Duration::from_millis(TICK_MS));
    }
    let Ok(up) = TcpStream::connect(upstream) else {
        return; // upstream gone: the daemon sees the connection close
    };
    let closed = Arc::new(AtomicBool::new(false));
    let (down2, up2) = (down.try_clone().unwrap(), up.try_clone().unwrap());
    let (b, c, s) = (blackholed.clone(), closed.clone(), stop.clone());
    let back = std::thread::spawn(move || pump(up2, down2, &b, &c, &s));
    pump(down, up, blackholed, &closed, stop);
    let _ = back.join();
}

/// Copies `from` to `to` while not blackholed; on EOF or an error closes
/// both and tells the other pump.
fn pump(mut from: TcpStream, mut to: TcpStream, blackholed: &AtomicBool, closed: &AtomicBool, stop: &AtomicBool) {
    from.set_read_timeout(Some(Duration::from_millis(TICK_MS))).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    while !closed.load(Ordering::Acquire) && !stop.load(Ordering::Acquire) {
        if blackholed.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(TICK_MS));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    closed.store(true, Ordering::Release);
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

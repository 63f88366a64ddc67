//! Readiness of a listener thread's sockets without looking at each: one
//! epoll set holds every SUB and monitor socket's `ZMQ_FD` and a doorbell
//! (an eventfd the API rings after queueing a control message, opening the
//! ready gate or shutting down), so the thread sleeps in `epoll_wait` until
//! something is ready and then touches only what is.
//!
//! `ZMQ_FD` is edge-like: it signals when a socket's mailbox gets commands
//! (a message arriving on an idle pipe is one), not while messages wait. So
//! a socket must be read until `EAGAIN` once it signals; a reader that stops
//! early (a burst cap, for fairness) keeps the socket in its own "hot" list
//! and looks again without waiting. A socket leaves the set (`remove`)
//! before it is closed, so a reused descriptor number cannot be confused
//! with it.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The token the doorbell reports.
pub(crate) const BELL: u64 = u64::MAX;
/// Most readiness events taken per wait; more wait for the next one.
const EVENTS_PER_WAIT_MAX: usize = 256;

/// An eventfd any thread may ring to wake one listener thread.
pub(crate) struct Doorbell {
    fd: OwnedFd,
}

impl Doorbell {
    pub(crate) fn new() -> io::Result<Doorbell> {
        // SAFETY: eventfd takes no pointers; a valid descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        Ok(Doorbell { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Wakes the thread waiting on this bell (or its next wait).
    pub(crate) fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd. A full
        // counter (EAGAIN) already means "rung".
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    fn clear(&self) {
        let mut n: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own nonblocking eventfd.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
    }
}

/// One thread's epoll set.
pub(crate) struct Poller {
    epoll: OwnedFd,
    events: Vec<libc::epoll_event>,
}

impl Poller {
    /// An epoll set holding `bell` (reported as `BELL`).
    pub(crate) fn new(bell: &Doorbell) -> io::Result<Poller> {
        // SAFETY: epoll_create1 takes no pointers.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        let p = Poller { epoll, events: vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS_PER_WAIT_MAX] };
        p.ctl(libc::EPOLL_CTL_ADD, bell.fd.as_raw_fd(), BELL)?;
        Ok(p)
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: token };
        // SAFETY: `ev` is a live epoll_event; the kernel copies it.
        if unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Watches `socket`, reporting `token` when it may have something.
    pub(crate) fn add(&self, socket: &zmq::Socket, token: u64) -> io::Result<()> {
        let fd = socket.get_fd().map_err(io::Error::from)?;
        self.ctl(libc::EPOLL_CTL_ADD, fd, token)
    }

    /// Stops watching `socket`; call before it is closed.
    pub(crate) fn remove(&self, socket: &zmq::Socket) {
        if let Ok(fd) = socket.get_fd() {
            let _ = self.ctl(libc::EPOLL_CTL_DEL, fd, 0);
        }
    }

    /// Waits up to `timeout_ms` (-1: no limit, 0: not at all) and appends
    /// the tokens of what is ready to `ready`. A rung bell is cleared and
    /// reported as `BELL`. EINTR counts as nothing ready.
    pub(crate) fn wait(&mut self, timeout_ms: i32, bell: &Doorbell, ready: &mut Vec<u64>) -> io::Result<()> {
        // SAFETY: `events` holds EVENTS_PER_WAIT_MAX initialized entries the kernel may overwrite.
        let n = unsafe {
            libc::epoll_wait(self.epoll.as_raw_fd(), self.events.as_mut_ptr(), EVENTS_PER_WAIT_MAX as i32, timeout_ms)
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted { Ok(()) } else { Err(e) };
        }
        for ev in &self.events[..n as usize] {
            let token = ev.u64;
            if token == BELL {
                bell.clear();
            }
            ready.push(token);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_with_a_message_is_reported_and_the_bell_wakes() {
        let ctx = zmq::Context::new();
        let a = ctx.socket(zmq::PAIR).unwrap();
        a.bind("inproc://poller-test").unwrap();
        let b = ctx.socket(zmq::PAIR).unwrap();
        b.connect("inproc://poller-test").unwrap();
        let bell = Doorbell::new().unwrap();
        let mut p = Poller::new(&bell).unwrap();
        p.add(&a, 7).unwrap();
        // Drain whatever the connection left in the mailbox.
        let _ = a.get_events();
        let mut ready = Vec::new();
        p.wait(0, &bell, &mut ready).unwrap();
        ready.clear();
        b.send("x", 0).unwrap();
        p.wait(1_000, &bell, &mut ready).unwrap();
        assert_eq!(ready, vec![7]);
        assert_eq!(a.recv_bytes(zmq::DONTWAIT).unwrap(), b"x");
        assert!(a.recv_bytes(zmq::DONTWAIT).is_err(), "read until EAGAIN");
        ready.clear();
        bell.ring();
        p.wait(1_000, &bell, &mut ready).unwrap();
        assert_eq!(ready, vec![BELL]);
        ready.clear();
        p.wait(0, &bell, &mut ready).unwrap();
        assert!(ready.is_empty(), "a cleared bell stays quiet");
        p.remove(&a);
        b.send("y", 0).unwrap();
        p.wait(50, &bell, &mut ready).unwrap();
        assert!(ready.is_empty(), "a removed socket is not reported");
    }
}

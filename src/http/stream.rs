//! A connected TCP or Unix stream, as the HTTP server reads and writes it:
//! one type for both, with read timeouts that are only set (a system call)
//! when they change.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::request::ReadTimeout;

enum Inner {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// A connected stream of either kind.
pub struct Stream {
    inner: Inner,
    /// The read timeout last set on the socket.
    read_timeout: Option<Duration>,
}

impl Stream {
    pub fn tcp(s: TcpStream) -> Stream {
        Stream { inner: Inner::Tcp(s), read_timeout: None }
    }

    pub fn unix(s: UnixStream) -> Stream {
        Stream { inner: Inner::Unix(s), read_timeout: None }
    }

    /// Another handle to the same socket (its timeouts are the socket's).
    pub fn try_clone(&self) -> io::Result<Stream> {
        let inner = match &self.inner {
            Inner::Tcp(s) => Inner::Tcp(s.try_clone()?),
            Inner::Unix(s) => Inner::Unix(s.try_clone()?),
        };
        Ok(Stream { inner, read_timeout: None })
    }

    pub fn shutdown(&self) {
        let _ = match &self.inner {
            Inner::Tcp(s) => s.shutdown(Shutdown::Both),
            Inner::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    /// No more writes: the peer reads to the end, then sees it.
    pub fn shutdown_write(&self) {
        let _ = match &self.inner {
            Inner::Tcp(s) => s.shutdown(Shutdown::Write),
            Inner::Unix(s) => s.shutdown(Shutdown::Write),
        };
    }

    pub fn set_write_timeout(&self, t: Duration) -> io::Result<()> {
        match &self.inner {
            Inner::Tcp(s) => s.set_write_timeout(Some(t)),
            Inner::Unix(s) => s.set_write_timeout(Some(t)),
        }
    }
}

impl ReadTimeout for Stream {
    fn set_read_timeout(&mut self, t: Duration) -> io::Result<()> {
        if self.read_timeout == Some(t) {
            return Ok(());
        }
        match &self.inner {
            Inner::Tcp(s) => s.set_read_timeout(Some(t))?,
            Inner::Unix(s) => s.set_read_timeout(Some(t))?,
        }
        self.read_timeout = Some(t);
        Ok(())
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.inner {
            Inner::Tcp(s) => s.read(buf),
            Inner::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.inner {
            Inner::Tcp(s) => s.write(buf),
            Inner::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.inner {
            Inner::Tcp(s) => s.flush(),
            Inner::Unix(s) => s.flush(),
        }
    }
}

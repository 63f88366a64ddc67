//! systemd readiness (`Type=notify`): one datagram to `$NOTIFY_SOCKET`,
//! written by hand rather than through a library. Does nothing when the
//! daemon is not started by systemd.
//!
//! Startup (snapshot load, peer recovery) may outlast `TimeoutStartSec`, so
//! until `READY=1` a `StartupExtender` asks systemd for more time, a
//! little at a time: a daemon that hangs still times out.

use std::os::unix::net::UnixDatagram;
use std::sync::mpsc;
use std::time::Duration;

/// How often the start timeout is extended while the daemon starts.
pub const EXTEND_EVERY_MS: u64 = 10_000;
/// How much each extension asks for, from the moment it is sent.
pub const EXTEND_BY_MS: u64 = 30_000;

/// Sends `state` (e.g. `READY=1`) to systemd; returns whether it was sent.
pub fn notify(state: &str) -> bool {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return false;
    };
    let Ok(sock) = UnixDatagram::unbound() else {
        return false;
    };
    let bytes = path.as_encoded_bytes();
    let sent = if let Some(name) = bytes.strip_prefix(b"@") {
        // An abstract socket: the name follows a leading NUL.
        use std::os::linux::net::SocketAddrExt;
        match std::os::unix::net::SocketAddr::from_abstract_name(name) {
            Ok(addr) => sock.send_to_addr(state.as_bytes(), &addr).is_ok(),
            Err(_) => false,
        }
    } else {
        sock.send_to(state.as_bytes(), std::path::Path::new(&path)).is_ok()
    };
    if !sent {
        crate::warn!("could not notify systemd at {}", path.to_string_lossy());
    }
    sent
}

/// Extends systemd's start timeout every `EXTEND_EVERY_MS` until dropped.
pub struct StartupExtender(Option<(mpsc::Sender<()>, std::thread::JoinHandle<()>)>);

impl StartupExtender {
    /// Starts extending (at once, then periodically); a no-op outside systemd.
    pub fn start() -> StartupExtender {
        if std::env::var_os("NOTIFY_SOCKET").is_none() {
            return StartupExtender(None);
        }
        let (tx, rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new().name("notify-extend".into()).spawn(move || loop {
            notify(&format!("EXTEND_TIMEOUT_USEC={}\nSTATUS=starting", EXTEND_BY_MS * 1000));
            match rx.recv_timeout(Duration::from_millis(EXTEND_EVERY_MS)) {
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                _ => return,
            }
        });
        StartupExtender(thread.ok().map(|t| (tx, t)))
    }
}

impl Drop for StartupExtender {
    fn drop(&mut self) {
        if let Some((stop, thread)) = self.0.take() {
            drop(stop);
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ready_reaches_a_socket() {
        let dir = std::env::temp_dir().join(format!("kv-indexer-notify-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let rx = std::os::unix::net::UnixDatagram::bind(&dir).unwrap();
        // The variable is process-wide: this is the only test that sets it.
        std::env::set_var("NOTIFY_SOCKET", &dir);
        assert!(super::notify("READY=1"));
        std::env::remove_var("NOTIFY_SOCKET");
        let mut buf = [0u8; 32];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        let _ = std::fs::remove_file(&dir);
    }
}

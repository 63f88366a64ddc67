//! systemd readiness (`Type=notify`): one datagram to `$NOTIFY_SOCKET`,
//! written by hand rather than through a library. Does nothing when the
//! daemon is not started by systemd.

use std::os::unix::net::UnixDatagram;

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
        crate::warn!("could not notify systemd at {:?}", path);
    }
    sent
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

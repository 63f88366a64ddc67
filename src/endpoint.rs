//! Syntax checks for the addresses a client hands us: the ZMQ endpoints a
//! listener will connect to, and the URLs of peers we will fetch `/dump`
//! from. Checked at the boundary so a typo is a 400 now, not a listener
//! that fails later. Only syntax: nothing is resolved or connected here.

/// Longest endpoint or peer URL accepted, in bytes.
pub const ADDRESS_BYTES_MAX: usize = 256;

/// Longest `ipc://` path: what fits in a Unix socket address on Linux.
const IPC_PATH_BYTES_MAX: usize = 107;

/// Checks a ZMQ endpoint to connect to: `tcp://host:port` (host a name, an
/// IPv4 address or a bracketed IPv6 address; port 1-65535) or `ipc://path`.
/// `*` is refused: it means "every interface" for a bind and cannot be
/// connected to. Returns a message saying what is wrong.
pub fn validate_zmq_endpoint(endpoint: &str) -> Result<(), String> {
    let bad =
        |why: &str| Err(format!("invalid ZMQ endpoint {endpoint:?}: {why}; expected tcp://host:port or ipc://path"));
    if endpoint.len() > ADDRESS_BYTES_MAX {
        return bad("too long");
    }
    if let Some(path) = endpoint.strip_prefix("ipc://") {
        if path.is_empty() {
            return bad("empty ipc path");
        }
        if path.len() > IPC_PATH_BYTES_MAX {
            return bad("ipc path longer than a Unix socket address allows");
        }
        if path.bytes().any(|b| b.is_ascii_control()) {
            return bad("control character in the ipc path");
        }
        return Ok(());
    }
    let Some(address) = endpoint.strip_prefix("tcp://") else {
        return bad("unsupported scheme");
    };
    if let Err(why) = host_port(address) {
        return bad(why);
    }
    Ok(())
}

/// Checks a peer URL, `http://host:port` with an optional trailing `/`,
/// and returns it without the slash, so one peer has one spelling.
pub fn validate_peer_url(url: &str) -> Result<String, String> {
    let bad = |why: &str| Err(format!("invalid peer url {url:?}: {why}; expected http://host:port"));
    if url.len() > ADDRESS_BYTES_MAX {
        return bad("too long");
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return bad("unsupported scheme (only http:// is supported)");
    };
    let address = rest.strip_suffix('/').unwrap_or(rest);
    if let Err(why) = host_port(address) {
        return bad(why);
    }
    Ok(format!("http://{address}"))
}

/// Checks `host:port`.
fn host_port(address: &str) -> Result<(), &'static str> {
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err("missing port");
    };
    // Digits only: `parse` would take a sign.
    let digits = port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit());
    if !digits || !matches!(port.parse::<u32>(), Ok(1..=65535)) {
        return Err("port must be a number 1-65535");
    }
    if host.is_empty() {
        return Err("missing host");
    }
    if host == "*" {
        return Err("host `*` can only be bound, not connected to");
    }
    if let Some(inner) = host.strip_prefix('[') {
        let Some(v6) = inner.strip_suffix(']') else {
            return Err("missing `]` after an IPv6 address");
        };
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return Err("invalid IPv6 address");
        }
        return Ok(());
    }
    let name_byte = |b: u8| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_';
    if !host.bytes().all(name_byte) {
        return Err("host must be a name or an IP address (IPv6 in brackets)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zmq_endpoints() {
        for ok in [
            "tcp://127.0.0.1:5557",
            "tcp://host-1.example.com:1",
            "tcp://[::1]:65535",
            "tcp://[fe80::1]:5557",
            "ipc:///tmp/engine.sock",
            "ipc://@abstract",
        ] {
            assert_eq!(validate_zmq_endpoint(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "tcp://",
            "tcp://host",
            "tcp://:5557",
            "tcp://*:5557",
            "tcp://host:0",
            "tcp://host:65536",
            "tcp://host:+5",
            "tcp://host:55x",
            "tcp://host:5557;other:1",
            "tcp://a:b:5557",
            "tcp://[::1:5557",
            "tcp://[zz]:5557",
            "tcp://host name:5557",
            "udp://host:5557",
            "inproc://x",
            "ipc://",
            "TCP://host:5557",
        ] {
            let err = validate_zmq_endpoint(bad).expect_err(bad);
            assert!(err.contains("tcp://host:port"), "{err}");
        }
        let long = format!("ipc:///{}", "a".repeat(200));
        assert!(validate_zmq_endpoint(&long).is_err());
    }

    #[test]
    fn peer_urls() {
        assert_eq!(validate_peer_url("http://10.0.0.2:8090/"), Ok("http://10.0.0.2:8090".to_string()));
        assert_eq!(validate_peer_url("http://peer:8090"), Ok("http://peer:8090".to_string()));
        for bad in [
            "https://peer:8090",
            "http://peer",
            "http://peer:8090/dump",
            "http://peer:8090//",
            "http://:8090",
            "http://*:8090",
            "peer:8090",
            "http://user@peer:8090",
        ] {
            assert!(validate_peer_url(bad).is_err(), "{bad}");
        }
    }
}

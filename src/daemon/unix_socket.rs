//! Who may use the API's Unix socket: its owner and its group, read and
//! write (mode 0660), whatever the umask (systemd's `UMask=0077` would
//! otherwise leave it to the daemon's own user). The group is the daemon's
//! primary group: under systemd, `Group=` names the co-located router's
//! group (`DynamicUser=` then keeps a dynamic user in that static group).
//! No chown: the unit's syscall filter refuses it, rightly.

use std::path::Path;

/// Mode of the socket file: owner and group may connect.
pub const SOCKET_MODE: u32 = 0o660;

/// Sets mode 0660 on the socket at `path`.
pub fn grant(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(|e| format!("cannot set the mode of unix socket {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn the_socket_gets_0660() {
        let dir = std::env::temp_dir().join(format!("kv-indexer-grant-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("api.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
        grant(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o660);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

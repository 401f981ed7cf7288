//! What a systemd service needs: readiness notifications (`Type=notify`) and knowing
//! whether stderr goes to the journal. Both are no-ops elsewhere.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Sends `state` (`READY=1`, `STOPPING=1`, `STATUS=...`, newline-separated) to systemd's
/// notification socket, if the service manager gave one. Failures are logged, not fatal:
/// the service manager is then wrong about the state, not the server.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let sent = UnixDatagram::unbound().and_then(|sock| {
        use std::os::unix::ffi::OsStrExt;
        match path.as_bytes().strip_prefix(b"@") {
            // A name in the abstract namespace.
            Some(name) => sock.send_to_addr(state.as_bytes(), &SocketAddr::from_abstract_name(name)?),
            None => sock.send_to(state.as_bytes(), &path),
        }
    });
    if let Err(e) = sent {
        tracing::warn!(socket = %path.to_string_lossy(), "could not notify systemd: {e}");
    }
}

/// Whether stderr is the journal: systemd sets `JOURNAL_STREAM` to the device and inode
/// of the stream it connected, which stays true only while nobody redirected stderr.
pub fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else { return false };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else { return false };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else { return false };
    // /proc/self/fd/2 follows the descriptor to its socket or pipe.
    std::fs::metadata("/proc/self/fd/2").is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_reaches_a_socket() {
        let path = std::env::temp_dir().join(format!("strata-notify-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let sock = UnixDatagram::bind(&path).unwrap();
        // SAFETY: this test is the only one that reads or writes NOTIFY_SOCKET.
        unsafe { std::env::set_var("NOTIFY_SOCKET", &path) };
        notify("READY=1");
        unsafe { std::env::remove_var("NOTIFY_SOCKET") };
        let mut buf = [0u8; 64];
        let n = sock.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        std::fs::remove_file(&path).unwrap();
    }
}

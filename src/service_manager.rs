//! Telling systemd how the router is (sd_notify(3), for `Type=notify` units such as
//! deploy/systemd/switchyard.service): ready once serving, the new main process when one
//! takes over from another (`--upgrade --quit-predecessor` from `ExecReload`, which needs
//! `NotifyAccess=all`), stopping on SIGTERM. Nothing is sent without `NOTIFY_SOCKET`.
//! A datagram on a Unix socket: a dependency would add nothing to these few lines.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Sends `state` (`KEY=value` lines) to the service manager, if there is one.
pub(crate) fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = UnixDatagram::unbound().and_then(|socket| {
        let path = path.as_bytes();
        // A leading '@' names a socket in the abstract namespace.
        let address = match path.strip_prefix(b"@") {
            Some(name) => SocketAddr::from_abstract_name(name)?,
            None => SocketAddr::from_pathname(std::ffi::OsStr::from_bytes(path))?,
        };
        socket.send_to_addr(state.as_bytes(), &address)
    });
    if let Err(e) = sent {
        log::warn!("the service manager was not told {state:?}: {e}");
    }
}

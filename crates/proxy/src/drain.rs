//! Ending connections to backends that left their app. A route change never cuts a
//! connection by itself: requests and WebSockets keep the backend they started with. Only
//! when a backend is removed (scale down, redeploy, app deleted) are its remaining upstream
//! connections shut down, after a grace period that lets short requests finish.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{getpeername, getsockname, shutdown, Shutdown, SockaddrStorage};

use crate::balancer::{BackendState, Upstream, UpstreamConnection};
use crate::metrics;

/// Retires the backends of `old` that `new` no longer has.
pub(crate) fn retire_removed(old: &Upstream, new: &Upstream, grace: Duration) {
    let removed: Vec<Arc<BackendState>> = old
        .backends()
        .iter()
        .filter(|b| new.find(b.address).is_none())
        .cloned()
        .collect();
    retire(removed, grace);
}

/// Retires every backend of a deleted app.
pub(crate) fn retire_all(old: &Upstream, grace: Duration) {
    retire(old.backends().to_vec(), grace);
}

fn retire(backends: Vec<Arc<BackendState>>, grace: Duration) {
    if backends.is_empty() {
        return;
    }
    for backend in &backends {
        backend.retire();
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        log::warn!("no runtime to drain retired backends on; their connections stay open");
        return;
    };
    runtime.spawn(async move {
        tokio::time::sleep(grace).await;
        for backend in backends {
            // Re-added during the grace period: it is in service again, keep its connections.
            if !backend.is_retired() {
                continue;
            }
            for connection in backend.connections() {
                if close_if_same(connection, backend.address) {
                    metrics::DRAINED_CONNECTIONS.inc();
                }
            }
        }
    });
}

/// Shuts the socket down only if its descriptor still belongs to the same TCP connection:
/// a live 4-tuple is unique, so a descriptor number reused by another socket is left alone.
fn close_if_same(connection: UpstreamConnection, peer: SocketAddr) -> bool {
    let local = getsockname::<SockaddrStorage>(connection.fd)
        .ok()
        .and_then(|a| to_std(&a));
    let remote = getpeername::<SockaddrStorage>(connection.fd)
        .ok()
        .and_then(|a| to_std(&a));
    if local != Some(connection.local) || remote != Some(peer) {
        return false;
    }
    match shutdown(connection.fd, Shutdown::Both) {
        Ok(()) => {
            log::info!(
                "closed a connection to removed backend {peer} after the drain grace period"
            );
            true
        }
        Err(e) => {
            log::debug!("shutdown of a connection to {peer} failed: {e}");
            false
        }
    }
}

fn to_std(address: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = address.as_sockaddr_in() {
        return Some(SocketAddr::from((v4.ip(), v4.port())));
    }
    address
        .as_sockaddr_in6()
        .map(|v6| SocketAddr::from((v6.ip(), v6.port())))
}

//! One client connection as the protocols take it (`client_h1`, `h2`, `tls`): where it
//! comes from, its thread's event loop, the listener's stop, and its place in the count of
//! open connections; and the look at its first bytes that tells the protocols apart.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::event_loop::EventLoop;

/// While a client's first bytes have come in part, how long to wait before looking again.
const PARTIAL_PEEK_PAUSE: Duration = Duration::from_millis(1);

/// One client connection.
pub(super) struct Connection {
    pub(super) peer: SocketAddr,
    /// The router's address the client connected to (its port as the WAF's rules see it).
    pub(super) reached: SocketAddr,
    pub(super) worker: Rc<EventLoop>,
    pub(super) stopped: watch::Receiver<bool>,
    pub(super) _open: OpenConnection,
}

/// Counts a client connection open on its thread while it lives.
pub(super) struct OpenConnection(Rc<EventLoop>);

impl OpenConnection {
    pub(super) fn count(worker: &Rc<EventLoop>) -> Self {
        worker
            .open_connections
            .set(worker.open_connections.get() + 1);
        Self(worker.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        let open = &self.0.open_connections;
        open.set(open.get().saturating_sub(1));
    }
}

/// Looks at what a client sent first, leaving it on the socket for whoever reads next,
/// until `decide` can tell from it (`None` while too little has come). A peek leaves the
/// socket readable, so between looks this sleeps a moment rather than waiting for
/// readiness, which would spin.
pub(super) async fn peek_until<T>(
    stream: &TcpStream,
    buffer: &mut [u8],
    mut decide: impl FnMut(&[u8]) -> Option<T>,
) -> std::io::Result<T> {
    loop {
        let peeked = stream.peek(buffer).await?;
        if peeked == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed before its first bytes were complete",
            ));
        }
        if let Some(decided) = decide(&buffer[..peeked]) {
            return Ok(decided);
        }
        tokio::time::sleep(PARTIAL_PEEK_PAUSE).await;
    }
}

//! An upgraded connection (WebSocket) relayed between the client's and the backend's
//! sockets. A direction holds a buffer only while data flows: it waits for its socket to be
//! readable with none, takes one for what is there, and lets it go as soon as a read would
//! wait again, so an idle WebSocket costs its two sockets and a task, not two buffers.
//!
//! When the router closes the backend's side (a drain), the client gets a close frame 1001
//! between two of the backend's frames, as on the Pingora listeners (`websocket_close`).

use std::cell::{Cell, RefCell};
use std::io::ErrorKind;
use std::net::Shutdown;
use std::time::Duration;

use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use socket2::SockRef;
use tokio::net::TcpStream;

use super::bodies::RequestEnd;
use crate::websocket_close::{self, FrameBoundary};

/// Most bytes read at once in one direction.
const READ_CHUNK: usize = 16 * 1024;

/// Once one side has closed, how long the other may still send (its close frame in reply,
/// say) before the relay ends, as nginx ends an upgraded connection when either side does;
/// not at once, so that what was just sent is not lost to a reset from closing on unread
/// bytes.
const HALF_CLOSED_GRACE: Duration = Duration::from_secs(1);

/// Relays until both sides are done; the request is logged when this returns.
pub(super) async fn run(client: OnUpgrade, backend: OnUpgrade, end: RequestEnd) {
    let (client, backend) = match tokio::join!(client, backend) {
        (Ok(client), Ok(backend)) => (client, backend),
        (Err(e), _) | (_, Err(e)) => {
            log::debug!("request {}: upgrade failed: {e}", end.ctx.request_id);
            return;
        }
    };
    let (Some((client, client_early)), Some((backend, backend_early))) =
        (into_tcp(client), into_tcp(backend))
    else {
        log::warn!(
            "request {}: an upgraded connection is not a TCP socket; closed",
            end.ctx.request_id
        );
        return;
    };
    let mut end = end;
    let outcome = relay(&client, &backend, &client_early, &backend_early, &mut end).await;
    if let Err(e) = outcome {
        log::debug!("request {}: relay ended: {e}", end.ctx.request_id);
    }
}

/// The socket under an upgraded connection, with what hyper had read past the head.
fn into_tcp(upgraded: Upgraded) -> Option<(TcpStream, bytes::Bytes)> {
    let parts = upgraded.downcast::<TokioIo<TcpStream>>().ok()?;
    Some((parts.io.into_inner(), parts.read_buf))
}

async fn relay(
    client: &TcpStream,
    backend: &TcpStream,
    client_early: &[u8],
    backend_early: &[u8],
    end: &mut RequestEnd,
) -> std::io::Result<()> {
    let frames = RefCell::new(FrameBoundary::default());
    write_all(backend, client_early).await?;
    frames.borrow_mut().advance(backend_early);
    write_all(client, backend_early).await?;
    end.bytes_out += backend_early.len();
    end.bytes_in.set(end.bytes_in.get() + client_early.len());

    let bytes_in = end.bytes_in.clone();
    let to_backend = pump(client, backend, |n, _| bytes_in.set(bytes_in.get() + n));
    let bytes_out = Cell::new(0);
    let to_client = pump(backend, client, |n, data| {
        frames.borrow_mut().advance(data);
        bytes_out.set(bytes_out.get() + n);
    });
    tokio::pin!(to_backend, to_client);
    let first = tokio::select! {
        result = &mut to_client => {
            // The backend is done (or was closed by the router): tell the client.
            let closed_by_router = end
                .ctx
                .upstream_connection
                .as_ref()
                .is_some_and(|c| c.connection().closed_for().is_some());
            if closed_by_router && frames.borrow().at_boundary() {
                let _ = write_all(client, &websocket_close::going_away_frame()).await;
            }
            let _ = SockRef::from(client).shutdown(Shutdown::Write);
            let _ = tokio::time::timeout(HALF_CLOSED_GRACE, &mut to_backend).await;
            result
        }
        result = &mut to_backend => {
            let _ = SockRef::from(backend).shutdown(Shutdown::Write);
            let _ = tokio::time::timeout(HALF_CLOSED_GRACE, &mut to_client).await;
            result
        }
    };
    end.bytes_out += bytes_out.get();
    first
}

/// Copies `from` to `to` until `from` ends, calling `seen` with each piece.
async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    mut seen: impl FnMut(usize, &[u8]),
) -> std::io::Result<()> {
    loop {
        from.readable().await?;
        let mut buffer = Vec::with_capacity(READ_CHUNK);
        loop {
            buffer.clear();
            match from.try_read_buf(&mut buffer) {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    seen(n, &buffer);
                    write_all(to, &buffer).await?;
                }
                // Nothing more for now: the buffer goes until data comes again.
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
    }
}

async fn write_all(to: &TcpStream, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        to.writable().await?;
        match to.try_write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

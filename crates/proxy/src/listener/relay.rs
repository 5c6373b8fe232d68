//! An upgraded connection (WebSocket) relayed between the client's and the backend's
//! sockets (the client's through TLS on the HTTPS listener). A direction holds a buffer only
//! while data flows: it waits for its socket to be readable with none, takes one for what is
//! there, and lets it go as soon as a read would wait again, so an idle WebSocket costs its
//! two sockets and a task, not two buffers (and OpenSSL gives its buffers back while idle).
//!
//! When the router closes the backend's side (a drain asks through the connection table;
//! the relay, owning the socket now, shuts it down), the client gets a close frame 1001
//! between two of the backend's frames (`websocket_close`).

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::io::ErrorKind;
use std::net::Shutdown;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use socket2::SockRef;
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_openssl::SslStream;

use crate::connection::websocket_close::{self, FrameBoundary};
use crate::pipeline::end::RequestEnd;
use crate::routing::connections::ShutdownRequest;

/// Most bytes read at once in one direction.
const READ_CHUNK: usize = 16 * 1024;

/// Once one side has closed, how long the other may still send (its close frame in reply,
/// say) before the relay ends, as nginx ends an upgraded connection when either side does;
/// not at once, so that what was just sent is not lost to a reset from closing on unread
/// bytes.
const HALF_CLOSED_GRACE: Duration = Duration::from_secs(1);

/// The client's connection after its 101 went out, with what it had sent past its
/// request's head.
pub(crate) type ClientUpgrade = oneshot::Receiver<(ClientSide, Bytes)>;

/// The client's socket, under TLS or not.
pub(crate) enum ClientSide {
    Plain(TcpStream),
    Tls(SslStream<TcpStream>),
}

/// A client's stream handed to the relay once the protocol switched.
pub(crate) trait IntoClientSide {
    fn into_client_side(self) -> ClientSide;
}

impl IntoClientSide for TcpStream {
    fn into_client_side(self) -> ClientSide {
        ClientSide::Plain(self)
    }
}

impl IntoClientSide for SslStream<TcpStream> {
    fn into_client_side(self) -> ClientSide {
        ClientSide::Tls(self)
    }
}

/// Relays until both sides are done; the request is logged when this returns. `backend`:
/// the backend's socket and what it sent past its answer's head.
pub(crate) async fn run(
    client: ClientUpgrade,
    backend: Option<(TcpStream, Bytes)>,
    end: Box<RequestEnd>,
) {
    let Ok((client, client_early)) = client.await else {
        log::debug!(
            "request {}: the client's connection was not handed over",
            end.ctx.request_id
        );
        return;
    };
    let client = match client {
        ClientSide::Plain(stream) => Side::Plain(stream),
        ClientSide::Tls(stream) => Side::Tls(RefCell::new(stream)),
    };
    let Some((backend, backend_early)) =
        backend.map(|(stream, early)| (Side::Plain(stream), early))
    else {
        log::warn!(
            "request {}: the backend's side of an upgrade was not a socket; closed",
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

/// One side of a relayed connection. TLS is in a `RefCell` because both directions use the
/// one OpenSSL session, each only within a single poll, never across an await.
enum Side {
    Plain(TcpStream),
    Tls(RefCell<SslStream<TcpStream>>),
}

impl Side {
    async fn readable(&self) -> std::io::Result<()> {
        match self {
            Self::Plain(stream) => stream.readable().await,
            Self::Tls(stream) => poll_fn(|cx| stream.borrow().get_ref().poll_read_ready(cx)).await,
        }
    }

    /// Reads what is there; `None` when a read would wait.
    async fn try_read(&self, buffer: &mut BytesMut) -> std::io::Result<Option<usize>> {
        match self {
            Self::Plain(stream) => match stream.try_read_buf(buffer) {
                Ok(n) => Ok(Some(n)),
                Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(None),
                Err(e) => Err(e),
            },
            // OpenSSL may hold decrypted bytes the socket no longer shows as readable, so
            // the session is asked, not the socket.
            Self::Tls(stream) => {
                poll_fn(|cx| {
                    let mut stream = stream.borrow_mut();
                    Poll::Ready(
                        match tokio_util::io::poll_read_buf(Pin::new(&mut *stream), cx, buffer) {
                            Poll::Ready(read) => read.map(Some),
                            Poll::Pending => Ok(None),
                        },
                    )
                })
                .await
            }
        }
    }

    async fn write_all(&self, mut data: &[u8]) -> std::io::Result<()> {
        while !data.is_empty() {
            let written = match self {
                Self::Plain(stream) => {
                    stream.writable().await?;
                    match stream.try_write(data) {
                        Ok(n) => n,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => 0,
                        Err(e) => return Err(e),
                    }
                }
                Self::Tls(stream) => {
                    poll_fn(|cx| Pin::new(&mut *stream.borrow_mut()).poll_write(cx, data)).await?
                }
            };
            data = &data[written..];
        }
        Ok(())
    }

    /// Ends both ways of this side's socket at once, as a drain does.
    fn shutdown_both(&self) {
        let _ = match self {
            Self::Plain(stream) => SockRef::from(stream).shutdown(Shutdown::Both),
            Self::Tls(stream) => SockRef::from(stream.borrow().get_ref()).shutdown(Shutdown::Both),
        };
    }

    /// Ends this side's sending (a TLS side sends its close_notify first).
    async fn shutdown_write(&self) {
        match self {
            Self::Plain(stream) => {
                let _ = SockRef::from(stream).shutdown(Shutdown::Write);
            }
            Self::Tls(stream) => {
                let _ = poll_fn(|cx| Pin::new(&mut *stream.borrow_mut()).poll_shutdown(cx)).await;
            }
        }
    }
}

async fn relay(
    client: &Side,
    backend: &Side,
    client_early: &[u8],
    backend_early: &[u8],
    end: &mut RequestEnd,
) -> std::io::Result<()> {
    let frames = RefCell::new(FrameBoundary::default());
    backend.write_all(client_early).await?;
    frames.borrow_mut().advance(backend_early);
    client.write_all(backend_early).await?;
    end.bytes_out += backend_early.len();
    end.bytes_in.set(end.bytes_in.get() + client_early.len());

    let bytes_in = end.bytes_in.clone();
    let to_backend = pump(client, backend, |n, _| bytes_in.set(bytes_in.get() + n));
    let bytes_out = Cell::new(0);
    let shutdown = end
        .ctx
        .upstream_connection
        .as_ref()
        .map(|c| c.connection().shutdown_request().clone());
    let to_client = until_shut_down(
        backend,
        shutdown.as_deref(),
        pump(backend, client, |n, data| {
            frames.borrow_mut().advance(data);
            bytes_out.set(bytes_out.get() + n);
        }),
    );
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
                let _ = client.write_all(&websocket_close::going_away_frame()).await;
            }
            client.shutdown_write().await;
            let _ = tokio::time::timeout(HALF_CLOSED_GRACE, &mut to_backend).await;
            result
        }
        result = &mut to_backend => {
            backend.shutdown_write().await;
            let _ = tokio::time::timeout(HALF_CLOSED_GRACE, &mut to_client).await;
            result
        }
    };
    end.bytes_out += bytes_out.get();
    first
}

/// Runs `pump`, reading from `backend`, to its end; when the router asks for the backend's
/// socket to be shut down meanwhile (or had asked before the relay began), shuts it down,
/// which the pump then reads as the backend's close.
async fn until_shut_down(
    backend: &Side,
    shutdown: Option<&ShutdownRequest>,
    pump: impl std::future::Future<Output = std::io::Result<()>>,
) -> std::io::Result<()> {
    tokio::pin!(pump);
    let Some(shutdown) = shutdown else {
        return pump.await;
    };
    tokio::select! {
        ended = &mut pump => return ended,
        () = shutdown.requested() => backend.shutdown_both(),
    }
    pump.await
}

/// Copies `from` to `to` until `from` ends, calling `seen` with each piece.
async fn pump(from: &Side, to: &Side, mut seen: impl FnMut(usize, &[u8])) -> std::io::Result<()> {
    loop {
        let mut buffer = BytesMut::with_capacity(READ_CHUNK);
        loop {
            buffer.clear();
            match from.try_read(&mut buffer).await? {
                Some(0) => return Ok(()),
                Some(n) => {
                    seen(n, &buffer);
                    to.write_all(&buffer).await?;
                }
                // Nothing more for now: the buffer goes until data comes again.
                None => break,
            }
        }
        drop(buffer);
        from.readable().await?;
    }
}

//! HTTP/2 from clients on the listener: over TLS when ALPN chose `h2`, in clear when
//! the connection opens with the HTTP/2 preface (prior knowledge, as `--http` takes it).
//! Each stream is one request through the same `pipeline::handle` as HTTP/1.1, run as a task
//! of the connection's thread. Beyond what the h2 crate enforces itself (streams reset
//! before they are accepted, CVE-2023-44487), a connection is closed when its client
//! cancels too many streams the router already took on (`h2_resets`), and an idle connection is asked to go away after the client idle timeout.

use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::time::{Duration, Instant};

use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::connection::{peek_until, Connection};
use super::send_deadline::SendDeadline;
use crate::connection::h2_resets::{Cancellations, CANCELLATION_WINDOW, MOST_CANCELLED_STREAMS};
use crate::pipeline::{self, client::Client};
use crate::request_body::RequestBody;

/// The HTTP/2 connection preface a client with prior knowledge opens with (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Streams served at once on one connection: nginx's `http2_max_concurrent_streams`.
const MAX_CONCURRENT_STREAMS: u32 = 128;
/// Largest request head (decoded) a client may send, as the HTTP/1.1 read buffer allows;
/// routing refuses heads over 32 KiB with 431 as on HTTP/1.1.
const MAX_HEADER_LIST_SIZE: u32 = 64 * 1024;

/// Runs the h2 crate's stream tasks on the connection's thread: nothing per stream is
/// shared with another thread, so nothing is locked or sent.
#[derive(Clone, Copy)]
struct LocalExec;

impl<F> hyper::rt::Executor<F> for LocalExec
where
    F: Future + 'static,
{
    fn execute(&self, future: F) {
        // Called while the connection's task is polled: the stream is metered as its.
        crate::traffic::cost::spawn_stream(future);
    }
}

/// Whether a plain connection opens with the HTTP/2 preface. Decided on the first bytes:
/// anything else is HTTP/1.1 (hyper then answers what is not HTTP at all). An error when the
/// client closes first.
pub(super) async fn opens_with_preface(stream: &TcpStream) -> std::io::Result<bool> {
    let mut first = [0u8; PREFACE.len()];
    peek_until(stream, &mut first, |data| {
        if data != &PREFACE[..data.len()] {
            Some(false)
        } else {
            (data.len() == PREFACE.len()).then_some(true)
        }
    })
    .await
}

/// A stream taken on; counted as cancelled when dropped before its answer's head was made
/// (hyper drops the request's future when the client resets the stream).
struct TakenStream {
    cancellations: Rc<Cancellations>,
    answered: bool,
}

impl TakenStream {
    /// The stream's answer head is made: whatever happens next is not a cancellation.
    fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for TakenStream {
    fn drop(&mut self) {
        if !self.answered {
            self.cancellations.count_one();
        }
    }
}

/// Serves `stream` as HTTP/2 until the client goes, the listener stops, the connection
/// idles past the client idle timeout, or its client cancels too many streams.
pub(super) async fn serve<S>(connection: Connection, stream: S, tls: bool)
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let Connection {
        peer,
        reached,
        worker,
        mut stopped,
        _open,
    } = connection;
    let idle = worker.shared.client_timeouts.idle;
    let stream = SendDeadline::new(stream, worker.shared.client_timeouts.send);
    let last_request = Rc::new(Cell::new(Instant::now()));
    let cancellations = Rc::new(Cancellations::new());
    let client = Client::new(peer, reached, tls);
    let service = {
        let (last_request, cancellations) = (last_request.clone(), cancellations.clone());
        service_fn(move |request| {
            last_request.set(Instant::now());
            let taken = TakenStream {
                cancellations: cancellations.clone(),
                answered: false,
            };
            let request = request.map(RequestBody::H2);
            // Boxed, built in place: hyper runs each stream as a task holding this future,
            // and a task the size of a request's whole state (3.8 KiB) is copied as it is
            // spawned and again as it finishes (perf: 3% of an HTTP/2 request's CPU in
            // memmove); a task holding a box is copied for the price of a pointer.
            let answer = Box::into_pin(Box::write(
                Box::new_uninit(),
                pipeline::handle(request, None, client.clone(), worker.clone(), None),
            ));
            async move {
                let response = answer.await;
                taken.answered();
                Ok::<_, std::convert::Infallible>(response)
            }
        })
    };
    let mut builder = http2::Builder::new(LocalExec);
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_header_list_size(MAX_HEADER_LIST_SIZE);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let outcome = tokio::select! {
        outcome = connection.as_mut() => outcome,
        _ = stopped.changed() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
        _ = idle_past(&last_request, idle) => {
            // GOAWAY: streams still under way (a long download) finish first.
            connection.as_mut().graceful_shutdown();
            connection.await
        }
        _ = cancellations.too_many() => {
            log::warn!(
                "listener: HTTP/2 connection from {peer} closed: it cancelled more than \
                 {MOST_CANCELLED_STREAMS} streams in {CANCELLATION_WINDOW:?}"
            );
            return;
        }
    };
    if let Err(e) = outcome {
        log::debug!("listener: HTTP/2 connection from {peer} ended: {e}");
    }
}

/// Resolves once no request has started for `idle`.
async fn idle_past(last_request: &Cell<Instant>, idle: Duration) {
    loop {
        let until = last_request.get() + idle;
        if until <= Instant::now() {
            return;
        }
        tokio::time::sleep_until(until.into()).await;
    }
}

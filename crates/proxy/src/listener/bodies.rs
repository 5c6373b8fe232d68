//! The two bodies a proxied request streams: the client's to the backend, and the answer to
//! the client. Each counts its bytes for the access log and holds the deadline of each read;
//! the answer also carries the request's end: when it is done (or dropped, when the client
//! leaves) the backend connection goes back to the pool if it was read to the end, and the
//! request is logged and counted.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use switchyard_h1::AnswerFields;
use tokio::io::AsyncReadExt;
use tokio::time::Sleep;

use super::backend_h1::{BackendBody, BackendFailure};
use super::inspection::Held;
use super::read_ahead::ReadAhead;
use super::request_body::{PeerError, RequestBody};
use super::service::Client;
use super::EventLoop;
use crate::access_log::Exchange;
use crate::context::RequestCtx;
use crate::respond::BODY_PIECE;
use crate::stage::cache;
use crate::stage::mirror::MirrorFeed;

/// Why a body stopped short.
#[derive(Debug)]
pub(super) enum BodyError {
    /// The client's side failed (reset, malformed chunk).
    Peer(PeerError),
    /// The backend's answer stopped short or broke.
    Backend(BackendFailure),
    /// No byte came within the read deadline.
    TimedOut(Duration),
    /// A file being sent could not be read.
    File(std::io::Error),
    /// The client's body passed the app's `max_body_bytes`.
    TooLarge(u64),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Peer(e) => write!(f, "{e}"),
            Self::Backend(e) => write!(f, "{e}"),
            Self::TimedOut(after) => write!(f, "no data for {after:?}"),
            Self::File(e) => write!(f, "reading the file: {e}"),
            Self::TooLarge(limit) => write!(f, "the body passed the app's limit of {limit} bytes"),
        }
    }
}

impl std::error::Error for BodyError {}

/// A read deadline re-armed after each piece that arrives, created only when a read waits.
struct ReadDeadline {
    after: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl ReadDeadline {
    fn new(after: Duration) -> Self {
        Self { after, sleep: None }
    }

    /// Called when a read is pending: true once the deadline has passed.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let after = self.after;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(after)));
        sleep.as_mut().poll(cx).is_ready()
    }

    fn data_arrived(&mut self) {
        self.sleep = None;
    }
}

fn poll_with_deadline<B: Body<Data = Bytes> + Unpin>(
    body: &mut B,
    deadline: &mut ReadDeadline,
    cx: &mut Context<'_>,
    failed: fn(B::Error) -> BodyError,
) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
    match Pin::new(body).poll_frame(cx) {
        Poll::Ready(frame) => {
            deadline.data_arrived();
            Poll::Ready(frame.map(|f| f.map_err(failed)))
        }
        Poll::Pending if deadline.expired(cx) => {
            Poll::Ready(Some(Err(BodyError::TimedOut(deadline.after))))
        }
        Poll::Pending => Poll::Pending,
    }
}

fn data_len(frame: &Frame<Bytes>) -> usize {
    frame.data_ref().map_or(0, Bytes::len)
}

/// How the client's body failed on its way to the backend: the request's answer is then
/// the client's doing (408, 400), not the backend's (502).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClientBodyFailure {
    /// Nothing came within the body deadline.
    TimedOut,
    /// The body broke: a malformed chunk, a reset.
    Broken,
    /// The body passed the app's `max_body_bytes`.
    TooLarge,
}

impl ClientBodyFailure {
    pub(super) fn status(self) -> u16 {
        match self {
            Self::TimedOut => 408,
            Self::Broken => 400,
            Self::TooLarge => 413,
        }
    }
}

/// The client's request body on its way to the backend.
pub(super) struct ForwardBody {
    /// Where a failure of the client's side is told.
    failure: Rc<Cell<Option<ClientBodyFailure>>>,
    /// What was read before the request went on (for the WAF), sent first; its trailers,
    /// if the body had any, are sent last.
    held: Option<Bytes>,
    held_trailers: Option<HeaderMap>,
    incoming: Option<RequestBody>,
    deadline: ReadDeadline,
    bytes_in: Rc<Cell<usize>>,
    /// A copy of the body for the app's shadow backend, pushed as it is read; dropped (the
    /// copy then aborts) if the body stops short.
    mirror: Option<MirrorFeed>,
    /// The app's `max_body_bytes`: the body is cut where it passes it.
    limit: Option<u64>,
}

impl ForwardBody {
    /// `incoming`, each read within `read_deadline`, counted into `bytes_in`.
    pub(super) fn new(
        incoming: RequestBody,
        read_deadline: Duration,
        bytes_in: Rc<Cell<usize>>,
    ) -> Self {
        Self {
            failure: Rc::default(),
            held: None,
            held_trailers: None,
            incoming: Some(incoming),
            deadline: ReadDeadline::new(read_deadline),
            bytes_in,
            mirror: None,
            limit: None,
        }
    }

    /// The body fails with [`ClientBodyFailure::TooLarge`] where it passes `limit` bytes
    /// (those read ahead for the WAF included).
    pub(super) fn limited_to(mut self, limit: Option<u64>) -> Self {
        self.limit = limit;
        self
    }

    /// `held` (already read and counted) goes before the rest of the body.
    pub(super) fn after(mut self, held: Option<Held>) -> Self {
        if let Some(held) = held {
            self.held = (!held.data.is_empty()).then_some(held.data);
            self.held_trailers = held.trailers;
        }
        self
    }

    /// A body read whole before, sent again to another backend.
    pub(super) fn replay(held: Held) -> Self {
        Self::empty().after(Some(held))
    }

    /// A failure of the client's side is told in `failure`.
    pub(super) fn failures_into(mut self, failure: Rc<Cell<Option<ClientBodyFailure>>>) -> Self {
        self.failure = failure;
        self
    }

    /// Each piece read is also pushed into `feed`.
    pub(super) fn mirrored_into(mut self, feed: Option<MirrorFeed>) -> Self {
        self.mirror = feed;
        self
    }

    /// The app's limit, once the body counted has passed it.
    fn passed_limit(limit: Option<u64>, bytes_in: &Cell<usize>) -> Option<u64> {
        limit.filter(|l| bytes_in.get() as u64 > *l)
    }

    /// Ends a body past the app's `limit`: the failure told, nothing more sent, read or
    /// mirrored; the error that ends it.
    fn cut(&mut self, limit: u64) -> BodyError {
        self.failure.set(Some(ClientBodyFailure::TooLarge));
        self.held = None;
        self.incoming = None;
        self.mirror = None;
        BodyError::TooLarge(limit)
    }

    /// No body (a retried request never had one).
    pub(super) fn empty() -> Self {
        Self {
            failure: Rc::default(),
            held: None,
            held_trailers: None,
            incoming: None,
            deadline: ReadDeadline::new(Duration::MAX),
            bytes_in: Rc::default(),
            mirror: None,
            limit: None,
        }
    }
}

impl Body for ForwardBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        // What was read ahead for the WAF may already be past the limit.
        if let Some(limit) = Self::passed_limit(this.limit, &this.bytes_in) {
            return Poll::Ready(Some(Err(this.cut(limit))));
        }
        let incoming_ended = this.incoming.as_ref().is_none_or(Body::is_end_stream);
        if let Some(held) = this.held.take() {
            if let Some(feed) = this.mirror.as_mut() {
                let end = incoming_ended && this.held_trailers.is_none();
                if !feed.push(Some(&held), end) {
                    this.mirror = None;
                }
            }
            return Poll::Ready(Some(Ok(Frame::data(held))));
        }
        let Some(incoming) = this.incoming.as_mut().filter(|_| !incoming_ended) else {
            return Poll::Ready(this.held_trailers.take().map(|t| Ok(Frame::trailers(t))));
        };
        let frame = ready!(poll_with_deadline(
            incoming,
            &mut this.deadline,
            cx,
            BodyError::Peer
        ));
        match &frame {
            Some(Ok(frame)) => {
                this.bytes_in.set(this.bytes_in.get() + data_len(frame));
                // Not a byte past the limit goes on.
                if let Some(limit) = Self::passed_limit(this.limit, &this.bytes_in) {
                    return Poll::Ready(Some(Err(this.cut(limit))));
                }
            }
            Some(Err(BodyError::TimedOut(_))) => {
                this.failure.set(Some(ClientBodyFailure::TimedOut))
            }
            Some(Err(_)) => this.failure.set(Some(ClientBodyFailure::Broken)),
            None => {}
        }
        if let Some(feed) = this.mirror.as_mut() {
            // Readers stop once the body says it has ended, so the end is told with the
            // last piece rather than waited for.
            let keep = match &frame {
                Some(Ok(frame)) => feed.push(frame.data_ref(), incoming.is_end_stream()),
                None => feed.push(None, true),
                Some(Err(_)) => false,
            };
            if !keep {
                this.mirror = None;
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none()
            && self.held_trailers.is_none()
            && self.incoming.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let held = self.held.as_ref().map_or(0, |held| held.len() as u64);
        let rest = self
            .incoming
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint);
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + held);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + held);
        }
        hint
    }
}

/// What the log needs of a request, kept until its answer is done (or, for a WebSocket,
/// until the relay ends); recorded when dropped, so a request whose client left midway is
/// logged too.
pub(super) struct RequestEnd {
    pub(super) worker: Rc<EventLoop>,
    pub(super) ctx: RequestCtx,
    pub(super) method: Method,
    pub(super) target: Uri,
    pub(super) version: Version,
    /// The client's connection.
    pub(super) connection: Rc<Client>,
    pub(super) bytes_in: Rc<Cell<usize>>,
    /// The status sent, 0 until one is.
    pub(super) status: u16,
    pub(super) bytes_out: usize,
    /// The backend's answer's fields as read, for an HTTP/1.x client's head, when the
    /// answer was not made into a map (`AnswerForm::AsRead`).
    pub(super) answer_fields: Option<AnswerFields>,
}

impl Drop for RequestEnd {
    fn drop(&mut self) {
        let (ctx, status) = (&self.ctx, self.status);
        ctx.count_answer(status);
        self.worker.shared.access_log.record(
            &Exchange {
                method: &self.method,
                target: &self.target,
                version: self.version,
                bytes_in: self.bytes_in.get(),
                bytes_out: self.bytes_out,
                client: Some(self.connection.ip()),
            },
            ctx,
            status,
        );
        self.ctx.release_attempt();
    }
}

enum Source {
    /// The backend's answer; its connection goes back to the pool once it has been read
    /// to its end.
    Backend {
        body: BackendBody,
        deadline: ReadDeadline,
    },
    /// The backend's answer read ahead of the client; its connection is the reader's.
    ReadAhead(ReadAhead),
    Local(Option<Bytes>),
    /// A static file, sent up to the length its head announced.
    File {
        file: tokio::fs::File,
        remaining: u64,
        buffer: BytesMut,
    },
}

/// The answer on its way to the client.
pub(super) struct AnswerBody {
    source: Source,
    /// Boxed: the body is moved several times per answer (hyper's HTTP/2 server moves it a
    /// dozen times), and the request's state is most of its size.
    end: Option<Box<RequestEnd>>,
}

impl AnswerBody {
    /// The backend's answer's fields as read, when no map was made of them: taken once, by
    /// the HTTP/1.x driver writing the client's head.
    pub(super) fn take_answer_fields(&mut self) -> Option<AnswerFields> {
        self.end.as_mut()?.answer_fields.take()
    }

    /// The request this answers, for the router's own fields on its head.
    pub(super) fn request_ctx(&self) -> Option<&RequestCtx> {
        self.end.as_ref().map(|end| &end.ctx)
    }

    /// The backend's body, read within `read_deadline` per piece, from `connection`.
    pub(super) fn from_backend(
        body: BackendBody,
        read_deadline: Duration,
        end: Box<RequestEnd>,
    ) -> Self {
        Self {
            source: Source::Backend {
                body,
                deadline: ReadDeadline::new(read_deadline),
            },
            end: Some(end),
        }
    }

    /// The backend's answer, read ahead of the client by `read_ahead`.
    pub(super) fn read_ahead(read_ahead: ReadAhead, end: Box<RequestEnd>) -> Self {
        Self {
            source: Source::ReadAhead(read_ahead),
            end: Some(end),
        }
    }

    /// The first `length` bytes of `file`, in pieces of at most `BODY_PIECE`.
    pub(super) fn file(file: tokio::fs::File, length: u64, end: Box<RequestEnd>) -> Self {
        Self {
            source: Source::File {
                file,
                remaining: length,
                buffer: BytesMut::new(),
            },
            end: Some(end),
        }
    }

    /// A body the router wrote itself; `end` is `None` when the request is logged elsewhere
    /// (an upgraded connection is logged when it closes).
    pub(super) fn local(body: Bytes, end: Option<Box<RequestEnd>>) -> Self {
        Self {
            source: Source::Local((!body.is_empty()).then_some(body)),
            end,
        }
    }
}

impl Body for AnswerBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let frame = match &mut this.source {
            Source::Local(body) => body.take().map(|bytes| Ok(Frame::data(bytes))),
            Source::ReadAhead(read_ahead) => {
                let frame = ready!(read_ahead.poll_piece(cx)).map(|piece| piece.map(Frame::data));
                if let Some(end) = this.end.as_mut() {
                    if let Some(Err(e)) = &frame {
                        log::warn!(
                            "request {}: app {}: the backend's answer stopped: {e}",
                            end.ctx.request_id,
                            end.ctx.app_name()
                        );
                    }
                    if end.ctx.cache.is_some() {
                        keep_for_cache(&mut end.ctx, &frame, read_ahead.is_end_stream());
                    }
                }
                frame
            }
            Source::File {
                file,
                remaining,
                buffer,
            } => ready!(poll_file(file, remaining, buffer, cx)),
            Source::Backend { body, deadline } => {
                let frame = ready!(poll_with_deadline(body, deadline, cx, BodyError::Backend));
                match &frame {
                    // Read to the end: the connection can carry the next request.
                    None => {
                        if let (Some(connection), Some(end)) = (body.take_reusable(), &this.end) {
                            end.worker.pool.put(connection);
                        }
                    }
                    Some(Err(e)) => {
                        if let Some(end) = &this.end {
                            log::warn!(
                                "request {}: app {}: the backend's answer stopped: {e}",
                                end.ctx.request_id,
                                end.ctx.app_name()
                            );
                        }
                    }
                    Some(Ok(_)) => {}
                }
                if let Some(end) = this.end.as_mut().filter(|end| end.ctx.cache.is_some()) {
                    keep_for_cache(&mut end.ctx, &frame, body.is_end_stream());
                }
                frame
            }
        };
        if let (Some(Ok(frame)), Some(end)) = (&frame, this.end.as_mut()) {
            end.bytes_out += data_len(frame);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        match &self.source {
            Source::Local(body) => body.is_none(),
            Source::File { remaining, .. } => *remaining == 0,
            Source::Backend { body, .. } => body.is_end_stream(),
            Source::ReadAhead(read_ahead) => read_ahead.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            Source::Local(body) => {
                SizeHint::with_exact(body.as_ref().map_or(0, |b| b.len() as u64))
            }
            Source::File { remaining, .. } => SizeHint::with_exact(*remaining),
            Source::Backend { body, .. } => body.size_hint(),
            Source::ReadAhead(_) => SizeHint::default(),
        }
    }
}

/// A response the cache keeps: each piece is collected, stored at the end.
fn keep_for_cache(
    ctx: &mut RequestCtx,
    frame: &Option<Result<Frame<Bytes>, BodyError>>,
    ended: bool,
) {
    match frame {
        Some(Ok(piece)) => cache::on_response_body(ctx, &piece.data_ref().cloned(), ended),
        None => cache::on_response_body(ctx, &None, true),
        Some(Err(_)) => {}
    }
}

/// The next piece of a file being sent. A file that shrank while being sent ends early
/// (the client sees a short body, as with nginx); one that grew is cut at its announced
/// length.
fn poll_file(
    file: &mut tokio::fs::File,
    remaining: &mut u64,
    buffer: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
    if *remaining == 0 {
        return Poll::Ready(None);
    }
    let piece = usize::try_from(*remaining).map_or(BODY_PIECE, |r| r.min(BODY_PIECE));
    buffer.reserve(piece);
    let mut limited = (&mut *file).take(piece as u64);
    let read = match ready!(tokio_util::io::poll_read_buf(
        Pin::new(&mut limited),
        cx,
        buffer
    )) {
        Ok(read) => read,
        Err(e) => return Poll::Ready(Some(Err(BodyError::File(e)))),
    };
    if read == 0 {
        *remaining = 0;
        return Poll::Ready(None);
    }
    *remaining -= read as u64;
    Poll::Ready(Some(Ok(Frame::data(buffer.split().freeze()))))
}

impl Drop for AnswerBody {
    fn drop(&mut self) {
        // An empty body (204, 304, a HEAD's answer) is never read: its end is known from
        // the head, and so is the connection's answer over.
        if let (Source::Backend { body, .. }, Some(end)) = (&mut self.source, &self.end) {
            if let Some(connection) = body.take_reusable() {
                end.worker.pool.put(connection);
            }
        }
    }
}

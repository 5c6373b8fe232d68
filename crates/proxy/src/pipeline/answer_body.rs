//! The answer on its way to the client: the backend's body (read within its deadline, or
//! read ahead of a slow client), a file, or a body the router made. It carries the
//! request's end: when it is done (or dropped, when the client leaves) the backend
//! connection goes back to the pool if it was read to the end, and the request is logged
//! and counted (`end`).

use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use switchyard_h1::AnswerFields;
use tokio::io::AsyncReadExt;

use super::end::RequestEnd;
use crate::body_read::{data_len, poll_with_deadline, BodyError, ReadDeadline};
use crate::content_coding::Encoder;
use crate::context::RequestCtx;
use crate::respond::BODY_PIECE;
use crate::stage::cache;
use crate::upstream::backend_h1::BackendBody;
use crate::upstream::read_ahead::ReadAhead;

/// What a body's next poll gives: a frame, its end (`None`), or an error.
type NextFrame = Option<Result<Frame<Bytes>, BodyError>>;

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
pub(crate) struct AnswerBody {
    source: Source,
    /// Compresses the backend's body on its way (`stage::compress`).
    encoder: Option<Box<Encoder>>,
    /// Boxed: the body is moved several times per answer (hyper's HTTP/2 server moves it a
    /// dozen times), and the request's state is most of its size.
    end: Option<Box<RequestEnd>>,
}

impl AnswerBody {
    /// The backend's answer's fields as read, when no map was made of them: taken once, by
    /// the HTTP/1.x driver writing the client's head.
    pub(crate) fn take_answer_fields(&mut self) -> Option<AnswerFields> {
        self.end.as_mut()?.answer_fields.take()
    }

    /// The request this answers, for the router's own fields on its head.
    pub(crate) fn request_ctx(&self) -> Option<&RequestCtx> {
        self.end.as_ref().map(|end| &end.ctx)
    }

    /// The backend's body, read within `read_deadline` per piece, from `connection`.
    pub(crate) fn from_backend(
        body: BackendBody,
        read_deadline: Duration,
        end: Box<RequestEnd>,
    ) -> Self {
        Self {
            source: Source::Backend {
                body,
                deadline: ReadDeadline::new(read_deadline),
            },
            encoder: None,
            end: Some(end),
        }
    }

    /// The backend's answer, read ahead of the client by `read_ahead`.
    pub(crate) fn read_ahead(read_ahead: ReadAhead, end: Box<RequestEnd>) -> Self {
        Self {
            source: Source::ReadAhead(read_ahead),
            encoder: None,
            end: Some(end),
        }
    }

    /// The first `length` bytes of `file`, in pieces of at most `BODY_PIECE`.
    pub(crate) fn file(file: tokio::fs::File, length: u64, end: Box<RequestEnd>) -> Self {
        Self {
            source: Source::File {
                file,
                remaining: length,
                buffer: BytesMut::new(),
            },
            encoder: None,
            end: Some(end),
        }
    }

    /// A body the router wrote itself; `end` is `None` when the request is logged elsewhere
    /// (an upgraded connection is logged when it closes).
    pub(crate) fn local(body: Bytes, end: Option<Box<RequestEnd>>) -> Self {
        Self {
            source: Source::Local((!body.is_empty()).then_some(body)),
            encoder: None,
            end,
        }
    }
}

impl AnswerBody {
    /// The same body, compressed on its way by `encoder`.
    pub(crate) fn encoded_by(mut self, encoder: Option<Box<Encoder>>) -> Self {
        self.encoder = encoder;
        self
    }

    /// The source's next frame.
    fn poll_source(&mut self, cx: &mut Context<'_>) -> Poll<NextFrame> {
        let frame = match &mut self.source {
            Source::Local(body) => body.take().map(|bytes| Ok(Frame::data(bytes))),
            Source::ReadAhead(read_ahead) => {
                let frame = ready!(read_ahead.poll_piece(cx)).map(|piece| piece.map(Frame::data));
                if let (Some(Err(e)), Some(end)) = (&frame, self.end.as_ref()) {
                    log::warn!(
                        "request {}: app {}: the backend's answer stopped: {e}",
                        end.ctx.request_id,
                        end.ctx.app_name()
                    );
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
                        if let (Some(connection), Some(end)) = (body.take_reusable(), &self.end) {
                            end.worker.pool.put(connection);
                        }
                    }
                    Some(Err(e)) => {
                        if let Some(end) = &self.end {
                            log::warn!(
                                "request {}: app {}: the backend's answer stopped: {e}",
                                end.ctx.request_id,
                                end.ctx.app_name()
                            );
                        }
                    }
                    Some(Ok(_)) => {}
                }
                frame
            }
        };
        Poll::Ready(frame)
    }

    fn source_ended(&self) -> bool {
        match &self.source {
            Source::Local(body) => body.is_none(),
            Source::File { remaining, .. } => *remaining == 0,
            Source::Backend { body, .. } => body.is_end_stream(),
            Source::ReadAhead(read_ahead) => read_ahead.is_end_stream(),
        }
    }

    /// `frame` of the source through the encoder: `None` when it made no bytes yet (the
    /// caller polls again; data is only fed here, and compressed piece by piece by the
    /// caller), and whether the compressed stream ends with what it returns.
    fn encode(encoder: &mut Encoder, frame: NextFrame) -> Option<(NextFrame, bool)> {
        let encoded = match frame {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    encoder.feed(data);
                    return None;
                }
                // Trailers of a compressed answer: the stream ends first.
                Err(_) => encoder.finish(),
            },
            None if encoder.finished() => return Some((None, true)),
            None => {
                let tail = encoder.finish();
                return Some((
                    Some(tail.map(Frame::data).map_err(BodyError::Encoding)),
                    true,
                ));
            }
            Some(Err(e)) => return Some((Some(Err(e)), false)),
        };
        match encoded {
            Ok(bytes) if bytes.is_empty() => None,
            Ok(bytes) => Some((Some(Ok(Frame::data(bytes))), false)),
            Err(e) => Some((Some(Err(BodyError::Encoding(e))), false)),
        }
    }
}

/// Source bytes compressed at once: between two, the body lets the event loop run others
/// once its poll has run its slice (`cost::poll_slice_spent`). Some 0.2 ms of gzip here.
const ENCODE_PIECE: usize = 8 * 1024;

/// Compressing an answer read ahead, all in memory, a poll would go on for as long as the
/// answer: 3.4 ms for a 256 KiB page, every other request on the loop waiting (the meter's
/// longest polls under bench/engines/fair_share.py). It stops at its slice instead. Woken
/// by itself, the task would run again before the loop polls its sockets; `yield_now`
/// defers the wake until after that poll.
fn yield_to_the_loop<T>(cx: &mut Context<'_>) -> Poll<T> {
    let _ = std::future::Future::poll(std::pin::pin!(tokio::task::yield_now()), cx);
    Poll::Pending
}

impl Body for AnswerBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let (frame, encoded_end) = loop {
            if let Some(encoder) = this.encoder.as_deref_mut() {
                if encoder.has_unencoded() {
                    if crate::traffic::cost::poll_slice_spent() {
                        return yield_to_the_loop(cx);
                    }
                    match encoder.encode_next(ENCODE_PIECE) {
                        Ok(bytes) if bytes.is_empty() => continue,
                        Ok(bytes) => break (Some(Ok(Frame::data(bytes))), Some(false)),
                        Err(e) => break (Some(Err(BodyError::Encoding(e))), Some(false)),
                    }
                }
            }
            let frame = ready!(this.poll_source(cx));
            let Some(encoder) = this.encoder.as_deref_mut() else {
                break (frame, None);
            };
            if let Some((frame, ended)) = Self::encode(encoder, frame) {
                break (frame, Some(ended));
            }
        };
        let from_backend = matches!(this.source, Source::Backend { .. } | Source::ReadAhead(_));
        let keeps = from_backend && this.end.as_ref().is_some_and(|end| end.ctx.cache.is_some());
        // Whether this is the last piece, asked only by the cache (a call the hot path skips).
        let ended = keeps && encoded_end.unwrap_or_else(|| this.source_ended());
        if let Some(end) = this.end.as_mut() {
            if keeps {
                keep_for_cache(&mut end.ctx, &frame, ended);
            }
            if let Some(Ok(frame)) = &frame {
                end.bytes_out += data_len(frame);
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.source_ended() && self.encoder.as_ref().is_none_or(|e| e.finished())
    }

    fn size_hint(&self) -> SizeHint {
        if self.encoder.is_some() {
            return SizeHint::default();
        }
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
        Some(Ok(piece)) => cache::body_phase(ctx, &piece.data_ref().cloned(), ended),
        None => cache::body_phase(ctx, &None, true),
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

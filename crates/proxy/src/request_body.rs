//! A client's request body as the stages read it, whichever protocol brought it: an
//! HTTP/2 stream's (hyper's `Incoming`), an HTTP/3 stream's (h3's), or an HTTP/1.x
//! connection's, read by the request's task straight from the connection's buffer and
//! socket (`client_h1`), with no task or channel between.

use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::buffered_body::{BufferedBody, PieceOrTrailers};

/// An HTTP/3 request stream's receiving half.
pub(crate) type H3Stream = h3::server::RequestStream<h3_quinn::RecvStream, Bytes>;

/// Why a client's body stopped short.
#[derive(Debug)]
pub(crate) enum PeerError {
    /// An HTTP/2 stream failed (reset, flow control, a malformed frame).
    H2(hyper::Error),
    /// The connection failed while the body was read.
    Io(std::io::Error),
    /// The connection closed before the body's end.
    Closed,
    /// A chunked body broke the chunked coding.
    Chunked(switchyard_h1::ChunkedError),
    /// An HTTP/3 stream failed, or its body did not match its Content-Length (RFC 9114
    /// §4.1.2: malformed).
    H3(String),
}

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::H2(e) => write!(f, "{e}"),
            Self::Io(e) => write!(f, "reading the body: {e}"),
            Self::Closed => write!(f, "the client closed before the body's end"),
            Self::Chunked(e) => write!(f, "a malformed chunked body: {e:?}"),
            Self::H3(e) => write!(f, "{e}"),
        }
    }
}

/// The body of an HTTP/1.x request, read from its connection by whoever polls it.
pub(crate) trait ConnectionBody {
    /// The next piece of the body, `None` at its end.
    fn poll_piece(&self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, PeerError>>>;
    /// Whether the body has been read to its end (or had none).
    fn ended(&self) -> bool;
    /// How many bytes are left, when the body has a length.
    fn left(&self) -> Option<u64>;
}

/// A request's body.
pub(crate) enum RequestBody {
    H2(Incoming),
    H1(Rc<dyn ConnectionBody>),
    H3(Box<H3Body>),
    /// Read whole by the router first (`stage::request_buffer`).
    Buffered(Box<BufferedBody>),
}

impl RequestBody {
    /// Whether its bytes were counted as they came from the client already (a body read
    /// whole first): those who read it on do not count them again.
    pub(crate) fn counted_already(&self) -> bool {
        matches!(self, Self::Buffered(_))
    }
}

/// An HTTP/3 request's body, held to the length its Content-Length declares.
///
/// Dropped unread, quinn asks the client to stop sending with code 0, which HTTP/3 takes as
/// H3_NO_ERROR (unknown codes are, RFC 9114 section 8.1). Not `stop_sending` from a Drop:
/// h3-quinn 0.0.10 unwraps a stream its pending read has moved away, so stopping a body
/// while a read is pending panics.
pub(crate) struct H3Body {
    stream: H3Stream,
    /// A piece read when the request was taken, not handed on yet.
    first: Option<Bytes>,
    /// What reading failed with when the request was taken, to hand on at the first poll.
    failed: Option<PeerError>,
    ended: bool,
    declared: Option<u64>,
    received: u64,
}

impl H3Body {
    /// The body of a request whose fields declared `declared` bytes. Looked at once
    /// without waiting: a request whose stream ended with its head has no body, which the
    /// stages must know (a GET may then be retried, a body need not be waited for).
    pub(crate) fn new(stream: H3Stream, declared: Option<u64>) -> Self {
        let mut body = Self {
            stream,
            first: None,
            failed: None,
            ended: false,
            declared,
            received: 0,
        };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match body.poll_piece(&mut cx) {
            Poll::Ready(Some(Ok(piece))) => body.first = Some(piece),
            Poll::Ready(Some(Err(e))) => body.failed = Some(e),
            Poll::Ready(None) | Poll::Pending => {}
        }
        body
    }

    fn counted(&mut self, piece: Bytes) -> Result<Bytes, PeerError> {
        self.received += piece.len() as u64;
        match self.declared {
            Some(declared) if self.received > declared => Err(PeerError::H3(
                "the body is longer than its Content-Length".into(),
            )),
            _ => Ok(piece),
        }
    }

    fn poll_piece(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, PeerError>>> {
        if let Some(failed) = self.failed.take() {
            self.ended = true;
            return Poll::Ready(Some(Err(failed)));
        }
        if let Some(piece) = self.first.take() {
            return Poll::Ready(Some(Ok(piece)));
        }
        if self.ended {
            return Poll::Ready(None);
        }
        match std::task::ready!(self.stream.poll_recv_data(cx)) {
            Ok(Some(mut piece)) => {
                let piece = piece.copy_to_bytes(piece.remaining());
                Poll::Ready(Some(self.counted(piece)))
            }
            Ok(None) => {
                self.ended = true;
                match self.declared {
                    Some(declared) if declared != self.received => Poll::Ready(Some(Err(
                        PeerError::H3("the body is shorter than its Content-Length".into()),
                    ))),
                    _ => Poll::Ready(None),
                }
            }
            Err(e) => {
                self.ended = true;
                Poll::Ready(Some(Err(PeerError::H3(e.to_string()))))
            }
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = PeerError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, PeerError>>> {
        match self.get_mut() {
            Self::H2(incoming) => Pin::new(incoming)
                .poll_frame(cx)
                .map(|frame| frame.map(|f| f.map_err(PeerError::H2))),
            Self::H1(connection) => connection
                .poll_piece(cx)
                .map(|piece| piece.map(|p| p.map(Frame::data))),
            Self::H3(body) => body
                .poll_piece(cx)
                .map(|piece| piece.map(|p| p.map(Frame::data))),
            Self::Buffered(body) => body.poll_piece(cx).map(|piece| {
                piece.map(|p| {
                    p.map(|next| match next {
                        PieceOrTrailers::Piece(data) => Frame::data(data),
                        PieceOrTrailers::Trailers(trailers) => Frame::trailers(trailers),
                    })
                    .map_err(PeerError::Io)
                })
            }),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::H2(incoming) => incoming.is_end_stream(),
            Self::H1(connection) => connection.ended(),
            Self::H3(body) => body.ended && body.first.is_none() && body.failed.is_none(),
            Self::Buffered(body) => body.ended(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::H2(incoming) => incoming.size_hint(),
            Self::H1(connection) => match connection.left() {
                Some(left) => SizeHint::with_exact(left),
                None => SizeHint::default(),
            },
            Self::H3(body) => match body.declared {
                Some(declared) => SizeHint::with_exact(declared.saturating_sub(body.received)),
                None => SizeHint::default(),
            },
            Self::Buffered(body) => SizeHint::with_exact(body.left()),
        }
    }
}

/// The part of a request's body a stage read before it goes on (the WAF's inspection), sent
/// on before the rest.
#[derive(Clone, Default)]
pub(crate) struct Held {
    pub(crate) data: Bytes,
    /// Trailers, when the body was read to its end and had some.
    pub(crate) trailers: Option<HeaderMap>,
}

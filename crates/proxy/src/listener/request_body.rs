//! A client's request body as the stages read it, whichever protocol brought it: an
//! HTTP/2 stream's (hyper's `Incoming`), or an HTTP/1.x connection's, read by the request's
//! task straight from the connection's buffer and socket (`client_h1`), with no task or
//! channel between.

use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

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
}

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::H2(e) => write!(f, "{e}"),
            Self::Io(e) => write!(f, "reading the body: {e}"),
            Self::Closed => write!(f, "the client closed before the body's end"),
            Self::Chunked(e) => write!(f, "a malformed chunked body: {e:?}"),
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
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::H2(incoming) => incoming.is_end_stream(),
            Self::H1(connection) => connection.ended(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::H2(incoming) => incoming.size_hint(),
            Self::H1(connection) => match connection.left() {
                Some(left) => SizeHint::with_exact(left),
                None => SizeHint::default(),
            },
        }
    }
}

//! Reading a body piece by piece within a deadline, re-armed by each piece, and why a body
//! stopped short: shared by the client's body on its way to a backend
//! (`upstream::forward_body`), the answer on its way to the client
//! (`pipeline::answer_body`), and the bodies the app's filters read whole
//! (`stage::filters`, [`read_to_end`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use tokio::time::Sleep;

use crate::request_body::PeerError;
use crate::upstream::failure::BackendFailure;

/// Why a body stopped short.
#[derive(Debug)]
pub(crate) enum BodyError {
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
    /// The answer could not be compressed.
    Encoding(std::io::Error),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Peer(e) => write!(f, "{e}"),
            Self::Backend(e) => write!(f, "{e}"),
            Self::TimedOut(after) => write!(f, "no data for {after:?}"),
            Self::File(e) => write!(f, "reading the file: {e}"),
            Self::TooLarge(limit) => write!(f, "the body passed the app's limit of {limit} bytes"),
            Self::Encoding(e) => write!(f, "compressing the answer: {e}"),
        }
    }
}

impl std::error::Error for BodyError {}

/// A read deadline re-armed after each piece that arrives, created only when a read waits.
pub(crate) struct ReadDeadline {
    pub(crate) after: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl ReadDeadline {
    pub(crate) fn new(after: Duration) -> Self {
        Self { after, sleep: None }
    }

    /// Called when a read is pending: true once the deadline has passed.
    pub(crate) fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let after = self.after;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(after)));
        sleep.as_mut().poll(cx).is_ready()
    }

    pub(crate) fn data_arrived(&mut self) {
        self.sleep = None;
    }
}

pub(crate) fn poll_with_deadline<B: Body<Data = Bytes> + Unpin>(
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

/// Reads what is left of `body` onto `whole`, each piece within the deadline of the last,
/// `whole` never past `limit` bytes (`TooLarge` instead); `piece` is told each piece's
/// length as it comes. The body's trailers, when it has some.
pub(crate) async fn read_to_end<B: Body<Data = Bytes> + Unpin>(
    body: &mut B,
    whole: &mut Vec<u8>,
    limit: u64,
    mut deadline: ReadDeadline,
    failed: fn(B::Error) -> BodyError,
    mut piece: impl FnMut(usize),
) -> Result<Option<http::HeaderMap>, BodyError> {
    let mut trailers = None;
    while !body.is_end_stream() {
        let next = std::future::poll_fn(|cx| poll_with_deadline(body, &mut deadline, cx, failed));
        let Some(frame) = next.await.transpose()? else {
            break;
        };
        match frame.into_data() {
            Ok(data) => {
                piece(data.len());
                if (whole.len() + data.len()) as u64 > limit {
                    return Err(BodyError::TooLarge(limit));
                }
                whole.extend_from_slice(&data);
            }
            Err(frame) => trailers = frame.into_trailers().ok().or(trailers),
        }
    }
    Ok(trailers)
}

pub(crate) fn data_len(frame: &Frame<Bytes>) -> usize {
    frame.data_ref().map_or(0, Bytes::len)
}

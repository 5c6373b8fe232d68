//! The client's request body on its way to the backend: what the WAF held first, the rest
//! as it comes within the body deadline, cut at the app's limit, copied to the mirror; how
//! it failed is told to the request (408, 400, 413 are the client's doing, not a 502).

use std::cell::Cell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use crate::body_feed::BodyFeed;
use crate::body_read::{data_len, poll_with_deadline, BodyError, ReadDeadline};
use crate::request_body::Held;
use crate::request_body::RequestBody;
use crate::respond::{Reason, Refusal};

/// How the client's body failed on its way to the backend: the request's answer is then
/// the client's doing (408, 400), not the backend's (502).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientBodyFailure {
    /// Nothing came within the body deadline.
    TimedOut,
    /// The body broke: a malformed chunk, a reset.
    Broken,
    /// The body passed the app's `max_body_bytes`.
    TooLarge,
}

impl From<ClientBodyFailure> for Reason {
    fn from(failure: ClientBodyFailure) -> Self {
        match failure {
            ClientBodyFailure::TimedOut => Self::ClientBodyTimedOut,
            ClientBodyFailure::Broken => Self::ClientBodyBroken,
            ClientBodyFailure::TooLarge => Self::ClientBodyTooLarge,
        }
    }
}

impl From<ClientBodyFailure> for Refusal {
    fn from(failure: ClientBodyFailure) -> Self {
        Self::new(failure.into())
    }
}

/// The client's request body on its way to the backend.
pub(crate) struct ForwardBody {
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
    mirror: Option<BodyFeed>,
    /// The app's `max_body_bytes`: the body is cut where it passes it.
    limit: Option<u64>,
}

impl ForwardBody {
    /// `incoming`, each read within `read_deadline`, counted into `bytes_in`.
    #[inline]
    pub(crate) fn new(
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
    #[inline]
    pub(crate) fn limited_to(mut self, limit: Option<u64>) -> Self {
        self.limit = limit;
        self
    }

    /// `held` (already read and counted) goes before the rest of the body.
    #[inline]
    pub(crate) fn after(mut self, held: Option<Held>) -> Self {
        if let Some(held) = held {
            self.held = (!held.data.is_empty()).then_some(held.data);
            self.held_trailers = held.trailers;
        }
        self
    }

    /// A body read whole before, sent again to another backend.
    pub(crate) fn replay(held: Held) -> Self {
        Self::empty().after(Some(held))
    }

    /// A failure of the client's side is told in `failure`.
    #[inline]
    pub(crate) fn failures_into(mut self, failure: Rc<Cell<Option<ClientBodyFailure>>>) -> Self {
        self.failure = failure;
        self
    }

    /// Each piece read is also pushed into `feed`.
    #[inline]
    pub(crate) fn mirrored_into(mut self, feed: Option<BodyFeed>) -> Self {
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
    pub(crate) fn empty() -> Self {
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
                if !incoming.counted_already() {
                    this.bytes_in.set(this.bytes_in.get() + data_len(frame));
                }
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

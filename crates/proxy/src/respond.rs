//! Every answer the router makes itself instead of the app's, and every proxy error turned
//! into a status code, in one place: each stage that stops a request says so with a
//! [`Refusal`], and `pipeline::answer` writes it. Bodies are short and carry no internal
//! detail, only the request id.

use std::borrow::Cow;

/// An answer of the router's own instead of the app's: a stage refused the request, or the
/// app could not be reached. The one type every stage stops a request with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) status: u16,
    /// A short text saying why: the body, with the request id.
    pub(crate) text: Cow<'static, str>,
    /// In how many seconds the client is asked to come back (`Retry-After`, the one field
    /// a refusal adds to those every answer of the router carries); set when the worker
    /// pool or a limit asks it to wait, and the connection is then paced.
    pub(crate) retry_after_s: Option<u32>,
}

impl Refusal {
    pub(crate) const fn new(status: u16, text: &'static str) -> Self {
        Self {
            status,
            text: Cow::Borrowed(text),
            retry_after_s: None,
        }
    }

    /// A refusal whose text is made for this request (a limit's numbers, an image's size).
    pub(crate) fn explained(status: u16, text: String) -> Self {
        Self {
            text: Cow::Owned(text),
            ..Self::new(status, "")
        }
    }

    /// `status` with the router's usual text for it.
    pub(crate) fn of_status(status: u16) -> Self {
        Self::new(status, text_for(status))
    }

    /// The app gave no usable answer: 504 when it took too long, 502 otherwise.
    pub(crate) fn upstream_failed(timed_out: bool) -> Self {
        Self::of_status(if timed_out { 504 } else { 502 })
    }

    /// The client is asked to come back in `seconds`.
    pub(crate) const fn come_back_in(mut self, seconds: u32) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }
}

impl From<LocalAnswer> for Refusal {
    fn from(answer: LocalAnswer) -> Self {
        Self {
            retry_after_s: answer.retry_after_s(),
            ..Self::new(answer.status(), answer.text())
        }
    }
}

/// The reasons shared by several stages for a refusal, each with its status and text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LocalAnswer {
    /// No app owns the Host: 404.
    UnknownHost,
    /// The request has no usable Host header: 400.
    MissingHost,
    /// The app exists but has no backends: 503.
    NoBackends,
    /// The app has backends but none is usable: 502.
    NoHealthyBackend,
    /// The route could not be looked up (store unavailable, nothing cached): 503.
    RouteUnavailable,
    /// The request's headers exceed the router's budget: 431.
    HeadersTooLarge,
    /// The request's body framing cannot be forwarded unambiguously: 400.
    AmbiguousFraming,
    /// The app's WAF blocked the request: 403.
    WafBlocked,
    /// The app's WAF could not inspect in time and the app fails closed: 503.
    WafOverloaded,
}

impl LocalAnswer {
    /// The status code of this answer.
    pub(crate) fn status(self) -> u16 {
        match self {
            Self::UnknownHost => 404,
            Self::MissingHost | Self::AmbiguousFraming => 400,
            Self::NoBackends | Self::RouteUnavailable | Self::WafOverloaded => 503,
            Self::WafBlocked => 403,
            Self::NoHealthyBackend => 502,
            Self::HeadersTooLarge => 431,
        }
    }

    /// Seconds the client is asked to wait (`Retry-After`): for the worker pool's
    /// refusals, as the images stage asks.
    pub(crate) fn retry_after_s(self) -> Option<u32> {
        (self == Self::WafOverloaded).then_some(POOL_BUSY_RETRY_AFTER_S)
    }

    pub(crate) fn text(self) -> &'static str {
        match self {
            Self::UnknownHost => "no app is configured for this host",
            Self::MissingHost => "the request has no valid Host header",
            Self::NoBackends => "this app has no running containers",
            Self::NoHealthyBackend => "no container of this app is reachable",
            Self::RouteUnavailable => "routing is temporarily unavailable",
            Self::HeadersTooLarge => "request headers too large",
            Self::AmbiguousFraming => "the request body's framing is ambiguous",
            Self::WafBlocked => "request blocked by the web application firewall",
            Self::WafOverloaded => "request inspection is overloaded, try again shortly",
        }
    }
}

/// Seconds a client is asked to wait after the worker pool refused its request (busy, or
/// its deadline would pass): the WAF's and the images stage's `Retry-After`.
pub(crate) const POOL_BUSY_RETRY_AFTER_S: u32 = 1;

/// Largest piece of a response body written at once: the client send timeout is a deadline
/// for each piece, so a large cached answer is not held to the deadline of a small one.
pub(crate) const BODY_PIECE: usize = 64 * 1024;

/// Text for a status the router sends on a proxy failure.
pub(crate) fn text_for(status: u16) -> &'static str {
    match status {
        400 => "bad request",
        408 => "request timeout",
        502 => "the app did not answer correctly",
        504 => "the app did not answer in time",
        _ => "the request could not be completed",
    }
}

/// The body of an answer the router makes itself: short, with nothing internal but the
/// request id.
pub(crate) fn error_body(status: u16, text: &str, request_id: &str) -> String {
    format!("{status} {text}\nrequest id: {request_id}\n")
}

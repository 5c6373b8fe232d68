//! Every answer the router makes itself, and every proxy error turned into a status code,
//! in one place. Bodies are short and carry no internal detail, only the request id.

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use pingora::{Error, ErrorSource, ErrorType};

use crate::context::RequestCtx;

/// A response the router sends without asking a backend.
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

/// Writes a local answer and records it for the access log.
pub(crate) async fn send(
    session: &mut Session,
    ctx: &mut RequestCtx,
    answer: LocalAnswer,
) -> pingora::Result<()> {
    write_error(session, ctx, answer.status(), answer.text()).await
}

/// Status for a proxy failure: upstream timeouts are 504, other upstream failures 502,
/// malformed downstream requests 400, and a dead downstream gets nothing (0).
pub(crate) fn status_for(error: &Error) -> u16 {
    match error.etype() {
        ErrorType::HTTPStatus(code) => *code,
        ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout
            if error.esource() == &ErrorSource::Upstream =>
        {
            504
        }
        _ => match error.esource() {
            ErrorSource::Upstream => 502,
            ErrorSource::Downstream => match error.etype() {
                // Nothing reaches a client that is gone or does not read.
                ErrorType::WriteError
                | ErrorType::WriteTimedout
                | ErrorType::ReadError
                | ErrorType::ConnectionClosed => 0,
                ErrorType::ReadTimedout => 408,
                _ => 400,
            },
            ErrorSource::Internal | ErrorSource::Unset => 500,
        },
    }
}

/// Largest piece of a response body written at once: the client send timeout is a deadline
/// for each piece, so a large cached answer is not held to the deadline of a small one.
pub(crate) const BODY_PIECE: usize = 64 * 1024;

/// Writes a complete body held in memory, in pieces of at most [`BODY_PIECE`].
pub(crate) async fn write_whole_body(
    session: &mut Session,
    mut body: Bytes,
) -> pingora::Result<()> {
    loop {
        let piece = body.split_to(body.len().min(BODY_PIECE));
        let last = body.is_empty();
        session.write_response_body(Some(piece), last).await?;
        if last {
            return Ok(());
        }
    }
}

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

/// Sends a permanent redirect that keeps the method and body (308).
pub(crate) async fn write_redirect(
    session: &mut Session,
    ctx: &mut RequestCtx,
    location: &str,
) -> pingora::Result<()> {
    const STATUS: u16 = 308;
    ctx.local_status = Some(STATUS);
    let body = Bytes::from(format!("308 moved to {location}\n"));
    let mut header = ResponseHeader::build(STATUS, Some(4))?;
    header.insert_header("location", location)?;
    header.insert_header("content-type", "text/plain; charset=utf-8")?;
    header.insert_header("content-length", body.len().to_string())?;
    header.insert_header("x-request-id", ctx.request_id.as_str())?;
    session
        .write_response_header(Box::new(header), false)
        .await?;
    session.write_response_body(Some(body), true).await?;
    Ok(())
}

/// Sends a small plain-text error with the request id, unless a response already started.
pub(crate) async fn write_error(
    session: &mut Session,
    ctx: &mut RequestCtx,
    status: u16,
    text: &str,
) -> pingora::Result<()> {
    write_error_with(session, ctx, status, text, &[]).await
}

/// [`write_error`] with extra response headers (e.g. `Retry-After`).
pub(crate) async fn write_error_with(
    session: &mut Session,
    ctx: &mut RequestCtx,
    status: u16,
    text: &str,
    extra: &[(&'static str, &str)],
) -> pingora::Result<()> {
    ctx.local_status = Some(status);
    if session.response_written().is_some() {
        return Ok(());
    }
    let body = Bytes::from(error_body(status, text, &ctx.request_id));
    let mut header = ResponseHeader::build(status, Some(4))?;
    header.insert_header("content-type", "text/plain; charset=utf-8")?;
    header.insert_header("content-length", body.len().to_string())?;
    header.insert_header("x-request-id", ctx.request_id.as_str())?;
    header.insert_header("cache-control", "no-store")?;
    for (name, value) in extra {
        header.insert_header(*name, *value)?;
    }
    session
        .write_response_header(Box::new(header), false)
        .await?;
    session.write_response_body(Some(body), true).await?;
    Ok(())
}

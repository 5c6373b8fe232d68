//! Stage last-but-one, upstream: pick a backend, tell it who is asking, and decide what a
//! failure means — mark the backend down, retry elsewhere, or give up.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pingora::http::RequestHeader;
use pingora::protocols::Digest;
use pingora::proxy::Session;
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorType};

use std::sync::Arc;

use crate::balancer::Pick;
use crate::context::RequestCtx;
use crate::metrics;
use crate::respond::LocalAnswer;
use crate::upstream_connections::{ConnectionTable, Socket};
use crate::websocket_close::{self, FrameBoundary};

/// How long an idle keep-alive connection to a backend is kept in the pool. Shorter than
/// the usual app-server idle timeouts (60 s and up) so the backend rarely closes first.
const UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Picks the backend for the next attempt and describes how to reach it.
pub(crate) fn choose_peer(
    session: &Session,
    ctx: &mut RequestCtx,
) -> Result<Box<HttpPeer>, LocalAnswer> {
    choose_peer_for(ctx, session.is_upgrade_req())
}

/// [`choose_peer`] for a request that is an upgrade (`upgrade`) or not, whatever engine
/// serves it.
pub(crate) fn choose_peer_for(
    ctx: &mut RequestCtx,
    upgrade: bool,
) -> Result<Box<HttpPeer>, LocalAnswer> {
    ctx.release_attempt();
    let Some(route) = ctx.route.clone() else {
        return Err(LocalAnswer::UnknownHost);
    };
    let guard = match route.upstream.pick(&ctx.tried) {
        Pick::Backend(guard) => guard,
        Pick::NoBackends => return Err(LocalAnswer::NoBackends),
        Pick::NoneHealthy => return Err(LocalAnswer::NoHealthyBackend),
    };
    let address = guard.backend().address;
    ctx.tried.push(address);
    ctx.backend = Some(guard);
    ctx.attempt_started = Some(Instant::now());

    let timeouts = &route.app.timeouts;
    let mut peer = HttpPeer::new(address, false, String::new());
    peer.options.connection_timeout = Some(Duration::from_millis(timeouts.connect_ms));
    peer.options.write_timeout = Some(Duration::from_millis(timeouts.write_ms));
    // An upgraded connection (WebSocket) may legitimately stay silent for hours; its own
    // pings keep it alive, so only ordinary requests get a read deadline.
    peer.options.read_timeout = if upgrade {
        None
    } else {
        Some(Duration::from_millis(timeouts.read_ms))
    };
    peer.options.idle_timeout = Some(UPSTREAM_IDLE_TIMEOUT);
    Ok(Box::new(peer))
}

/// Sets `X-Forwarded-For` (appended), `X-Forwarded-Proto` and `X-Request-Id` for the backend.
pub(crate) fn set_forwarded_headers(
    session: &Session,
    request: &mut RequestHeader,
    ctx: &RequestCtx,
) -> pingora::Result<()> {
    let client_ip = session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip());
    set_forwarded_headers_for(client_ip, request, ctx)
}

/// `X-Forwarded-For` (with `client_ip` appended), `X-Forwarded-Proto` and `X-Request-Id`.
pub(crate) fn set_forwarded_headers_for(
    client_ip: Option<IpAddr>,
    request: &mut RequestHeader,
    ctx: &RequestCtx,
) -> pingora::Result<()> {
    if let Some(client_ip) = client_ip {
        let forwarded_for = forwarded_for(request.headers.get("x-forwarded-for"), client_ip);
        request.insert_header("x-forwarded-for", forwarded_for)?;
    }
    request.insert_header("x-forwarded-proto", if ctx.tls { "https" } else { "http" })?;
    request.insert_header("x-request-id", ctx.request_id.as_str())?;
    Ok(())
}

/// `X-Forwarded-For` with `client` appended to what the request carried.
pub(crate) fn forwarded_for(previous: Option<&http::HeaderValue>, client: IpAddr) -> String {
    match previous.and_then(|v| v.to_str().ok()) {
        Some(previous) if !previous.trim().is_empty() => format!("{previous}, {client}"),
        _ => client.to_string(),
    }
}

/// Enters the upstream socket in the connection table, so that a drain can find it (see
/// `drain`). The local address comes from Pingora's per-connection digest, which caches it,
/// so a pooled connection costs no syscall per request.
pub(crate) fn on_connected(
    ctx: &mut RequestCtx,
    connections: &Arc<ConnectionTable>,
    fd: std::os::fd::RawFd,
    digest: Option<&Digest>,
) {
    let local = digest
        .and_then(|d| d.socket_digest.as_ref())
        .and_then(|s| s.local_addr())
        .and_then(|a| a.as_inet().copied());
    if let Some(local) = local {
        register_connection(ctx, connections, Socket { fd, local });
    }
}

/// Enters `socket`, the current attempt's connection to its backend, in the connection
/// table under the request's app and Host, whatever engine made it.
pub(crate) fn register_connection(
    ctx: &mut RequestCtx,
    connections: &Arc<ConnectionTable>,
    socket: Socket,
) {
    let (Some(backend), Some(route), Some(host)) = (
        ctx.backend.as_ref(),
        ctx.route.as_ref(),
        ctx.host.as_deref(),
    ) else {
        return;
    };
    let ticket = connections.register(route.clone(), host, backend.backend().address, socket);
    ctx.upstream_connection = Some(ticket);
}

/// A connection to the backend could not be made. Nothing reached it, so any request may
/// be retried on another backend, whatever its method.
pub(crate) fn on_connect_failure(ctx: &mut RequestCtx, mut error: Box<Error>) -> Box<Error> {
    let retry = record_connect_failure(ctx, kind_of(&error), error.etype().as_str());
    error.set_retry(retry);
    error
}

/// Marks the backend of the current attempt down for a while after a failed connect
/// (`kind` as in the errors metric, `detail` for the log) and tells whether another attempt
/// is allowed.
pub(crate) fn record_connect_failure(
    ctx: &mut RequestCtx,
    kind: &'static str,
    detail: &str,
) -> bool {
    let app = ctx.app_name().to_string();
    if let Some(backend) = ctx.backend.as_ref() {
        backend.backend().mark_passively_down();
        log::warn!(
            "request {}: app {app}: backend {} unreachable ({detail}); skipping it for {:?}",
            ctx.request_id,
            backend.backend().address,
            crate::balancer::PASSIVE_DOWN_FOR
        );
    }
    metrics::UPSTREAM_ERRORS
        .with_label_values(&[app.as_str(), kind])
        .inc();
    let retry = attempts_left(ctx);
    if retry {
        metrics::UPSTREAM_RETRIES.inc();
    }
    retry
}

/// The backend failed after the connection was made. Retrying is safe only for idempotent
/// requests whose body pingora still holds and before any response reached the client; a
/// timeout is not retried, since the backend may still be working and waiting twice as long
/// helps nobody.
pub(crate) fn on_proxy_error(
    session: &Session,
    ctx: &mut RequestCtx,
    mut error: Box<Error>,
) -> Box<Error> {
    if error.esource() == &pingora::ErrorSource::Downstream {
        // The client left (or reset its stream): not the backend's failure, and no one is
        // waiting for a retry, which would only send the request to another backend.
        error.set_retry(false);
        return error;
    }
    let app = ctx.app_name().to_string();
    metrics::UPSTREAM_ERRORS
        .with_label_values(&[app.as_str(), kind_of(&error)])
        .inc();
    let retry = session.req_header().method.is_idempotent()
        && !session.as_ref().retry_buffer_truncated()
        && session.response_written().is_none()
        && !is_timeout(&error)
        && !ctx.upgraded
        && attempts_left(ctx);
    error.set_retry(retry);
    if retry {
        metrics::UPSTREAM_RETRIES.inc();
    }
    error
}

/// Records the time to the response header and whether the connection was upgraded.
pub(crate) fn on_response_header(ctx: &mut RequestCtx, status: u16) {
    if ctx.upstream_time.is_none() {
        ctx.upstream_time = ctx.attempt_started.map(|s| s.elapsed());
    }
    if status == 101 && !ctx.upgraded {
        ctx.upgraded = true;
        ctx.websocket_frames = Some(FrameBoundary::default());
        metrics::OPEN_WEBSOCKETS.inc();
    }
}

/// Follows the backend's WebSocket frames, and when the router closed the connection (see
/// `drain`), ends the client's side with a close frame 1001 where a frame may go in.
pub(crate) fn on_upgraded_body(
    ctx: &mut RequestCtx,
    body: &mut Option<Bytes>,
    end_of_stream: bool,
) {
    let Some(frames) = ctx.websocket_frames.as_mut() else {
        return;
    };
    if let Some(bytes) = body.as_ref() {
        frames.advance(bytes);
    }
    let closed_by_router = ctx
        .upstream_connection
        .as_ref()
        .is_some_and(|c| c.connection().closed_for().is_some());
    if end_of_stream && closed_by_router && frames.at_boundary() {
        let close = websocket_close::going_away_frame();
        *body = Some(match body.take() {
            Some(last) if !last.is_empty() => [last, close].concat().into(),
            _ => close,
        });
        ctx.websocket_frames = None;
    }
}

pub(crate) fn attempts_left(ctx: &RequestCtx) -> bool {
    let allowed = ctx.route.as_ref().map_or(0, |r| usize::from(r.app.retries));
    ctx.tried.len() <= allowed
}

fn is_timeout(error: &Error) -> bool {
    matches!(
        error.etype(),
        ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout
    )
}

fn kind_of(error: &Error) -> &'static str {
    match error.etype() {
        ErrorType::ConnectTimedout => "connect_timeout",
        ErrorType::ConnectRefused => "connect_refused",
        ErrorType::ConnectError | ErrorType::ConnectNoRoute => "connect_error",
        ErrorType::ReadTimedout | ErrorType::WriteTimedout => "timeout",
        ErrorType::ConnectionClosed => "closed",
        ErrorType::ReadError | ErrorType::WriteError => "io",
        ErrorType::InvalidHTTPHeader | ErrorType::H1Error | ErrorType::H2Error => "protocol",
        _ => "other",
    }
}

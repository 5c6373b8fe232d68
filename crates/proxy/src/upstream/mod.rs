//! The upstream: everything that talks to an app's backends, for the proxied request and
//! for the images stage's originals alike. A backend is chosen (`attempt`, on the
//! balancer and the health of `routing`), connected to or taken idle from this thread's
//! pool (`pool`), entered in the connection table so a drain can find it, spoken to in
//! HTTP/1.1 (`backend_h1`) after the PROXY protocol header of an app that asks for one
//! (`proxy_protocol`), retried where the request allows, marked down when it cannot
//! be reached, and its failures mapped to one status each (`failure`: 504 when too late,
//! 502 otherwise; a failure of the client's body is the client's: 408, 400, 413). The
//! answer is read ahead of a slow client within `response_buffers` (`read_ahead`). The
//! router's own requests (mirror copies, image originals) have their own connections
//! (`outbound`), so a slow shadow never holds a connection a client's request needs; the
//! image originals still choose, register, retry and map their failures through
//! `attempt`.

pub(crate) mod attempt;
pub(crate) mod backend_h1;
pub(crate) mod failure;
pub(crate) mod forward_body;
pub(crate) mod outbound;
pub(crate) mod outgoing;
pub(crate) mod pool;
pub(crate) mod read_ahead;
pub(crate) mod response_buffers;

use std::time::Duration;

use http::{Method, Response};

use crate::context::RequestCtx;
use crate::event_loop::EventLoop;
use crate::metrics;
use crate::proxy_protocol::Destination;
use crate::respond::Refusal;
use backend_h1::BackendBody;
use failure::ConnectFailure;
use forward_body::ForwardBody;
pub(crate) use outgoing::{AnswerForm, Outgoing, RequestEdits};

/// How long a backend of the route's app may take to answer, and between pieces of its
/// answer.
pub(crate) fn read_deadline(ctx: &RequestCtx) -> Duration {
    let read_ms = ctx.route.as_ref().map_or(0, |r| r.app.timeouts.read_ms);
    Duration::from_millis(read_ms)
}

/// Sends `outgoing` to a backend of the route's app, retried within the app's `retries`
/// while it may be: the backend's answer head, or the refusal that stands for it. `body` is
/// taken by the first attempt; a retry sends the body in hand again.
pub(crate) async fn forward(
    worker: &EventLoop,
    ctx: &mut RequestCtx,
    outgoing: &Outgoing<'_>,
    body: &mut Option<ForwardBody>,
) -> Result<Response<BackendBody>, Refusal> {
    let &Outgoing {
        head,
        announced,
        repeatable,
        replay,
        client_failure,
        ..
    } = outgoing;
    let Some(connect_ms) = ctx.route.as_ref().map(|r| r.app.timeouts.connect_ms) else {
        return Err(Refusal::upstream_failed(false));
    };
    let connect_timeout = Duration::from_millis(connect_ms);
    let answer_within = read_deadline(ctx);
    loop {
        let address = attempt::begin_attempt(ctx)?;
        let destination = Destination {
            backend: address,
            announced,
        };
        let connection = match worker.pool.get(destination, connect_timeout).await {
            Ok(connection) => connection,
            Err(failure) => {
                if attempt::record_connect_failure(ctx, failure.kind(), &failure.detail()) {
                    continue;
                }
                let timed_out = matches!(failure, ConnectFailure::TimedOut);
                return Err(Refusal::upstream_failed(timed_out));
            }
        };
        attempt::register_connection(ctx, &worker.shared.connections, connection.shutdown.clone());
        let may_retry = repeatable && attempt::attempts_left(ctx);
        let again =
            || replay.map_or_else(ForwardBody::empty, |held| ForwardBody::replay(held.clone()));
        let sent = body.take().unwrap_or_else(again);
        let answers_head = head.method == Method::HEAD;
        let bound = worker.clock.deadline_in(answer_within);
        let exchange = std::pin::pin!(connection.exchange(outgoing, sent, answers_head));
        let error = match bound.bound(exchange).await {
            Ok(Ok(response)) => {
                attempt::on_response_header(ctx, response.status().as_u16());
                return Ok(response);
            }
            Ok(Err(e)) => {
                if let Some(failure) = client_failure.get() {
                    // The client's body stopped, not the backend: no retry, no 502.
                    log::debug!(
                        "request {}: the client's body failed ({failure:?}): {e}",
                        ctx.request_id
                    );
                    return Err(failure.into());
                }
                e
            }
            Err(_) => {
                count_upstream_error(ctx, "timeout");
                log::warn!(
                    "request {}: app {}: backend {address} sent no answer within {answer_within:?}",
                    ctx.request_id,
                    ctx.app_name()
                );
                return Err(Refusal::upstream_failed(true));
            }
        };
        count_upstream_error(ctx, error.kind());
        if may_retry {
            metrics::UPSTREAM_RETRIES.inc();
            continue;
        }
        log::warn!(
            "request {}: app {}: backend {address} failed: {error}",
            ctx.request_id,
            ctx.app_name()
        );
        return Err(Refusal::upstream_failed(false));
    }
}

fn count_upstream_error(ctx: &RequestCtx, kind: &'static str) {
    metrics::UPSTREAM_ERRORS
        .with_label_values(&[ctx.app_name(), kind])
        .inc();
}

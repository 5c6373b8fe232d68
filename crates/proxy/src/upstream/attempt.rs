//! Attempts at a backend, for the upstream step of a request (`crate::pipeline`) and
//! for the originals the images stage fetches: pick a backend the request has not tried,
//! enter its connection in the connection table, and decide what a failure means — mark
//! the backend down, retry elsewhere within the app's `retries`, or give up.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::context::RequestCtx;
use crate::metrics;
use crate::respond::Reason;
use crate::routing::balancer::Pick;
use crate::routing::connections::{ConnectionTable, ShutdownRequest};
use crate::upstream::outbound::{ConnectError, SideConnection, SidePool, Target};

/// Starts the next attempt: picks a backend the request has not tried, counts it in
/// flight and returns its address; or says why none can be used.
pub(crate) fn begin_attempt(ctx: &mut RequestCtx) -> Result<SocketAddr, Reason> {
    ctx.release_attempt();
    let Some(route) = ctx.route.clone() else {
        return Err(Reason::UnknownHost);
    };
    let picked = match ctx.sticky.as_deref().and_then(|sticky| sticky.backend()) {
        Some(sticky) => route.upstream.pick_preferring(sticky, &ctx.tried),
        None => route.upstream.pick(&ctx.tried),
    };
    let guard = match picked {
        Pick::Backend(guard) => guard,
        Pick::NoBackends => return Err(Reason::NoBackends),
        Pick::NoneHealthy => return Err(Reason::NoHealthyBackend),
    };
    let address = guard.backend().address;
    ctx.tried.push(address);
    ctx.backend = Some(guard);
    ctx.attempt_started = Some(Instant::now());
    Ok(address)
}

/// Why a request the router makes itself found no connection to the app.
#[derive(Debug)]
pub(crate) enum SideConnectFailure {
    /// No backend could be tried (none, none healthy, or every one tried).
    NoBackend(Reason),
    /// The last backend tried could not be reached, and no retry was left.
    Connect(ConnectError),
}

/// A connection from `pool` to one of the request's app's backends (in cleartext), for a
/// request the router makes itself (an image's original, a background revalidation): as
/// the client's own requests go, a backend that cannot be reached within `timeout` is
/// marked down and another tried within the app's retries.
pub(crate) async fn connect_side(
    ctx: &mut RequestCtx,
    pool: &SidePool,
    timeout: Duration,
) -> Result<SideConnection, SideConnectFailure> {
    let proxy_protocol = ctx
        .route
        .as_ref()
        .and_then(|route| route.app.forwarding.proxy_protocol);
    loop {
        let address = begin_attempt(ctx).map_err(SideConnectFailure::NoBackend)?;
        let target = Target {
            address,
            tls: None,
            proxy_protocol,
        };
        match pool.get(&target, timeout).await {
            Ok(connection) => return Ok(connection),
            Err(e) => {
                let kind = match e {
                    ConnectError::TimedOut => "connect_timeout",
                    ConnectError::Failed(_) => "connect_error",
                };
                if !record_connect_failure(ctx, kind, &e.to_string()) {
                    return Err(SideConnectFailure::Connect(e));
                }
            }
        }
    }
}

/// Enters the current attempt's connection to its backend, whose owner watches `shutdown`,
/// in the connection table under the request's app and Host, where a drain can find it
/// (see `drain`).
pub(crate) fn register_connection(
    ctx: &mut RequestCtx,
    connections: &Arc<ConnectionTable>,
    shutdown: Arc<ShutdownRequest>,
) {
    let (Some(backend), Some(route), Some(host)) = (
        ctx.backend.as_ref(),
        ctx.route.as_ref(),
        ctx.host.as_deref(),
    ) else {
        return;
    };
    let ticket = connections.register(route.clone(), host, backend.backend().address, shutdown);
    ctx.upstream_connection = Some(ticket);
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
            crate::routing::balancer::PASSIVE_DOWN_FOR
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

/// Records the time to the response header and whether the connection was upgraded.
pub(crate) fn on_response_header(ctx: &mut RequestCtx, status: u16) {
    if ctx.upstream_time.is_none() {
        ctx.upstream_time = ctx.attempt_started.map(|s| s.elapsed());
    }
    if status == 101 && !ctx.upgraded {
        ctx.upgraded = true;
        // A WebSocket may stay open for hours: it no longer holds a turn of the fair share.
        ctx.fair_turn = None;
        metrics::OPEN_WEBSOCKETS.inc();
        if let Some(app) = &ctx.charged {
            app.cost
                .websockets
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Whether the app's retries allow another attempt after the ones made.
pub(crate) fn attempts_left(ctx: &RequestCtx) -> bool {
    let allowed = ctx.route.as_ref().map_or(0, |r| usize::from(r.app.retries));
    ctx.tried.len() <= allowed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::route_cache::route_of;

    #[test]
    fn another_attempt_is_allowed_while_the_apps_retries_last() {
        for (retries, tried, allowed) in [
            (0, 0, true),
            (0, 1, false),
            (1, 1, true),
            (1, 2, false),
            (2, 2, true),
            (2, 3, false),
        ] {
            let spec = serde_json::json!({
                "domains": ["a.test"], "backends": ["127.0.0.1:9"], "retries": retries,
            });
            let app = switchyard_model::parse_app_spec("a", &spec).expect("a valid spec");
            let mut ctx = RequestCtx::new();
            ctx.route = Some(route_of(app));
            ctx.tried = (0..tried)
                .map(|i| SocketAddr::from(([127, 0, 0, 1], 9000 + i)))
                .collect();
            assert_eq!(
                attempts_left(&ctx),
                allowed,
                "retries {retries}, tried {tried}"
            );
        }
    }
}

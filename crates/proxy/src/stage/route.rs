//! Stage 1, route: Host → app. The authority of an absolute-form URI (and HTTP/2's
//! `:authority`) wins over the Host header, as RFC 9112 requires.

use http::{HeaderMap, Uri};
use switchyard_model::normalize_host;

use crate::context::RequestCtx;
use crate::respond::LocalAnswer;
use crate::routing::route_cache::RouteCache;

/// Request line and headers larger than this are refused with 431 before routing. hyper
/// accepts larger heads (up to its read buffer); backends (nginx: 8 KiB lines, 32 KiB in all) would refuse them
/// anyway, and a router should not carry them.
pub(crate) const MAX_REQUEST_HEAD_BYTES: usize = 32 * 1024;

/// Resolves the request's app into `ctx.route`, or says which answer to send instead.
pub(crate) async fn route(
    target: &Uri,
    headers: &HeaderMap,
    ctx: &mut RequestCtx,
    routes: &RouteCache,
) -> Result<(), LocalAnswer> {
    let target_bytes = target.path_and_query().map_or(1, |p| p.as_str().len())
        + target.authority().map_or(0, |a| a.as_str().len());
    let head_bytes: usize = target_bytes
        + headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum::<usize>();
    if head_bytes > MAX_REQUEST_HEAD_BYTES {
        return Err(LocalAnswer::HeadersTooLarge);
    }
    // Two Host lines could route differently here and at the backend: refused, as RFC 9112
    // §3.2 requires (whatever the authority says).
    if headers.get_all(http::header::HOST).iter().nth(1).is_some() {
        return Err(LocalAnswer::MissingHost);
    }
    // An authority and a Host naming different hosts would be routed here by one and at the
    // backend (or a cache between) by the other: refused (RFC 9113 §8.3.1 for HTTP/2).
    if let (Some(authority), Some(host)) = (target.authority(), headers.get(http::header::HOST)) {
        let host = host.to_str().ok().and_then(normalize_host);
        if host.is_none() || host != normalize_host(authority.as_str()) {
            return Err(LocalAnswer::MissingHost);
        }
    }
    let raw_host = match target.authority() {
        Some(authority) => Some(authority.as_str()),
        None => headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok()),
    };
    let Some(raw_host) = raw_host else {
        return Err(LocalAnswer::MissingHost);
    };
    // Userinfo in an authority (`user@host`) never names a host we serve.
    let Some(host) = normalize_host(raw_host) else {
        return Err(LocalAnswer::UnknownHost);
    };
    let resolved = routes.resolve(&host).await;
    ctx.host = Some(host);
    match resolved {
        Ok(Some(route)) => {
            ctx.route = Some(route);
            Ok(())
        }
        Ok(None) => Err(LocalAnswer::UnknownHost),
        Err(e) => {
            log::error!(
                "request {}: cannot route host {:?}: {e}",
                ctx.request_id,
                ctx.host.as_deref().unwrap_or("")
            );
            Err(LocalAnswer::RouteUnavailable)
        }
    }
}

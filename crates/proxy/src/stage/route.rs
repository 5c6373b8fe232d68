//! Stage route: Host → app. The authority of an absolute-form URI (and HTTP/2's
//! `:authority`) wins over the Host header, as RFC 9112 requires.

use http::Uri;
use switchyard_model::normalize_host;

use crate::context::RequestCtx;
use crate::request_fields::{Fields, Known};
use crate::respond::Reason;
use crate::routing::route_cache::RouteCache;

/// Request line and headers larger than this are refused with 431 before routing. hyper
/// accepts larger heads (up to its read buffer); backends (nginx: 8 KiB lines, 32 KiB in all) would refuse them
/// anyway, and a router should not carry them.
pub(crate) const MAX_REQUEST_HEAD_BYTES: usize = 32 * 1024;

/// Resolves the request's app into `ctx.route`, or says which answer to send instead.
pub(crate) async fn route(
    target: &Uri,
    fields: Fields<'_>,
    ctx: &mut RequestCtx,
    routes: &RouteCache,
) -> Result<(), Reason> {
    let target_bytes = target.path_and_query().map_or(1, |p| p.as_str().len())
        + target.authority().map_or(0, |a| a.as_str().len());
    let head_bytes = target_bytes + fields.head_bytes();
    if head_bytes > MAX_REQUEST_HEAD_BYTES {
        return Err(Reason::HeadersTooLarge);
    }
    // Two Host lines could route differently here and at the backend: refused, as RFC 9112
    // §3.2 requires (whatever the authority says).
    if fields.hosts() > 1 {
        return Err(Reason::MissingHost);
    }
    // An authority and a Host naming different hosts would be routed here by one and at the
    // backend (or a cache between) by the other: refused (RFC 9113 §8.3.1 for HTTP/2).
    let host_field = fields.get(Known::Host);
    if let (Some(authority), Some(host)) = (target.authority(), host_field) {
        let host = std::str::from_utf8(host).ok().and_then(normalize_host);
        if host.is_none() || host != normalize_host(authority.as_str()) {
            return Err(Reason::MissingHost);
        }
    }
    let raw_host = match target.authority() {
        Some(authority) => Some(authority.as_str()),
        None => host_field.and_then(|h| std::str::from_utf8(h).ok()),
    };
    let Some(raw_host) = raw_host else {
        return Err(Reason::MissingHost);
    };
    // Userinfo in an authority (`user@host`) never names a host we serve.
    let Some(host) = normalize_host(raw_host) else {
        return Err(Reason::UnknownHost);
    };
    let resolved = routes.resolve(&host).await;
    ctx.host = Some(host);
    match resolved {
        Ok(Some(route)) => {
            ctx.charge_to(&route.requests);
            ctx.route = Some(route);
            Ok(())
        }
        Ok(None) => Err(Reason::UnknownHost),
        Err(e) => {
            log::error!(
                "request {}: cannot route host {:?}: {e}",
                ctx.request_id,
                ctx.host.as_deref().unwrap_or("")
            );
            Err(Reason::RouteUnavailable)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use http::HeaderValue;

    use crate::request_fields;

    use crate::routing::route_cache::RouteCacheLimits;

    /// A route cache over an empty store: what is refused here is refused before any lookup.
    fn empty_routes() -> (RouteCache, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = switchyard_store::EmbeddedStore::open(dir.path()).expect("store");
        let limits = RouteCacheLimits {
            apps: 10,
            domains: 10,
            response_bytes: 0,
        };
        (RouteCache::new(Arc::new(store), limits), dir)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn heads_that_could_route_two_ways_or_are_too_large_are_refused() {
        let (routes, _dir) = empty_routes();
        let big = "x".repeat(MAX_REQUEST_HEAD_BYTES);
        for (target, headers, expected) in [
            ("/", vec![("host", "a.test")], Err(Reason::UnknownHost)),
            ("/", vec![], Err(Reason::MissingHost)),
            (
                "/",
                vec![("host", "a.test"), ("host", "b.test")],
                Err(Reason::MissingHost),
            ),
            (
                "http://a.test/",
                vec![("host", "b.test")],
                Err(Reason::MissingHost),
            ),
            (
                "http://a.test/",
                vec![("host", "A.TEST.")],
                Err(Reason::UnknownHost),
            ),
            ("/", vec![("host", "user@a.test")], Err(Reason::UnknownHost)),
            (
                "/",
                vec![("host", "a.test"), ("x-big", big.as_str())],
                Err(Reason::HeadersTooLarge),
            ),
        ] {
            let mut map = http::HeaderMap::new();
            for (name, value) in &headers {
                map.append(*name, HeaderValue::from_str(value).expect("value"));
            }
            let as_read = request_fields::from_pairs(&headers);
            let uri: Uri = target.parse().expect("target");
            // The same answer whether the fields are a map (HTTP/2) or as read (HTTP/1.x).
            for fields in [Fields::Map(&map), Fields::AsRead(&as_read)] {
                let mut ctx = RequestCtx::new();
                assert_eq!(
                    route(&uri, fields, &mut ctx, &routes).await,
                    expected,
                    "{target} {:?}",
                    headers
                        .iter()
                        .map(|(n, v)| (n, v.len()))
                        .collect::<Vec<_>>()
                );
            }
        }
    }
}

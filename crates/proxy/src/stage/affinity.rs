//! Stage affinity, sticky sessions: an app's first answer to a client sets a cookie naming
//! the backend that served it, and the client's later requests — HTTP/1, HTTP/2 and
//! WebSocket upgrades alike — go to that backend while it is in the app and usable. A
//! backend removed, retired (drained) or down loses its clients to the balancer, which
//! gives them a new cookie; adding backends moves nobody.
//!
//! The cookie holds a token, never an address: the first 16 bytes of an HMAC-SHA256, under
//! the fleet's key (kept in the store, so every router of a fleet reads another's
//! cookies), of the app's name and the backend's address (`routing::affinity_tokens`). A
//! client cannot make a token for a backend it was not given, nor learn an address from
//! one. Each route keeps its backends' tokens, made the first time one of its requests
//! needs them.

use std::net::SocketAddr;

use http::HeaderValue;

use crate::context::RequestCtx;
use crate::cookies::cookie_values;
use crate::metrics;
use crate::request_fields::Fields;
use crate::routing::affinity_tokens::{self, Sticky, Tokens};
use crate::routing::route_cache::AppRoute;

/// The route's tokens, made the first time they are needed; `None` before the key came.
fn tokens_of(route: &AppRoute) -> Option<&Tokens> {
    let key = affinity_tokens::key()?;
    let tokens = route.affinity.as_deref()?;
    let affinity = route.app.affinity.as_ref()?;
    let backends = route.upstream.backends().iter().map(|b| b.address);
    let cookie = |token: &str, tls: bool| {
        let mut cookie = format!(
            "{}={token}; Path=/; HttpOnly; SameSite=Lax",
            affinity.cookie
        );
        if tls {
            cookie.push_str("; Secure");
        }
        if let Some(ttl) = affinity.ttl_s {
            cookie.push_str(&format!("; Max-Age={ttl}"));
        }
        HeaderValue::try_from(cookie).ok()
    };
    Some(tokens.get_or_init(|| Tokens::of(route.app.name.as_str(), backends, key, cookie)))
}

/// Notes, for a request to an app with affinity, what its cookie says: the backend it names
/// (when it is one of the app's) is tried first by the upstream step.
pub(crate) fn note_cookie(ctx: &mut RequestCtx, fields: Fields<'_>) {
    let Some(route) = ctx.route.as_ref() else {
        return;
    };
    let Some(affinity) = route.app.affinity.as_ref() else {
        return;
    };
    let Some(tokens) = tokens_of(route) else {
        count("no_key");
        return;
    };
    let mut sent = cookie_values(fields.values("cookie"), &affinity.cookie).peekable();
    if sent.peek().is_none() {
        return;
    }
    // A cookie naming no backend of the app now: its backend left (or it was forged).
    ctx.sticky = Some(Box::new(
        match sent.find_map(|token| tokens.backend(token)) {
            Some(backend) => Sticky::Named(backend),
            None => Sticky::Gone,
        },
    ));
}

/// The `Set-Cookie` for the answer of the backend at `served_by`, when the client's cookie
/// does not name it already (a first request, or its backend is gone or down).
pub(crate) fn set_cookie(ctx: &RequestCtx, served_by: SocketAddr) -> Option<HeaderValue> {
    let route = ctx.route.as_ref()?;
    let tokens = tokens_of(route)?;
    match ctx.sticky.as_deref() {
        Some(Sticky::Named(named)) if *named == served_by => {
            count("kept");
            return None;
        }
        Some(_) => count("moved"),
        None => count("assigned"),
    }
    tokens.cookie(served_by, ctx.tls).cloned()
}

/// Gives an app's answer the affinity cookie for the backend that served it, when the
/// client's does not name it: noted in the context, and added to the answer's own
/// `Set-Cookie` fields as it is written (`pipeline::RouterFields`), so that the answer's
/// fields need not be made a map for it.
pub(crate) fn add_cookie(ctx: &mut RequestCtx) {
    ctx.sticky_cookie = ctx.tried.last().and_then(|served| set_cookie(ctx, *served));
}

/// Counts a request's result in `switchyard_affinity_total`.
fn count(result: &str) {
    metrics::count_result(
        &metrics::AFFINITY_BY_RESULT,
        &metrics::AFFINITY_RESULTS,
        &metrics::AFFINITY,
        result,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::route_cache::route_of;
    use http::header::COOKIE;
    use http::HeaderMap;

    #[test]
    fn a_cookie_naming_a_backend_of_the_app_is_noted() {
        affinity_tokens::set_key("the fleet's secret");
        let app = switchyard_model::parse_app_spec(
            "shop",
            &serde_json::json!({
                "backends": ["127.0.0.1:9001", "127.0.0.1:9002"],
                "affinity": {"cookie": "sticky"}
            }),
        )
        .expect("valid app");
        let route = route_of(app);
        let second: SocketAddr = "127.0.0.1:9002".parse().expect("address");
        let token = tokens_of(&route)
            .expect("tokens")
            .token(second)
            .expect("token")
            .to_string();
        let mut ctx = RequestCtx::new();
        ctx.route = Some(route);
        let mut headers = HeaderMap::new();
        let cookie = format!("theme=dark; sticky={token}");
        headers.insert(COOKIE, HeaderValue::try_from(cookie).expect("value"));
        note_cookie(&mut ctx, Fields::Map(&headers));
        assert_eq!(ctx.sticky.as_deref(), Some(&Sticky::Named(second)));
        assert!(set_cookie(&ctx, second).is_none(), "kept: no new cookie");
        let first: SocketAddr = "127.0.0.1:9001".parse().expect("address");
        let moved = set_cookie(&ctx, first).expect("a new cookie");
        assert!(moved.to_str().expect("ascii").starts_with("sticky="));

        headers.insert(COOKIE, HeaderValue::from_static("sticky=forged"));
        note_cookie(&mut ctx, Fields::Map(&headers));
        assert_eq!(ctx.sticky.as_deref(), Some(&Sticky::Gone));
    }
}

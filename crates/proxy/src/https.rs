//! Stage 1b, HTTPS policy of the app: a plain-HTTP request to an app that asks for it is
//! redirected to HTTPS (308 keeps the method and body), and HTTPS responses carry the app's
//! `Strict-Transport-Security`.

use crate::context::RequestCtx;

/// ACME HTTP-01 challenges must stay reachable over plain HTTP, or an app that redirects
/// could never obtain its first certificate.
const ACME_CHALLENGE_PREFIX: &str = "/.well-known/acme-challenge/";

/// The `Location` to redirect to, when this request must move to HTTPS. `https_port` is the
/// port clients reach HTTPS on (omitted from the URL when 443); without an HTTPS listener
/// nothing is redirected.
pub(crate) fn redirect_location(
    target: &http::Uri,
    ctx: &RequestCtx,
    https_port: Option<u16>,
) -> Option<String> {
    let https_port = https_port?;
    let route = ctx.route.as_ref()?;
    if ctx.tls || !route.app.https_redirect {
        return None;
    }
    let path = target.path_and_query().map_or("/", |p| p.as_str());
    if path.starts_with(ACME_CHALLENGE_PREFIX) {
        return None;
    }
    let host = ctx.host.as_deref()?;
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    Some(if https_port == 443 {
        format!("https://{host}{path}")
    } else {
        format!("https://{host}:{https_port}{path}")
    })
}

/// The `Strict-Transport-Security` value a response to this request carries, if any.
pub(crate) fn hsts_value(ctx: &RequestCtx) -> Option<String> {
    if !ctx.tls {
        return None;
    }
    ctx.route
        .as_ref()
        .and_then(|r| r.app.hsts)
        .map(|hsts| hsts.header_value())
}

//! Stage https, the HTTPS policy of the app: a plain-HTTP request to an app that asks for it is
//! redirected to HTTPS (308 keeps the method and body), and HTTPS responses carry the app's
//! `Strict-Transport-Security` and, when the router serves HTTP/3, the `Alt-Svc` that
//! tells browsers where (RFC 7838).

use std::sync::OnceLock;

use crate::context::RequestCtx;

/// How long a client may remember the HTTP/3 alternative: a day, as Caddy and Cloudflare
/// advertise it.
const ALT_SVC_MAX_AGE_S: u32 = 86_400;

static ALT_SVC: OnceLock<String> = OnceLock::new();

/// From now on, answers over TLS advertise HTTP/3 on UDP `port` (set once, at start).
pub fn advertise_http3(port: u16) {
    let _ = ALT_SVC.set(format!("h3=\":{port}\"; ma={ALT_SVC_MAX_AGE_S}"));
}

/// The `Alt-Svc` a response to this request carries, if any: over TLS, when HTTP/3 is
/// served and the app has not opted out.
pub(crate) fn alt_svc_value(ctx: &RequestCtx) -> Option<&'static str> {
    let advertised = ctx.route.as_ref().is_none_or(|r| r.app.advertise_http3);
    (ctx.tls && advertised).then(advertised_http3).flatten()
}

/// The `Alt-Svc` of the router's HTTP/3 listener, when it has one.
pub(crate) fn advertised_http3() -> Option<&'static str> {
    ALT_SVC.get().map(String::as_str)
}

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
    // ACME HTTP-01 challenges must stay reachable over plain HTTP (the app may answer its
    // own), or an app that redirects could never obtain its first certificate.
    if path.starts_with(crate::stage::acme_challenge::PREFIX) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::route_cache::route_of;

    /// A request for `host` (as routed: an IPv6 literal comes without brackets) to an app.
    fn request_to(host: &str, redirecting: bool, tls: bool) -> RequestCtx {
        let spec = serde_json::json!({
            "domains": ["shop.test"],
            "backends": ["127.0.0.1:9"],
            "https_redirect": redirecting,
        });
        let app = switchyard_model::parse_app_spec("a", &spec).expect("a valid spec");
        let mut ctx = RequestCtx::new();
        ctx.route = Some(route_of(app));
        ctx.host = Some(host.to_string());
        ctx.tls = tls;
        ctx
    }

    #[test]
    fn only_plain_requests_of_apps_that_ask_move_to_https_with_path_and_query() {
        let uri = |u: &'static str| http::Uri::from_static(u);
        for (host, redirecting, tls, target, port, expected) in [
            (
                "shop.test",
                true,
                false,
                "/cart?id=7",
                Some(443),
                Some("https://shop.test/cart?id=7"),
            ),
            (
                "shop.test",
                true,
                false,
                "/",
                Some(8443),
                Some("https://shop.test:8443/"),
            ),
            (
                "::1",
                true,
                false,
                "/a",
                Some(8443),
                Some("https://[::1]:8443/a"),
            ),
            ("shop.test", true, true, "/", Some(443), None),
            ("shop.test", false, false, "/", Some(443), None),
            ("shop.test", true, false, "/", None, None),
            (
                "shop.test",
                true,
                false,
                "/.well-known/acme-challenge/t",
                Some(443),
                None,
            ),
        ] {
            let ctx = request_to(host, redirecting, tls);
            assert_eq!(
                redirect_location(&uri(target), &ctx, port).as_deref(),
                expected,
                "{host} redirect={redirecting} tls={tls} {target} {port:?}"
            );
        }
    }
}

//! Stage redirects: the app's moves (a host to another, a path prefix elsewhere), answered
//! before anything asks the app. An ACME HTTP-01 challenge is never moved: the app (or the
//! fleet's issuer, a stage earlier) must be able to answer it for the moved host too.

use http::Uri;

use crate::context::RequestCtx;

/// The status and `Location` of the app's first redirect that takes this request.
pub(crate) fn redirect(target: &Uri, ctx: &RequestCtx) -> Option<(u16, String)> {
    let app = &ctx.route.as_ref()?.app;
    if app.redirects.is_empty() {
        return None;
    }
    let path = target.path();
    if path.starts_with(crate::stage::acme_challenge::PREFIX) {
        return None;
    }
    let host = ctx.host.as_deref()?;
    app.redirects.iter().find_map(|redirect| {
        let location = redirect.location(host, path, target.query())?;
        Some((redirect.status, location))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::route_cache::route_of;

    fn request_to(host: &str) -> RequestCtx {
        let spec = serde_json::json!({
            "domains": ["example.com", "www.example.com"],
            "backends": ["127.0.0.1:9"],
            "redirects": [
                {"host": "www.example.com", "to": "https://example.com", "status": 308},
                {"path_prefix": "/docs", "to": "https://docs.example.org", "status": 302}
            ]
        });
        let app = switchyard_model::parse_app_spec("site", &spec).expect("valid app");
        let mut ctx = RequestCtx::new();
        ctx.host = Some(host.into());
        ctx.route = Some(route_of(app));
        ctx
    }

    #[test]
    fn the_first_redirect_that_takes_the_request_answers() {
        let www = request_to("www.example.com");
        let uri: Uri = "/docs/a?b=c".parse().expect("uri");
        assert_eq!(
            redirect(&uri, &www),
            Some((308, "https://example.com/docs/a?b=c".into()))
        );
        let apex = request_to("example.com");
        assert_eq!(
            redirect(&uri, &apex),
            Some((302, "https://docs.example.org/a?b=c".into()))
        );
        let other: Uri = "/shop".parse().expect("uri");
        assert_eq!(redirect(&other, &apex), None);
        let challenge: Uri = "/.well-known/acme-challenge/abc".parse().expect("uri");
        assert_eq!(
            redirect(&challenge, &www),
            None,
            "challenges stay reachable"
        );
    }
}

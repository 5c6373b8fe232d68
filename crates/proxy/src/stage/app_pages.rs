//! Stage app_pages: the app's own pages in place of the router's. While the app is in
//! maintenance every request is answered 503 with its page (the backends are not asked);
//! the router's own 502, 503 and 504 for the app carry the app's error page. The HTML goes
//! to clients that ask for HTML (browsers); HEAD requests and other clients (APIs, curl)
//! get the router's plain text, as Heroku's router does.

use bytes::Bytes;
use http::Method;

use crate::context::RequestCtx;
use crate::request_fields::Fields;

/// Notes whether this client gets the app's HTML pages: a request other than HEAD whose
/// `Accept` names `text/html` (as browsers' navigations do).
pub(crate) fn note_html_client(ctx: &mut RequestCtx, method: &Method, fields: Fields<'_>) {
    ctx.wants_html = method != Method::HEAD && fields.values("accept").any(names_html);
}

fn names_html(accept: &[u8]) -> bool {
    accept.split(|b| *b == b',').any(|range| {
        let media = range.split(|b| *b == b';').next().unwrap_or_default();
        let refused = range
            .split(|b| *b == b';')
            .skip(1)
            .any(|p| p.trim_ascii().eq_ignore_ascii_case(b"q=0"));
        media.trim_ascii().eq_ignore_ascii_case(b"text/html") && !refused
    })
}

/// Whether the app is in maintenance, and the `Retry-After` it asks for.
pub(crate) fn in_maintenance(ctx: &RequestCtx) -> Option<Option<u32>> {
    let maintenance = ctx.route.as_ref()?.app.maintenance.as_deref()?;
    maintenance.enabled.then_some(maintenance.retry_after_s)
}

/// The app's HTML for the router's answer `status` to this request: its maintenance page
/// (`maintenance`) or its error page, when it has one and the client takes HTML.
pub(crate) fn html_for(ctx: &RequestCtx, status: u16, maintenance: bool) -> Option<Bytes> {
    if !ctx.wants_html {
        return None;
    }
    let app = &ctx.route.as_ref()?.app;
    let page = if maintenance {
        app.maintenance.as_deref()?.page_html.as_deref()?
    } else {
        app.error_pages.as_deref()?.page(status)?
    };
    Some(Bytes::copy_from_slice(page.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_goes_to_clients_that_ask_for_it() {
        for (accept, html) in [
            ("text/html,application/xhtml+xml,*/*;q=0.8", true),
            ("TEXT/HTML", true),
            ("application/json", false),
            ("*/*", false),
            ("text/html;q=0, application/json", false),
            ("text/htmlx", false),
        ] {
            assert_eq!(names_html(accept.as_bytes()), html, "{accept}");
        }
    }
}

//! The response phase's one writer: every answer, the app's or the router's own, becomes
//! the client's response here, with the fields every answer of the router carries.

use std::time::Duration;

use bytes::Bytes;
use http::header::{
    CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, LOCATION, RETRY_AFTER, SET_COOKIE,
    STRICT_TRANSPORT_SECURITY, WWW_AUTHENTICATE,
};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, Version};
use http_body::Body as _;

use super::answer_body::AnswerBody;
use super::end::RequestEnd;
use crate::context::RequestCtx;
use crate::fields_mut::FieldsMut;
use crate::forwarded::X_REQUEST_ID;
use crate::listener::relay::{self, ClientUpgrade};
use crate::metrics;
use crate::respond::{self, Reason, Refusal};
use crate::stage::cache::{self, FromCache};
use crate::stage::header_rules::Rules;
use crate::stage::https;
use crate::stage::static_files::StaticFile;
use crate::stage::{app_pages, basic_auth};
use crate::upstream::backend_h1::BackendBody;
use crate::upstream::read_ahead::ReadAhead;

pub(super) const X_CACHE: HeaderName = HeaderName::from_static("x-cache");
const X_ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");

/// What the router answers a request with. Moved once per request: boxing the large
/// variant would cost every proxied request an allocation to save a copy.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Answer {
    /// The backend's response, its body read within `read_deadline` per piece.
    Backend {
        response: Response<BackendBody>,
        read_deadline: Duration,
    },
    /// A redirect: the app's own (`stage::redirects`), or 308 to HTTPS.
    Redirect { status: u16, location: String },
    /// The app is in maintenance: 503 with its page.
    Maintenance { retry_after_s: Option<u32> },
    /// The app's password protection asks for credentials: 401.
    Unauthorized { realm: String },
    /// A file under the app's static root.
    File(StaticFile),
    /// A copy from the app's response cache: fresh, refreshed by the app's 304, or stale
    /// standing in for the app.
    Cached(FromCache),
    /// A 200 the router made (a resized image).
    Made { headers: HeaderMap, body: Bytes },
    /// An answer one of the app's filters made (`send_local_response`).
    Filtered(switchyard_filters::LocalResponse),
    /// An answer of the router's own instead of the app's: a stage refused the request,
    /// or the app could not be reached.
    Refused(Refusal),
}

/// What a stage says of a request: it goes on, or this answers it.
pub(crate) type Flow = std::ops::ControlFlow<Answer>;

impl From<Refusal> for Answer {
    fn from(refusal: Refusal) -> Self {
        Self::Refused(refusal)
    }
}

impl From<Reason> for Answer {
    fn from(answer: Reason) -> Self {
        Self::Refused(answer.into())
    }
}

/// Writes `answer` as the client's response; `client_upgrade`: where the client's
/// connection goes once a 101 has gone out.
pub(super) fn write(
    answer: Answer,
    client_upgrade: Option<ClientUpgrade>,
    end: Box<RequestEnd>,
) -> Response<AnswerBody> {
    // Only the routes of apps with answer rules pay for the route's count.
    let route = (end.ctx.route.as_ref())
        .filter(|route| (route.header_rules.as_ref()).is_some_and(|r| !r.answer.is_empty()))
        .cloned();
    let rules = route
        .as_ref()
        .and_then(|route| route.header_rules.as_deref());
    let mut response = match answer {
        Answer::Backend {
            response,
            read_deadline,
        } => {
            // The app's fields, as read or in a map, edited before the router adds its own.
            return backend_response(response, read_deadline, client_upgrade, rules, end);
        }
        Answer::Redirect { status, location } => {
            let body = format!("{status} moved to {location}\n");
            local_response(status, Bytes::from(body), Some(location), end)
        }
        Answer::Maintenance { retry_after_s } => {
            let mut refusal = Refusal::new(Reason::Maintenance);
            refusal.retry_after_s = retry_after_s;
            refusal_response(refusal, end)
        }
        Answer::Unauthorized { realm } => {
            let refusal = Refusal::new(Reason::Unauthorized);
            let mut response = refusal_response(refusal, end);
            if let Ok(challenge) = HeaderValue::try_from(basic_auth::challenge(&realm)) {
                response.headers_mut().insert(WWW_AUTHENTICATE, challenge);
            }
            response
        }
        Answer::File(file) => file_response(file, end),
        Answer::Cached(answer) => {
            let (status, headers, body) = cache::cached_answer(&answer);
            made_response(status, headers, body, end)
        }
        Answer::Made { headers, body } => made_response(200, headers, body, end),
        Answer::Filtered(local) => {
            let mut headers = HeaderMap::with_capacity(local.headers.len() + 1);
            for (name, value) in local.headers {
                headers.append(name, value);
            }
            headers.insert(CONTENT_LENGTH, HeaderValue::from(local.body.len()));
            made_response(local.status, headers, local.body, end)
        }
        Answer::Refused(refusal) => refusal_response(refusal, end),
    };
    if let Some(rules) = rules {
        (rules.answer).apply(&mut FieldsMut::map(response.headers_mut()));
    }
    response
}

/// The router's own answer instead of the app's, as its reason's row says: the status, the
/// text with the request id (or the app's HTML page for it, when it has one for this
/// client), and `Retry-After`; counted and noted for the access log by its reason.
fn refusal_response(refusal: Refusal, mut end: Box<RequestEnd>) -> Response<AnswerBody> {
    let status = refusal.status();
    let maintenance = refusal.reason.row().page == respond::Page::Maintenance;
    let page = app_pages::html_for(&end.ctx, status, maintenance);
    count(refusal.reason);
    end.ctx.refused = Some(refusal.reason);
    let html = page.is_some();
    let body = page.unwrap_or_else(|| {
        Bytes::from(respond::error_body(
            status,
            refusal.text(),
            Some(&end.ctx.request_id),
        ))
    });
    let mut response = local_response(status, body, None, end);
    if html {
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
    }
    if let Some(seconds) = refusal.retry_after_s {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// The router's answer to what never became a request (a refused HTTP/1 head, an HTTP/3
/// request in 0-RTT data): its reason's row, with no request id and no app's page, which
/// need a request. Counted by its reason as every refusal is.
pub(crate) fn before_request(reason: Reason) -> Response<Bytes> {
    let row = reason.row();
    count(reason);
    let body = Bytes::from(respond::error_body(row.status, row.text, None));
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::from_u16(row.status).unwrap_or(StatusCode::BAD_REQUEST);
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(seconds) = row.retry_after_s {
        headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// Every refusal, whichever writer makes it, in `switchyard_refusals_total`.
fn count(reason: Reason) {
    metrics::REFUSALS.with_label_values(&[reason.label()]).inc();
}

fn backend_response(
    mut response: Response<BackendBody>,
    read_deadline: Duration,
    client_upgrade: Option<ClientUpgrade>,
    rules: Option<&Rules>,
    mut end: Box<RequestEnd>,
) -> Response<AnswerBody> {
    end.status = response.status().as_u16();
    // The client's connection speaks its own version, whatever the backend's was (the
    // HTTP/1 driver writes an HTTP/1.1 status line to every client, as nginx does).
    *response.version_mut() = Version::HTTP_11;
    // The backend's hop-by-hop fields were left out when its head was read. Fields that go
    // on as read get the router's own from the HTTP/1.x driver (`RouterFields`), no map.
    end.answer_fields = response.body_mut().take_fields();
    if let Some(rules) = rules {
        let as_read = end.answer_fields.as_mut();
        rules
            .answer
            .apply(&mut FieldsMut::new(response.headers_mut(), as_read));
    }
    if end.answer_fields.is_none() {
        set_router_headers(response.headers_mut(), &end.ctx);
    }
    if let Some(label) = cache::x_cache(&end.ctx) {
        response
            .headers_mut()
            .insert(X_CACHE, HeaderValue::from_static(label));
    }
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            log::warn!(
                "request {}: app {}: the backend switched protocols unasked",
                end.ctx.request_id,
                end.ctx.app_name()
            );
            let mut refused = refusal_response(Reason::UnaskedUpgrade.into(), end);
            if let Some(rules) = rules {
                rules
                    .answer
                    .apply(&mut FieldsMut::map(refused.headers_mut()));
            }
            return refused;
        };
        let (parts, body) = response.into_parts();
        // The relay's polls are charged with the request's.
        crate::traffic::cost::spawn_for_connection(relay::run(
            client_upgrade,
            body.into_upgraded(),
            end,
        ));
        return Response::from_parts(parts, AnswerBody::local(Bytes::new(), None));
    }
    if end.ctx.cache.is_some() && response.body().is_end_stream() {
        // An empty body is never read: a response the cache keeps is complete now.
        cache::body_phase(&mut end.ctx, &None, true);
    }
    let encoder = end.ctx.encoder.take();
    if reads_ahead(&response, &end) {
        let buffers = end.worker.shared.response_buffers.clone();
        let worker = end.worker.clone();
        return response.map(|body| {
            AnswerBody::read_ahead(ReadAhead::start(body, read_deadline, worker, buffers), end)
                .encoded_by(encoder)
        });
    }
    response.map(|body| AnswerBody::from_backend(body, read_deadline, end).encoded_by(encoder))
}

/// Whether the backend's answer is read ahead of the client: when the router reads ahead,
/// the app lets it, the body did not come whole with the head, and the answer is not a
/// stream (`text/event-stream`, or `X-Accel-Buffering: no` as apps behind nginx say it).
fn reads_ahead(response: &Response<BackendBody>, end: &RequestEnd) -> bool {
    let field = |name: &HeaderName| {
        let in_map = response.headers().get(name).map(HeaderValue::as_bytes);
        in_map.or_else(|| end.answer_fields.as_ref()?.get(name.as_str()))
    };
    end.worker.shared.response_buffers.enabled()
        && end
            .ctx
            .route
            .as_ref()
            .is_some_and(|r| r.app.response_buffering)
        && !response.body().all_in_hand()
        && !field(&CONTENT_TYPE).is_some_and(|v| v.starts_with(b"text/event-stream"))
        && !field(&X_ACCEL_BUFFERING).is_some_and(|v| v.eq_ignore_ascii_case(b"no"))
}

fn local_response(
    status: u16,
    body: Bytes,
    location: Option<String>,
    mut end: Box<RequestEnd>,
) -> Response<AnswerBody> {
    end.status = status;
    let mut response = Response::new(());
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Some(id) = request_id_value(end.ctx.request_id.as_bytes()) {
        headers.insert(X_REQUEST_ID, id);
    }
    match location.and_then(|l| HeaderValue::try_from(l).ok()) {
        Some(location) => {
            headers.insert(LOCATION, location);
        }
        None => {
            headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        }
    }
    response.map(|()| AnswerBody::local(body, Some(end)))
}

/// An answer the router has whole: from the cache, or made here. A HEAD gets its head.
fn made_response(
    status: u16,
    headers: HeaderMap,
    body: Bytes,
    mut end: Box<RequestEnd>,
) -> Response<AnswerBody> {
    end.status = status;
    let mut response = Response::new(());
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    *response.headers_mut() = headers;
    set_router_headers(response.headers_mut(), &end.ctx);
    let body = if end.method == Method::HEAD {
        Bytes::new()
    } else {
        body
    };
    response.map(|()| AnswerBody::local(body, Some(end)))
}

fn file_response(file: StaticFile, mut end: Box<RequestEnd>) -> Response<AnswerBody> {
    end.status = 200;
    let mut response = Response::new(());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(file.content_type));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(file.length));
    set_router_headers(headers, &end.ctx);
    let body = if file.head_only {
        AnswerBody::local(Bytes::new(), Some(end))
    } else {
        AnswerBody::file(file.file, file.length, end)
    };
    response.map(|()| body)
}

/// The headers every answer of the router carries: the request id, and HSTS over TLS for
/// apps that ask; and the fields added to the app's own (a sticky-session cookie).
fn set_router_headers(headers: &mut HeaderMap, ctx: &RequestCtx) {
    let own = RouterFields::of(ctx);
    for (name, value) in own.iter() {
        let value = if *name == X_REQUEST_ID {
            request_id_value(value)
        } else {
            HeaderValue::from_bytes(value).ok()
        };
        if let Some(value) = value {
            headers.insert(name.clone(), value);
        }
    }
    if let Some(cookie) = own.sticky_cookie {
        headers.append(SET_COOKIE, cookie.clone());
    }
}

/// The request id as an answer's field. Marked sensitive, which HTTP/2's HPACK encoder
/// takes as "never index": a value new on every answer would otherwise enter the
/// connection's dynamic table each time, push out the fields that do repeat, and be
/// compared with every earlier id still in it (the h2 crate walks all entries of a name),
/// 5% of an HTTP/2 request's CPU in perf. HTTP/1.x ignores the mark.
fn request_id_value(id: &[u8]) -> Option<HeaderValue> {
    let mut value = HeaderValue::from_bytes(id).ok()?;
    value.set_sensitive(true);
    Some(value)
}

/// The router's own fields on an app's answer: the request id, HSTS over HTTPS for an app
/// that asks for it, and over TLS the `Alt-Svc` of HTTP/3 when it is served. They replace a
/// field of the same name the app sent. Beside them, the sticky-session cookie, added to
/// the app's own `Set-Cookie` fields. Put in the answer's map (`set_router_headers`), or,
/// for an answer whose fields go on as read, written after them by the HTTP/1.x driver
/// with no map made.
pub(crate) struct RouterFields<'a> {
    request_id: &'a str,
    hsts: Option<String>,
    alt_svc: Option<&'static str>,
    /// Added to the app's fields, replacing none (`stage::affinity`).
    pub(crate) sticky_cookie: Option<&'a HeaderValue>,
}

impl<'a> RouterFields<'a> {
    /// The most fields the router adds to an answer: what a writer keeps room for.
    pub(crate) const MOST: usize = 3;

    pub(crate) fn of(ctx: &'a RequestCtx) -> Self {
        Self {
            request_id: &ctx.request_id,
            hsts: https::hsts_value(ctx),
            alt_svc: https::alt_svc_value(ctx),
            sticky_cookie: ctx.sticky_cookie.as_ref(),
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&'static HeaderName, &[u8])> + Clone {
        static REQUEST_ID: HeaderName = X_REQUEST_ID;
        static HSTS: HeaderName = STRICT_TRANSPORT_SECURITY;
        static ALT_SVC: HeaderName = http::header::ALT_SVC;
        let hsts = self.hsts.as_deref().map(str::as_bytes);
        let fields: [_; RouterFields::MOST] = [
            (&REQUEST_ID, Some(self.request_id.as_bytes())),
            (&HSTS, hsts),
            (&ALT_SVC, self.alt_svc.map(str::as_bytes)),
        ];
        fields
            .into_iter()
            .filter_map(|(name, value)| Some((name, value?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_id_on_an_answer_is_kept_out_of_hpack_tables() {
        let mut ctx = RequestCtx::new();
        ctx.request_id = "4bf92f3577b34da6".into();
        let mut headers = HeaderMap::new();
        headers.insert(X_REQUEST_ID, HeaderValue::from_static("the app's own"));
        set_router_headers(&mut headers, &ctx);
        let ids: Vec<_> = headers.get_all(X_REQUEST_ID).iter().collect();
        assert_eq!(
            ids,
            ["4bf92f3577b34da6"],
            "the router's id replaces the app's"
        );
        assert!(ids[0].is_sensitive(), "never indexed by HTTP/2's encoder");
        assert!(request_id_value(b"bad\nid").is_none());
    }
}

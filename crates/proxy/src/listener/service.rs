//! The life of one request, the one place that orders the stages (`stage/mod.rs` lists
//! them): request id, framing, route, HTTPS redirect, WAF, static files, cache, images,
//! mirror, upstream (pick, connect, retries, passive health, drain registration), the
//! answer (kept by the cache, or a stale copy in its place), the log.

use std::borrow::Cow;
use std::cell::Cell;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{
    CACHE_CONTROL, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, COOKIE, HOST, LOCATION, RETRY_AFTER,
    STRICT_TRANSPORT_SECURITY,
};
use http::{
    HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri, Version,
};
use http_body::Body as _;
use rand::Rng;
use switchyard_give_way::LightRequest;

use super::backend_h1::{AnswerForm, BackendBody};
use super::bodies::{AnswerBody, ForwardBody, RequestEnd};
use super::inspection;
use super::pool::ConnectFailure;
use super::read_ahead::ReadAhead;
use super::relay::ClientUpgrade;
use super::request_body::RequestBody;
use super::{relay, EventLoop};
use crate::context::RequestCtx;
use crate::forwarded::{Forwarding, X_REQUEST_ID};
use crate::metrics;
use crate::request_fields::{Fields, Known, RequestFields};
use crate::respond::{self, LocalAnswer};
use crate::response_cache::memory::CachedResponse;
use crate::routing::attempt;
use crate::stage::acme_challenge;
use crate::stage::cache::{self, AppAnswer, CacheStatus};
use crate::stage::framing;
use crate::stage::https;
use crate::stage::images::{self, ImageAnswer};
use crate::stage::limits;
use crate::stage::mirror;
use crate::stage::request_id::request_id;
use crate::stage::route;
use crate::stage::static_files::{self, StaticFile};
use crate::stage::waf::{self, Endpoints};

const X_CACHE: HeaderName = HeaderName::from_static("x-cache");
const X_ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");

/// What the router answers a request with. Moved once per request: boxing the large
/// variant would cost every proxied request an allocation to save a copy.
#[allow(clippy::large_enum_variant)]
pub(super) enum Answer {
    /// The backend's response, its body read within `read_deadline` per piece.
    Backend {
        response: Response<BackendBody>,
        read_deadline: Duration,
    },
    /// A 308 to HTTPS.
    Redirect(String),
    /// A file under the app's static root.
    File(StaticFile),
    /// A copy from the app's response cache: fresh, or stale standing in for the app.
    Cached(Arc<CachedResponse>, CacheStatus),
    /// A 200 the router made (a resized image).
    Made { headers: HeaderMap, body: Bytes },
    /// An answer of the router's own instead of the app's (a refusal, or a failure to get
    /// the app's): the status, a short text saying why (the body, with the request id),
    /// and in how many seconds the client is asked to come back (`Retry-After`).
    Refused {
        status: u16,
        text: Cow<'static, str>,
        retry_after: Option<u32>,
    },
}

impl Answer {
    /// The router's own answer `status`, with the text that goes with it.
    pub(super) fn own(status: u16, text: &'static str) -> Self {
        Self::Refused {
            status,
            text: Cow::Borrowed(text),
            retry_after: None,
        }
    }
}

impl From<LocalAnswer> for Answer {
    fn from(answer: LocalAnswer) -> Self {
        Self::Refused {
            status: answer.status(),
            text: Cow::Borrowed(answer.text()),
            retry_after: answer.retry_after_s(),
        }
    }
}

/// The client end of a connection, as each of its requests needs it.
pub(super) struct Client {
    ip: IpAddr,
    port: u16,
    /// The port the client connected to.
    server_port: u16,
    tls: bool,
    /// `X-Forwarded-For` for a request that brings none: the address, formatted once per
    /// connection rather than per request.
    forwarded_for: Option<HeaderValue>,
    /// The router is stopping: answers close the connection after them.
    closing: Cell<bool>,
    /// Until when the connection's next request waits: the worker pool refused one of its
    /// requests and asked the client to come back after `Retry-After`.
    paced_until: Cell<Option<tokio::time::Instant>>,
}

impl Client {
    pub(super) fn new(peer: SocketAddr, server_port: u16, tls: bool) -> Rc<Self> {
        Rc::new(Self {
            ip: peer.ip(),
            port: peer.port(),
            server_port,
            tls,
            forwarded_for: HeaderValue::try_from(peer.ip().to_string()).ok(),
            closing: Cell::new(false),
            paced_until: Cell::new(None),
        })
    }

    /// The worker pool refused a request of this connection, asking the client to come back
    /// in `retry_after_s`: a next request on it before then waits until then.
    ///
    /// A client that asks again at once on the same connection (wrk does; so does a naive
    /// retry loop) would otherwise keep the event loops answering refusals, tens of
    /// thousands a second, and the light requests sharing the loops wait behind them
    /// (bench/bench_images.py: light p99 11–18 ms beside 400 such connections). Held, each
    /// such connection costs one refusal per `Retry-After` and a timer. A fresh connection
    /// is never held: a careful client is refused in microseconds. HTTP/2 streams are not
    /// held, since one connection carries the light requests of the same page.
    ///
    /// Held for a random half to whole `Retry-After`: connections refused together (a burst
    /// of new ones) and held exactly as long would come back together every `Retry-After`,
    /// and the light requests arriving in each burst wait behind it (bench_waf beside 400
    /// connections: light requests of 5–8 ms once a second). Never past `Retry-After`, so a
    /// client that honours it is not held longer than it waits by itself.
    fn pace_after_refusal(&self, retry_after_s: u32) {
        let retry_after = Duration::from_secs(u64::from(retry_after_s));
        let held = retry_after.mul_f64(rand::thread_rng().gen_range(0.5..=1.0));
        self.paced_until
            .set(Some(tokio::time::Instant::now() + held));
    }

    /// Waits out the pool's `Retry-After` if this connection was refused and this request
    /// came too soon (HTTP/1 only); how long it waited.
    async fn wait_out_refusal(&self, version: Version) -> Duration {
        let Some(until) = self.paced_until.take() else {
            return Duration::ZERO;
        };
        let now = tokio::time::Instant::now();
        if version >= Version::HTTP_2 || until <= now {
            return Duration::ZERO;
        }
        metrics::PACED_REQUESTS.inc();
        tokio::time::sleep_until(until).await;
        until.saturating_duration_since(now)
    }

    /// From now on, each answer closes the connection after it.
    pub(super) fn close_after_answer(&self) {
        self.closing.set(true);
    }

    /// Whether answers close the connection after them (the router is stopping).
    pub(super) fn closing(&self) -> bool {
        self.closing.get()
    }

    pub(super) fn ip(&self) -> IpAddr {
        self.ip
    }

    fn endpoints(&self) -> Endpoints {
        Endpoints {
            client: Some(SocketAddr::new(self.ip, self.port)),
            server_port: self.server_port,
        }
    }
}

/// Serves one request. `client_upgrade`: where the client's connection comes once a 101
/// has gone out, for a request that asks for an upgrade.
pub(super) async fn handle(
    request: Request<RequestBody>,
    as_read: Option<RequestFields>,
    client: Rc<Client>,
    worker: Rc<EventLoop>,
    client_upgrade: Option<ClientUpgrade>,
) -> Response<AnswerBody> {
    let bytes_in = Rc::new(Cell::new(0));
    let mut end = Box::new(RequestEnd {
        worker: worker.clone(),
        // Made in place: a named local, though moved from, would keep its 416 bytes in
        // this future's state for the whole request (rustc -Zprint-type-sizes).
        ctx: {
            let mut ctx = RequestCtx::new();
            ctx.tls = client.tls;
            ctx.request_id = request_id(Fields::of(request.headers(), as_read.as_ref()));
            ctx
        },
        method: request.method().clone(),
        target: request.uri().clone(),
        version: request.version(),
        connection: client.clone(),
        bytes_in: bytes_in.clone(),
        status: 0,
        bytes_out: 0,
        answer_fields: None,
    });
    let (head, incoming) = request.into_parts();
    let mut unread = Some(incoming);
    let mut answer = proxy(
        head,
        as_read,
        &mut unread,
        &client,
        &mut end.ctx,
        &worker,
        bytes_in,
    )
    .await;
    // Its answer is ready: the workers go on giving way a moment (crates/give-way) while
    // the loop sends it and the client reads it. A WebSocket or a long download stops
    // counting here, or the workers would give way for as long as one stays open.
    end.ctx.light = None;
    if let Answer::Refused {
        status: 500..,
        retry_after: None,
        ..
    } = answer
    {
        // The app failed or could not be reached: a stale copy stands in if one may.
        if let Some(stale) = cache::take_stale(&mut end.ctx) {
            answer = Answer::Cached(stale, CacheStatus::Stale);
        }
    }
    let mut response = match answer {
        Answer::Backend {
            response,
            read_deadline,
        } => backend_response(response, read_deadline, client_upgrade, end),
        Answer::Redirect(location) => {
            let body = format!("308 moved to {location}\n");
            local_response(308, body, Some(location), end)
        }
        Answer::File(file) => file_response(file, end),
        Answer::Cached(copy, status) => {
            let headers = cache::cached_headers(&copy, status);
            made_response(copy.status, headers, copy.body.clone(), end)
        }
        Answer::Made { headers, body } => made_response(200, headers, body, end),
        Answer::Refused {
            status,
            text,
            retry_after,
        } => {
            let body = respond::error_body(status, &text, &end.ctx.request_id);
            let mut response = local_response(status, body, None, end);
            if let Some(seconds) = retry_after {
                response
                    .headers_mut()
                    .insert(RETRY_AFTER, HeaderValue::from(seconds));
            }
            response
        }
    };
    if let Some(incoming) = unread.filter(|body| !body.is_end_stream()) {
        linger(incoming, &mut response);
    }
    response
}

/// How long the rest of a body the router answered without reading may take to come in
/// before the connection is closed anyway (nginx's `lingering_timeout`).
const REFUSED_BODY_LINGER: Duration = Duration::from_secs(5);

/// An HTTP/1 client may still be sending the body of a request the router has answered (a
/// refused upload, an unknown host): closing with its bytes unread would reset the
/// connection, and the client could lose the answer. The connection closes after this
/// answer instead, and the rest of the body is read and dropped meanwhile, for a bounded
/// time. An HTTP/2 stream ends on its own (hyper resets the rest of it).
fn linger(mut incoming: RequestBody, response: &mut Response<AnswerBody>) {
    if response.version() == Version::HTTP_2 {
        return;
    }
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    tokio::task::spawn_local(async move {
        let drained = async {
            while let Some(Ok(_)) =
                std::future::poll_fn(|cx| Pin::new(&mut incoming).poll_frame(cx)).await
            {
            }
        };
        let _ = tokio::time::timeout(REFUSED_BODY_LINGER, drained).await;
    });
}

/// The answer to a request; its body is taken from `unread` once it goes to a backend, and
/// left there otherwise. `as_read`: an HTTP/1.x client's fields where they were read, when
/// `head`'s map is empty; they are made a map for the stages that read a request whole.
#[allow(clippy::too_many_arguments)]
async fn proxy(
    mut head: http::request::Parts,
    mut as_read: Option<RequestFields>,
    unread: &mut Option<RequestBody>,
    client: &Client,
    ctx: &mut RequestCtx,
    worker: &EventLoop,
    bytes_in: Rc<Cell<usize>>,
) -> Answer {
    let Some(incoming) = unread.as_mut() else {
        return failed(false);
    };
    ctx.held = client.wait_out_refusal(head.version).await;
    match &as_read {
        // Fields as read have neither Transfer-Encoding nor Upgrade (`client_h1`), and the
        // codec checked their lengths: the length declared is what is left to read.
        Some(fields) => {
            ctx.declared_length =
                framing::declared_length(Fields::AsRead(fields).get(Known::ContentLength));
        }
        None => match framing::check_request(&mut head.headers) {
            Ok(length) => ctx.declared_length = length,
            Err(answer) => return answer.into(),
        },
    }
    let shared = &worker.shared;
    let fields = Fields::of(&head.headers, as_read.as_ref());
    if let Err(answer) = route::route(&head.uri, fields, ctx, &shared.routes).await {
        return answer.into();
    }
    if let Some(key_authorization) =
        acme_challenge::answer(&head.method, head.uri.path(), ctx, shared.routes.store()).await
    {
        let mut headers = HeaderMap::with_capacity(2);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        headers.insert(CONTENT_LENGTH, HeaderValue::from(key_authorization.len()));
        return Answer::Made {
            headers,
            body: Bytes::from(key_authorization),
        };
    }
    let Some(route) = ctx.route.clone() else {
        return LocalAnswer::UnknownHost.into();
    };
    if as_read.is_some() && reads_whole_request(&route.app) {
        match as_read.take().map(|fields| fields.to_map()) {
            Some(Ok(map)) => head.headers = map,
            _ => return Answer::own(400, respond::text_for(400)),
        }
    }
    // A request that will wait for no worker is what the workers give way for; one that
    // will (an inspection, a resize) is the heavy work itself.
    let inspected = shared.waf.is_some() && waf::policy_of(ctx).is_some();
    let resized = shared.images.is_some() && images::wants_resize(ctx, &head);
    if !inspected && !resized {
        ctx.light = Some(LightRequest::start());
    }
    if let Some(limits) = route.app.limits.as_deref() {
        let request = limits::Request {
            app: route.app.name.as_str(),
            limits,
            peer: client.ip,
            headers: &head.headers,
            target_len: head.uri.path_and_query().map_or(0, |p| p.as_str().len()),
            declared_length: ctx.declared_length,
        };
        match shared.limiter.admit(request).await {
            Ok(places) => ctx.limit_places = places,
            Err(refusal) => {
                return Answer::Refused {
                    status: refusal.status,
                    text: Cow::Borrowed(refusal.text),
                    retry_after: refusal.retry_after_s,
                }
            }
        }
    }
    if let Some(location) = https::redirect_location(&head.uri, ctx, shared.https_port) {
        return Answer::Redirect(location);
    }
    let body_deadline = shared.client_timeouts.body;
    if head.version == Version::HTTP_2
        && ctx.declared_length == Some(0)
        && !incoming.is_end_stream()
        && !empty_body_ends(incoming, body_deadline).await
    {
        return LocalAnswer::AmbiguousFraming.into();
    }
    // The WAF, the cache and the images are awaited boxed, and only on the routes that
    // have them: their states (2.1, 4.4 and 1.5 KiB) would otherwise size this future,
    // which every request builds and moves whole (callgrind: memcpy, 4k instructions a
    // request before).
    let held = if waf::policy_of(ctx).is_some() {
        let inspector = shared.waf.as_deref();
        let endpoints = client.endpoints();
        let inspected = Box::pin(inspection::inspect(
            &head,
            incoming,
            endpoints,
            ctx,
            inspector,
            body_deadline,
            &bytes_in,
        ));
        match inspected.await {
            Ok(held) => held,
            Err(refused) => {
                if let Some(seconds) = refused.retry_after() {
                    client.pace_after_refusal(seconds);
                }
                return refused.into();
            }
        }
    } else {
        None
    };
    if let Some(file) = static_files::find(ctx, &head.method, head.uri.path()).await {
        return Answer::File(file);
    }
    if cache::may_answer(ctx) {
        let redis = shared.cache_redis.as_ref();
        if let Some(fresh) = Box::pin(cache::look_up_request(ctx, &head, redis)).await {
            return Answer::Cached(fresh, CacheStatus::Hit);
        }
    }
    // After the cache: a resized image the app lets be cached is made once.
    let stage = shared.images.as_ref();
    let image = if images::wants_resize(ctx, &head) {
        Box::pin(images::resize_for(
            stage,
            &shared.connections,
            ctx,
            &head,
            Some(client.ip),
        ))
        .await
    } else {
        None
    };
    if let Some(image) = image {
        let answer = image_answer(image, &head.headers, ctx);
        if let Answer::Refused {
            retry_after: Some(seconds),
            ..
        } = answer
        {
            client.pace_after_refusal(seconds);
        }
        return answer;
    }
    let upgrade = Fields::of(&head.headers, as_read.as_ref()).contains(Known::Upgrade);
    let body_ended = incoming.is_end_stream();
    let mirror_feed = if upgrade {
        None
    } else {
        let has_body = !body_ended || held.as_ref().is_some_and(|h| !h.data.is_empty());
        mirror::start_copy(&worker.mirrors, &head, Some(client.ip), has_body, ctx)
    };
    let answer_form = if head.version != Version::HTTP_2 && !cache::may_answer(ctx) {
        AnswerForm::AsRead
    } else {
        AnswerForm::Map
    };
    if as_read.is_some() {
        // In origin form, with no framing to rewrite and no cookies to join (`client_h1`).
        head.version = Version::HTTP_11;
    } else {
        prepare_for_backend(&mut head);
    }
    let forwarding = Forwarding::new(
        Fields::of(&head.headers, as_read.as_ref()).get(Known::ForwardedFor),
        Some(client.ip),
        client.forwarded_for.as_ref(),
        ctx,
    );

    let timeouts = &route.app.timeouts;
    let connect_timeout = Duration::from_millis(timeouts.connect_ms);
    let read_deadline = Duration::from_millis(timeouts.read_ms);
    // Only a request whose body is all in hand (none, or read whole for the WAF) can be
    // sent again after a failure.
    let repeatable = head.method.is_idempotent() && body_ended && !upgrade;
    let replay = if repeatable { held.clone() } else { None };
    let Some(incoming) = unread.take() else {
        return failed(false);
    };
    let client_failure = Rc::new(Cell::new(None));
    let mut body = Some(
        ForwardBody::new(incoming, body_deadline, bytes_in)
            .limited_to(route.app.limits.as_deref().and_then(|l| l.max_body_bytes))
            .after(held)
            .mirrored_into(mirror_feed)
            .failures_into(client_failure.clone()),
    );
    loop {
        let address = match attempt::begin_attempt(ctx) {
            Ok(address) => address,
            Err(answer) => return answer.into(),
        };
        let connection = match worker.pool.get(address, connect_timeout).await {
            Ok(connection) => connection,
            Err(failure) => {
                if attempt::record_connect_failure(ctx, failure.kind(), &failure.detail()) {
                    continue;
                }
                return failed(matches!(failure, ConnectFailure::TimedOut));
            }
        };
        attempt::register_connection(ctx, &shared.connections, connection.shutdown.clone());
        let may_retry = repeatable && attempt::attempts_left(ctx);
        let again = || {
            replay
                .clone()
                .map_or_else(ForwardBody::empty, ForwardBody::replay)
        };
        let outgoing = body.take().unwrap_or_else(again);
        let answers_head = head.method == Method::HEAD;
        let bound = worker.clock.deadline_in(read_deadline);
        let exchange = std::pin::pin!(connection.exchange(
            &head,
            as_read.as_ref(),
            &forwarding,
            outgoing,
            answers_head,
            answer_form
        ));
        let error = match bound.bound(exchange).await {
            Ok(Ok(response)) => {
                let status = response.status().as_u16();
                attempt::on_response_header(ctx, status);
                // A route with a cache has its request's map (`reads_whole_request`).
                let verdict =
                    cache::on_app_response(&head.headers, ctx, status, response.headers());
                if verdict == AppAnswer::StaleStandsIn {
                    if let Some(stale) = cache::take_stale(ctx) {
                        return Answer::Cached(stale, CacheStatus::Stale);
                    }
                }
                return Answer::Backend {
                    response,
                    read_deadline,
                };
            }
            Ok(Err(e)) => {
                if let Some(failure) = client_failure.get() {
                    // The client's body stopped, not the backend: no retry, no 502.
                    log::debug!(
                        "request {}: the client's body failed ({failure:?}): {e}",
                        ctx.request_id
                    );
                    let status = failure.status();
                    return Answer::own(status, respond::text_for(status));
                }
                e
            }
            Err(_) => {
                count_upstream_error(ctx, "timeout");
                log::warn!(
                    "request {}: app {}: backend {address} sent no answer within {read_deadline:?}",
                    ctx.request_id,
                    ctx.app_name()
                );
                return failed(true);
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
        return failed(false);
    }
}

/// An HTTP/2 request that declares an empty body but has not ended its stream is held until
/// it does: DATA that follows would make it malformed (RFC 9113 §8.1.1), and the backend's
/// answer must not reach the client first as if the request had been well formed. False
/// when the stream carried data, failed or did not end within `deadline`.
async fn empty_body_ends(incoming: &mut RequestBody, deadline: Duration) -> bool {
    loop {
        let next = std::future::poll_fn(|cx| Pin::new(&mut *incoming).poll_frame(cx));
        match tokio::time::timeout(deadline, next).await {
            Ok(None) => return true,
            Ok(Some(Ok(frame))) if frame.data_ref().is_some_and(Bytes::is_empty) => {}
            Ok(Some(Ok(frame))) if frame.is_trailers() => {}
            _ => return false,
        }
    }
}

/// The request head as the backend gets it: origin-form target, the Host routed on, one
/// framing. Hop-by-hop fields are left out, and the forwarding fields put in place of the
/// client's, as the head is written (`backend_h1`), not in the map.
fn prepare_for_backend(head: &mut http::request::Parts) {
    let headers = &mut head.headers;
    if let Some(authority) = head.uri.authority() {
        if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
            headers.insert(HOST, host);
        }
    }
    head.uri = head
        .uri
        .path_and_query()
        .map_or_else(|| Uri::from_static("/"), |p| Uri::from(p.clone()));
    if head.version == Version::HTTP_2 {
        join_cookies(headers);
    }
    head.version = Version::HTTP_11;
    framing::normalise_for_backend(headers);
}

/// Whether a stage on `app`'s route reads the request whole (through `http::request::Parts`):
/// its fields are then made a map first.
fn reads_whole_request(app: &switchyard_model::App) -> bool {
    app.limits.is_some()
        || app.cache.is_some()
        || app.images.is_some()
        || app.mirror.is_some()
        || app.waf.is_some()
}

/// HTTP/2 clients may split `Cookie` into one field per cookie; an HTTP/1.1 backend gets
/// them as the one field HTTP/1.1 allows (RFC 9113 §8.2.3).
fn join_cookies(headers: &mut HeaderMap) {
    let mut cookies = headers.get_all(COOKIE).iter();
    let (Some(first), Some(_)) = (cookies.next(), cookies.next()) else {
        return;
    };
    let mut joined = first.as_bytes().to_vec();
    for cookie in headers.get_all(COOKIE).iter().skip(1) {
        joined.extend_from_slice(b"; ");
        joined.extend_from_slice(cookie.as_bytes());
    }
    if let Ok(joined) = HeaderValue::from_bytes(&joined) {
        headers.insert(COOKIE, joined);
    }
}

fn backend_response(
    mut response: Response<BackendBody>,
    read_deadline: Duration,
    client_upgrade: Option<ClientUpgrade>,
    mut end: Box<RequestEnd>,
) -> Response<AnswerBody> {
    end.status = response.status().as_u16();
    // The client's connection speaks its own version, whatever the backend's was (the
    // HTTP/1 driver writes an HTTP/1.1 status line to every client, as nginx does).
    *response.version_mut() = Version::HTTP_11;
    // The backend's hop-by-hop fields were left out when its head was read. Fields that go
    // on as read get the router's own from the HTTP/1.x driver (`RouterFields`), no map.
    end.answer_fields = response.body_mut().take_fields();
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
            end.ctx.local_status = Some(502);
            log::warn!(
                "request {}: app {}: the backend switched protocols unasked",
                end.ctx.request_id,
                end.ctx.app_name()
            );
            let body = respond::error_body(502, respond::text_for(502), &end.ctx.request_id);
            return local_response(502, body, None, end);
        };
        let (parts, body) = response.into_parts();
        tokio::task::spawn_local(relay::run(client_upgrade, body.into_upgraded(), end));
        return Response::from_parts(parts, AnswerBody::local(Bytes::new(), None));
    }
    if end.ctx.cache.is_some() && response.body().is_end_stream() {
        // An empty body is never read: a response the cache keeps is complete now.
        cache::on_response_body(&mut end.ctx, &None, true);
    }
    if reads_ahead(&response, &end) {
        let buffers = end.worker.shared.response_buffers.clone();
        let worker = end.worker.clone();
        return response.map(|body| {
            AnswerBody::read_ahead(ReadAhead::start(body, read_deadline, worker, buffers), end)
        });
    }
    response.map(|body| AnswerBody::from_backend(body, read_deadline, end))
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
    body: String,
    location: Option<String>,
    mut end: Box<RequestEnd>,
) -> Response<AnswerBody> {
    end.ctx.local_status = Some(status);
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
    response.map(|()| AnswerBody::local(Bytes::from(body), Some(end)))
}

/// The answer of the images stage; a resized image goes through the cache's decisions as
/// the app's own answers do.
fn image_answer(image: ImageAnswer, request_headers: &HeaderMap, ctx: &mut RequestCtx) -> Answer {
    let (content_type, body, cache_control) = match image {
        ImageAnswer::Refused {
            status,
            text,
            retry_after,
        } => {
            return Answer::Refused {
                status,
                text: Cow::Owned(text),
                retry_after: retry_after.then_some(respond::POOL_BUSY_RETRY_AFTER_S),
            }
        }
        ImageAnswer::Resized {
            content_type,
            body,
            cache_control,
        } => (content_type, body, cache_control),
    };
    let mut headers = HeaderMap::with_capacity(4);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    if let Some(value) = cache_control.and_then(|v| HeaderValue::try_from(v).ok()) {
        headers.insert(CACHE_CONTROL, value);
    }
    if let Some(label) = cache::keep_local_answer(request_headers, ctx, 200, &headers, &body) {
        headers.insert(X_CACHE, HeaderValue::from_static(label));
    }
    Answer::Made { headers, body }
}

/// An answer the router has whole: from the cache, or made here. A HEAD gets its head.
fn made_response(
    status: u16,
    headers: HeaderMap,
    body: Bytes,
    mut end: Box<RequestEnd>,
) -> Response<AnswerBody> {
    end.ctx.local_status = Some(status);
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
    end.ctx.local_status = Some(200);
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
/// apps that ask.
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

/// The router's own fields on an app's answer: the request id, and HSTS over HTTPS for an
/// app that asks for it. They replace a field of the same name the app sent. Put in the
/// answer's map (`set_router_headers`), or, for an answer whose fields go on as read, written
/// after them by the HTTP/1.x driver with no map made.
pub(super) struct RouterFields<'a> {
    request_id: &'a str,
    hsts: Option<String>,
}

impl<'a> RouterFields<'a> {
    pub(super) fn of(ctx: &'a RequestCtx) -> Self {
        Self {
            request_id: &ctx.request_id,
            hsts: https::hsts_value(ctx),
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&'static HeaderName, &[u8])> + Clone {
        static REQUEST_ID: HeaderName = X_REQUEST_ID;
        static HSTS: HeaderName = STRICT_TRANSPORT_SECURITY;
        let hsts = self.hsts.as_deref().map(str::as_bytes);
        [
            (&REQUEST_ID, Some(self.request_id.as_bytes())),
            (&HSTS, hsts),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)))
    }
}

/// The answer to a request no backend answered: 504 when one took too long, 502 otherwise.
fn failed(timed_out: bool) -> Answer {
    let status = if timed_out { 504 } else { 502 };
    Answer::own(status, respond::text_for(status))
}

fn count_upstream_error(ctx: &RequestCtx, kind: &'static str) {
    metrics::UPSTREAM_ERRORS
        .with_label_values(&[ctx.app_name(), kind])
        .inc();
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

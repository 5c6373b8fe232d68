//! The app's proxy-wasm filters (`switchyard-filters` runs them): the request's head, its
//! body read whole, the app's answer head, and the log, each handed to the filters in the
//! views the ABI gives them, and their edits, answers and failures made the request's.
//! The calls they dispatch (`proxy_http_call`) go to an app of this router named by the
//! filter, through this thread's side connections.

use std::cell::Cell;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use http_body::Body as _;
use http_body_util::{BodyExt, Full};
use switchyard_filters::{
    HttpCall, HttpCallAnswer, HttpCalls, LocalResponse, RequestFacts, RequestFilters, RequestHead,
    ResponseHead, Verdict,
};

use crate::body_read::{read_to_end, BodyError, ReadDeadline};
use crate::context::RequestCtx;
use crate::event_loop::EventLoop;
use crate::request_body::{Held, RequestBody};
use crate::respond::{Reason, Refusal};
use crate::routing::route_cache::AppRoute;
use crate::upstream::attempt::{self, SideConnectFailure};
use crate::upstream::backend_h1::BackendBody;

/// The body filters read when the app sets no `max_body_bytes`.
const DEFAULT_BODY_LIMIT: u64 = 1 << 20;
/// The largest answer body the filters are handed.
const MAX_ANSWER_BODY: u64 = 1 << 20;
/// The most of a call's answer a filter is given.
const MAX_CALL_ANSWER_BYTES: usize = 1 << 20;
/// How long connecting to a called app may take, within the call's timeout.
const CALL_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What the filters made of the request: it goes on, or this answers it.
pub(crate) enum Outcome {
    Continue,
    Answer(LocalResponse),
    Refused(Refusal),
}

impl From<Verdict> for Outcome {
    fn from(verdict: Verdict) -> Self {
        match verdict {
            Verdict::Continue => Outcome::Continue,
            Verdict::Respond(local) => Outcome::Answer(local),
            Verdict::Failed { .. } => Outcome::Refused(Reason::FilterFailed.into()),
        }
    }
}

/// The request's head through the app's filters: their contexts made (kept in `ctx` for
/// the rest of the request), `on_http_request_headers`, their edits applied to `head`.
pub(crate) async fn on_request_head(
    route: &AppRoute,
    head: &mut http::request::Parts,
    peer: SocketAddr,
    ctx: &mut RequestCtx,
    worker: &EventLoop,
) -> Outcome {
    let Some(filters) = route.filters.as_deref() else {
        return Outcome::Continue;
    };
    if let Some((name, why)) = &filters.missing {
        log::warn!(
            "app '{}': the filter '{name}' cannot run: {why}",
            route.app.name.as_str()
        );
        return Outcome::Refused(Reason::FilterFailed.into());
    }
    let facts = RequestFacts {
        app: route.app.name.as_str().into(),
        source: Some(peer),
        request_id: ctx.request_id.to_string(),
        protocol: protocol(head.version),
    };
    let (mut run, started) = RequestFilters::start(&filters.plugins, facts).await;
    if started != Verdict::Continue {
        ctx.filters = Some(Box::new(run));
        return started.into();
    }
    let fields = std::mem::take(&mut head.headers);
    let mut view = request_view(head, ctx, fields);
    let no_body = ctx.declared_length == Some(0);
    let calls = Calls { worker };
    let verdict = run.request_headers(&mut view, no_body, &calls).await;
    head.headers = std::mem::take(&mut view.headers);
    let path = head.uri.path_and_query().map_or("/", |p| p.as_str());
    if view.path != path {
        if let Ok(uri) = view.path.parse::<Uri>() {
            head.uri = uri;
        }
    }
    if view.method != head.method.as_str() {
        if let Ok(changed) = Method::from_bytes(view.method.as_bytes()) {
            head.method = changed;
        }
    }
    if Some(&view.authority) != ctx.host.as_ref() && !view.authority.is_empty() {
        if let Ok(host) = HeaderValue::from_str(&view.authority) {
            head.headers.insert(HOST, host);
        }
    }
    run.keep_for_log(view);
    ctx.filters = Some(Box::new(run));
    verdict.into()
}

/// The request's body through the filters: read whole (after what the WAF held, if it
/// did), within the app's `max_body_bytes` (1 MiB without one), handed to
/// `on_http_request_body`, and sent on with its length as the filters left it.
pub(crate) async fn on_request_body(
    head: &mut http::request::Parts,
    incoming: &mut RequestBody,
    held: Option<Held>,
    ctx: &mut RequestCtx,
    worker: &EventLoop,
    bytes_in: &Cell<usize>,
) -> Result<Option<Held>, Outcome> {
    let has_body = !incoming.is_end_stream() || held.as_ref().is_some_and(|h| !h.data.is_empty());
    if !has_body {
        return Ok(held);
    }
    let Some(mut run) = take_run(ctx, RequestFilters::any_alive) else {
        return Ok(held);
    };
    let limit = (ctx.route.as_ref())
        .and_then(|route| route.app.limits.as_deref())
        .and_then(|limits| limits.max_body_bytes)
        .unwrap_or(DEFAULT_BODY_LIMIT);
    // What the WAF held, then the rest.
    let (mut body, held_trailers) = match held {
        Some(held) => (held.data.to_vec(), held.trailers),
        None => (Vec::new(), None),
    };
    let deadline = ReadDeadline::new(worker.shared.client_timeouts.body);
    let counted_already = incoming.counted_already();
    let counted = |piece| {
        if !counted_already {
            bytes_in.set(bytes_in.get() + piece);
        }
    };
    let read = read_to_end(
        incoming,
        &mut body,
        limit,
        deadline,
        BodyError::Peer,
        counted,
    )
    .await;
    let trailers = match read {
        Ok(trailers) => trailers.or(held_trailers),
        Err(stopped) => {
            ctx.filters = Some(run);
            let reason = match stopped {
                BodyError::TooLarge(_) => Reason::FilterBodyTooLarge,
                BodyError::TimedOut(_) => Reason::ClientBodyTimedOut,
                _ => Reason::ClientBodyBroken,
            };
            return Err(Outcome::Refused(reason.into()));
        }
    };
    let view = request_view(head, ctx, head.headers.clone());
    let verdict = run.request_body(&view, &mut body, &Calls { worker }).await;
    ctx.filters = Some(run);
    match Outcome::from(verdict) {
        Outcome::Continue => {}
        other => return Err(other),
    }
    // The body goes on whole, with the length it has now.
    head.headers.remove(TRANSFER_ENCODING);
    head.headers
        .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    ctx.declared_length = Some(body.len() as u64);
    Ok(Some(Held {
        data: Bytes::from(body),
        trailers,
    }))
}

/// The app's answer head through the filters, backwards: their edits applied to `response`.
pub(crate) async fn on_answer_head<B>(
    response: &mut Response<B>,
    ctx: &mut RequestCtx,
    worker: &EventLoop,
) -> Outcome {
    let Some(mut run) = take_run(ctx, RequestFilters::any_alive) else {
        return Outcome::Continue;
    };
    let mut view = ResponseHead {
        status: response.status().as_u16(),
        headers: std::mem::take(response.headers_mut()),
    };
    let verdict = run
        .response_headers(&mut view, false, &Calls { worker })
        .await;
    *response.headers_mut() = std::mem::take(&mut view.headers);
    if let Ok(status) = StatusCode::from_u16(view.status) {
        *response.status_mut() = status;
    }
    ctx.filters = Some(run);
    verdict.into()
}

/// The app's answer body through the filters, when one paused on the answer's head for it
/// and it can be read whole first: declared
/// (`Content-Length`) within [`MAX_ANSWER_BODY`], not compressed or kept by the cache on its
/// way (those streams are the router's own), and not the answer to a HEAD. It is then read,
/// its connection given back, handed to `on_http_response_body` once, and answered as the
/// filters left it; any other answer streams by without the body callback.
pub(crate) async fn on_answer_body(
    response: &mut Response<BackendBody>,
    head_only: bool,
    ctx: &mut RequestCtx,
    worker: &EventLoop,
) -> Option<Outcome> {
    let status = response.status().as_u16();
    let declared =
        (response.headers().get(CONTENT_LENGTH)).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let readable = !head_only
        && ctx.encoder.is_none()
        && ctx.cache.is_none()
        && !matches!(status, 100..=199 | 204 | 304)
        && declared.is_some_and(|length| length <= MAX_ANSWER_BODY);
    if !readable {
        return None;
    }
    let mut run = take_run(ctx, RequestFilters::wants_answer_body)?;
    let deadline = ReadDeadline::new(crate::upstream::read_deadline(ctx));
    let mut body = Vec::new();
    let read = read_to_end(
        response.body_mut(),
        &mut body,
        MAX_ANSWER_BODY,
        deadline,
        BodyError::Backend,
        |_| {},
    );
    if let Err(stopped) = read.await {
        ctx.filters = Some(run);
        return Some(Outcome::Refused(match stopped {
            BodyError::TimedOut(_) => Reason::UpstreamTimedOut.into(),
            _ => Refusal::upstream_failed(false),
        }));
    }
    if let Some(connection) = response.body_mut().take_reusable() {
        worker.pool.put(connection);
    }
    let view = ResponseHead {
        status,
        headers: response.headers().clone(),
    };
    let verdict = run.response_body(&view, &mut body, &Calls { worker }).await;
    ctx.filters = Some(run);
    match Outcome::from(verdict) {
        Outcome::Continue => {}
        other => return Some(other),
    }
    let headers = (response.headers().iter())
        .filter(|(name, _)| **name != CONTENT_LENGTH && **name != TRANSFER_ENCODING)
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    Some(Outcome::Answer(LocalResponse {
        status,
        headers,
        body: Bytes::from(body),
        details: String::new(),
    }))
}

/// The request's filters, taken out of `ctx` (to be put back) when `wanted` says they have
/// work in this phase.
fn take_run(
    ctx: &mut RequestCtx,
    wanted: fn(&RequestFilters) -> bool,
) -> Option<Box<RequestFilters>> {
    ctx.filters.take_if(|run| wanted(run))
}

/// The request's head as the filters see it, with `fields` as its fields.
fn request_view(head: &http::request::Parts, ctx: &RequestCtx, fields: HeaderMap) -> RequestHead {
    RequestHead {
        method: head.method.as_str().to_string(),
        path: (head.uri.path_and_query())
            .map_or("/", |p| p.as_str())
            .to_string(),
        authority: ctx.host.clone().unwrap_or_default(),
        scheme: if ctx.tls { "https" } else { "http" },
        headers: fields,
    }
}

fn protocol(version: Version) -> &'static str {
    match version {
        Version::HTTP_2 => "HTTP/2",
        Version::HTTP_3 => "HTTP/3",
        Version::HTTP_10 => "HTTP/1.0",
        _ => "HTTP/1.1",
    }
}

/// The calls filters dispatch, made from this thread: the upstream a filter names is an
/// app of this router, reached at one of its backends as the router reaches it.
struct Calls<'a> {
    worker: &'a EventLoop,
}

impl HttpCalls for Calls<'_> {
    fn call<'a>(
        &'a self,
        call: &'a HttpCall,
    ) -> Pin<Box<dyn Future<Output = Option<HttpCallAnswer>> + 'a>> {
        Box::pin(async move {
            match tokio::time::timeout(call.timeout, self.make(call)).await {
                Ok(Ok(answer)) => Some(answer),
                Ok(Err(why)) => {
                    log::info!("a filter's call to '{}' failed: {why}", call.upstream);
                    None
                }
                Err(_) => {
                    log::info!(
                        "a filter's call to '{}' timed out after {:?}",
                        call.upstream,
                        call.timeout
                    );
                    None
                }
            }
        })
    }
}

impl Calls<'_> {
    async fn make(&self, call: &HttpCall) -> Result<HttpCallAnswer, String> {
        let shared = &self.worker.shared;
        let route = (shared.routes.app(&call.upstream).await)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no app named '{}'", call.upstream))?;
        let mut ctx = RequestCtx::new();
        ctx.route = Some(route);
        let pool = &self.worker.filter_calls;
        let mut connection =
            attempt::connect_side(&mut ctx, pool, CALL_CONNECT_TIMEOUT.min(call.timeout))
                .await
                .map_err(|failure| match failure {
                    SideConnectFailure::NoBackend(_) => {
                        "the app has no reachable container".to_string()
                    }
                    SideConnectFailure::Connect(e) => e.to_string(),
                })?;
        let pseudo = |name: &str| {
            call.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_slice())
        };
        let method =
            Method::from_bytes(pseudo(":method").unwrap_or(b"GET")).map_err(|e| e.to_string())?;
        let path =
            std::str::from_utf8(pseudo(":path").unwrap_or(b"/")).map_err(|e| e.to_string())?;
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .version(Version::HTTP_11)
            .body(
                Full::new(call.body.clone())
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
            .map_err(|e| e.to_string())?;
        let fields = request.headers_mut();
        for (name, value) in call.headers.iter().filter(|(k, _)| !k.starts_with(':')) {
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_bytes(value),
            ) {
                fields.append(name, value);
            }
        }
        if let Some(Ok(host)) = pseudo(":authority").map(HeaderValue::from_bytes) {
            fields.insert(HOST, host);
        }
        let response = connection
            .sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let (parts, mut body) = response.into_parts();
        let mut collected = BytesMut::new();
        while let Some(frame) = body.frame().await {
            if let Ok(piece) = frame.map_err(|e| e.to_string())?.into_data() {
                if collected.len() + piece.len() > MAX_CALL_ANSWER_BYTES {
                    return Err("the answer is larger than 1 MiB".into());
                }
                collected.extend_from_slice(&piece);
            }
        }
        ctx.release_attempt();
        pool.put(connection);
        Ok(HttpCallAnswer {
            status: parts.status.as_u16(),
            headers: (parts.headers.iter())
                .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
                .collect(),
            body: collected.freeze(),
        })
    }
}

//! Stage mirror: copy a share of an app's requests to its shadow backends and ignore their
//! answers.
//!
//! The primary never waits for a shadow. A copy runs in its own task on its own connection
//! pool with its own deadlines; the request body reaches it through a channel the request
//! path only ever pushes into, never awaits. What can pile up is bounded twice: at most
//! `max_in_flight` copies per app (more are dropped, not queued) and at most
//! `max_body_bytes` of body per copy (a larger body is not mirrored).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderValue, Request, Version};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty};
use parking_lot::Mutex;
use switchyard_model::{Mirror, MirrorKey};
use tokio::sync::mpsc;

use crate::body_feed::{BodyEvent, BodyFeed};
use crate::context::RequestCtx;
use crate::cookies::cookie_values;
use crate::forwarded;
use crate::hop_by_hop;
use crate::metrics;
use crate::request_fields::Fields;
use crate::routing::mirror_state::CopyInFlight;
use crate::routing::route_cache::AppRoute;
use crate::upstream::outbound::{ConnectError, SideBody, SidePool, Target, TlsTarget};

/// Idle keep-alive connections kept to shadow backends, per thread, over all apps. A shadow that takes
/// 1 s at 1,000 req/s holds 1,000 connections; a smaller pool would reconnect for most copies.
const MIRROR_POOL_SIZE: usize = 2048;
/// A shadow's response body is read (and discarded) up to this size so its connection can
/// be reused; beyond it the connection is closed instead.
const MAX_DRAINED_RESPONSE: usize = 1024 * 1024;
/// `Expect` asks the next hop for a 100 the client waits for: a shadow's would go nowhere.
const NOT_MIRRORED: &str = "expect";

/// One thread's connections to shadow backends, shared by every app and separate from the
/// primary backends' pool so shadows can never take a primary's connection.
pub(crate) struct MirrorClient {
    pool: SidePool,
}

impl MirrorClient {
    pub(crate) fn new() -> Self {
        Self {
            pool: SidePool::new(
                MIRROR_POOL_SIZE,
                metrics::SIDE_IDLE_CONNECTIONS.with_label_values(&["mirror"]),
            ),
        }
    }

    /// Closes this thread's shadow connections idle for too long.
    pub(crate) fn sweep_idle(&self) {
        self.pool.sweep();
    }
}

/// Why a copy was not delivered; the label of `switchyard_mirror_dropped_total`.
#[derive(Debug, Clone, Copy)]
enum Dropped {
    InFlightLimit,
    BodyLimit,
    /// The client's request ended before its body did (or the primary failed first).
    Aborted,
    Error,
    Timeout,
}

impl Dropped {
    fn label(self) -> &'static str {
        match self {
            Self::InFlightLimit => "in_flight_limit",
            Self::BodyLimit => "body_limit",
            Self::Aborted => "aborted",
            Self::Error => "error",
            Self::Timeout => "timeout",
        }
    }

    fn count(self, app: &str) {
        metrics::MIRROR_DROPPED
            .with_label_values(&[app, self.label()])
            .inc();
    }
}

/// Starts a copy of `request` (not an upgrade) when its app mirrors and the request is in
/// the share; the feed its body must be pushed into, when `has_body`.
pub(crate) fn start_copy(
    client: &Arc<MirrorClient>,
    request: &http::request::Parts,
    client_ip: Option<IpAddr>,
    has_body: bool,
    ctx: &RequestCtx,
) -> Option<BodyFeed> {
    let route = ctx.route.as_ref()?;
    let (Some(mirror), Some(state)) = (route.app.mirror.as_ref(), route.mirror.as_ref()) else {
        return None;
    };
    if !mirror.applies_to(request.method.as_str(), request.uri.path())
        || !is_selected(mirror, request, client_ip)
    {
        return None;
    }
    let app = route.app.name.as_str();
    if ctx
        .declared_length
        .is_some_and(|length| length > mirror.max_body_bytes)
    {
        Dropped::BodyLimit.count(app);
        return None;
    }
    let Some(in_flight) = state.try_acquire(mirror.max_in_flight) else {
        Dropped::InFlightLimit.count(app);
        return None;
    };
    let head = match copy_head(request, client_ip, ctx, has_body) {
        Ok(head) => head,
        Err(e) => {
            log::debug!("request {}: mirror copy not built: {e}", ctx.request_id);
            Dropped::Error.count(app);
            return None;
        }
    };
    let address = state.pick(&mirror.backends)?;
    let (feed, body) = if has_body {
        let (feed, receiver) = BodyFeed::new(mirror.max_body_bytes);
        (Some(feed), Some(receiver))
    } else {
        (None, None)
    };
    let copy = ShadowCopy {
        target: shadow_target(mirror, address),
        head,
        body,
        timeout: Duration::from_millis(mirror.timeout_ms),
        route: route.clone(),
        request_id: ctx.request_id.clone(),
        _in_flight: in_flight,
    };
    tokio::spawn(copy.run(client.clone()));
    feed
}

fn is_selected(mirror: &Mirror, request: &http::request::Parts, client_ip: Option<IpAddr>) -> bool {
    match &mirror.key {
        MirrorKey::Random => mirror.selects_draw(rand::random()),
        MirrorKey::ClientIp => {
            client_ip.is_some_and(|ip| mirror.selects(ip.to_string().as_bytes()))
        }
        MirrorKey::Header(name) => request
            .headers
            .get(name.as_str())
            .is_some_and(|v| mirror.selects(v.as_bytes())),
        MirrorKey::Query(name) => request
            .uri
            .query()
            .and_then(|query| query_value(query, name))
            .is_some_and(|v| mirror.selects(v.as_bytes())),
        MirrorKey::Cookie(name) => {
            cookie_values(Fields::Map(&request.headers).values("cookie"), name)
                .next()
                .is_some_and(|v| mirror.selects(v.as_bytes()))
        }
    }
}

/// The first value of `name` in a query string, as sent.
fn query_value<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then_some(value)
    })
}

/// The request as the shadow sees it: the client's method, path, query and end-to-end
/// headers, the forwarding headers the primary gets, and `X-Mirrored-By`.
fn copy_head(
    request: &http::request::Parts,
    client_ip: Option<IpAddr>,
    ctx: &RequestCtx,
    has_body: bool,
) -> Result<http::request::Parts, http::Error> {
    let target = request.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let (mut copy, ()) = Request::builder()
        .method(request.method.clone())
        .uri(target)
        .version(Version::HTTP_11)
        .body(())?
        .into_parts();
    for (name, value) in hop_by_hop::end_to_end(&request.headers) {
        if name != NOT_MIRRORED {
            copy.headers.append(name.clone(), value.clone());
        }
    }
    if !copy.headers.contains_key(header::HOST) {
        if let Some(host) = request
            .uri
            .authority()
            .map(|a| a.as_str())
            .or(ctx.host.as_deref())
        {
            copy.headers
                .insert(header::HOST, HeaderValue::from_str(host)?);
        }
    }
    if has_body && !copy.headers.contains_key(header::CONTENT_LENGTH) {
        copy.headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
    }
    let hop = ctx.hop(request.version);
    forwarded::set_forwarded_headers(client_ip, &mut copy.headers, &hop);
    copy.headers
        .insert("x-mirrored-by", HeaderValue::from_static("switchyard"));
    Ok(copy)
}

fn shadow_target(mirror: &Mirror, address: SocketAddr) -> Target {
    Target {
        address,
        tls: mirror.tls.then(|| TlsTarget {
            server_name: mirror.sni.clone(),
            verify: mirror.verify_tls,
        }),
        // A shadow is another service, not the app's backends: it gets plain HTTP.
        proxy_protocol: None,
    }
}

/// One copy on its way to a shadow backend.
struct ShadowCopy {
    target: Target,
    head: http::request::Parts,
    body: Option<mpsc::UnboundedReceiver<BodyEvent>>,
    timeout: Duration,
    route: Arc<AppRoute>,
    request_id: Arc<str>,
    _in_flight: CopyInFlight,
}

impl ShadowCopy {
    async fn run(self, client: Arc<MirrorClient>) {
        let route = self.route.clone();
        let app = route.app.name.as_str();
        let request_id = self.request_id.clone();
        match self.deliver(&client.pool).await {
            Ok((status, waited)) => {
                metrics::MIRROR_SENT
                    .with_label_values(&[app, metrics::status_class(status)])
                    .inc();
                metrics::MIRROR_DURATION
                    .with_label_values(&[app])
                    .observe(waited.as_secs_f64());
            }
            Err((reason, detail)) => {
                log::debug!(
                    "request {request_id}: mirror copy for app {app} dropped ({}): {detail}",
                    reason.label()
                );
                reason.count(app);
            }
        }
    }

    /// Sends the copy and reads the shadow's answer; returns its status and the time from
    /// the end of the body to its head. Every step — connecting, each piece of body, the
    /// answer — must make progress within the mirror's timeout; waiting for the client's
    /// next piece of body does not count.
    async fn deliver(self, pool: &SidePool) -> Result<(u16, Duration), (Dropped, String)> {
        let timeout = self.timeout;
        let mut connection = pool.get(&self.target, timeout).await.map_err(|e| match e {
            ConnectError::TimedOut => (Dropped::Timeout, e.to_string()),
            ConnectError::Failed(_) => (Dropped::Error, e.to_string()),
        })?;
        let progress = Arc::new(Progress::new(timeout));
        let body: SideBody = match self.body {
            Some(events) => CopyBody {
                events,
                progress: progress.clone(),
            }
            .boxed_unsync(),
            None => Empty::new().map_err(|never| match never {}).boxed_unsync(),
        };
        let request = Request::from_parts(self.head, body);
        let response = progress
            .within(connection.sender.send_request(request))
            .await?
            .map_err(|e| failed(&e))?;
        let body_sent = progress.body_ended_at();
        let status = response.status().as_u16();
        let waited = body_sent.elapsed();
        // The answer's body is read and dropped so the connection can be reused; a large
        // one is not worth it.
        let mut answer = response.into_body();
        let mut drained = 0;
        let mut complete = false;
        while drained <= MAX_DRAINED_RESPONSE {
            progress.restart();
            match progress.within(answer.frame()).await? {
                Some(Ok(frame)) => drained += frame.data_ref().map_or(0, Bytes::len),
                Some(Err(e)) => return Err(failed(&e)),
                None => {
                    complete = true;
                    break;
                }
            }
        }
        if complete {
            pool.put(connection);
        }
        Ok((status, waited))
    }
}

/// When a copy must next make progress: `None` while it waits for the client's body.
struct Progress {
    timeout: Duration,
    due: Mutex<Option<Instant>>,
    body_ended: Mutex<Option<Instant>>,
}

impl Progress {
    fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            due: Mutex::new(Some(Instant::now() + timeout)),
            body_ended: Mutex::new(None),
        }
    }

    fn restart(&self) {
        *self.due.lock() = Some(Instant::now() + self.timeout);
    }

    fn waiting_for_client(&self) {
        *self.due.lock() = None;
    }

    fn body_ended(&self) {
        *self.body_ended.lock() = Some(Instant::now());
        self.restart();
    }

    /// When the body ended (the request was sent), or now for a request without one.
    fn body_ended_at(&self) -> Instant {
        self.body_ended.lock().unwrap_or_else(Instant::now)
    }

    /// `step`'s outcome, or a timeout once progress is overdue.
    async fn within<T>(
        &self,
        step: impl std::future::Future<Output = T>,
    ) -> Result<T, (Dropped, String)> {
        tokio::pin!(step);
        loop {
            let due = *self.due.lock();
            let wake = due.unwrap_or_else(|| Instant::now() + self.timeout);
            tokio::select! {
                done = &mut step => return Ok(done),
                _ = tokio::time::sleep_until(wake.into()) => {
                    if self.due.lock().is_some_and(|due| due <= Instant::now()) {
                        return Err((Dropped::Timeout, format!("no progress within {:?}", self.timeout)));
                    }
                }
            }
        }
    }
}

/// The client's body as the copy sends it, ending in an error that says why when the copy
/// must not be completed (over the limit, or the client's request ended first).
struct CopyBody {
    events: mpsc::UnboundedReceiver<BodyEvent>,
    progress: Arc<Progress>,
}

/// Why a copy's body stopped short.
#[derive(Debug)]
struct BodyStopped(Dropped);

impl std::fmt::Display for BodyStopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Dropped::BodyLimit => f.write_str("body over max_body_bytes"),
            _ => f.write_str("request ended before its body"),
        }
    }
}

impl std::error::Error for BodyStopped {}

impl Body for CopyBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.events.poll_recv(cx) {
            Poll::Pending => {
                self.progress.waiting_for_client();
                Poll::Pending
            }
            Poll::Ready(Some(BodyEvent::Data(chunk))) => {
                self.progress.restart();
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
            Poll::Ready(Some(BodyEvent::End)) => {
                self.progress.body_ended();
                Poll::Ready(None)
            }
            Poll::Ready(Some(BodyEvent::OverLimit)) => {
                Poll::Ready(Some(Err(Box::new(BodyStopped(Dropped::BodyLimit)))))
            }
            Poll::Ready(None) => Poll::Ready(Some(Err(Box::new(BodyStopped(Dropped::Aborted))))),
        }
    }
}

/// A failed exchange: why, as the copy's body said, or an error of the shadow's side.
fn failed(error: &(dyn std::error::Error + 'static)) -> (Dropped, String) {
    let mut source = Some(error);
    while let Some(cause) = source {
        if let Some(BodyStopped(reason)) = cause.downcast_ref::<BodyStopped>() {
            return (*reason, cause.to_string());
        }
        source = cause.source();
    }
    (Dropped::Error, error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_found_as_sent() {
        assert_eq!(query_value("a=1&apikey=k%20y&b", "apikey"), Some("k%20y"));
        assert_eq!(query_value("b&apikey", "apikey"), Some(""));
        assert_eq!(query_value("apikeyx=1", "apikey"), None);
    }
}

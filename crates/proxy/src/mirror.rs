//! Stage mirror: copy a share of an app's requests to its shadow backends and ignore their
//! answers.
//!
//! The primary never waits for a shadow. A copy runs in its own task on its own connection
//! pool with its own deadlines; the request body reaches it through a channel the request
//! path only ever pushes into, never awaits. What can pile up is bounded twice: at most
//! `max_in_flight` copies per app (more are dropped, not queued) and at most
//! `max_body_bytes` of body per copy (a larger body is not mirrored).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header;
use pingora::connectors::http::v1::Connector;
use pingora::connectors::ConnectorOptions;
use pingora::http::RequestHeader;
use pingora::protocols::http::v1::client::HttpSession;
use pingora::proxy::Session;
use pingora::upstreams::peer::HttpPeer;
use prometheus::IntGauge;
use switchyard_model::{Mirror, MirrorKey};
use tokio::sync::mpsc;

use crate::context::RequestCtx;
use crate::metrics;
use crate::route_cache::AppRoute;
use crate::upstream;

/// Idle keep-alive connections kept to shadow backends, per thread, over all apps. A shadow that takes
/// 1 s at 1,000 req/s holds 1,000 connections; a smaller pool would reconnect for most copies.
const MIRROR_POOL_SIZE: usize = 2048;
/// How long an idle connection to a shadow backend stays pooled.
const MIRROR_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// A shadow's response body is read (and discarded) up to this size so its connection can
/// be reused; beyond it the connection is closed instead.
const MAX_DRAINED_RESPONSE: usize = 1024 * 1024;
/// Headers that describe one hop, not the request: never copied to a shadow.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
];

/// The connections to shadow backends, shared by every app and separate from the primary
/// backends' pool so shadows can never take a primary's connection.
pub(crate) struct MirrorClient {
    connector: Connector,
}

impl MirrorClient {
    pub(crate) fn new() -> Self {
        Self {
            connector: Connector::new(Some(ConnectorOptions::new(MIRROR_POOL_SIZE))),
        }
    }
}

/// Live mirroring state of one app, kept with its route. The in-flight count outlives
/// route rebuilds (a change to the app) so the cap holds across them.
#[derive(Debug)]
pub struct MirrorState {
    in_flight: Arc<AtomicU32>,
    next_backend: AtomicUsize,
    in_flight_gauge: IntGauge,
}

impl MirrorState {
    /// State for `app`, continuing the count of the route it replaces.
    pub(crate) fn new(app: &str, previous: Option<&MirrorState>) -> Self {
        Self {
            in_flight: previous.map_or_else(Default::default, |p| p.in_flight.clone()),
            next_backend: AtomicUsize::new(0),
            in_flight_gauge: metrics::MIRROR_IN_FLIGHT.with_label_values(&[app]),
        }
    }

    fn try_acquire(&self, cap: u32) -> Option<InFlight> {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            })
            .ok()?;
        self.in_flight_gauge.inc();
        Some(InFlight {
            count: self.in_flight.clone(),
            gauge: self.in_flight_gauge.clone(),
        })
    }

    fn pick(&self, backends: &[SocketAddr]) -> Option<SocketAddr> {
        let turn = self.next_backend.fetch_add(1, Ordering::Relaxed);
        backends.get(turn % backends.len().max(1)).copied()
    }
}

/// One copy counted against the app's `max_in_flight` until dropped.
struct InFlight {
    count: Arc<AtomicU32>,
    gauge: IntGauge,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
        self.gauge.dec();
    }
}

/// The request path's end of a copy in progress: body chunks are pushed here as they
/// arrive from the client.
#[derive(Debug)]
pub(crate) struct MirrorFeed {
    sender: mpsc::UnboundedSender<BodyEvent>,
    limit: u64,
    /// Body bytes handed to the copy so far.
    forwarded: u64,
    /// Body bytes seen by the current upstream attempt: a retry replays the body from its
    /// start, and only what goes beyond `forwarded` is new.
    seen_this_attempt: u64,
}

#[derive(Debug)]
enum BodyEvent {
    Data(Bytes),
    End,
    OverLimit,
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

/// Starts a copy of this request when its app mirrors and the request is in the share.
pub(crate) fn start(client: &Arc<MirrorClient>, session: &mut Session, ctx: &mut RequestCtx) {
    if session.is_upgrade_req() {
        return;
    }
    let client_ip = session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip());
    let has_body = !session.is_body_empty();
    ctx.mirror = start_copy(client, session.req_header(), client_ip, has_body, ctx);
}

/// Starts a copy of `request` (not an upgrade) when its app mirrors and the request is in
/// the share; the feed its body must be pushed into, when `has_body`.
pub(crate) fn start_copy(
    client: &Arc<MirrorClient>,
    request: &http::request::Parts,
    client_ip: Option<IpAddr>,
    has_body: bool,
    ctx: &RequestCtx,
) -> Option<MirrorFeed> {
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
    let declared_length = request
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared_length.is_some_and(|length| length > mirror.max_body_bytes) {
        Dropped::BodyLimit.count(app);
        return None;
    }
    let Some(in_flight) = state.try_acquire(mirror.max_in_flight) else {
        Dropped::InFlightLimit.count(app);
        return None;
    };
    let header = match copy_header(request, client_ip, ctx, has_body) {
        Ok(header) => header,
        Err(e) => {
            log::debug!("request {}: mirror copy not built: {e}", ctx.request_id);
            Dropped::Error.count(app);
            return None;
        }
    };
    let address = state.pick(&mirror.backends)?;
    let (feed, body) = if has_body {
        // Unbounded in count but not in bytes: the feed stops at `max_body_bytes`.
        let (sender, receiver) = mpsc::unbounded_channel();
        let feed = MirrorFeed {
            sender,
            limit: mirror.max_body_bytes,
            forwarded: 0,
            seen_this_attempt: 0,
        };
        (Some(feed), Some(receiver))
    } else {
        (None, None)
    };
    let copy = Copy {
        peer: shadow_peer(mirror, address),
        header,
        body,
        timeout: Duration::from_millis(mirror.timeout_ms),
        route: route.clone(),
        request_id: ctx.request_id.clone(),
        _in_flight: in_flight,
    };
    tokio::spawn(copy.run(client.clone()));
    feed
}

/// Hands a piece of the client's body to the copy in progress, if any. Never waits.
pub(crate) fn forward_body(ctx: &mut RequestCtx, chunk: Option<&Bytes>, end_of_stream: bool) {
    if let Some(feed) = ctx.mirror.as_mut() {
        if !feed.push(chunk, end_of_stream) {
            ctx.mirror = None;
        }
    }
}

impl MirrorFeed {
    /// Hands a piece of the client's body to the copy. Never waits. False once the copy
    /// needs nothing more (the body ended, passed the limit, or the copy is over).
    pub(crate) fn push(&mut self, chunk: Option<&Bytes>, end_of_stream: bool) -> bool {
        let mut keep = true;
        if let Some(chunk) = chunk.filter(|c| !c.is_empty()) {
            let start = self.seen_this_attempt;
            self.seen_this_attempt += chunk.len() as u64;
            if self.seen_this_attempt > self.forwarded {
                let fresh = chunk.slice((self.forwarded.saturating_sub(start)) as usize..);
                self.forwarded = self.seen_this_attempt;
                keep = if self.forwarded > self.limit {
                    let _ = self.sender.send(BodyEvent::OverLimit);
                    false
                } else {
                    // An error means the copy already ended (e.g. the shadow was unreachable).
                    self.sender.send(BodyEvent::Data(fresh)).is_ok()
                };
            }
        }
        if keep && end_of_stream {
            let _ = self.sender.send(BodyEvent::End);
            keep = false;
        }
        keep
    }
}

/// A new upstream attempt starts: the body will be replayed from its beginning.
pub(crate) fn on_new_attempt(ctx: &mut RequestCtx) {
    if let Some(feed) = ctx.mirror.as_mut() {
        feed.seen_this_attempt = 0;
    }
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
        MirrorKey::Cookie(name) => request
            .headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(|cookies| cookie_value(cookies, name))
            .is_some_and(|v| mirror.selects(v.as_bytes())),
    }
}

/// The first value of `name` in a query string, as sent.
fn query_value<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then_some(value)
    })
}

fn cookie_value<'c>(cookies: &'c str, name: &str) -> Option<&'c str> {
    cookies.split(';').find_map(|pair| {
        let (key, value) = pair.trim().split_once('=')?;
        (key == name).then_some(value.trim_matches('"'))
    })
}

/// The request as the shadow sees it: the client's method, path, query and end-to-end
/// headers, the forwarding headers the primary gets, and `X-Mirrored-By`.
fn copy_header(
    request: &http::request::Parts,
    client_ip: Option<IpAddr>,
    ctx: &RequestCtx,
    has_body: bool,
) -> pingora::Result<RequestHeader> {
    let target = request
        .uri
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .as_bytes();
    let mut copy = RequestHeader::build(request.method.clone(), target, None)?;
    let nominated: Vec<String> = request
        .headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|token| token.trim().to_ascii_lowercase())
        .collect();
    for (name, value) in request.headers.iter() {
        let name_text = name.as_str();
        if HOP_BY_HOP.contains(&name_text) || nominated.iter().any(|n| n == name_text) {
            continue;
        }
        copy.append_header(name.clone(), value.clone())?;
    }
    if copy.headers.get(header::HOST).is_none() {
        if let Some(host) = request
            .uri
            .authority()
            .map(|a| a.as_str())
            .or(ctx.host.as_deref())
        {
            copy.insert_header(header::HOST, host)?;
        }
    }
    if has_body && copy.headers.get(header::CONTENT_LENGTH).is_none() {
        copy.insert_header(header::TRANSFER_ENCODING, "chunked")?;
    }
    upstream::set_forwarded_headers_for(client_ip, &mut copy, ctx)?;
    copy.insert_header("x-mirrored-by", "switchyard")?;
    Ok(copy)
}

fn shadow_peer(mirror: &Mirror, address: SocketAddr) -> HttpPeer {
    let sni = mirror.sni.clone().unwrap_or_default();
    let mut peer = HttpPeer::new(address, mirror.tls, sni);
    let timeout = Some(Duration::from_millis(mirror.timeout_ms));
    peer.options.connection_timeout = timeout;
    peer.options.total_connection_timeout = timeout;
    peer.options.read_timeout = timeout;
    peer.options.write_timeout = timeout;
    peer.options.idle_timeout = Some(MIRROR_IDLE_TIMEOUT);
    peer.options.verify_cert = mirror.verify_tls;
    peer.options.verify_hostname = mirror.verify_tls && mirror.sni.is_some();
    peer
}

/// One copy on its way to a shadow backend.
struct Copy {
    peer: HttpPeer,
    header: RequestHeader,
    body: Option<mpsc::UnboundedReceiver<BodyEvent>>,
    timeout: Duration,
    route: Arc<AppRoute>,
    request_id: String,
    _in_flight: InFlight,
}

impl Copy {
    async fn run(self, client: Arc<MirrorClient>) {
        let route = self.route.clone();
        let app = route.app.name.as_str();
        let request_id = self.request_id.clone();
        match self.deliver(&client).await {
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

    /// Sends the copy and reads the shadow's response header; returns its status and the
    /// time from the end of the body to that header.
    async fn deliver(
        mut self,
        client: &MirrorClient,
    ) -> Result<(u16, Duration), (Dropped, String)> {
        let timeout = self.timeout;
        let (mut http, _reused) = within(timeout, client.connector.get_http_session(&self.peer))
            .await?
            .map_err(failed)?;
        within(timeout, http.write_request_header(Box::new(self.header)))
            .await?
            .map_err(failed)?;
        if let Some(receiver) = self.body.as_mut() {
            loop {
                match receiver.recv().await {
                    Some(BodyEvent::Data(chunk)) => {
                        within(timeout, http.write_body(&chunk))
                            .await?
                            .map_err(failed)?;
                    }
                    Some(BodyEvent::End) => break,
                    Some(BodyEvent::OverLimit) => {
                        return Err((Dropped::BodyLimit, "body over max_body_bytes".into()))
                    }
                    None => return Err((Dropped::Aborted, "request ended before its body".into())),
                }
            }
        }
        let body_sent = Instant::now();
        let status = within(timeout, answer(&mut http)).await?.map_err(failed)?;
        let waited = body_sent.elapsed();
        client
            .connector
            .release_http_session(http, &self.peer, Some(MIRROR_IDLE_TIMEOUT))
            .await;
        Ok((status, waited))
    }
}

/// Finishes the request and reads the shadow's answer, draining a small body so the
/// connection can be reused.
async fn answer(http: &mut HttpSession) -> pingora::Result<u16> {
    http.finish_body().await?;
    let status = http.read_resp_header_parts().await?.status.as_u16();
    let mut drained = 0;
    while let Some(chunk) = http.read_body_ref().await? {
        drained += chunk.len();
        if drained > MAX_DRAINED_RESPONSE {
            break;
        }
    }
    Ok(status)
}

async fn within<T>(
    timeout: Duration,
    step: impl std::future::Future<Output = T>,
) -> Result<T, (Dropped, String)> {
    tokio::time::timeout(timeout, step)
        .await
        .map_err(|_| (Dropped::Timeout, format!("no progress within {timeout:?}")))
}

fn failed(error: Box<pingora::Error>) -> (Dropped, String) {
    let reason = match error.etype() {
        pingora::ErrorType::ConnectTimedout
        | pingora::ErrorType::ReadTimedout
        | pingora::ErrorType::WriteTimedout => Dropped::Timeout,
        _ => Dropped::Error,
    };
    (reason, error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_and_cookie_values_are_found_as_sent() {
        assert_eq!(query_value("a=1&apikey=k%20y&b", "apikey"), Some("k%20y"));
        assert_eq!(query_value("b&apikey", "apikey"), Some(""));
        assert_eq!(query_value("apikeyx=1", "apikey"), None);
        assert_eq!(cookie_value("sid=abc; user=\"42\"", "user"), Some("42"));
        assert_eq!(cookie_value("sid=abc", "user"), None);
    }
}

//! The life of a request, in order. Each Pingora phase below calls one stage module; reading
//! this file top to bottom tells what happens to every request:
//!
//! 1. `request_filter`: request id, then **framing** (a body framing that no backend could
//!    read unambiguously is refused with 400; an upgrade other than WebSocket is dropped),
//!    then **route** (Host → app; 404/400/503 answered here),
//!    then **https** (308 to HTTPS for apps that ask), then **waf** (the request, and a body
//!    within the app's limit, inspected on the worker pool: 403 or 503 here), then
//!    **images** (`/_img/WxH/…` resized on the worker pool: 400/422/503 here), then
//!    **static** (a file under the
//!    app's static root answers), then **cache** (a fresh cached response is sent here),
//!    then **mirror** (a copy to the shadow backends starts, fire-and-forget).
//! 2. `request_body_filter`: each piece of the body is also handed to the mirror copy.
//! 3. `upstream_peer`: **upstream** picks a backend (502/503 when none can be used).
//! 4. `upstream_request_filter`: **framing** (one canonical Transfer-Encoding or
//!    Content-Length line) and forwarded headers for the backend.
//! 5. `connected_to_upstream`: the socket enters the connection table, where a deletion or a
//!    domain transfer (or an app's deadline for removed backends) can find it (`drain`).
//! 6. `fail_to_connect` / `error_while_proxy`: passive health and the retry decision.
//! 7. `upstream_response_filter` / `response_filter` / `response_body_filter`: upstream
//!    timing, upgrades, the cache's decision to keep the response (an app error with a
//!    stale copy at hand becomes a failure, answered below), `X-Cache`, request id, HSTS;
//!    a WebSocket the router closed ends with a close frame.
//! 8. `fail_to_proxy`: a stale copy stands in if the cache has one, otherwise the failure
//!    becomes a status code (`respond`).
//! 9. `logging`: **log** — access-log line and metrics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::protocols::Digest;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use pingora::Error;
use switchyard_model::ClientTimeouts;

use crate::access_log::AccessLog;
use crate::cache;
use crate::cache_redis::CacheRedis;
use crate::context::RequestCtx;
use crate::framing;
use crate::h2_resets;
use crate::head_deadline;
use crate::https;
use crate::images::{self, ImageStage};
use crate::mirror::{self, MirrorClient};
use crate::respond;
use crate::route;
use crate::route_cache::RouteCache;
use crate::static_files;
use crate::upstream;
use crate::upstream_connections::ConnectionTable;
use crate::waf::{self, Inspector};
use crate::worker_pool::WorkerPool;

/// The router: Switchyard's implementation of Pingora's proxy phases.
pub struct Router {
    routes: Arc<RouteCache>,
    connections: Arc<ConnectionTable>,
    access_log: AccessLog,
    https_port: Option<u16>,
    mirrors: Arc<MirrorClient>,
    cache_redis: Option<Arc<CacheRedis>>,
    waf: Option<Arc<Inspector>>,
    /// `None` until a worker pool is given: resize requests are then answered 503.
    images: Option<ImageStage>,
    client_timeouts: ClientTimeouts,
    /// Set when the server stops accepting (shutdown or upgrade hand-over).
    stopping: Arc<AtomicBool>,
}

/// How long the rest of an upload refused midway is read and dropped before closing.
const REFUSED_UPLOAD_LINGER: Duration = Duration::from_secs(5);

impl Router {
    /// A router serving both listeners; backend connections in use are entered in
    /// `connections`; `https_port` is where clients reach HTTPS (for redirects), `None` when
    /// there is no HTTPS listener; `cache_redis` serves apps whose cache lives in Redis.
    pub fn new(
        routes: Arc<RouteCache>,
        connections: Arc<ConnectionTable>,
        access_log: AccessLog,
        https_port: Option<u16>,
        cache_redis: Option<Arc<CacheRedis>>,
    ) -> Self {
        Self {
            routes,
            connections,
            access_log,
            https_port,
            mirrors: Arc::new(MirrorClient::new()),
            cache_redis,
            waf: None,
            images: None,
            client_timeouts: ClientTimeouts::default(),
            stopping: Arc::default(),
        }
    }

    /// Deadlines for clients. Pingora would otherwise keep an idle HTTP/1.1 connection
    /// forever (or as long as the client's own `Keep-Alive` header asks) and wait for the next
    /// request's head without any deadline, and wait forever on a client that stops reading.
    pub fn with_client_timeouts(mut self, timeouts: ClientTimeouts) -> Self {
        self.client_timeouts = timeouts;
        self
    }

    /// Apps with a `waf` option are inspected by `inspector`; without one, their requests
    /// follow their `on_overload` policy.
    pub fn with_waf(mut self, inspector: Arc<Inspector>) -> Self {
        self.waf = Some(inspector);
        self
    }

    /// The flag to set when the server stops accepting. From then on answers carry
    /// `Connection: close`: a client would otherwise send its next request on a connection
    /// Pingora closes as soon as the answer is out (and see it reset).
    pub fn stopping(&self) -> Arc<AtomicBool> {
        self.stopping.clone()
    }

    /// CPU-heavy stages other than the WAF (image resizing) run on `pool`; without one,
    /// resize requests are answered 503.
    pub fn with_worker_pool(mut self, pool: Arc<WorkerPool>) -> Self {
        self.images = Some(ImageStage::new(pool));
        self
    }

    /// What a thread of the hyper listener shares with this router's.
    pub(crate) fn shared_with_hyper_listener(&self) -> crate::hyper_engine::Shared {
        crate::hyper_engine::Shared {
            routes: self.routes.clone(),
            connections: self.connections.clone(),
            access_log: self.access_log.clone(),
            https_port: self.https_port,
            client_timeouts: self.client_timeouts,
            waf: self.waf.clone(),
            cache_redis: self.cache_redis.clone(),
            images: self.images.as_ref().map(ImageStage::for_another_thread),
        }
    }

    /// The router for another server thread: the same routes, logs, limits and stop flag,
    /// with its own pools of idle backend connections (mirrors' and images' too). Pingora
    /// watches an idle connection from a task on a random thread of its runtime; one thread
    /// taking a connection another thread's task still watches loses it (see
    /// bench/ENGINE.md), so each thread keeps its own.
    pub fn for_another_thread(&self) -> Self {
        Self {
            routes: self.routes.clone(),
            connections: self.connections.clone(),
            access_log: self.access_log.clone(),
            https_port: self.https_port,
            mirrors: Arc::new(MirrorClient::new()),
            cache_redis: self.cache_redis.clone(),
            waf: self.waf.clone(),
            images: self.images.as_ref().map(ImageStage::for_another_thread),
            client_timeouts: self.client_timeouts,
            stopping: self.stopping.clone(),
        }
    }
}

#[async_trait]
impl ProxyHttp for Router {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::new()
    }

    async fn early_request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        head_deadline::head_received();
        ctx.h2_stream = h2_resets::TakenStream::start(session);
        Ok(())
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<bool> {
        ctx.request_id = request_id(&session.req_header().headers);
        if self.stopping.load(Ordering::Relaxed) {
            session.set_keepalive(None);
        } else if session.get_keepalive().is_some() {
            session.set_keepalive(Some(self.client_timeouts.idle.as_secs().max(1)));
        }
        // A WebSocket's client may rightly stay silent for hours (its pings keep it alive), as
        // its backend may (see `upstream`); an ordinary body gets a deadline per read. HTTP/2
        // streams have no per-read deadline in Pingora; flow control bounds what they hold.
        let body_deadline = (!session.is_upgrade_req()).then_some(self.client_timeouts.body);
        session.set_read_timeout(body_deadline);
        session.set_write_timeout(Some(self.client_timeouts.send));
        ctx.tls = session
            .digest()
            .is_some_and(|digest| digest.ssl_digest.is_some());
        if let Err(answer) = framing::check_request(session.req_header_mut()) {
            respond::send(session, ctx, answer).await?;
            return Ok(true);
        }
        if let Err(answer) = route::route(session, ctx, &self.routes).await {
            respond::send(session, ctx, answer).await?;
            return Ok(true);
        }
        if let Some(location) = https::redirect_location(session, ctx, self.https_port) {
            respond::write_redirect(session, ctx, &location).await?;
            return Ok(true);
        }
        if let Some(answer) = waf::inspect(session, ctx, self.waf.as_deref()).await? {
            respond::send(session, ctx, answer).await?;
            return Ok(true);
        }
        if static_files::serve(session, ctx).await? {
            return Ok(true);
        }
        if cache::serve_or_prepare(session, ctx, self.cache_redis.as_ref()).await? {
            return Ok(true);
        }
        // After the cache: a resized image the app lets be cached is made once.
        if images::serve(self.images.as_ref(), session, ctx).await? {
            return Ok(true);
        }
        mirror::start(&self.mirrors, session, ctx);
        Ok(false)
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        waf::on_body(ctx, body, end_of_stream, self.waf.as_deref()).await?;
        mirror::forward_body(ctx, body.as_ref(), end_of_stream);
        Ok(())
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<Box<HttpPeer>> {
        mirror::on_new_attempt(ctx);
        waf::on_new_attempt(ctx);
        upstream::choose_peer(session, ctx)
            .map_err(|answer| Error::new(pingora::ErrorType::HTTPStatus(answer.status())))
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        framing::normalise_for_backend(request)?;
        upstream::set_forwarded_headers(session, request, ctx)
    }

    async fn connected_to_upstream(
        &self,
        _session: &mut Session,
        _reused: bool,
        _peer: &HttpPeer,
        fd: std::os::unix::io::RawFd,
        digest: Option<&Digest>,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        upstream::on_connected(ctx, &self.connections, fd, digest);
        Ok(())
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        error: Box<Error>,
    ) -> Box<Error> {
        upstream::on_connect_failure(ctx, error)
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        error: Box<Error>,
        ctx: &mut RequestCtx,
        _client_reused: bool,
    ) -> Box<Error> {
        let error = error.more_context(format!("peer: {peer}"));
        upstream::on_proxy_error(session, ctx, error)
    }

    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        upstream::on_response_header(ctx, response.status.as_u16());
        cache::on_upstream_response(session, ctx, response)
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        cache::on_response_header(ctx, response)?;
        response.insert_header("x-request-id", ctx.request_id.as_str())?;
        https::add_hsts(response, ctx)
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<Option<Duration>> {
        cache::on_response_body(ctx, body, end_of_stream);
        upstream::on_upgraded_body(ctx, body, end_of_stream);
        Ok(None)
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        error: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        if let Some(answer) = ctx.refused_with.take() {
            if let Err(e) = respond::send(session, ctx, answer).await {
                log::debug!("request {}: could not send {answer:?}: {e}", ctx.request_id);
            }
            // Refused mid-upload: read (and drop) the rest for a while, as nginx's lingering
            // close does, so that closing does not reset the connection under the answer
            // before the client has read it.
            let _ = tokio::time::timeout(REFUSED_UPLOAD_LINGER, session.drain_request_body()).await;
            return FailToProxy {
                error_code: answer.status(),
                can_reuse_downstream: false,
            };
        }
        if let Some(status) = cache::serve_stale_on_failure(session, ctx).await {
            return FailToProxy {
                error_code: status,
                can_reuse_downstream: false,
            };
        }
        let status = respond::status_for(error);
        if status > 0 {
            if let Err(e) =
                respond::write_error(session, ctx, status, respond::text_for(status)).await
            {
                log::debug!("request {}: could not send {status}: {e}", ctx.request_id);
            }
        }
        FailToProxy {
            error_code: status,
            can_reuse_downstream: false,
        }
    }

    fn suppress_error_log(&self, _session: &Session, ctx: &RequestCtx, error: &Error) -> bool {
        // Local answers (404, 503 …) travel as HTTPStatus errors; they are not faults.
        if matches!(error.etype(), pingora::ErrorType::HTTPStatus(_)) {
            return true;
        }
        // A client that goes away (a phone losing its network under a WebSocket, a tab
        // closed mid-download) is neither the router's fault nor the backend's, and happens
        // all day: an ERROR line each would bury the real faults. The access log still has
        // the request.
        if error.esource() == &pingora::ErrorSource::Downstream {
            log::debug!(
                "request {}: the client's side failed: {error}",
                ctx.request_id
            );
            return true;
        }
        false
    }

    async fn logging(&self, session: &mut Session, error: Option<&Error>, ctx: &mut RequestCtx) {
        // The answer is out: a kept-alive connection now idles, then reads its next head.
        head_deadline::next_head_within(self.client_timeouts.idle + self.client_timeouts.header);
        if let Some(stream) = ctx.h2_stream.as_mut() {
            stream.ended(error.is_some_and(|e| e.esource() == &pingora::ErrorSource::Downstream));
        }
        let status = session
            .response_written()
            .map(|r| r.status.as_u16())
            .or(ctx.local_status)
            .unwrap_or(0);
        ctx.count_answer(status);
        self.access_log.record(session, ctx, status);
        ctx.release_attempt();
    }
}

/// The client's `X-Request-Id` when it looks like one (so a platform's edge can trace a
/// request end to end), otherwise a fresh random id.
pub(crate) fn request_id(headers: &http::HeaderMap) -> String {
    let given = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            (20..=200).contains(&v.len())
                && v.bytes().all(|b| {
                    b.is_ascii_alphanumeric()
                        || matches!(b, b'-' | b'_' | b'.' | b'+' | b'/' | b'=')
                })
        });
    match given {
        Some(id) => id.to_string(),
        None => random_request_id(),
    }
}

/// 128 random bits in 32 hex digits, written directly: `format!` costs several times more,
/// on every request that brings no id of its own.
fn random_request_id() -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let random = rand::random::<u128>();
    let mut digits = [0u8; 32];
    for (i, digit) in digits.iter_mut().enumerate() {
        *digit = HEX[((random >> ((31 - i) * 4)) & 0xf) as usize];
    }
    // Pushing the 32 digits one char at a time cost more than the random bits themselves.
    String::from_utf8_lossy(&digits).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_request_id_is_32_lowercase_hex_digits_and_a_given_one_is_kept() {
        let none = http::HeaderMap::new();
        let first = request_id(&none);
        let second = request_id(&none);
        assert_eq!(first.len(), 32, "{first}");
        assert!(
            first
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{first}"
        );
        assert_ne!(first, second);
        let mut given = http::HeaderMap::new();
        given.insert(
            "x-request-id",
            http::HeaderValue::from_static("trace-0123456789abcdef-xyz"),
        );
        assert_eq!(request_id(&given), "trace-0123456789abcdef-xyz");
        given.insert("x-request-id", http::HeaderValue::from_static("short"));
        assert_eq!(
            request_id(&given).len(),
            32,
            "too short to be an id: replaced"
        );
    }
}

//! Stage cache: answer from the app's response cache, or let the request through and keep
//! its response when the app allows it; stand in with a stale copy when the app fails.
//!
//! Only opted-in paths are cached, GET and HEAD only. A response is kept when its status is
//! cacheable, its `Cache-Control` has no `no-store`/`private`/`no-cache`, it sets no cookie
//! (unless the app opts in, and then the cookie is not stored) and it is not `Vary: *`.
//! Freshness: `s-maxage`, else `max-age`, else the app's `ttl_s`. Concurrent misses for one
//! URL wait for the first one's response instead of all reaching the app.
//!
//! With the `redis` store, responses are kept in the cache Redis shared by the fleet (each
//! router still coalesces its own misses). With `redis-versioned` the app owns the cache
//! (the versioned layout): the router only reads the current version's body from Redis.
//!
//! The pipeline enters the stage through its phases, and its state for the request is in
//! the context (`CacheCtx`): [`applies`] (whether the route caches at all), then
//! [`request_phase`] (a fresh copy answers), [`response_phase`] (the app's answer head:
//! kept, or a stale copy stands in for an error), [`body_phase`] (each piece of a kept
//! answer), and [`stand_in_for_failure`] (an app that could not be reached). An answer the
//! router made (a resized image) goes through [`keep_made_answer`]. The answer's writer
//! reads [`x_cache`] and [`cached_headers`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, HeaderName, HeaderValue, Method};
use switchyard_model::{CacheStore, ResponseCache};

use crate::context::RequestCtx;
use crate::metrics;
use crate::response_cache::memory::{
    AppResponseCache, CachedResponse, Entry, FillGuard, FillTicket,
};
use crate::response_cache::redis::CacheRedis;
use crate::routing::route_cache::AppRoute;

/// Longest a miss waits for another request filling the same URL.
const FILL_WAIT_CEILING: Duration = Duration::from_secs(10);
/// Statuses kept (RFC 9111 heuristically cacheable ones a platform's apps send).
const CACHEABLE_STATUSES: &[u16] = &[200, 203, 204, 300, 301, 308, 404, 410];
/// Response headers never stored: they describe one connection or one client.
const NOT_STORED: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "set-cookie",
    "age",
    "x-request-id",
];

/// The `X-Cache` verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CacheStatus {
    Hit,
    Miss,
    Stale,
    Bypass,
}

impl CacheStatus {
    fn label(self) -> &'static str {
        match self {
            Self::Hit => "HIT",
            Self::Miss => "MISS",
            Self::Stale => "STALE",
            Self::Bypass => "BYPASS",
        }
    }
}

/// What the cache stage knows about one request of an app that caches. The app's policy is
/// read from the request's route, which is fixed for the request.
pub(crate) struct CacheCtx {
    status: CacheStatus,
    cache: Arc<AppResponseCache>,
    /// The cache Redis, for apps whose responses are kept there (`redis` store).
    shared: Option<Arc<CacheRedis>>,
    key: String,
    /// An expired copy that may still stand in if the app fails.
    stale: Option<Arc<CachedResponse>>,
    /// Set when this request may store its response.
    fill: Option<Fill>,
}

impl std::fmt::Debug for CacheCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheCtx")
            .field("status", &self.status)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

struct Fill {
    /// Released once the response can be read back, waking the requests waiting for it.
    guard: Option<FillGuard>,
    vary: Option<Arc<[HeaderName]>>,
    stored_key: String,
    response: Option<PendingResponse>,
    body: BytesMut,
}

struct PendingResponse {
    status: u16,
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    fresh_for: Duration,
}

/// Whether the request's app has a response cache: [`request_phase`] does nothing
/// otherwise, and is not worth the state its future carries.
pub(crate) fn applies(ctx: &RequestCtx) -> bool {
    ctx.route
        .as_ref()
        .is_some_and(|route| route.app.cache.is_some() && route.response_cache.is_some())
}

/// Looks the request up: a fresh copy to answer with (counted as a hit), or `None` to go on
/// to the app, with what the cache needs to keep its response (or stand in for it) left in
/// `ctx`.
pub(crate) async fn request_phase(
    ctx: &mut RequestCtx,
    request: &http::request::Parts,
    redis: Option<&Arc<CacheRedis>>,
) -> Option<Arc<CachedResponse>> {
    let route = ctx.route.clone()?;
    let (Some(policy), Some(cache)) = (route.app.cache.as_ref(), route.response_cache.as_ref())
    else {
        return None;
    };
    let method = &request.method;
    let eligible = (method == Method::GET || method == Method::HEAD)
        && policy.covers(request.uri.path())
        && (policy.cache_authorized || request.headers.get(header::AUTHORIZATION).is_none());
    let scheme = if ctx.tls { "https" } else { "http" };
    let key = format!(
        "{scheme}://{}{}",
        ctx.host.as_deref().unwrap_or(""),
        request.uri.path_and_query().map_or("/", |pq| pq.as_str())
    );
    let mut state = CacheCtx {
        status: CacheStatus::Bypass,
        cache: cache.clone(),
        shared: None,
        key,
        stale: None,
        fill: None,
    };
    if !eligible {
        count(ctx, CacheStatus::Bypass);
        ctx.cache = Some(state);
        return None;
    }
    state.status = CacheStatus::Miss;
    match (policy.store, redis) {
        (CacheStore::Memory, _) => {}
        (_, None) => {
            report_no_cache_redis(ctx.app_name());
            ctx.cache = Some(state);
            return None;
        }
        (CacheStore::RedisVersioned, Some(redis)) => {
            return versioned(ctx, state, redis).await;
        }
        (CacheStore::Redis, Some(redis)) => state.shared = Some(redis.clone()),
    }
    let app = route.app.name.as_str();
    let headers = &request.headers;
    let mut looked = look_up(headers, &state, app).await;
    let needs_fetch = !matches!(looked, Some(Looked::Fresh(_)));
    if needs_fetch && method == Method::GET {
        match cache.begin_fill(&state.key) {
            FillTicket::Leader(guard) => {
                // Another leader may have stored the response between the look-up above and
                // taking the lock: look once more before going to the app.
                looked = look_up(headers, &state, app).await.or(looked);
                if !matches!(looked, Some(Looked::Fresh(_))) {
                    state.fill = Some(Fill::new(Some(guard), &state.key));
                }
            }
            FillTicket::Uncoordinated => state.fill = Some(Fill::new(None, &state.key)),
            FillTicket::Follower(done) => {
                let wait = Duration::from_millis(route.app.timeouts.read_ms).min(FILL_WAIT_CEILING);
                let _ = tokio::time::timeout(wait, done).await;
                looked = look_up(headers, &state, app).await.or(looked);
                if !matches!(looked, Some(Looked::Fresh(_))) {
                    state.fill = Some(Fill::new(None, &state.key));
                }
            }
        }
    }
    match looked {
        Some(Looked::Fresh(response)) => {
            count(ctx, CacheStatus::Hit);
            state.status = CacheStatus::Hit;
            ctx.cache = Some(state);
            Some(response)
        }
        Some(Looked::Stale(response)) => {
            state.stale = Some(response);
            ctx.cache = Some(state);
            None
        }
        None => {
            ctx.cache = Some(state);
            None
        }
    }
}

/// The versioned layout: the app wrote the body of this URL's current version; serve it, or
/// let the app answer (and write it). The router never writes here.
async fn versioned(
    ctx: &mut RequestCtx,
    state: CacheCtx,
    redis: &CacheRedis,
) -> Option<Arc<CachedResponse>> {
    let Some(body) = redis.versioned_body(&state.key).await else {
        ctx.cache = Some(state);
        return None;
    };
    count(ctx, CacheStatus::Hit);
    ctx.cache = Some(CacheCtx {
        status: CacheStatus::Hit,
        ..state
    });
    let now = Instant::now();
    Some(Arc::new(CachedResponse {
        status: 200,
        headers: vec![(
            header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/html; charset=utf-8"),
        )],
        body,
        stored_at: now,
        fresh_until: now,
        stale_until: now,
    }))
}

/// An app's cache lives in Redis but this router has none: its pages come from the app.
/// Said once per process, not per request.
fn report_no_cache_redis(app: &str) {
    static REPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !REPORTED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        log::warn!(
            "app {app}: its cache store is in Redis, which needs --cache-redis; its pages \
             come from the app"
        );
    }
}

enum Looked {
    Fresh(Arc<CachedResponse>),
    /// Expired but within `stale_if_error_s`.
    Stale(Arc<CachedResponse>),
}

async fn look_up(headers: &HeaderMap, state: &CacheCtx, app: &str) -> Option<Looked> {
    let (entry, variant) = match entry_at(state, app, &state.key).await? {
        Entry::Varies(names) => {
            let key = variant_key(&state.key, &names, headers);
            (entry_at(state, app, &key).await?, Some(key))
        }
        entry => (entry, None),
    };
    let Entry::Response(response) = entry else {
        return None;
    };
    let now = Instant::now();
    if now < response.fresh_until {
        Some(Looked::Fresh(response))
    } else if now < response.stale_until {
        Some(Looked::Stale(response))
    } else {
        // Redis expires its copies by itself.
        if state.shared.is_none() {
            state.cache.remove(variant.as_deref().unwrap_or(&state.key));
        }
        None
    }
}

async fn entry_at(state: &CacheCtx, app: &str, key: &str) -> Option<Entry> {
    match &state.shared {
        Some(redis) => redis.shared_entry(app, key).await,
        None => state.cache.get(key),
    }
}

fn variant_key(key: &str, names: &[HeaderName], headers: &HeaderMap) -> String {
    let mut variant = key.to_string();
    for name in names {
        variant.push('\n');
        for (i, value) in headers.get_all(name).iter().enumerate() {
            if i > 0 {
                variant.push(',');
            }
            variant.push_str(&String::from_utf8_lossy(value.as_bytes()));
        }
    }
    variant
}

impl Fill {
    fn new(guard: Option<FillGuard>, key: &str) -> Self {
        Self {
            guard,
            vary: None,
            stored_key: key.to_string(),
            response: None,
            body: BytesMut::new(),
        }
    }
}

/// What becomes of the app's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AppAnswer {
    /// It goes to the client (and is kept if the fill decided so).
    GoesOn,
    /// The app failed and a stale copy is at hand: it answers instead.
    StaleStandsIn,
}

/// The app answered `status` with `headers` to a request with `request_headers`: the stale
/// copy that stands in for an app error, if one may, or `None` for the app's answer to go
/// on (kept if the request holds the fill and the answer is storable).
pub(crate) fn response_phase(
    request_headers: &HeaderMap,
    ctx: &mut RequestCtx,
    status: u16,
    headers: &HeaderMap,
) -> Option<Arc<CachedResponse>> {
    match on_app_response(request_headers, ctx, status, headers) {
        AppAnswer::StaleStandsIn => stand_in_for_failure(ctx),
        AppAnswer::GoesOn => None,
    }
}

/// Whether to keep the app's answer, or whether a stale copy stands in for an app error.
fn on_app_response(
    request_headers: &HeaderMap,
    ctx: &mut RequestCtx,
    status: u16,
    headers: &HeaderMap,
) -> AppAnswer {
    let (Some(state), Some(policy)) = (ctx.cache.as_mut(), cache_policy(&ctx.route)) else {
        return AppAnswer::GoesOn;
    };
    if status >= 500 && state.stale.is_some() {
        state.fill = None;
        return AppAnswer::StaleStandsIn;
    }
    let Some(fill) = state.fill.as_mut() else {
        return AppAnswer::GoesOn;
    };
    match storable(policy, status, headers) {
        Some((fresh_for, vary)) => {
            if let Some(names) = &vary {
                fill.stored_key = variant_key(&state.key, names, request_headers);
            }
            fill.vary = vary;
            fill.response = Some(PendingResponse {
                status,
                headers: headers
                    .iter()
                    .filter(|(name, _)| !NOT_STORED.contains(&name.as_str()))
                    .map(|(name, value)| (name.clone(), value.clone()))
                    .collect(),
                fresh_for,
            });
        }
        None => state.fill = None,
    }
    AppAnswer::GoesOn
}

/// How long `response` may be served, and the headers it varies by; `None` if it must not
/// be kept.
fn storable(
    policy: &ResponseCache,
    status: u16,
    headers: &HeaderMap,
) -> Option<(Duration, Option<Arc<[HeaderName]>>)> {
    if !CACHEABLE_STATUSES.contains(&status) {
        return None;
    }
    if headers.get(header::SET_COOKIE).is_some() && !policy.cache_set_cookie {
        return None;
    }
    let declared_length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared_length.is_some_and(|length| length > policy.max_object_bytes) {
        return None;
    }
    let mut max_age = None;
    let mut shared_max_age = None;
    for directive in headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
    {
        let (name, value) = directive
            .trim()
            .split_once('=')
            .unwrap_or((directive.trim(), ""));
        let seconds = || value.trim_matches('"').parse::<u64>().ok();
        match name.to_ascii_lowercase().as_str() {
            "no-store" | "private" | "no-cache" => return None,
            "max-age" => max_age = seconds(),
            "s-maxage" => shared_max_age = seconds(),
            _ => {}
        }
    }
    let fresh_for = shared_max_age.or(max_age).unwrap_or(policy.ttl_s);
    if fresh_for == 0 {
        return None;
    }
    let mut vary = Vec::new();
    for name in headers
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|n| !n.is_empty())
    {
        if name == "*" {
            return None;
        }
        vary.push(HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes()).ok()?);
    }
    vary.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    vary.dedup();
    let vary = (!vary.is_empty()).then(|| Arc::from(vary));
    Some((Duration::from_secs(fresh_for), vary))
}

/// The `X-Cache` of a response from the app, for an app that caches (a miss is counted
/// here, once its answer is known to go out).
pub(crate) fn x_cache(ctx: &RequestCtx) -> Option<&'static str> {
    let state = ctx.cache.as_ref()?;
    if state.status == CacheStatus::Miss {
        count(ctx, CacheStatus::Miss);
    }
    Some(state.status.label())
}

/// Collects the body of a response being kept, storing it at its end.
pub(crate) fn body_phase(ctx: &mut RequestCtx, body: &Option<Bytes>, end_of_stream: bool) {
    let (Some(state), Some(policy)) = (ctx.cache.as_mut(), cache_policy(&ctx.route)) else {
        return;
    };
    let Some(fill) = state.fill.as_mut() else {
        return;
    };
    if fill.response.is_none() {
        return;
    }
    if let Some(chunk) = body.as_ref() {
        if (fill.body.len() + chunk.len()) as u64 > policy.max_object_bytes {
            state.fill = None;
            return;
        }
        fill.body.extend_from_slice(chunk);
    }
    if !end_of_stream {
        return;
    }
    let Some(fill) = state.fill.take() else {
        return;
    };
    let Some(pending) = fill.response else {
        return;
    };
    let now = Instant::now();
    let fresh_until = now + pending.fresh_for;
    let stored = CachedResponse {
        status: pending.status,
        headers: pending.headers,
        body: fill.body.freeze(),
        stored_at: now,
        fresh_until,
        stale_until: fresh_until + Duration::from_secs(policy.stale_if_error_s),
    };
    let mut entries = Vec::with_capacity(2);
    if let Some(names) = fill.vary {
        entries.push((state.key.clone(), Entry::Varies(names)));
    }
    entries.push((fill.stored_key, Entry::Response(Arc::new(stored))));
    metrics::CACHE_STORES.inc();
    match (&state.shared, &ctx.route) {
        (Some(redis), Some(route)) => {
            redis.store_shared(route.app.name.as_str(), entries, fill.guard);
        }
        _ => {
            for (key, entry) in entries {
                state.cache.insert(key, entry);
            }
        }
    }
}

/// A response the router made itself for an app that caches (a resized image) goes through
/// the same decisions as the app's own: kept when storable (the request held the fill).
/// Returns its `X-Cache`.
pub(crate) fn keep_made_answer(
    request_headers: &HeaderMap,
    ctx: &mut RequestCtx,
    status: u16,
    headers: &HeaderMap,
    body: &Bytes,
) -> Option<&'static str> {
    on_app_response(request_headers, ctx, status, headers);
    let label = x_cache(ctx);
    body_phase(ctx, &Some(body.clone()), true);
    label
}

/// The stale copy that stands in for an app that failed or could not be reached, if one is
/// allowed (counted as stale).
pub(crate) fn stand_in_for_failure(ctx: &mut RequestCtx) -> Option<Arc<CachedResponse>> {
    let state = ctx.cache.as_mut()?;
    let stale = state.stale.take()?;
    state.status = CacheStatus::Stale;
    state.fill = None;
    count(ctx, CacheStatus::Stale);
    Some(stale)
}

/// The head of an answer from the cache: the stored headers, its length, age and `X-Cache`.
pub(crate) fn cached_headers(response: &CachedResponse, status: CacheStatus) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(response.headers.len() + 5);
    for (name, value) in &response.headers {
        headers.append(name.clone(), value.clone());
    }
    headers.insert(header::CONTENT_LENGTH, response.body.len().into());
    headers.insert(header::AGE, response.stored_at.elapsed().as_secs().into());
    headers.insert(
        HeaderName::from_static("x-cache"),
        HeaderValue::from_static(status.label()),
    );
    headers
}

fn count(ctx: &RequestCtx, status: CacheStatus) {
    metrics::CACHE_REQUESTS
        .with_label_values(&[ctx.app_name(), status.label()])
        .inc();
}

fn cache_policy(route: &Option<Arc<AppRoute>>) -> Option<&ResponseCache> {
    route.as_ref()?.app.cache.as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy() -> ResponseCache {
        let app = switchyard_model::parse_app_spec(
            "a",
            &json!({"cache": {"paths": ["/"], "ttl_s": 60, "max_object_bytes": 100}}),
        )
        .expect("valid");
        *app.cache.expect("cache")
    }

    fn response_headers(headers: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(value).expect("value"),
            );
        }
        map
    }

    #[test]
    fn cache_control_set_cookie_and_vary_decide_what_is_kept() {
        let p = policy();
        let kept = |status: u16, h: &[(&str, &str)]| storable(&p, status, &response_headers(h));
        let fresh = |h: &[(&str, &str)]| kept(200, h).map(|(d, _)| d.as_secs());
        assert_eq!(fresh(&[]), Some(60));
        assert_eq!(fresh(&[("cache-control", "public, max-age=5")]), Some(5));
        assert_eq!(
            fresh(&[("cache-control", "max-age=5, s-maxage=9")]),
            Some(9)
        );
        assert_eq!(fresh(&[("cache-control", "max-age=0")]), None);
        for refused in ["no-store", "private", "no-cache", "private, max-age=60"] {
            assert_eq!(fresh(&[("cache-control", refused)]), None, "{refused}");
        }
        assert_eq!(fresh(&[("set-cookie", "sid=1")]), None);
        assert_eq!(fresh(&[("vary", "*")]), None);
        assert_eq!(fresh(&[("content-length", "101")]), None);
        assert_eq!(kept(500, &[]).map(|_| ()), None);
        let (_, vary) = kept(200, &[("vary", "Accept-Encoding, accept-language")]).expect("kept");
        let names: Vec<&str> = vary
            .iter()
            .flat_map(|v| v.iter())
            .map(|n| n.as_str())
            .collect();
        assert_eq!(names, ["accept-encoding", "accept-language"]);
    }
}

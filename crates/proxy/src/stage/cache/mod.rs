//! Stage cache: answer from the app's response cache, or let the request through and keep
//! its response when the app allows it; revalidate a stale copy with the app; stand in with
//! a stale copy when the app fails; forget what an unsafe request changed.
//!
//! Only opted-in paths are cached, GET and HEAD only. What is kept and for how long is what
//! the app's answer says, read as RFC 9111 reads it ([`freshness`]); a stale copy with a
//! validator is revalidated with a conditional request, and the app's 304 refreshes it
//! ([`validators`]); a client's own conditional request is answered 304 from a stored copy,
//! and a range of a stored answer 206 ([`ranges`]).
//! A 2xx or 3xx answer to an unsafe method invalidates its URL and the same-origin URLs in
//! its `Location` and `Content-Location` (§4.4). Concurrent misses and revalidations of one
//! URL wait for the first one's answer instead of all reaching the app.
//!
//! With the `redis` store, responses are kept in the cache Redis shared by the fleet (each
//! router still coalesces its own misses), and an invalidation reaches every router. With
//! `redis-versioned` the app owns the cache (the versioned layout): the router only reads
//! the current version's body from Redis.
//!
//! The pipeline enters the stage through its phases, and its state for the request is in
//! the context (`CacheCtx`): [`applies`] (whether the route caches at all), then
//! [`request_phase`] (a fresh copy answers), [`upstream_request_phase`] (the conditional
//! request that revalidates), [`response_phase`] (the app's answer head: kept, refreshing a
//! copy, or a stale copy stands in for an error), [`body_phase`] (each piece of a kept
//! answer), and [`stand_in_for_failure`] (an app that could not be reached). An answer the
//! router made (a resized image) goes through [`keep_made_answer`]. The answer's writer
//! reads [`x_cache`] and [`cached_answer`].

pub(crate) mod background;
mod copies;
mod freshness;
mod ranges;
pub(crate) mod state;
mod validators;

use copies::{copy_of, forget, refreshed_copy, replace, storable, store, stored_fields, Refresh};

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, HeaderName, HeaderValue, Method};
use switchyard_model::{CacheStore, ResponseCache, StoredCopy};

use crate::context::RequestCtx;
use crate::metrics;
use crate::response_cache::memory::{CachedResponse, Entry, FillGuard, FillTicket};
use crate::response_cache::redis::CacheRedis;
use crate::routing::route_cache::AppRoute;
pub(crate) use state::{CacheCtx, CacheStatus};
use state::{Fill, PendingResponse};

/// Longest a miss waits for another request filling the same URL.
const FILL_WAIT_CEILING: Duration = Duration::from_secs(10);
/// An answer from the cache: the copy, its `X-Cache`, and the part of it the client's own
/// request asks for (a 304 for its conditional, a range).
#[derive(Debug)]
pub(crate) struct FromCache {
    pub(crate) copy: Arc<CachedResponse>,
    pub(crate) status: CacheStatus,
    served: Served,
}

/// What of a copy goes to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Served {
    Whole,
    /// The client's copy is current: a 304.
    NotModified,
    /// One range of the body: a 206, or a 416 for none of it.
    Part(ranges::Part),
}

impl FromCache {
    /// The copy as a GET (`is_get`) or HEAD with `request`'s fields gets it: conditionals
    /// and ranges apply to stored 200s.
    fn for_request(
        copy: Arc<CachedResponse>,
        status: CacheStatus,
        request: &HeaderMap,
        is_get: bool,
    ) -> Self {
        let served = if copy.status != 200 {
            Served::Whole
        } else if validators::not_modified(request, &copy.headers) {
            Served::NotModified
        } else if is_get {
            match ranges::asked(request, &copy.headers, copy.body.len()) {
                ranges::Part::Whole => Served::Whole,
                part => Served::Part(part),
            }
        } else {
            Served::Whole
        };
        Self {
            copy,
            status,
            served,
        }
    }

    fn whole(copy: Arc<CachedResponse>, status: CacheStatus) -> Self {
        Self {
            copy,
            status,
            served: Served::Whole,
        }
    }
}

/// Whether the request's app has a response cache: [`request_phase`] does nothing
/// otherwise, and is not worth the state its future carries.
pub(crate) fn applies(ctx: &RequestCtx) -> bool {
    ctx.route
        .as_ref()
        .is_some_and(|route| route.app.cache.is_some() && route.response_cache.is_some())
}

/// Looks the request up: a fresh copy to answer with (counted as a hit), or `None` to go on
/// to the app, with what the cache needs to keep its response (or revalidate, or stand in
/// for it) left in `ctx`.
pub(crate) async fn request_phase(
    ctx: &mut RequestCtx,
    request: &http::request::Parts,
    redis: Option<&Arc<CacheRedis>>,
) -> Option<FromCache> {
    let route = ctx.route.clone()?;
    let (Some(policy), Some(cache)) = (route.app.cache.as_ref(), route.response_cache.as_ref())
    else {
        return None;
    };
    let method = &request.method;
    let eligible = (method == Method::GET || method == Method::HEAD)
        && policy.covers(request.uri.path())
        && (policy.cache_authorized || request.headers.get(header::AUTHORIZATION).is_none());
    let mut state = CacheCtx {
        status: CacheStatus::Bypass,
        cache: cache.clone(),
        shared: None,
        key: url_key(
            ctx,
            request.uri.path_and_query().map_or("/", |pq| pq.as_str()),
        ),
        invalidates: !method.is_safe(),
        generation: None,
        stale: None,
        fill: None,
        revalidating: false,
        sent_at: None,
        client_conditionals: None,
        background: None,
    };
    if policy.store == CacheStore::Redis {
        state.shared = redis.cloned();
    }
    if !eligible {
        count(ctx, CacheStatus::Bypass);
        ctx.cache = Some(Box::new(state));
        return None;
    }
    state.status = CacheStatus::Miss;
    match (policy.store, redis) {
        (CacheStore::Memory, _) => {}
        (_, None) => {
            report_no_cache_redis(ctx.app_name());
            ctx.cache = Some(Box::new(state));
            return None;
        }
        (CacheStore::RedisVersioned, Some(redis)) => {
            return versioned(ctx, state, redis).await;
        }
        (CacheStore::Redis, Some(_)) => {}
    }
    let app = route.app.name.as_str();
    let headers = &request.headers;
    let mut looked = look_up(headers, &mut state, app).await;
    let needs_fetch = !matches!(looked, Some(Looked::Fresh(_)));
    if needs_fetch && method == Method::GET {
        match cache.begin_fill(&state.key) {
            FillTicket::Leader(guard) => {
                // Another leader may have stored the response between the look-up above and
                // taking the lock: look once more before going to the app.
                looked = look_up(headers, &mut state, app).await.or(looked);
                match &looked {
                    Some(Looked::Fresh(_)) => {}
                    Some(Looked::Stale(copy, key)) if refreshes_in_background(copy) => {
                        let copy = copy.clone();
                        state.background = Some(Refresh {
                            route: route.clone(),
                            host: ctx.host.clone(),
                            tls: ctx.tls,
                            path_and_query: request
                                .uri
                                .path_and_query()
                                .map_or("/", |pq| pq.as_str())
                                .to_string(),
                            request_headers: varied_fields(headers, &copy.headers),
                            stale: copy.clone(),
                            key: key.clone(),
                            guard,
                            cache: cache.clone(),
                            shared: state.shared.clone(),
                        });
                        return Some(answer_stale(ctx, state, copy, headers));
                    }
                    _ => state.fill = Some(Fill::new(Some(guard), &state.key)),
                }
            }
            FillTicket::Uncoordinated => state.fill = Some(Fill::new(None, &state.key)),
            FillTicket::Follower(done) => {
                // RFC 5861: while the first request revalidates, the stale copy answers.
                if let Some(Looked::Stale(copy, _)) = &looked {
                    if Instant::now() < copy.revalidating_until {
                        let copy = copy.clone();
                        return Some(answer_stale(ctx, state, copy, headers));
                    }
                }
                let wait = Duration::from_millis(route.app.timeouts.read_ms).min(FILL_WAIT_CEILING);
                let _ = tokio::time::timeout(wait, done).await;
                looked = look_up(headers, &mut state, app).await.or(looked);
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
            ctx.cache = Some(Box::new(state));
            let is_get = method == Method::GET;
            Some(FromCache::for_request(
                response,
                CacheStatus::Hit,
                headers,
                is_get,
            ))
        }
        Some(Looked::Stale(response, key)) => {
            state.stale = Some((response, key));
            ctx.cache = Some(Box::new(state));
            None
        }
        None => {
            ctx.cache = Some(Box::new(state));
            None
        }
    }
}

/// Whether a stale copy is answered at once and revalidated in the background: within the
/// answer's `stale-while-revalidate`, with a validator to revalidate with.
fn refreshes_in_background(copy: &CachedResponse) -> bool {
    Instant::now() < copy.revalidating_until && freshness::has_validator(&copy.headers)
}

/// A stale copy answering a GET while it is revalidated (counted as stale).
fn answer_stale(
    ctx: &mut RequestCtx,
    mut state: CacheCtx,
    copy: Arc<CachedResponse>,
    request: &HeaderMap,
) -> FromCache {
    count(ctx, CacheStatus::Stale);
    state.status = CacheStatus::Stale;
    ctx.cache = Some(Box::new(state));
    FromCache::for_request(copy, CacheStatus::Stale, request, true)
}

/// The request's fields a copy's answer varies by: a background revalidation sends them
/// again, so the app answers for the same variant.
fn varied_fields(request: &HeaderMap, stored: &HeaderMap) -> HeaderMap {
    let mut fields = HeaderMap::new();
    let names = stored
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok());
    for name in names {
        for value in request.get_all(&name) {
            fields.append(name.clone(), value.clone());
        }
    }
    fields
}

/// The background revalidation the request's answer leaves behind, if any.
pub(crate) fn take_background_refresh(ctx: &mut RequestCtx) -> Option<Refresh> {
    ctx.cache.as_mut()?.background.take()
}

/// The cache key of `path_and_query` on the request's scheme and host.
fn url_key(ctx: &RequestCtx, path_and_query: &str) -> String {
    cache_key(ctx.tls, ctx.host.as_deref().unwrap_or(""), path_and_query)
}

/// The cache key layout: `scheme://host/path?query`.
fn cache_key(tls: bool, host: &str, path_and_query: &str) -> String {
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{host}{path_and_query}")
}

/// The versioned layout: the app wrote the body of this URL's current version; serve it, or
/// let the app answer (and write it). The router never writes here.
async fn versioned(ctx: &mut RequestCtx, state: CacheCtx, redis: &CacheRedis) -> Option<FromCache> {
    let Some(body) = redis.versioned_body(&state.key).await else {
        ctx.cache = Some(Box::new(state));
        return None;
    };
    count(ctx, CacheStatus::Hit);
    ctx.cache = Some(Box::new(CacheCtx {
        status: CacheStatus::Hit,
        ..state
    }));
    let now = Instant::now();
    let mut headers = HeaderMap::with_capacity(1);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    Some(FromCache::whole(
        Arc::new(CachedResponse {
            status: 200,
            headers,
            body,
            age_counts_from: now,
            lifetime: Duration::ZERO,
            decided_by: "the app's version in Redis",
            fresh_until: now,
            stale_until: now,
            revalidating_until: now,
            keep_until: now,
        }),
        CacheStatus::Hit,
    ))
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
    /// Expired but kept (to be revalidated, or to stand in): the copy and its key.
    Stale(Arc<CachedResponse>, String),
}

async fn look_up(headers: &HeaderMap, state: &mut CacheCtx, app: &str) -> Option<Looked> {
    let (entry, key) = match entry_at(state, app, &state.key).await? {
        Entry::Varies { names, generation } => {
            state.generation = Some(generation);
            let key = variant_key(&state.key, generation, &names, headers);
            (entry_at(state, app, &key).await?, key)
        }
        entry => (entry, state.key.clone()),
    };
    let Entry::Response(response) = entry else {
        return None;
    };
    let now = Instant::now();
    if now < response.fresh_until {
        Some(Looked::Fresh(response))
    } else if now < response.keep_until {
        Some(Looked::Stale(response, key))
    } else {
        // Redis expires its copies by itself.
        if state.shared.is_none() {
            state.cache.remove(&key);
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

fn variant_key(key: &str, generation: u64, names: &[HeaderName], headers: &HeaderMap) -> String {
    let mut variant = format!("{key}\n{generation:x}");
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

/// The request is about to go to the app: when it fills the cache, it asks for the whole
/// answer, or — with a stale copy that has a validator — whether that copy still holds.
pub(crate) fn upstream_request_phase(ctx: &mut RequestCtx, request: &mut HeaderMap) {
    let Some(state) = ctx.cache.as_mut() else {
        return;
    };
    if state.fill.is_none() {
        return;
    }
    state.sent_at = Some(SystemTime::now());
    state.client_conditionals = Some(validators::take_conditionals(request));
    if let Some((copy, _)) = &state.stale {
        if freshness::has_validator(&copy.headers) {
            validators::ask_if_changed(request, &copy.headers);
            state.revalidating = true;
        }
    }
}

/// The app answered `status` with `headers` to a request with `request_headers`: the copy
/// that answers instead — refreshed by the app's 304, or stale standing in for its error —
/// or `None` for the app's answer to go on (kept if the request holds the fill and the
/// answer is storable). The fields meant for the cache alone are taken out of `headers`.
pub(crate) fn response_phase(
    request_headers: &HeaderMap,
    ctx: &mut RequestCtx,
    status: u16,
    headers: &mut HeaderMap,
) -> Option<FromCache> {
    let answer = on_app_response(request_headers, ctx, status, headers);
    for targeted in &freshness::TARGETED {
        headers.remove(targeted);
    }
    match answer? {
        AppAnswer::Refreshed(copy) => {
            // The client's own conditionals (the request went with the copy's), and its range.
            let state = ctx.cache.as_mut()?;
            let mut asked = state.client_conditionals.take().unwrap_or_default();
            for name in [header::RANGE, header::IF_RANGE] {
                if let Some(value) = request_headers.get(&name) {
                    asked.insert(name, value.clone());
                }
            }
            // Only a GET fills, and so revalidates.
            Some(FromCache::for_request(
                copy,
                CacheStatus::Revalidated,
                &asked,
                true,
            ))
        }
        AppAnswer::StaleStandsIn => stand_in_for_failure(ctx),
    }
}

/// What answers instead of the app's answer.
enum AppAnswer {
    /// The app confirmed the stale copy with a 304: the copy, refreshed.
    Refreshed(Arc<CachedResponse>),
    /// The app failed and a stale copy may stand in.
    StaleStandsIn,
}

/// Whether to keep the app's answer, refresh the copy it validated, or let a stale copy
/// stand in for an app error; invalidates what an unsafe request changed.
fn on_app_response(
    request_headers: &HeaderMap,
    ctx: &mut RequestCtx,
    status: u16,
    headers: &HeaderMap,
) -> Option<AppAnswer> {
    let policy = cache_policy(&ctx.route)?;
    let state = ctx.cache.as_ref()?;
    if state.invalidates {
        if (200..400).contains(&status) {
            invalidate(ctx, headers);
        }
        return None;
    }
    if status == 304 && state.revalidating {
        return refresh(ctx, headers).map(AppAnswer::Refreshed);
    }
    let state = ctx.cache.as_mut()?;
    if status >= 500 && state.stale.is_some() {
        state.fill = None;
        return Some(AppAnswer::StaleStandsIn);
    }
    let fill = state.fill.as_mut()?;
    let received = Instant::now();
    match storable(policy, status, headers, state.sent_at) {
        Some((freshness, vary)) => {
            if let Some(names) = &vary {
                let generation = *state.generation.get_or_insert_with(rand::random);
                fill.stored_key = variant_key(&state.key, generation, names, request_headers);
            }
            fill.vary = vary;
            fill.response = Some(PendingResponse {
                status,
                headers: stored_fields(headers, policy.cache_set_cookie),
                freshness,
                received,
            });
        }
        None => state.fill = None,
    }
    None
}

/// The stale copy the app's 304 confirmed, with the 304's fields and a new freshness; stored
/// again when it still may be (§4.3.4), forgotten when not.
fn refresh(ctx: &mut RequestCtx, not_modified: &HeaderMap) -> Option<Arc<CachedResponse>> {
    let policy = cache_policy(&ctx.route)?;
    let app = ctx.app_name().to_string();
    let state = ctx.cache.as_mut()?;
    let (stale, key) = state.stale.take()?;
    let refreshed = refreshed_copy(policy, &stale, not_modified, state.sent_at);
    state.status = CacheStatus::Revalidated;
    count(ctx, CacheStatus::Revalidated);
    let state = ctx.cache.as_mut()?;
    let guard = state.fill.take().and_then(|fill| fill.guard);
    let shared = state.shared.as_ref();
    replace(&state.cache, shared, &app, key, refreshed.clone(), guard);
    Some(refreshed)
}

/// §4.4: a success answer to an unsafe request invalidates its URL and the same-origin URLs
/// its `Location` and `Content-Location` name, in this router's memory or in the Redis the
/// fleet shares. (The versioned layout is the app's own to change.)
fn invalidate(ctx: &RequestCtx, headers: &HeaderMap) {
    let (Some(state), Some(policy)) = (ctx.cache.as_ref(), cache_policy(&ctx.route)) else {
        return;
    };
    if policy.store == CacheStore::RedisVersioned {
        return;
    }
    let mut keys = vec![state.key.clone()];
    for name in [header::LOCATION, header::CONTENT_LOCATION] {
        let Some(target) = headers.get(name).and_then(|v| v.to_str().ok()) else {
            continue;
        };
        if let Some(key) = same_origin_key(ctx, target) {
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
    }
    metrics::CACHE_INVALIDATIONS.inc_by(keys.len() as u64);
    forget(&state.cache, state.shared.as_ref(), ctx.app_name(), keys);
}

/// The cache key of a `Location` or `Content-Location` value, if it names a URL of the
/// request's own origin (a path, or an absolute URL with the same scheme and host).
fn same_origin_key(ctx: &RequestCtx, target: &str) -> Option<String> {
    if target.starts_with('/') && !target.starts_with("//") {
        return Some(url_key(ctx, target));
    }
    let uri: http::Uri = target.parse().ok()?;
    let scheme = if ctx.tls { "https" } else { "http" };
    let same = uri.scheme_str() == Some(scheme)
        && uri
            .authority()
            .zip(ctx.host.as_deref())
            .is_some_and(|(authority, host)| authority.as_str().eq_ignore_ascii_case(host));
    same.then(|| url_key(ctx, uri.path_and_query().map_or("/", |pq| pq.as_str())))
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
    let stored = copy_of(
        pending.status,
        pending.headers,
        fill.body.freeze(),
        &pending.freshness,
        pending.received,
    );
    let mut entries = Vec::with_capacity(2);
    if let (Some(names), Some(generation)) = (fill.vary, state.generation) {
        entries.push((state.key.clone(), Entry::Varies { names, generation }));
    }
    entries.push((fill.stored_key, Entry::Response(Arc::new(stored))));
    metrics::CACHE_STORES.inc();
    let app = ctx
        .route
        .as_ref()
        .map_or("", |route| route.app.name.as_str());
    store(
        &state.cache,
        state.shared.as_ref(),
        app,
        entries,
        fill.guard,
    );
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
    if let Some(state) = ctx.cache.as_mut() {
        // Made here: no conditional request went anywhere.
        state.revalidating = false;
    }
    on_app_response(request_headers, ctx, status, headers);
    let label = x_cache(ctx);
    body_phase(ctx, &Some(body.clone()), true);
    label
}

/// The stale copy that stands in for an app that failed or could not be reached, if one is
/// allowed (counted as stale).
pub(crate) fn stand_in_for_failure(ctx: &mut RequestCtx) -> Option<FromCache> {
    let state = ctx.cache.as_mut()?;
    let may_stand_in = state
        .stale
        .as_ref()
        .is_some_and(|(copy, _)| Instant::now() < copy.stale_until);
    if !may_stand_in {
        return None;
    }
    let (stale, _) = state.stale.take()?;
    state.status = CacheStatus::Stale;
    state.fill = None;
    count(ctx, CacheStatus::Stale);
    Some(FromCache::whole(stale, CacheStatus::Stale))
}

/// An answer from the cache as it goes out: its status, head — the stored fields (those a
/// 304 keeps, when it is one), its length or range, age and `X-Cache` — and body.
pub(crate) fn cached_answer(answer: &FromCache) -> (u16, HeaderMap, Bytes) {
    let copy = &answer.copy;
    let length = copy.body.len();
    let (status, mut headers, body) = match &answer.served {
        Served::NotModified => (
            304,
            validators::not_modified_fields(&copy.headers),
            Bytes::new(),
        ),
        Served::Whole => (copy.status, copy.headers.clone(), copy.body.clone()),
        Served::Part(ranges::Part::Bytes(range)) => {
            let mut headers = copy.headers.clone();
            let content_range = format!("bytes {}-{}/{length}", range.start, range.end - 1);
            if let Ok(value) = HeaderValue::try_from(content_range) {
                headers.insert(header::CONTENT_RANGE, value);
            }
            (206, headers, copy.body.slice(range.clone()))
        }
        Served::Part(_) => {
            let mut headers = HeaderMap::with_capacity(4);
            if let Ok(value) = HeaderValue::try_from(format!("bytes */{length}")) {
                headers.insert(header::CONTENT_RANGE, value);
            }
            (416, headers, Bytes::new())
        }
    };
    if status != 304 {
        headers.insert(header::CONTENT_LENGTH, body.len().into());
    }
    headers.insert(header::AGE, copy.age_counts_from.elapsed().as_secs().into());
    headers.insert(
        HeaderName::from_static("x-cache"),
        HeaderValue::from_static(answer.status.label()),
    );
    (status, headers, body)
}

/// What the app's cache holds for `path` on `host` (over HTTP and HTTPS), for `explain`:
/// each copy's age, freshness lifetime and the field that decided it, or the headers its
/// variants are kept by. `null` for an app without a cache of its own copies.
pub(crate) async fn stored_copies(
    route: &AppRoute,
    redis: Option<&CacheRedis>,
    host: &str,
    path: &str,
) -> Option<Vec<StoredCopy>> {
    let (Some(policy), Some(cache)) = (route.app.cache.as_deref(), route.response_cache.as_ref())
    else {
        return None;
    };
    let mut copies = Vec::new();
    for tls in [false, true] {
        let key = cache_key(tls, host, path);
        let entry = match (policy.store, redis) {
            (CacheStore::Memory, _) => cache.get(&key),
            (CacheStore::Redis, Some(redis)) => {
                redis.shared_entry(route.app.name.as_str(), &key).await
            }
            _ => None,
        };
        let described = match entry {
            None => continue,
            Some(Entry::Varies { names, .. }) => StoredCopy::Varies {
                url: key,
                varies_by: names.iter().map(|n| n.as_str().to_string()).collect(),
                why: "one copy per variant of these request headers",
            },
            Some(Entry::Response(copy)) => describe_copy(&key, &copy),
        };
        copies.push(described);
    }
    Some(copies)
}

fn describe_copy(key: &str, copy: &CachedResponse) -> StoredCopy {
    let now = Instant::now();
    let state = if now < copy.fresh_until {
        "fresh"
    } else if freshness::has_validator(&copy.headers) {
        "stale: revalidated with the app on the next request"
    } else {
        "stale: the app is asked on the next request"
    };
    StoredCopy::Answer {
        url: key.to_string(),
        status: copy.status,
        age_s: copy.age_counts_from.elapsed().as_secs(),
        freshness_lifetime_s: copy.lifetime.as_secs(),
        decided_by: copy.decided_by,
        fresh_for_s: copy.fresh_until.saturating_duration_since(now).as_secs(),
        may_stand_in_for_errors_s: copy.stale_until.saturating_duration_since(now).as_secs(),
        state,
        bytes: copy.body.len(),
    }
}

fn count(ctx: &RequestCtx, status: CacheStatus) {
    metrics::CACHE_REQUESTS
        .with_label_values(&[ctx.app_name(), status.label()])
        .inc();
}

fn cache_policy(route: &Option<Arc<AppRoute>>) -> Option<&ResponseCache> {
    route.as_ref()?.app.cache.as_deref()
}

/// A field map from name-value pairs, for the tests of this stage's modules.
#[cfg(test)]
fn test_fields(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).expect("name"),
            HeaderValue::from_str(value).expect("value"),
        );
    }
    map
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

    #[test]
    fn cache_control_set_cookie_and_vary_decide_what_is_kept() {
        let p = policy();
        let kept = |status: u16, h: &[(&str, &str)]| storable(&p, status, &test_fields(h), None);
        let fresh = |h: &[(&str, &str)]| kept(200, h).map(|(f, _)| f.lifetime.as_secs());
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

//! How an app's answer becomes a copy and is kept: the fields a copy keeps, its freshness
//! and windows, the writes to this router's memory or to the Redis a fleet shares, and the
//! stale copy a background revalidation refreshes. Shared by the stage's request phases
//! and the background revalidation.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName};
use switchyard_model::ResponseCache;

use super::freshness::{self, Exchange, Freshness};
use super::validators;
use crate::hop_by_hop;
use crate::response_cache::memory::{AppResponseCache, CachedResponse, Entry, FillGuard};
use crate::response_cache::redis::CacheRedis;
use crate::routing::route_cache::AppRoute;

/// How long past its freshness a copy with a validator is kept to be revalidated (bounded by
/// the app's bytes in memory, and by Redis's own eviction).
const KEPT_FOR_REVALIDATION: Duration = Duration::from_secs(3600);
/// Response fields never stored beside the hop-by-hop ones: they describe one exchange
/// (`Age` is the cache's own to send, the request id the router's), or are meant for the
/// cache alone (the targeted fields).
const NOT_STORED: &[&str] = &[
    "age",
    "x-request-id",
    "cdn-cache-control",
    "surrogate-control",
];

/// `stale` with the fields of the app's 304 (sent at `sent_at`) and the freshness they give
/// now; not fresh, and kept no longer, when the answer may not be stored any more.
pub(super) fn refreshed_copy(
    policy: &ResponseCache,
    stale: &CachedResponse,
    not_modified: &HeaderMap,
    sent_at: Option<SystemTime>,
) -> Arc<CachedResponse> {
    let kept = stored_fields(not_modified, policy.cache_set_cookie);
    let headers = validators::refreshed(&stale.headers, &kept);
    let received = Instant::now();
    let freshness = storable(policy, stale.status, &headers, sent_at).map(|(f, _)| f);
    Arc::new(match freshness {
        Some(freshness) => copy_of(
            stale.status,
            headers,
            stale.body.clone(),
            &freshness,
            received,
        ),
        None => CachedResponse {
            status: stale.status,
            headers,
            body: stale.body.clone(),
            age_counts_from: received,
            lifetime: Duration::ZERO,
            decided_by: "not storable any more",
            fresh_until: received,
            stale_until: received,
            revalidating_until: received,
            keep_until: received,
        },
    })
}

/// The app's answer fields as a copy keeps them.
pub(super) fn stored_fields(headers: &HeaderMap, keeps_cookies: bool) -> HeaderMap {
    let mut stored = HeaderMap::with_capacity(headers.len());
    for (name, value) in hop_by_hop::end_to_end(headers) {
        if kept_field(name, keeps_cookies) {
            stored.append(name.clone(), value.clone());
        }
    }
    stored
}

pub(super) fn kept_field(name: &HeaderName, keeps_cookies: bool) -> bool {
    !NOT_STORED.contains(&name.as_str()) && (keeps_cookies || *name != header::SET_COOKIE)
}

/// A copy of an answer that arrived at `received` and stays fresh as `freshness` says.
pub(super) fn copy_of(
    status: u16,
    headers: HeaderMap,
    body: Bytes,
    freshness: &Freshness,
    received: Instant,
) -> CachedResponse {
    let fresh_until = received + freshness.lifetime.saturating_sub(freshness.initial_age);
    let stale_until = fresh_until + freshness.stale_if_error;
    let revalidating_until = fresh_until + freshness.stale_while_revalidate;
    let kept_for_revalidation = if freshness.has_validator {
        fresh_until + KEPT_FOR_REVALIDATION
    } else {
        fresh_until
    };
    CachedResponse {
        status,
        headers,
        body,
        age_counts_from: received
            .checked_sub(freshness.initial_age)
            .unwrap_or(received),
        lifetime: freshness.lifetime,
        decided_by: freshness.decided_by,
        fresh_until,
        stale_until,
        revalidating_until,
        keep_until: stale_until
            .max(revalidating_until)
            .max(kept_for_revalidation),
    }
}

/// How long `response` may be served, and the headers it varies by; `None` if it must not
/// be kept.
pub(super) fn storable(
    policy: &ResponseCache,
    status: u16,
    headers: &HeaderMap,
    sent_at: Option<SystemTime>,
) -> Option<(Freshness, Option<Arc<[HeaderName]>>)> {
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
    let received_at = SystemTime::now();
    let freshness = freshness::decide(&Exchange {
        status,
        headers,
        sent_at: sent_at.unwrap_or(received_at),
        received_at,
        default_ttl: policy.default_ttl_s.map(Duration::from_secs),
        stale_if_error: Duration::from_secs(policy.stale_if_error_s),
    })
    .ok()?;
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
    Some((freshness, vary))
}

pub(super) fn store<T: Send + 'static>(
    cache: &AppResponseCache,
    shared: Option<&Arc<CacheRedis>>,
    app: &str,
    entries: Vec<(String, Entry)>,
    done: Option<T>,
) {
    match shared {
        Some(redis) => redis.store_shared(app, entries, done),
        None => {
            for (key, entry) in entries {
                cache.insert(key, entry);
            }
        }
    }
}

pub(super) fn forget(
    cache: &AppResponseCache,
    shared: Option<&Arc<CacheRedis>>,
    app: &str,
    keys: Vec<String>,
) {
    match shared {
        Some(redis) => redis.invalidate_shared(app, keys),
        None => {
            for key in keys {
                cache.remove(&key);
            }
        }
    }
}

/// Puts `copy` in place under `key` — `done` goes once it can be read back — or, when it may
/// not be kept any more, forgets what `key` held.
pub(super) fn replace<T: Send + 'static>(
    cache: &AppResponseCache,
    shared: Option<&Arc<CacheRedis>>,
    app: &str,
    key: String,
    copy: Arc<CachedResponse>,
    done: Option<T>,
) {
    if copy.keep_until > Instant::now() {
        crate::metrics::CACHE_STORES.inc();
        store(cache, shared, app, vec![(key, Entry::Response(copy))], done);
    } else {
        forget(cache, shared, app, vec![key]);
    }
}

/// A stale copy to refresh, with what the request that found it knew.
pub(crate) struct Refresh {
    pub(crate) route: Arc<AppRoute>,
    pub(crate) host: Option<String>,
    pub(crate) tls: bool,
    pub(crate) path_and_query: String,
    /// The fields of the request that found the copy the refresh sends again: those its
    /// answer varies by select the same variant.
    pub(crate) request_headers: HeaderMap,
    pub(crate) stale: Arc<CachedResponse>,
    pub(crate) key: String,
    /// Held until the refresh ends: the URL's other requests take the stale copy meanwhile.
    pub(crate) guard: FillGuard,
    pub(crate) cache: Arc<AppResponseCache>,
    pub(crate) shared: Option<Arc<CacheRedis>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage::cache::test_fields;

    #[test]
    fn hop_by_hop_fields_and_those_connection_names_are_not_stored() {
        let answer = test_fields(&[
            ("connection", "x-trace, Keep-Alive"),
            ("keep-alive", "timeout=5"),
            ("x-trace", "1"),
            ("age", "3"),
            ("cdn-cache-control", "max-age=60"),
            ("set-cookie", "a=1"),
            ("etag", "\"v\""),
        ]);
        let names = |stored: HeaderMap| -> Vec<String> {
            stored.keys().map(|n| n.as_str().to_string()).collect()
        };
        assert_eq!(names(stored_fields(&answer, false)), ["etag"]);
        assert_eq!(names(stored_fields(&answer, true)), ["set-cookie", "etag"]);
    }
}

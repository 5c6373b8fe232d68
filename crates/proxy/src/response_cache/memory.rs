//! The in-memory response store: one bounded cache per app, carved out of one total budget,
//! and the fill locks that make concurrent misses for one URL send a single request.
//!
//! Each app's cache is sized by the app (`max_bytes`) and reserved from the router's total
//! (`--cache-memory-mb`) when the app's route is built; it is released when the route goes
//! (app deleted, or evicted from the route cache). Within an app, eviction is quick_cache's
//! S3-FIFO: one-hit wonders leave first, popular responses stay.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName};
use parking_lot::Mutex;
use prometheus::IntGauge;
use quick_cache::sync::Cache;
use quick_cache::{Lifecycle, Weighter};
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

use crate::metrics;

/// Most URLs being filled at once per app; beyond it misses are not coalesced.
const MAX_FILLS_IN_PROGRESS: usize = 10_000;
/// Bookkeeping per entry beyond its key and bytes, so tiny responses are not free.
const ENTRY_OVERHEAD: u64 = 200;

/// Every name of what decided a copy's lifetime (`decided_by`): those the cache stage's
/// freshness rules give, and the two it gives copies it did not decide for. A copy read
/// from the shared Redis names one of them.
pub(crate) const FRESHNESS_DECIDERS: [&str; 12] = [
    "s-maxage",
    "s-maxage (invalid)",
    "max-age",
    "max-age (invalid)",
    "Expires - Date",
    "Expires (invalid)",
    "no-cache",
    "default_ttl_s",
    "heuristic (Last-Modified)",
    "the app's version in Redis",
    "not storable any more",
    "Age (invalid)",
];

/// A stored response, ready to be written to a client.
#[derive(Debug)]
pub(crate) struct CachedResponse {
    pub(crate) status: u16,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    /// When the copy's age was zero: its `Age` is the time since (RFC 9111 §4.2.3).
    pub(crate) age_counts_from: Instant,
    /// Its freshness lifetime, and the field that decided it (for `explain`).
    pub(crate) lifetime: Duration,
    pub(crate) decided_by: &'static str,
    pub(crate) fresh_until: Instant,
    /// Until when it may stand in for an app that fails.
    pub(crate) stale_until: Instant,
    /// Until when it may answer while another request revalidates it.
    pub(crate) revalidating_until: Instant,
    /// Until when it is kept: past its freshness, a copy with a validator is kept to be
    /// revalidated with the app.
    pub(crate) keep_until: Instant,
}

impl CachedResponse {
    fn weight(&self) -> u64 {
        let headers: usize = self
            .headers
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len())
            .sum();
        (self.body.len() + headers) as u64 + ENTRY_OVERHEAD
    }
}

/// What is stored under a URL: the response, or — when the app's response varies by
/// request headers — the names of those headers, under which each variant is stored.
#[derive(Debug, Clone)]
pub(crate) enum Entry {
    Response(Arc<CachedResponse>),
    /// The variants' keys carry `generation`: once the URL's entry is invalidated, the next
    /// one gets a new generation and the old variants are never found again.
    Varies {
        names: Arc<[HeaderName]>,
        generation: u64,
    },
}

#[derive(Debug, Clone)]
struct EntryWeight;

impl Weighter<String, Entry> for EntryWeight {
    fn weight(&self, key: &String, entry: &Entry) -> u64 {
        let value = match entry {
            Entry::Response(response) => response.weight(),
            Entry::Varies { names, .. } => names.iter().map(|n| n.as_str().len() as u64).sum(),
        };
        key.len() as u64 + value + ENTRY_OVERHEAD
    }
}

#[derive(Debug, Clone)]
struct CountEvictions;

impl Lifecycle<String, Entry> for CountEvictions {
    type RequestState = ();

    fn begin_request(&self) -> Self::RequestState {}

    fn on_evict(&self, _state: &mut Self::RequestState, _key: String, _entry: Entry) {
        metrics::CACHE_EVICTIONS.inc();
    }
}

type EntryCache =
    Cache<String, Entry, EntryWeight, quick_cache::DefaultHashBuilder, CountEvictions>;

/// The router-wide byte budget that per-app caches are reserved from.
#[derive(Debug)]
pub(crate) struct CacheBudget {
    total: u64,
    reserved: AtomicU64,
}

impl CacheBudget {
    /// A budget of `total` bytes for all apps' cached responses.
    pub(crate) fn new(total: u64) -> Arc<Self> {
        Arc::new(Self {
            total,
            reserved: AtomicU64::new(0),
        })
    }

    /// Reserves up to `wanted` bytes; returns what was granted (maybe 0).
    fn reserve(&self, wanted: u64) -> u64 {
        let mut granted = 0;
        let _ = self
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |reserved| {
                granted = wanted.min(self.total.saturating_sub(reserved));
                Some(reserved + granted)
            });
        granted
    }

    fn release(&self, bytes: u64) {
        self.reserved.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// One app's cached responses and fills in progress.
pub(crate) struct AppResponseCache {
    entries: Option<EntryCache>,
    granted: u64,
    requested: u64,
    budget: Arc<CacheBudget>,
    fills: Mutex<HashMap<String, Arc<Notify>>>,
    bytes_gauge: IntGauge,
}

impl std::fmt::Debug for AppResponseCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppResponseCache")
            .field("granted", &self.granted)
            .finish_non_exhaustive()
    }
}

/// How a miss proceeds.
pub(crate) enum FillTicket {
    /// This request fetches and stores; others wait for it until the guard drops.
    Leader(FillGuard),
    /// Another request is fetching this URL: wait for it, then look again.
    Follower(OwnedNotified),
    /// Too many fills in progress: fetch without coalescing.
    Uncoordinated,
}

/// Held by the request filling a URL; dropping it wakes the requests waiting for it.
pub(crate) struct FillGuard {
    cache: Arc<AppResponseCache>,
    key: String,
}

impl Drop for FillGuard {
    fn drop(&mut self) {
        if let Some(waiters) = self.cache.fills.lock().remove(&self.key) {
            waiters.notify_waiters();
        }
    }
}

impl AppResponseCache {
    /// A cache of `max_bytes` for `app`, reserved from `budget` (less if the budget is
    /// short: the shortfall is logged and the app caches less).
    pub(crate) fn new(app: &str, max_bytes: u64, budget: &Arc<CacheBudget>) -> Self {
        let granted = budget.reserve(max_bytes);
        if granted < max_bytes {
            log::warn!(
                "app {app}: response cache gets {granted} of the {max_bytes} bytes it asks for; \
                 raise --cache-memory-mb"
            );
        }
        let entries = (granted > 0).then(|| {
            Cache::with(
                (granted / 16_384).clamp(16, 1 << 20) as usize,
                granted,
                EntryWeight,
                quick_cache::DefaultHashBuilder::default(),
                CountEvictions,
            )
        });
        Self {
            entries,
            granted,
            requested: max_bytes,
            budget: budget.clone(),
            fills: Mutex::new(HashMap::new()),
            bytes_gauge: metrics::CACHE_BYTES.with_label_values(&[app]),
        }
    }

    /// Whether this cache was made for the same size (and can be kept across a change).
    pub(crate) fn sized_for(&self, max_bytes: u64) -> bool {
        self.requested == max_bytes
    }

    pub(crate) fn get(&self, key: &str) -> Option<Entry> {
        self.entries.as_ref()?.get(key)
    }

    pub(crate) fn remove(&self, key: &str) {
        if let Some(entries) = &self.entries {
            entries.remove(key);
            self.bytes_gauge.set(entries.weight() as i64);
        }
    }

    pub(crate) fn insert(&self, key: String, entry: Entry) {
        if let Some(entries) = &self.entries {
            entries.insert(key, entry);
            self.bytes_gauge.set(entries.weight() as i64);
        }
    }

    /// Drops every response stored for `path` (any scheme, host, query string or variant),
    /// or for every path under it with `prefix`.
    pub(crate) fn purge(&self, path: &str, prefix: bool) {
        let Some(entries) = &self.entries else {
            return;
        };
        entries.retain(|key, _| {
            let stored_path = key_path(key);
            let hit = if prefix {
                stored_path.starts_with(path)
            } else {
                stored_path == path
            };
            !hit
        });
        self.bytes_gauge.set(entries.weight() as i64);
    }

    /// Claims the right to fill `key`, or a way to wait for whoever has it.
    pub(crate) fn begin_fill(self: &Arc<Self>, key: &str) -> FillTicket {
        let mut fills = self.fills.lock();
        if let Some(waiters) = fills.get(key) {
            // Created under the lock the leader takes to notify: no wake-up can be missed.
            return FillTicket::Follower(waiters.clone().notified_owned());
        }
        if fills.len() >= MAX_FILLS_IN_PROGRESS {
            return FillTicket::Uncoordinated;
        }
        fills.insert(key.to_string(), Arc::new(Notify::new()));
        FillTicket::Leader(FillGuard {
            cache: self.clone(),
            key: key.to_string(),
        })
    }
}

/// The path of a cache key (`scheme://host/path?query` plus `\nvariant…`), without query.
pub(crate) fn key_path(key: &str) -> &str {
    let url = key.split('\n').next().unwrap_or(key);
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    let path_and_query = after_scheme
        .find('/')
        .map_or("/", |start| &after_scheme[start..]);
    path_and_query.split('?').next().unwrap_or(path_and_query)
}

impl Drop for AppResponseCache {
    fn drop(&mut self) {
        self.budget.release(self.granted);
        self.bytes_gauge.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(body: &'static [u8]) -> Entry {
        let now = Instant::now();
        Entry::Response(Arc::new(CachedResponse {
            status: 200,
            headers: HeaderMap::new(),
            body: Bytes::from_static(body),
            age_counts_from: now,
            lifetime: Duration::from_secs(60),
            decided_by: "max-age",
            fresh_until: now + Duration::from_secs(60),
            stale_until: now + Duration::from_secs(60),
            revalidating_until: now + Duration::from_secs(60),
            keep_until: now + Duration::from_secs(60),
        }))
    }

    #[test]
    fn the_budget_is_shared_and_given_back() {
        let budget = CacheBudget::new(100_000);
        let a = AppResponseCache::new("a", 80_000, &budget);
        let b = AppResponseCache::new("b", 80_000, &budget);
        assert_eq!((a.granted, b.granted), (80_000, 20_000));
        drop(a);
        let c = AppResponseCache::new("c", 80_000, &budget);
        assert_eq!(c.granted, 80_000);
        let starved = AppResponseCache::new("d", 1_000, &budget);
        starved.insert("k".into(), response(b"x"));
        assert!(starved.get("k").is_none(), "no budget, nothing kept");
    }

    #[test]
    fn an_app_cache_stays_within_its_bytes() {
        let budget = CacheBudget::new(1 << 30);
        let cache = AppResponseCache::new("a", 64 * 1024, &budget);
        for i in 0..1000 {
            cache.insert(format!("/{i}"), response(&[0; 1024]));
        }
        let kept = (0..1000)
            .filter(|i| cache.get(&format!("/{i}")).is_some())
            .count();
        assert!(kept > 0 && kept < 64, "{kept} entries of 1 KiB in 64 KiB");
    }

    #[test]
    fn purges_by_path_or_prefix_across_queries_and_variants() {
        let cache = AppResponseCache::new("a", 1 << 20, &CacheBudget::new(1 << 20));
        for key in [
            "http://a.test/news?page=2",
            "https://www.a.test/news",
            "http://a.test/news\nfr",
            "http://a.test/news/1",
            "http://a.test/about",
        ] {
            cache.insert(key.to_string(), response(b"x"));
        }
        cache.purge("/news", false);
        let left = |k: &str| cache.get(k).is_some();
        assert!(!left("http://a.test/news?page=2") && !left("https://www.a.test/news"));
        assert!(!left("http://a.test/news\nfr"));
        assert!(left("http://a.test/news/1") && left("http://a.test/about"));
        cache.purge("/news/", true);
        assert!(!left("http://a.test/news/1") && left("http://a.test/about"));
    }

    #[tokio::test]
    async fn one_leader_per_key_and_followers_are_woken() {
        let cache = Arc::new(AppResponseCache::new(
            "a",
            1 << 20,
            &CacheBudget::new(1 << 20),
        ));
        let FillTicket::Leader(guard) = cache.begin_fill("/x") else {
            panic!("first is the leader");
        };
        let FillTicket::Follower(waiting) = cache.begin_fill("/x") else {
            panic!("second follows");
        };
        assert!(matches!(cache.begin_fill("/y"), FillTicket::Leader(_)));
        drop(guard);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("the follower is woken when the leader finishes");
        assert!(matches!(cache.begin_fill("/x"), FillTicket::Leader(_)));
    }
}

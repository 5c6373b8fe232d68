//! What the cache stage keeps of one request (its `RequestCtx.cache`), in a file of its own
//! so that the request's context holds it without importing the stage that reads it.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::BytesMut;
use http::{HeaderMap, HeaderName};

use super::copies::Refresh;
use super::freshness::Freshness;
use crate::response_cache::memory::{AppResponseCache, CachedResponse, FillGuard};
use crate::response_cache::redis::CacheRedis;

/// The `X-Cache` verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CacheStatus {
    Hit,
    Miss,
    /// A stale copy the app confirmed with a 304.
    Revalidated,
    Stale,
    Bypass,
}

impl CacheStatus {
    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Hit => "HIT",
            Self::Miss => "MISS",
            Self::Revalidated => "REVALIDATED",
            Self::Stale => "STALE",
            Self::Bypass => "BYPASS",
        }
    }
}

/// What the cache stage knows about one request of an app that caches. The app's policy is
/// read from the request's route, which is fixed for the request.
pub(crate) struct CacheCtx {
    pub(super) status: CacheStatus,
    pub(super) cache: Arc<AppResponseCache>,
    /// The cache Redis, for apps whose responses are kept there (`redis` store).
    pub(super) shared: Option<Arc<CacheRedis>>,
    pub(super) key: String,
    /// The request's method is unsafe: a success invalidates what is stored for the URL.
    pub(super) invalidates: bool,
    /// The generation of the URL's variants when its answers vary (`Entry::Varies`).
    pub(super) generation: Option<u64>,
    /// An expired copy (and its key): revalidated with the app, or standing in if it fails.
    pub(super) stale: Option<(Arc<CachedResponse>, String)>,
    /// Set when this request may store its response.
    pub(super) fill: Option<Fill>,
    /// The request went to the app with the stale copy's validators.
    pub(super) revalidating: bool,
    /// When the request went to the app: the copy's age counts the exchange.
    pub(super) sent_at: Option<SystemTime>,
    /// The client's conditionals, taken out of a request that fills the cache.
    pub(super) client_conditionals: Option<HeaderMap>,
    /// A stale copy answered at once, to be revalidated in the background.
    pub(super) background: Option<Refresh>,
}

impl std::fmt::Debug for CacheCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheCtx")
            .field("status", &self.status)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

pub(super) struct Fill {
    /// Released once the response can be read back, waking the requests waiting for it.
    pub(super) guard: Option<FillGuard>,
    pub(super) vary: Option<Arc<[HeaderName]>>,
    pub(super) stored_key: String,
    pub(super) response: Option<PendingResponse>,
    pub(super) body: BytesMut,
}

pub(super) struct PendingResponse {
    pub(super) status: u16,
    pub(super) headers: HeaderMap,
    pub(super) freshness: Freshness,
    pub(super) received: Instant,
}

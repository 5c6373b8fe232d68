//! What every thread of the listeners shares: routes, the connection table, the access log,
//! deadlines, and the stages' own state (WAF, cache Redis, image resizing). The life of a
//! request itself is in `pipeline`.

use std::sync::Arc;

use switchyard_model::{ClientTimeouts, IpNet, DEFAULT_LIMIT_CLIENTS};

use crate::access_log::AccessLog;
use crate::fleet_rate::FleetRates;
use crate::isolation::worker_pool::WorkerPool;
use crate::response_cache::redis::CacheRedis;
use crate::routing::connections::ConnectionTable;
use crate::routing::route_cache::RouteCache;
use crate::stage::images::ImageStage;
use crate::stage::limits::Limiter;
use crate::stage::request_buffer::{RequestBufferSettings, RequestBuffers};
use crate::stage::waf::Inspector;
use crate::upstream::response_buffers::ResponseBuffers;

/// Apps whose limit counters are kept (the route cache's default size): past it, the least
/// used app's counters start again.
const DEFAULT_LIMITED_APPS: usize = 100_000;

/// The router's shared state, built once by the binary and handed to the listener, whose
/// threads each get a copy (`Shared::for_another_thread`).
pub struct Router {
    shared: Shared,
}

/// What every thread of the listener shares: the one list of the router's shared state.
pub(crate) struct Shared {
    pub(crate) routes: Arc<RouteCache>,
    /// Where backend connections in use are entered, so a deletion can drain them.
    pub(crate) connections: Arc<ConnectionTable>,
    pub(crate) access_log: AccessLog,
    /// Where clients reach HTTPS (for redirects), `None` without an HTTPS listener.
    pub(crate) https_port: Option<u16>,
    pub(crate) client_timeouts: ClientTimeouts,
    /// The WAF's rules and spool; `None` when the router runs without (`--waf off`).
    pub(crate) waf: Option<Arc<Inspector>>,
    /// The cache Redis, for apps whose responses are kept there.
    pub(crate) cache_redis: Option<Arc<CacheRedis>>,
    /// The image stage, with this thread's own connections for originals; `None` without a
    /// worker pool (resize requests are then answered 503).
    pub(crate) images: Option<ImageStage>,
    /// Every app's limits and their counters.
    pub(crate) limiter: Arc<Limiter>,
    /// The limits of answers read ahead of slow clients.
    pub(crate) response_buffers: Arc<ResponseBuffers>,
    /// The settings and budgets of request bodies read whole.
    pub(crate) request_buffers: Arc<RequestBuffers>,
    /// Where CPU-heavy checks run off the event loops (passwords); `None` without a pool
    /// (they then run inline).
    pub(crate) pool: Option<Arc<WorkerPool>>,
}

impl Shared {
    /// A copy for another listener thread: the same state, its own image connections.
    fn for_another_thread(&self) -> Self {
        Self {
            routes: self.routes.clone(),
            connections: self.connections.clone(),
            access_log: self.access_log.clone(),
            https_port: self.https_port,
            client_timeouts: self.client_timeouts,
            waf: self.waf.clone(),
            cache_redis: self.cache_redis.clone(),
            images: self.images.as_ref().map(ImageStage::for_another_thread),
            limiter: self.limiter.clone(),
            response_buffers: self.response_buffers.clone(),
            request_buffers: self.request_buffers.clone(),
            pool: self.pool.clone(),
        }
    }
}

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
        let shared = Shared {
            routes,
            connections,
            access_log,
            https_port,
            cache_redis,
            waf: None,
            images: None,
            client_timeouts: ClientTimeouts::default(),
            limiter: Arc::new(Limiter::new(
                DEFAULT_LIMITED_APPS,
                DEFAULT_LIMIT_CLIENTS,
                Vec::new(),
            )),
            response_buffers: Arc::new(ResponseBuffers::off()),
            request_buffers: Arc::new(RequestBuffers::new(RequestBufferSettings::default())),
            pool: None,
        };
        Self { shared }
    }

    /// Backend answers are read ahead of slow clients within `buffers`' limits.
    pub fn with_response_buffers(mut self, buffers: ResponseBuffers) -> Self {
        self.shared.response_buffers = Arc::new(buffers);
        self
    }

    /// Request bodies are read whole within `buffers`' settings and budgets.
    pub fn with_request_buffers(mut self, buffers: RequestBuffers) -> Self {
        self.shared.request_buffers = Arc::new(buffers);
        self
    }

    /// Per-client limits keep at most `clients` records; `X-Forwarded-For` is believed from
    /// `trusted_proxies` only (the client address limits and IP rules see).
    pub fn with_limits(mut self, clients: usize, trusted_proxies: Vec<IpNet>) -> Self {
        self.shared.limiter =
            Arc::new(Limiter::new(DEFAULT_LIMITED_APPS, clients, trusted_proxies));
        self
    }

    /// App rates with `"scope": "fleet"` are counted with the other routers sharing the
    /// Redis at `url` (the store's); the returned task syncs the counts and must run.
    pub fn with_fleet_limits(self, url: &str) -> Result<(Self, FleetLimitSync), String> {
        let fleet = Arc::new(FleetRates::new(url, DEFAULT_LIMITED_APPS)?);
        self.shared.limiter.count_fleet_rates_with(fleet.clone());
        Ok((self, FleetLimitSync(fleet)))
    }

    /// Deadlines for clients: the first head, an idle keep-alive connection, each read of a
    /// body, each write of an answer.
    pub fn with_client_timeouts(mut self, timeouts: ClientTimeouts) -> Self {
        self.shared.client_timeouts = timeouts;
        self
    }

    /// Apps with a `waf` option are inspected by `inspector`; without one, their requests
    /// follow their `on_overload` policy.
    pub fn with_waf(mut self, inspector: Arc<Inspector>) -> Self {
        self.shared.waf = Some(inspector);
        self
    }

    /// CPU-heavy stages other than the WAF (image resizing, password checks) run on
    /// `pool`; without one, resize requests are answered 503 and passwords checked inline.
    pub fn with_worker_pool(mut self, pool: Arc<WorkerPool>) -> Self {
        self.shared.pool = Some(pool.clone());
        self.shared.images = Some(ImageStage::new(pool));
        self
    }

    /// What a thread of the listener shares with this router's.
    pub(crate) fn shared_with_listener_threads(&self) -> Shared {
        self.shared.for_another_thread()
    }
}

/// The sync of fleet-wide app rates with Redis.
pub struct FleetLimitSync(Arc<FleetRates>);

impl FleetLimitSync {
    /// Syncs every `interval` until `stop` resolves.
    pub async fn run(self, interval: std::time::Duration, stop: impl std::future::Future) {
        self.0.run(interval, stop).await;
    }
}

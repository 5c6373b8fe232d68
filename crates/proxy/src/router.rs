//! What every thread of the listeners shares: routes, the connection table, the access log,
//! deadlines, and the stages' own state (WAF, cache Redis, image resizing). The life of a
//! request itself is in `listener/service.rs`.

use std::sync::Arc;

use switchyard_model::{ClientTimeouts, IpNet, DEFAULT_LIMIT_CLIENTS};

use crate::access_log::AccessLog;
use crate::fleet_rate::FleetRates;
use crate::listener::ResponseBuffers;
use crate::response_cache::redis::CacheRedis;
use crate::routing::connections::ConnectionTable;
use crate::routing::route_cache::RouteCache;
use crate::stage::images::ImageStage;
use crate::stage::limits::Limiter;
use crate::stage::waf::Inspector;
use crate::worker_pool::WorkerPool;

/// Apps whose limit counters are kept (the route cache's default size): past it, the least
/// used app's counters start again.
const DEFAULT_LIMITED_APPS: usize = 100_000;

/// The router's shared state, built once by the binary and handed to the listener.
pub struct Router {
    routes: Arc<RouteCache>,
    connections: Arc<ConnectionTable>,
    access_log: AccessLog,
    https_port: Option<u16>,
    cache_redis: Option<Arc<CacheRedis>>,
    waf: Option<Arc<Inspector>>,
    /// `None` until a worker pool is given: resize requests are then answered 503.
    images: Option<ImageStage>,
    client_timeouts: ClientTimeouts,
    limiter: Arc<Limiter>,
    response_buffers: Arc<ResponseBuffers>,
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
        Self {
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
        }
    }

    /// Backend answers are read ahead of slow clients within `buffers`' limits.
    pub fn with_response_buffers(mut self, buffers: ResponseBuffers) -> Self {
        self.response_buffers = Arc::new(buffers);
        self
    }

    /// Per-client limits keep at most `clients` records; `X-Forwarded-For` is believed from
    /// `trusted_proxies` only (the client address limits and IP rules see).
    pub fn with_limits(mut self, clients: usize, trusted_proxies: Vec<IpNet>) -> Self {
        self.limiter = Arc::new(Limiter::new(DEFAULT_LIMITED_APPS, clients, trusted_proxies));
        self
    }

    /// App rates with `"scope": "fleet"` are counted with the other routers sharing the
    /// Redis at `url` (the store's); the returned task syncs the counts and must run.
    pub fn with_fleet_limits(self, url: &str) -> Result<(Self, FleetLimitSync), String> {
        let fleet = Arc::new(FleetRates::new(url, DEFAULT_LIMITED_APPS)?);
        self.limiter.count_fleet_rates_with(fleet.clone());
        Ok((self, FleetLimitSync(fleet)))
    }

    /// Deadlines for clients: the first head, an idle keep-alive connection, each read of a
    /// body, each write of an answer.
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

    /// CPU-heavy stages other than the WAF (image resizing) run on `pool`; without one,
    /// resize requests are answered 503.
    pub fn with_worker_pool(mut self, pool: Arc<WorkerPool>) -> Self {
        self.images = Some(ImageStage::new(pool));
        self
    }

    /// What a thread of the listener shares with this router's.
    pub(crate) fn shared_with_listener_threads(&self) -> crate::listener::Shared {
        crate::listener::Shared {
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
        }
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

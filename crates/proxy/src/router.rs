//! What every thread of the listeners shares: routes, the connection table, the access log,
//! deadlines, and the stages' own state (WAF, cache Redis, image resizing). The life of a
//! request itself is in `listener/service.rs`.

use std::sync::Arc;

use switchyard_model::ClientTimeouts;

use crate::access_log::AccessLog;
use crate::response_cache::redis::CacheRedis;
use crate::routing::connections::ConnectionTable;
use crate::routing::route_cache::RouteCache;
use crate::stage::images::ImageStage;
use crate::stage::waf::Inspector;
use crate::worker_pool::WorkerPool;

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
        }
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
        }
    }
}

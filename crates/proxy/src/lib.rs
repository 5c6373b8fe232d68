//! Switchyard's request path. [`HyperListener`] serves HTTP/1.1 and HTTP/2, plain and TLS,
//! on one single-threaded runtime per thread (see `hyper_engine`), each request through the
//! stages in `hyper_engine/service.rs`, with the shared state a [`Router`] holds;
//! [`RouteCache`] is the in-process view of the store the stages read; [`ChangeFollower`] keeps that view current
//! from the store's change events, and [`ConnectionDrain`] ends the backend connections a deletion or
//! a domain transfer leaves behind, found in the [`ConnectionTable`];
//! [`HealthChecker`] probes backends of apps that ask for it.
//! On the HTTPS listener, [`CertCache`] hands each handshake its certificate.

mod access_log;
mod app_requests;
mod balancer;
mod cache;
mod cache_redis;
mod cert_cache;
mod cert_expiry;
mod context;
mod drain;
mod follower;
mod framing;
mod h2_resets;
mod health;
mod https;
mod hyper_engine;
mod images;
mod metrics;
mod mirror;
mod outbound;
mod request_id;
mod respond;
mod response_store;
mod route;
mod route_cache;
mod router;
mod shutdown;
mod static_files;
mod thumbnail;
mod tls;
mod upstream;
mod upstream_connections;
mod waf;
mod websocket_close;
mod worker_pool;

pub use access_log::{AccessLog, AccessLogTarget, ACCESS_LOG_QUEUE_CAPACITY};
pub use cache_redis::{CacheRedis, PurgeReport};
pub use cert_cache::{CertCache, CertCacheLimits, ServedCert};
pub use cert_expiry::CertExpiryScan;
pub use drain::ConnectionDrain;
pub use follower::ChangeFollower;
pub use health::HealthChecker;
pub use hyper_engine::{HyperListener, HyperListenerStop, HyperTls, InheritedSockets};
pub use mirror::MirrorState;
pub use response_store::{AppResponseCache, CacheBudget};
pub use route_cache::{AppRoute, RouteCache, RouteCacheLimits};
pub use router::Router;
pub use shutdown::ShutdownWatch;
pub use tls::TicketKeyRotation;
pub use upstream_connections::ConnectionTable;
pub use waf::{Inspector, SpoolSettings};
pub use worker_pool::WorkerPool;

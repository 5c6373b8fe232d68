//! Switchyard's request path. [`Listener`] accepts, handshakes and speaks HTTP/1.1 and
//! HTTP/2, plain and TLS, on one single-threaded runtime per thread (`listener`); each
//! request goes through the phases of `pipeline`, which runs the stages of `stage` in their
//! order; `upstream` is everything that talks to a backend, the router's own requests
//! included; `isolation` keeps CPU-heavy work off the light requests' way; a [`Router`]
//! holds the state every thread shares. `routing` is what routing knows: the
//! [`RouteCache`] (the in-process view of the store the stages read), kept current from the
//! store's change events by the [`ChangeFollower`]; the [`ConnectionDrain`] that ends the
//! backend connections a deletion or a domain transfer leaves behind, found in the
//! [`ConnectionTable`]; the [`HealthChecker`]. `response_cache` holds the cache's copies,
//! `tls` the certificates ([`CertCache`]) and ticket keys, `connection` what is watched on
//! a client connection. The rest is infrastructure: metrics (and the lifetime of a deleted
//! app's series), the access log.

mod access_log;
mod app_files;
mod body_feed;
mod body_read;
mod buffered_body;
mod byte_budget;
mod connection;
mod content_coding;
mod context;
mod cookies;
mod event_loop;
mod fields_mut;
mod fleet_rate;
mod forwarded;
mod hop_by_hop;
mod idle_connections;
mod isolation;
mod listener;
mod metrics;
mod pipeline;
mod proxy_protocol;
mod request_body;
mod request_fields;
mod respond;
mod response_cache;
mod router;
mod routing;
mod shutdown;
mod stage;
mod thumbnail;
mod tls;
mod traffic;
mod upstream;
mod wall_clock;

pub use access_log::{format_rfc3339, AccessLog, AccessLogTarget};
pub use isolation::fair_share::{
    configure as configure_fair_share, sample_shares as sample_fair_shares, FairShare,
};
pub use isolation::worker_pool::{PoolScheduling, WorkerPool};
pub use listener::{InheritedSockets, Listener, ListenerStop, ListenerTls};
pub use respond::refusals_table;
pub use response_cache::redis::CacheRedis;
pub use router::{FleetLimitSync, Router};
pub use routing::affinity_tokens::set_key as set_affinity_key;
pub use routing::connections::ConnectionTable;
pub use routing::drain::ConnectionDrain;
pub use routing::explain::explain as explain_host;
pub use routing::filter_modules::{FilterDefaults, FilterModules};
pub use routing::follower::ChangeFollower;
pub use routing::health::HealthChecker;
pub use routing::names::{BackendNames, NameSettings};
pub use routing::recent_changes::RecentChanges;
pub use routing::route_cache::{RouteCache, RouteCacheLimits};
pub use shutdown::ShutdownWatch;
pub use stage::https::advertise_http3;
pub use stage::list::stages_table;
pub use stage::request_buffer::{RequestBufferSettings, RequestBuffers};
pub use stage::waf::{Inspector, SpoolSettings};
pub use tls::cert_cache::{CertCache, CertCacheLimits, ServedCert};
pub use tls::cert_expiry::{watch_default_cert, CertExpiryScan};
pub use tls::settings::TicketKeyRotation;
pub use traffic::cost::set_attribution as set_cpu_attribution;
pub use traffic::cost_metrics::{
    register as register_app_costs, set_top_apps as set_usage_top_apps,
};
pub use traffic::history::{TrafficHistory, TrafficOrder};
pub use traffic::usage::UsageLedger;
pub use upstream::response_buffers::ResponseBuffers;

/// What each metric of this crate is, for the reference (`switchyard reference`).
pub fn metric_docs() -> Vec<switchyard_metrics::MetricDoc> {
    let mut docs = metrics::documented();
    docs.extend(traffic::app_requests::documented());
    docs.extend(traffic::cost_metrics::documented());
    // The filters' host is a crate of its own; its metrics are the request path's.
    docs.extend(switchyard_filters::metric_docs());
    docs
}

//! Switchyard's request path. [`Router`] implements Pingora's proxy phases by calling one
//! stage module per phase (see `pipeline.rs` for the order); [`RouteCache`] is the
//! in-process view of the store the stages read; [`ChangeFollower`] keeps that view current
//! from the store's change events; [`HealthChecker`] probes backends of apps that ask for it.

mod access_log;
mod balancer;
mod context;
mod drain;
mod follower;
mod health;
mod metrics;
mod pipeline;
mod respond;
mod route;
mod route_cache;
mod upstream;

pub use access_log::{AccessLog, AccessLogTarget, ACCESS_LOG_QUEUE_CAPACITY};
pub use follower::ChangeFollower;
pub use health::HealthChecker;
pub use pipeline::Router;
pub use route_cache::{AppRoute, RouteCache, RouteCacheLimits};

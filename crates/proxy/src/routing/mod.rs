//! What routing knows and keeps current: the route cache (host → app, built once per
//! change), each app's backends with their balancing and health, the table of connections
//! to backends (so a deletion or a domain transfer can drain them), the follower that
//! applies the store's change events (and remembers the latest), the per-app request counts,
//! the explanation of where a host goes, and the tokens of sticky sessions.

pub(crate) mod affinity_tokens;
pub(crate) mod balancer;
pub(crate) mod connections;
pub(crate) mod drain;
pub(crate) mod explain;
pub(crate) mod filter_modules;
pub(crate) mod follower;
pub(crate) mod health;
pub(crate) mod mirror_state;
pub(crate) mod names;
pub(crate) mod recent_changes;
pub(crate) mod route_cache;

//! What the router counts of each app's traffic: the per-app answer counters the request
//! path increments (`app_requests`), what each app costs (`cost`), its usage for billing (`usage`), and the recent history sampled from them
//! (`history`). Counting, not routing: the route cache only hands each route its slot.

pub(crate) mod app_requests;
pub(crate) mod cost;
pub(crate) mod cost_metrics;
pub(crate) mod deleted_apps;
pub(crate) mod history;
pub(crate) mod usage;

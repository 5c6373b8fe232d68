//! What the router counts of each app's traffic: the per-app answer counters the request
//! path increments (`app_requests`), and the recent history sampled from them
//! (`history`). Counting, not routing: the route cache only hands each route its slot.

pub(crate) mod app_requests;
pub(crate) mod deleted_apps;
pub(crate) mod history;

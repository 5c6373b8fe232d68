//! What a router shows of its own state through the admin API: why a host goes where it
//! goes, its recent traffic, the changes it applied, what it resolved backend names to.
//! Built by the proxy, answered by the admin API, described by the API's OpenAPI document:
//! one type for the three, here where both crates see it.

use schemars::JsonSchema;
use serde::Serialize;

use crate::Balancer;

/// `GET /v1/explain`: where a request for a host (and path) goes, and why.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Explanation {
    /// The host, normalised (as given when it is no host name).
    pub host: String,
    /// The app serving it; null when none does.
    pub app: Option<String>,
    /// The path explained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The method explained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// How the host matched the app's domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<DomainRule>,
    /// The app's domain that matched (a wildcard is written `*.example.com`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// The stored domains looked up, in order, up to the one that matched.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tried: Vec<String>,
    /// Why no app serves it, and what the client gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// Each stage, in the order requests run them, and whether it acts on this request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageVerdict>,
    /// What the app's response cache holds for the path (over HTTP and HTTPS); absent when
    /// the app caches nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored: Option<Vec<StoredCopy>>,
    /// The backend the next request would take, and every backend's state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<NextBackend>,
}

impl Explanation {
    /// No app serves `host`, because `why`.
    pub fn unserved(host: String, tried: Vec<String>, why: String) -> Self {
        Self {
            host,
            app: None,
            path: None,
            method: None,
            rule: None,
            domain: None,
            tried,
            why: Some(why),
            stages: Vec::new(),
            stored: None,
            backend: None,
        }
    }
}

/// How a host matched an app's domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DomainRule {
    /// The host is one of the app's domains.
    Exact,
    /// The host is under one of the app's wildcards.
    Wildcard,
}

/// One stage's verdict on the explained request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct StageVerdict {
    /// The stage, e.g. `redirects`, `maintenance`, `cache`.
    pub stage: &'static str,
    /// Whether it acts on this request.
    pub applies: bool,
    /// Why, and what it does.
    pub why: String,
}

/// A copy the response cache holds.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum StoredCopy {
    /// One answer.
    Answer {
        /// Its cache key: scheme, host and path.
        url: String,
        /// Its status.
        status: u16,
        /// Its age, in seconds.
        age_s: u64,
        /// How long it is fresh in all, in seconds.
        freshness_lifetime_s: u64,
        /// What set that lifetime (`s-maxage`, `max-age`, `Expires - Date`, the app's
        /// `default_ttl_s`…).
        decided_by: &'static str,
        /// Seconds it stays fresh.
        fresh_for_s: u64,
        /// Seconds it may still answer in the app's place when the app fails.
        may_stand_in_for_errors_s: u64,
        /// Fresh, or what the next request does about it.
        state: &'static str,
        /// Its body's size.
        bytes: usize,
    },
    /// One copy per variant of request headers (`Vary`).
    Varies {
        /// Its cache key.
        url: String,
        /// The request headers its copies vary by.
        varies_by: Vec<String>,
        /// What that means.
        why: &'static str,
    },
}

/// The backend the next request would take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct NextBackend {
    /// Its address; null when none is usable.
    pub next: Option<String>,
    /// Why that one (or why none, with what the client gets).
    pub why: String,
    /// The app's balancer.
    pub balancer: Balancer,
    /// Every backend of the app, with its state on this router.
    pub backends: Vec<BackendView>,
}

/// A backend's state on this router.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct BackendView {
    /// `ip:port`.
    pub address: String,
    /// Its weight.
    pub weight: u32,
    /// Requests it is answering now.
    pub in_flight: usize,
    /// Whether a request may go to it.
    pub healthy: bool,
    /// Whether its active health checks fail.
    pub failing_checks: bool,
    /// Whether failed requests marked it down for a while.
    pub passively_down: bool,
    /// Whether it left the app and only finishes what it has.
    pub retired: bool,
}

/// `GET /v1/usage`: what each app used of the router since a time, for billing.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct UsageReport {
    /// Where the figures start (Unix seconds): the router's start, or the start of the
    /// minute holding `since`.
    pub since_unix: u64,
    /// When this router's counters started (Unix seconds).
    pub started_unix: u64,
    /// CPU seconds since the router started that no app was charged (accepting
    /// connections, timers, connections that never routed a request).
    pub unattributed_cpu_seconds: f64,
    /// The apps that used anything, by name.
    pub apps: Vec<AppUsageReport>,
    /// The last app of this page, to ask for the next (`after`); absent on the last page.
    pub next: Option<String>,
}

/// One app's usage.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct AppUsageReport {
    /// The app.
    pub app: String,
    /// CPU seconds the router spent on its behalf (event loops and worker pool).
    pub cpu_seconds: f64,
    /// Requests answered.
    pub requests: u64,
    /// Bytes read from its clients.
    pub client_bytes_in: u64,
    /// Bytes sent to its clients.
    pub client_bytes_out: u64,
    /// Client connections charged to it, open now.
    pub connections: i64,
    /// WebSockets relayed for it, open now.
    pub websockets: i64,
    /// Its requests under way now.
    pub in_flight: i64,
}

/// `GET /v1/stats/apps`: the busiest apps of the last minute.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct TrafficReport {
    /// Seconds per sample.
    pub resolution_s: u64,
    /// Seconds of history kept.
    pub window_s: u64,
    /// Apps with traffic in the window.
    pub tracked_apps: usize,
    /// Most apps the history keeps (the router's bound).
    pub max_apps: usize,
    /// Memory the history holds.
    pub memory_bytes: usize,
    /// The apps, busiest first.
    pub apps: Vec<AppTrafficReport>,
}

/// One app's recent traffic.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct AppTrafficReport {
    /// The app.
    pub app: String,
    /// Answers per second over the last sample.
    pub rps_10s: f64,
    /// Answers per second over the last minute.
    pub rps_1m: f64,
    /// Share of 5xx answers over the last minute.
    pub error_ratio_1m: f64,
    /// Share of 4xx answers over the last minute.
    pub client_error_ratio_1m: f64,
    /// Upper bound (ms) of the duration bucket holding the last sample's 99th percentile;
    /// null without answers.
    pub p99_ms_10s: Option<u64>,
    /// The same over the last minute.
    pub p99_ms_1m: Option<u64>,
    /// CPU the router spent for the app over the last minute, in milliseconds a second
    /// (1000 is one core).
    pub cpu_ms_per_s_1m: f64,
    /// CPU milliseconds per sample, oldest first.
    pub cpu_ms: Vec<u32>,
    /// Answers per sample, oldest first.
    pub requests: Vec<u32>,
    /// 5xx answers per sample.
    pub errors: Vec<u32>,
    /// Each sample's 99th percentile bound (ms).
    pub p99_ms: Vec<Option<u64>>,
}

/// `GET /v1/changes`: the store changes this router applied lately, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct RecentChangesReport {
    /// The changes.
    pub changes: Vec<AppliedChange>,
    /// How many the router keeps.
    pub kept_at_most: usize,
}

/// One applied change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct AppliedChange {
    /// When it was applied, milliseconds since the epoch.
    pub at_unix_ms: u64,
    /// What changed.
    #[schemars(extend("enum" = ["app", "cert", "cache_purge", "resync", "backend_addresses", "waf_reload"]))]
    pub kind: &'static str,
    /// The app, or for a certificate its domain; empty for a resync.
    pub subject: String,
    /// The domains whose routing it touched (the first few).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<String>,
    /// How many domains it touched in all.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub domains_total: usize,
    /// What it says beyond its subject (a purge's path, how many events a resync covers).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// How long the caches took to apply it, in microseconds.
    pub apply_us: u64,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// What this router resolved one backend given by name to (`GET /v1/apps/{name}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct ResolvedBackend {
    /// The backend as the app lists it (`host:port` or `srv:NAME`).
    pub backend: String,
    /// `resolved`; `stale` (the last resolution failed, the last good addresses are kept);
    /// `unresolved` (never answered); or `not in use on this router`.
    pub state: &'static str,
    /// The addresses in use, `ip:port`, with `=WEIGHT` from SRV records.
    pub addresses: Vec<String>,
    /// When it last resolved, seconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_unix: Option<u64>,
    /// The last resolution's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When it is resolved next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_resolution_in_ms: Option<u64>,
}

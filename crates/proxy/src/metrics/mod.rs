//! The proxy's Prometheus metrics, registered in the default registry that the admin API's
//! `/metrics` exposes. Labels are bounded: `app` only ever holds a stored app's name (unknown
//! hosts count under `app=""`), and `class`/`kind`/`result` are small fixed sets.
//! `switchyard_requests_total` is the exception to "registered here": `app_requests.rs` keeps it
//! as a slot per app. A deleted app's series, that slot included, leave with it
//! (`deleted_apps`): the route cache only tells what it sees.

#![allow(missing_docs)]

use std::collections::{HashMap, HashSet};

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{
    register_counter, register_histogram, register_histogram_vec, register_int_counter,
    register_int_counter_vec, register_int_gauge, register_int_gauge_vec, Counter, Histogram,
    HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
};
use switchyard_metrics::{known_gauge, registered, KnownGauge};

switchyard_metrics::declare_metrics! {
    pub(crate) static DNS_NAMES: IntGaugeVec = registered(register_int_gauge_vec!(
        "switchyard_dns_names",
        "Backend names followed, by state: resolved, stale (failing; the last good addresses \
         are kept) or unresolved (never answered).",
        &["state"]
    ));

    pub(crate) static FAIR_SHARE_DECISIONS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_fair_share_requests_total",
        "Requests of apps over their CPU share on a saturated event loop: queued (waited \
         behind the others), refused (503: waited --fair-share-queue-ms, or the queue was \
         full).",
        &["outcome"]
    ));

    pub(crate) static FAIR_SHARE_WAITING: IntGauge = registered(register_int_gauge!(
        "switchyard_fair_share_waiting",
        "Requests waiting behind other apps' now (at most 4096 an event loop)."
    ));

    pub(crate) static FAIR_SHARE_WAIT_SECONDS: Histogram = registered(register_histogram!(
        "switchyard_fair_share_wait_seconds",
        "How long queued requests waited for their turn.",
        vec![0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]
    ));

    pub(crate) static FAIR_SHARE_SATURATED_LOOPS: IntGauge = registered(register_int_gauge!(
        "switchyard_fair_share_saturated_loops",
        "Event loops saturated now (their probe's lag above --fair-share-lag-ms)."
    ));

    pub(crate) static FAIR_SHARE_OVER_SHARE_APPS: IntGauge = registered(register_int_gauge!(
        "switchyard_fair_share_over_share_apps",
        "Apps whose CPU over the last seconds is above their share."
    ));

    pub(crate) static FAIR_SHARE_FOLLOWED_APPS: IntGauge = registered(register_int_gauge!(
        "switchyard_fair_share_followed_apps",
        "Apps charged CPU lately, whose shares the sampler follows (bounded by the apps with \
         a route)."
    ));

    pub(crate) static DNS_NAMES_CAPACITY: IntGauge = registered(register_int_gauge!(
        "switchyard_dns_names_capacity",
        "Most backend names followed (--dns-max-names)."
    ));

    pub(crate) static HISTORY_APPS: IntGauge = registered(register_int_gauge!(
        "switchyard_history_apps",
        "Apps whose last 15 minutes of traffic are kept (those that answered in that window)."
    ));

    pub(crate) static HISTORY_CAPACITY: IntGauge = registered(register_int_gauge!(
        "switchyard_history_apps_capacity",
        "Most apps the traffic history keeps (--history-max-apps)."
    ));

    pub(crate) static HISTORY_REFUSED: IntCounter = registered(register_int_counter!(
        "switchyard_history_apps_refused_total",
        "Samples of busy apps not kept because the history already held --history-max-apps."
    ));

    pub(crate) static HISTORY_BYTES: IntGauge = registered(register_int_gauge!(
        "switchyard_history_bytes",
        "Approximate memory of the traffic history."
    ));

    pub(crate) static DNS_NAMES_REFUSED: IntCounter = registered(register_int_counter!(
        "switchyard_dns_names_refused_total",
        "Backend names not followed because --dns-max-names were already."
    ));

    pub(crate) static DNS_RESOLUTIONS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_dns_resolutions_total",
        "Resolutions of backend names, by result: same, changed (the addresses differ), failed.",
        &["result"]
    ));

    pub(crate) static REQUEST_DURATION: HistogramVec = registered(register_histogram_vec!(
        "switchyard_request_duration_seconds",
        "Time from request start to the last byte sent, by status class; upgraded \
         connections (WebSockets) are counted in switchyard_requests_total, not timed here.",
        &["class"],
        vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
    ));

    /// [`REQUEST_DURATION`]'s series, one per status class in [`STATUS_CLASSES`]' order: an
    /// answer finds its own by index, where `with_label_values` hashed the label under a lock
    /// on every request.
    pub(crate) static REQUEST_DURATION_BY_CLASS: [Histogram; STATUS_CLASSES.len()] =
        STATUS_CLASSES.map(|class| REQUEST_DURATION.with_label_values(&[class]));

    pub(crate) static UPSTREAM_ERRORS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_upstream_errors_total",
        "Failed attempts to reach or read from a backend, by app and kind.",
        &["app", "kind"]
    ));

    pub(crate) static UPSTREAM_RETRIES: IntCounter = registered(register_int_counter!(
        "switchyard_upstream_retries_total",
        "Attempts retried on another backend."
    ));

    pub(crate) static ROUTE_CACHE_HITS: IntCounter = registered(register_int_counter!(
        "switchyard_route_cache_hits_total",
        "Route-cache lookups answered from memory (domains and apps)."
    ));

    pub(crate) static ROUTE_CACHE_MISSES: IntCounter = registered(register_int_counter!(
        "switchyard_route_cache_misses_total",
        "Route-cache lookups that read the store."
    ));

    pub(crate) static ROUTE_CACHE_ENTRIES: IntGaugeVec = registered(register_int_gauge_vec!(
        "switchyard_route_cache_entries",
        "Entries in the route cache, by table (apps, domains).",
        &["table"]
    ));

    pub(crate) static ROUTE_CHANGES: IntCounter = registered(register_int_counter!(
        "switchyard_route_changes_total",
        "Change events applied to the route cache."
    ));

    pub(crate) static RECENT_CHANGES: IntGauge = registered(register_int_gauge!(
        "switchyard_recent_changes",
        "Applied changes kept for GET /v1/changes (the oldest dropped past the capacity)."
    ));

    pub(crate) static RECENT_CHANGES_CAPACITY: IntGauge = registered(register_int_gauge!(
        "switchyard_recent_changes_capacity",
        "Most applied changes kept for GET /v1/changes."
    ));

    pub(crate) static ROUTE_RESYNCS: IntCounter = registered(register_int_counter!(
        "switchyard_route_resyncs_total",
        "Full revalidations of the route cache after missed change events."
    ));

    pub(crate) static STALE_SERVES: IntCounter = registered(register_int_counter!(
        "switchyard_stale_serves_total",
        "Requests routed from the cache while the store was unreachable."
    ));

    pub(crate) static ACTIVE_REQUESTS: IntGauge = registered(register_int_gauge!(
        "switchyard_active_requests",
        "Requests (including upgraded connections) being proxied now."
    ));

    pub(crate) static LIMIT_DECISIONS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_limit_decisions_total",
        "Requests an app's limit looked at, by app, limit (ip, uri, header, body, \
         client_rate, client_connections, app_rate, in_flight) and result (allowed, queued: allowed after a \
         wait, refused, logged: would have been refused in log mode).",
        &["app", "limit", "result"]
    ));

    pub(crate) static APP_IN_FLIGHT: IntGaugeVec = registered(register_int_gauge_vec!(
        "switchyard_app_in_flight",
        "Requests in flight (WebSockets until they close) of each app with max_in_flight.",
        &["app"]
    ));

    pub(crate) static LIMIT_CLIENTS: IntGauge = registered(register_int_gauge!(
        "switchyard_limit_clients",
        "Client rate records held for per-client limits (all apps)."
    ));

    pub(crate) static LIMIT_CLIENT_CAPACITY: IntGauge = registered(register_int_gauge!(
        "switchyard_limit_client_capacity",
        "Most client rate records held (--limit-clients); past it the least used go."
    ));

    pub(crate) static LIMIT_FLEET_SYNCED: IntGauge = registered(register_int_gauge!(
        "switchyard_limit_fleet_synced",
        "1 when the last sync of fleet-wide app rates with Redis succeeded, 0 while Redis \
         is away (each router then limits on its own counts)."
    ));

    pub(crate) static LIMIT_FLEET_SYNC_FAILURES: IntCounter = registered(register_int_counter!(
        "switchyard_limit_fleet_sync_failures_total",
        "Syncs of fleet-wide app rates that failed (Redis away or slow)."
    ));

    pub(crate) static QUIC_HANDSHAKES: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_quic_handshakes_total",
        "QUIC handshakes of the HTTP/3 listener, by result: completed, failed, retried (the \
         client asked to prove its address first), certificate_cold (the name's certificate \
         was not in memory yet; the client's next attempt finds it).",
        &["result"]
    ));

    pub(crate) static QUIC_CONNECTIONS: IntGauge = registered(register_int_gauge!(
        "switchyard_quic_connections",
        "HTTP/3 connections open now."
    ));

    pub(crate) static QUIC_RTT: Histogram = registered(register_histogram!(
        "switchyard_quic_rtt_seconds",
        "Each HTTP/3 connection's smoothed round-trip time when it closed.",
        vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]
    ));

    pub(crate) static QUIC_PACKETS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_quic_packets_total",
        "UDP packets of the HTTP/3 connections, counted when each closes, by kind: sent, \
         lost (of those sent: lost ÷ sent is the loss the clients' paths show).",
        &["kind"]
    ));

    pub(crate) static HTTP3_REQUESTS: IntCounter = registered(register_int_counter!(
        "switchyard_http3_requests_total",
        "Requests that came over HTTP/3."
    ));

    pub(crate) static QUIC_EARLY_DATA: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_quic_early_data_total",
        "QUIC connections of a listener with --http3-early-data on, by result at the end of \
         their handshake: accepted (requests were taken from the client's 0-RTT data before \
         it), not_taken (none: none offered, or a ticket this router does not hold, each \
         being taken once).",
        &["result"]
    ));

    pub(crate) static HTTP3_EARLY_REQUESTS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_http3_early_requests_total",
        "HTTP/3 requests sent in 0-RTT data, by result: forwarded (GET, HEAD or OPTIONS, to \
         the app with Early-Data: 1), too_early (any other method, answered 425).",
        &["result"]
    ));

    pub(crate) static OPEN_WEBSOCKETS: IntGauge = registered(register_int_gauge!(
        "switchyard_open_websockets",
        "Upgraded connections (WebSocket and others) open now."
    ));

    pub(crate) static CLIENT_HEAD_TIMEOUTS: IntCounter = registered(register_int_counter!(
        "switchyard_client_head_timeouts_total",
        "Client connections closed because a request head did not arrive within the header timeout."
    ));

    pub(crate) static CLIENT_HEADS_REFUSED: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_client_heads_refused_total",
        "HTTP/1.x request heads refused before any stage saw them, by the status answered: 400 \
         (malformed, ambiguous framing, a bad Host or target) or 431 (more than 100 lines or \
         64 KiB of head); the connection closes after the answer.",
        &["status"]
    ));
    pub(crate) static REFUSALS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_refusals_total",
        "Answers the router made itself instead of the app's, by reason: the rows of \
         docs/reference/refusals.md (a refused head, an unknown host, a limit, a password, the \
         WAF, an image, the client's body, a backend that failed or timed out).",
        &["reason"]
    ));

    pub(crate) static H2_CONNECTIONS_CLOSED_FOR_RESETS: IntCounter = registered(register_int_counter!(
        "switchyard_h2_connections_closed_for_resets_total",
        "HTTP/2 connections closed for cancelling too many streams the router had taken on."
    ));

    /// Every reason is at zero from the start (the connection table sets them), so the
    /// first drain shows in a rate().
    pub(crate) static DRAINED_CONNECTIONS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_drained_connections_total",
        "Upstream connections the router closed, by reason: removed_backend_deadline (the \
         app's drain.removed_backend_s passed), app_deleted, domain_moved (after \
         --drain-grace-s).",
        &["reason"]
    ));

    pub(crate) static UPSTREAM_CONNECTIONS_IN_USE: IntGauge = registered(register_int_gauge!(
        "switchyard_upstream_connections_in_use",
        "Backend connections serving a request or a WebSocket now (the drain table's size)."
    ));

    pub(crate) static CONNECTIONS_TO_REMOVED_BACKENDS: IntGauge = registered(register_int_gauge!(
        "switchyard_connections_to_removed_backends",
        "Backend connections still open to a backend its app no longer lists."
    ));

    pub(crate) static HEALTH_TRANSITIONS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_health_transitions_total",
        "Backends marked up or down by active health checks, by app and new state.",
        &["app", "state"]
    ));

    pub(crate) static ACCESS_LOG_DROPPED: IntCounter = registered(register_int_counter!(
        "switchyard_access_log_dropped_total",
        "Access-log records dropped because the writer queue was full."
    ));

    pub(crate) static ACCESS_LOG_QUEUE: IntGauge = registered(register_int_gauge!(
        "switchyard_access_log_queue_depth",
        "Access-log records waiting to be written."
    ));

    pub(crate) static TLS_HANDSHAKES: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_tls_handshakes_total",
        "TLS handshakes by result: full, resumed, no_certificate (refused: no certificate \
         for the name and no default), store_error (refused: certificate lookup failed).",
        &["result"]
    ));

    pub(crate) static CERT_CACHE_HITS: IntCounter = registered(register_int_counter!(
        "switchyard_cert_cache_hits_total",
        "Certificate lookups answered from memory (including cached absences)."
    ));

    pub(crate) static CERT_CACHE_MISSES: IntCounter = registered(register_int_counter!(
        "switchyard_cert_cache_misses_total",
        "Certificate lookups that read (and parsed from) the store."
    ));

    pub(crate) static CERT_CACHE_ENTRIES: IntGauge = registered(register_int_gauge!(
        "switchyard_cert_cache_entries",
        "Names in the certificate cache (parsed certificates and cached absences)."
    ));

    pub(crate) static CERTS_STORED: IntGauge = registered(register_int_gauge!(
        "switchyard_certificates_stored",
        "Certificates in the store, as of the last expiry scan."
    ));

    pub(crate) static CERTS_EXPIRING_SOON: IntGauge = registered(register_int_gauge!(
        "switchyard_certificates_expiring_soon",
        "Stored certificates expiring within 14 days (or already expired), as of the last scan."
    ));

    pub(crate) static DEFAULT_CERT_EXPIRY: KnownGauge = registered(known_gauge(
        "switchyard_default_certificate_expiry_timestamp_seconds",
        "End of validity of the --default-cert served to names without a certificate of \
         their own (seconds since the epoch); absent without one."
    ));

    pub(crate) static TICKET_KEY_ROTATIONS: IntCounter = registered(register_int_counter!(
        "switchyard_tls_ticket_key_rotations_total",
        "TLS session-ticket key rotations."
    ));

    /// Registers every metric now, so each is exported (at zero) before its first event.
    pub(crate) static MIRROR_SENT: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_mirror_sent_total",
        "Mirror copies delivered and answered by a shadow backend, by app and the shadow's status class.",
        &["app", "class"]
    ));

    pub(crate) static MIRROR_DROPPED: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_mirror_dropped_total",
        "Mirror copies not sent or not completed, by app and reason (in_flight_limit, body_limit, aborted, error, timeout).",
        &["app", "reason"]
    ));

    pub(crate) static MIRROR_IN_FLIGHT: IntGaugeVec = registered(register_int_gauge_vec!(
        "switchyard_mirror_in_flight",
        "Mirror copies in progress, by app.",
        &["app"]
    ));

    pub(crate) static MIRROR_DURATION: HistogramVec = registered(register_histogram_vec!(
        "switchyard_mirror_duration_seconds",
        "Time from the end of the request body to the shadow's response header, by app.",
        &["app"],
        vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
    ));

    pub(crate) static CACHE_REQUESTS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_cache_requests_total",
        "Requests of apps that cache, by app and X-Cache result (HIT, MISS, REVALIDATED: a \
         stale copy the app confirmed with a 304, STALE, BYPASS).",
        &["app", "result"]
    ));

    pub(crate) static CACHE_BYTES: IntGaugeVec = registered(register_int_gauge_vec!(
        "switchyard_cache_bytes",
        "Bytes of responses held in memory, by app.",
        &["app"]
    ));

    pub(crate) static CACHE_STORES: IntCounter = registered(register_int_counter!(
        "switchyard_cache_stores_total",
        "Responses stored in the response cache."
    ));

    pub(crate) static CACHE_BACKGROUND_REVALIDATIONS: IntCounterVec = registered(
        register_int_counter_vec!(
            "switchyard_cache_background_revalidations_total",
            "Stale copies revalidated in the background while they answered \
             (stale-while-revalidate), by result (not_modified, replaced, kept: an answer the \
             cache does not keep, failed: no answer).",
            &["result"]
        )
    );

    pub(crate) static AFFINITY: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_affinity_total",
        "Requests to apps with sticky sessions, by result: kept (the cookie's backend served \
         it), assigned (no cookie, or one naming no backend of the app: a new one set), moved \
         (the cookie's backend was down, drained or failed: a new one set), no_key (the \
         fleet's key is not loaded yet: balanced, no cookie).",
        &["result"]
    ));

    /// [`AFFINITY`]'s series, in [`AFFINITY_RESULTS`]' order (see [`count_result`]).
    pub(crate) static AFFINITY_BY_RESULT: [IntCounter; AFFINITY_RESULTS.len()] =
        AFFINITY_RESULTS.map(|result| AFFINITY.with_label_values(&[result]));

    pub(crate) static COMPRESS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_compress_total",
        "Answers of a type an app compresses, to clients that accept a coding, by result: the \
         coding (zstd, br, gzip), skipped (already encoded, no-transform, not a 200, under \
         the app's min_bytes) or busy (1,024 streams compressing already; sent as is).",
        &["result"]
    ));

    /// [`COMPRESS`]'s series, in [`COMPRESS_RESULTS`]' order (see [`count_result`]).
    pub(crate) static COMPRESS_BY_RESULT: [IntCounter; COMPRESS_RESULTS.len()] =
        COMPRESS_RESULTS.map(|result| COMPRESS.with_label_values(&[result]));

    pub(crate) static COMPRESS_STREAMS: IntGauge = registered(register_int_gauge!(
        "switchyard_compress_streams",
        "Answers being compressed now (at most 1,024; past it answers go uncompressed)."
    ));

    pub(crate) static BASIC_AUTH_CHECKS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_basic_auth_checks_total",
        "Requests to password-protected apps, by result: open (an open path), cached (the \
         credentials passed a check in the last 10 minutes), verified (bcrypt on the worker \
         pool), shared (passed the check of the same credentials that another request \
         began), refused (401: none, unknown user or wrong password), locked_out (429: too \
         many failures from the client), overloaded (503: the pool could not check in time).",
        &["result"]
    ));

    /// [`BASIC_AUTH_CHECKS`]' series, in [`BASIC_AUTH_RESULTS`]' order (see
    /// [`count_result`]).
    pub(crate) static BASIC_AUTH_BY_RESULT: [IntCounter; BASIC_AUTH_RESULTS.len()] =
        BASIC_AUTH_RESULTS.map(|result| BASIC_AUTH_CHECKS.with_label_values(&[result]));

    pub(crate) static BASIC_AUTH_FAILING_CLIENTS: IntGauge = registered(register_int_gauge!(
        "switchyard_basic_auth_failing_clients",
        "Clients whose failed passwords are counted (per app; at most 65,536, the least recent \
         forgotten first)."
    ));

    pub(crate) static BASIC_AUTH_CHECKS_UNDER_WAY: IntGauge = registered(register_int_gauge!(
        "switchyard_basic_auth_checks_under_way",
        "Password checks under way that requests with the same credentials can wait for (at \
         most 4,096; past it a check runs alone, shared with nobody)."
    ));

    pub(crate) static CACHE_INVALIDATIONS: IntCounter = registered(register_int_counter!(
        "switchyard_cache_invalidations_total",
        "URLs invalidated by an unsafe request's answer (RFC 9111 §4.4): its own, Location's \
         and Content-Location's."
    ));

    pub(crate) static CACHE_EVICTIONS: IntCounter = registered(register_int_counter!(
        "switchyard_cache_evictions_total",
        "Responses evicted from the response cache to make room."
    ));

    pub(crate) static CACHE_REDIS_ERRORS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_cache_redis_errors_total",
        "Cache Redis failures, each served as a miss, by kind (connect, connection, \
         refused, timeout).",
        &["kind"]
    ));

    pub(crate) static CACHE_REDIS_WRITES: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_cache_redis_writes_total",
        "Writes to the shared cache Redis, by result (stored, invalidated: deleted after an \
         unsafe request, failed, shed: dropped because too many writes were in flight).",
        &["result"]
    ));

    pub(crate) static POOL_THREADS: IntGauge = registered(register_int_gauge!(
        "switchyard_pool_threads",
        "Worker threads for CPU-bound stages."
    ));

    pub(crate) static POOL_QUEUE_DEPTH: IntGauge = registered(register_int_gauge!(
        "switchyard_pool_queue_depth",
        "Tasks waiting for a worker thread."
    ));

    pub(crate) static POOL_WAIT: HistogramVec = registered(register_histogram_vec!(
        "switchyard_pool_wait_seconds",
        "Time tasks waited in the worker pool's queue, by stage.",
        &["stage"],
        POOL_BUCKETS.to_vec()
    ));

    pub(crate) static POOL_RUN: HistogramVec = registered(register_histogram_vec!(
        "switchyard_pool_run_seconds",
        "Time tasks ran on a worker thread, by stage.",
        &["stage"],
        POOL_BUCKETS.to_vec()
    ));

    pub(crate) static POOL_REJECTED: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_pool_rejected_total",
        "Tasks refused before being queued, by stage and reason: queue_full, or \
         would_miss_deadline (the work queued ahead would make it end past its deadline).",
        &["stage", "reason"]
    ));

    pub(crate) static PACED_REQUESTS: IntCounter = registered(register_int_counter!(
        "switchyard_paced_requests_total",
        "HTTP/1 requests held until the Retry-After their connection was given when the \
         worker pool refused its previous request (clients that ask again at once)."
    ));

    pub(crate) static POOL_GAVE_WAY: IntCounter = registered(register_int_counter!(
        "switchyard_pool_gave_way_total",
        "Times a worker running a task paused because other threads were waiting for a CPU \
         (checked every 250 µs; SCHED_IDLE alone lets a worker run on to the next tick)."
    ));

    pub(crate) static POOL_GAVE_WAY_SECONDS: Counter = registered(register_counter!(
        "switchyard_pool_gave_way_seconds_total",
        "Time workers spent paused for other threads waiting for a CPU."
    ));

    pub(crate) static POOL_SHED: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_pool_shed_total",
        "Tasks queued, then dropped unrun before their deadline because the work that came \
         to be ahead of them would have ended past it, by stage; their requests are refused \
         at once.",
        &["stage"]
    ));

    pub(crate) static POOL_TIMEOUTS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_pool_timeouts_total",
        "Tasks whose deadline passed before they finished, by stage.",
        &["stage"]
    ));

    pub(crate) static WAF_INSPECTIONS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_waf_requests_total",
        "Requests of apps with a WAF, by app and result (pass, matched, blocked, \
         overload_passed, overload_refused).",
        &["app", "result"]
    ));

    pub(crate) static WAF_RELOADS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_waf_reloads_total",
        "Loads of the WAF's rule files without a restart, by origin (api: this router's \
         admin API; fleet: another router's, announced through the store) and result \
         (loaded, refused: the rules in use stay).",
        &["origin", "result"]
    ));

    pub(crate) static WAF_SPOOL_BYTES: IntGauge = registered(register_int_gauge!(
        "switchyard_waf_spool_bytes",
        "Bytes of request bodies spooled to disk, waiting for the WAF."
    ));

    pub(crate) static WAF_SPOOL_BUDGET: IntGauge = registered(register_int_gauge!(
        "switchyard_waf_spool_budget_bytes",
        "Most bytes of request bodies the WAF spool may hold at once (--waf-spool-mb)."
    ));

    pub(crate) static WAF_BODY_UNINSPECTED: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_waf_body_uninspected_total",
        "Requests whose body was not inspected, or only its first max_body_bytes, by app.",
        &["app"]
    ));

    pub(crate) static IMAGE_REQUESTS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_image_requests_total",
        "Image resize requests, by app and result (resized, bad_request, unprocessable, \
         fetch_failed, overloaded).",
        &["app", "result"]
    ));

    pub(crate) static IDLE_BACKEND_CONNECTIONS: IntGauge = registered(register_int_gauge!(
        "switchyard_idle_backend_connections",
        "Idle backend connections kept by the listener's threads (at most 2,048 per \
         thread; a connection finished when the pool is full is closed)."
    ));

    pub(crate) static SIDE_IDLE_CONNECTIONS: IntGaugeVec = registered(register_int_gauge_vec!(
        "switchyard_side_idle_connections",
        "Idle connections kept for requests the router makes itself, by use: copies to \
         shadow backends (mirror, at most 2,048 per thread), originals for image \
         resizing (images, at most 256 per thread) and the cache's background \
         revalidations (cache, at most 64 per thread); one finished when the pool is full \
         is closed.",
        &["use"]
    ));

    pub(crate) static BACKEND_CONNECTS: IntCounter = registered(register_int_counter!(
        "switchyard_backend_connections_opened_total",
        "Backend connections the listener opened."
    ));

    pub(crate) static RESPONSES_READ_AHEAD: IntCounter = registered(register_int_counter!(
        "switchyard_responses_read_ahead_total",
        "Backend answers read ahead of their client (response buffering), their backend \
         connection freed once read."
    ));

    pub(crate) static SPARE_READ_BUFFERS: IntGauge = registered(register_int_gauge!(
        "switchyard_spare_read_buffers",
        "Read buffers given back by connections gone idle and kept, on their listener \
         thread, for the next connection that reads (at most 64 a thread, of at most 32 KiB)."
    ));

    pub(crate) static RESPONSE_BUFFER_FULL: IntCounter = registered(register_int_counter!(
        "switchyard_response_buffer_full_total",
        "Answers read ahead that filled their share (--response-buffer-mb) or the memory \
         and spool budgets, and went on at their client's pace."
    ));

    pub(crate) static RESPONSE_BUFFER_MEMORY: IntGauge = registered(register_int_gauge!(
        "switchyard_response_buffer_memory_bytes",
        "Bytes of answers read ahead of their clients, held in memory."
    ));

    pub(crate) static RESPONSE_BUFFER_MEMORY_BUDGET: IntGauge = registered(register_int_gauge!(
        "switchyard_response_buffer_memory_budget_bytes",
        "Most bytes answers read ahead may hold in memory (--response-buffer-memory-mb)."
    ));

    pub(crate) static RESPONSE_SPOOL: IntGauge = registered(register_int_gauge!(
        "switchyard_response_spool_bytes",
        "Bytes of answers read ahead of their clients, in spool files."
    ));

    pub(crate) static RESPONSE_SPOOL_BUDGET: IntGauge = registered(register_int_gauge!(
        "switchyard_response_spool_budget_bytes",
        "Most bytes answers read ahead may hold in spool files (--response-spool-mb)."
    ));

    pub(crate) static REQUEST_BUFFER_DECISIONS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_request_buffer_total",
        "Request bodies by what request buffering did: read whole in memory (memory) or \
         spooled (spooled), sent on as they came under a streaming path (streamed), or \
         refused: no room in the memory or spool budget (full, 503), behind the upload's \
         pace or past its deadline (too_slow, 408), a read that waited too long \
         (timed_out, 408), past the app's max_body_bytes (too_large, 413), broken or cut \
         (broken, 400).",
        &["outcome"]
    ));

    pub(crate) static REQUEST_BUFFER_MEMORY: IntGauge = registered(register_int_gauge!(
        "switchyard_request_buffer_memory_bytes",
        "Bytes of request bodies read whole, held in memory until sent on."
    ));

    pub(crate) static REQUEST_BUFFER_MEMORY_BUDGET: IntGauge = registered(register_int_gauge!(
        "switchyard_request_buffer_memory_budget_bytes",
        "Most bytes request bodies read whole may hold in memory (--request-buffer-memory-mb)."
    ));

    pub(crate) static REQUEST_SPOOL: IntGauge = registered(register_int_gauge!(
        "switchyard_request_spool_bytes",
        "Bytes of request bodies read whole, held in spool files until sent on."
    ));

    pub(crate) static REQUEST_SPOOL_BUDGET: IntGauge = registered(register_int_gauge!(
        "switchyard_request_spool_budget_bytes",
        "Most bytes request bodies read whole may hold in spool files (--request-spool-mb)."
    ));

    pub(crate) static DELETED_APPS_NOTED: IntGauge = registered(register_int_gauge!(
        "switchyard_deleted_apps_noted",
        "Deleted apps whose metric series are to be forgotten in the next batch (at most \
         65,536; the one that fills the set has the batch forgotten at once)."
    ));

    pub(crate) static DELETED_APPS_FORGOTTEN: IntCounter = registered(register_int_counter!(
        "switchyard_deleted_apps_forgotten_total",
        "Deleted apps whose metric series and request counts left the exposition."
    ));
}

/// Removes every series of the per-app metrics labelled with one of `apps` (deleted).
/// Holds one unit of a gauge while it lives: what is in progress (a request, a connection)
/// is counted exactly as long as its holder, whichever way it ends.
#[derive(Debug)]
pub(crate) struct Held(&'static IntGauge);

impl Held {
    pub(crate) fn on(gauge: &'static IntGauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.dec();
    }
}

pub(crate) fn forget_apps(apps: &HashSet<String>) {
    let counters = [
        &UPSTREAM_ERRORS,
        &LIMIT_DECISIONS,
        &HEALTH_TRANSITIONS,
        &MIRROR_SENT,
        &MIRROR_DROPPED,
        &CACHE_REQUESTS,
        &WAF_INSPECTIONS,
        &WAF_BODY_UNINSPECTED,
        &IMAGE_REQUESTS,
    ];
    for metric in counters {
        forget_series(metric, apps);
    }
    for metric in [&APP_IN_FLIGHT, &MIRROR_IN_FLIGHT, &CACHE_BYTES] {
        forget_series(metric, apps);
    }
    forget_series(&MIRROR_DURATION, apps);
}

/// Removes the series of `metric` whose `app` label is one of `apps`, whatever its other
/// labels: they are read from the series themselves (one walk, as a scrape does), so a
/// label value added later cannot be missed. A gauge's holder keeps updating its removed
/// series, unseen.
fn forget_series<T: MetricVecBuilder>(metric: &MetricVec<T>, apps: &HashSet<String>) {
    for family in metric.collect() {
        for series in family.get_metric() {
            let labels: HashMap<&str, &str> = series
                .get_label()
                .iter()
                .map(|pair| (pair.get_name(), pair.get_value()))
                .collect();
            if labels.get("app").is_some_and(|app| apps.contains(*app)) {
                // Only fails for a series already gone.
                let _ = metric.remove(&labels);
            }
        }
    }
}

const POOL_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// [`AFFINITY`]'s results.
pub(crate) const AFFINITY_RESULTS: [&str; 4] = ["kept", "assigned", "moved", "no_key"];

/// [`COMPRESS`]'s results.
pub(crate) const COMPRESS_RESULTS: [&str; 5] = ["skipped", "busy", "zstd", "br", "gzip"];

/// [`BASIC_AUTH_CHECKS`]' results.
pub(crate) const BASIC_AUTH_RESULTS: [&str; 7] = [
    "open",
    "cached",
    "verified",
    "shared",
    "refused",
    "locked_out",
    "overloaded",
];

/// Counts `result` in the series `by_result` holds for `results`, made once: a comparison
/// of a few short names, where `with_label_values` hashed the label under a lock on every
/// request (callgrind). A result not in the list is counted through `vec`.
pub(crate) fn count_result<const N: usize>(
    by_result: &[IntCounter; N],
    results: &[&str; N],
    vec: &IntCounterVec,
    result: &str,
) {
    match results.iter().position(|known| *known == result) {
        Some(index) => by_result[index].inc(),
        None => vec.with_label_values(&[result]).inc(),
    }
}

/// The `class` label values, in the order [`status_class_index`] numbers them.
pub(crate) const STATUS_CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "none"];

/// Position of a status code's class in [`STATUS_CLASSES`]; `none` when nothing was sent.
pub(crate) fn status_class_index(status: u16) -> usize {
    match status {
        100..=199 => 0,
        200..=299 => 1,
        300..=399 => 2,
        400..=499 => 3,
        500..=599 => 4,
        _ => 5,
    }
}

/// `2xx`-style class of a status code; `none` when nothing was sent.
pub(crate) fn status_class(status: u16) -> &'static str {
    STATUS_CLASSES[status_class_index(status)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{IntCounterVec, Opts};

    fn apps_in(metric: &IntCounterVec) -> Vec<String> {
        let mut apps: Vec<String> = metric
            .collect()
            .iter()
            .flat_map(|family| family.get_metric().iter())
            .flat_map(|series| series.get_label().iter())
            .filter(|pair| pair.get_name() == "app")
            .map(|pair| pair.get_value().to_string())
            .collect();
        apps.sort();
        apps
    }

    #[test]
    fn forgetting_apps_removes_each_of_their_series_and_only_theirs() {
        let metric = IntCounterVec::new(Opts::new("t_total", "t"), &["result", "app"])
            .expect("a valid metric");
        for (app, result) in [
            ("gone", "pass"),
            ("gone", "blocked"),
            ("also-gone", "pass"),
            ("kept", "pass"),
            ("kept", "blocked"),
        ] {
            metric.with_label_values(&[result, app]).inc();
        }
        let deleted: HashSet<String> = ["gone", "also-gone", "never-seen"].map(String::from).into();
        forget_series(&metric, &deleted);
        assert_eq!(apps_in(&metric), ["kept", "kept"]);
        // A series asked for again after the forgetting starts from zero.
        metric.with_label_values(&["pass", "gone"]).inc();
        assert_eq!(metric.with_label_values(&["pass", "gone"]).get(), 1);
    }
}

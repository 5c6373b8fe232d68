//! The store's Prometheus metrics (default registry, exported by the admin API): whether the
//! shared store answers, its failures, and the change subscription's state.

#![allow(missing_docs)]

use prometheus::{
    register_int_counter, register_int_counter_vec, register_int_gauge, IntCounter, IntCounterVec,
    IntGauge,
};
use switchyard_metrics::{known_gauge, registered, KnownGauge};

switchyard_metrics::declare_metrics! {
    pub(crate) static STORE_AVAILABLE: KnownGauge = registered(known_gauge(
        "switchyard_store_available",
        "1 when the last call to the shared store (Redis) succeeded, 0 while it is \
         unreachable; absent on a router whose routes are in the embedded store."
    ));

    pub(crate) static STORE_WRITES_NOT_DURABLE: IntCounter = registered(register_int_counter!(
        "switchyard_store_writes_not_durable_total",
        "App and certificate writes the Redis primary took but fewer replicas than \
         --store-ack-replicas acknowledged in time (answered 503)."
    ));

    pub(crate) static STORE_ERRORS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_store_errors_total",
        "Failed store calls, by kind (connect, connection, refused).",
        &["kind"]
    ));

    pub(crate) static PUBSUB_CONNECTED: IntGauge = registered(register_int_gauge!(
        "switchyard_store_subscription_connected",
        "1 while the change subscription (Redis Pub/Sub) is up."
    ));

    pub(crate) static REVISION: IntGauge = registered(register_int_gauge!(
        "switchyard_store_revision",
        "The last store revision this router saw (on subscribing and in each change event)."
    ));

    pub(crate) static LAST_SYNC: IntGauge = registered(register_int_gauge!(
        "switchyard_store_last_sync_timestamp_seconds",
        "When this router last knew itself in step with the store: its change subscription \
         made or an event received."
    ));

    pub(crate) static PRIMARY_MOVES: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_redis_primary_moves_total",
        "Times a Redis link moved to another primary (a Sentinel failover), by the link's \
         role (route store, response cache, fleet limits).",
        &["role"]
    ));

    pub(crate) static AUDIT_RECORDS: IntCounter = registered(register_int_counter!(
        "switchyard_audit_records_total",
        "Writes through the admin API recorded in the audit log."
    ));

    pub(crate) static AUDIT_TRIMMED: IntCounter = registered(register_int_counter!(
        "switchyard_audit_records_trimmed_total",
        "Oldest audit records removed to keep the log within --audit-retention."
    ));

    pub(crate) static AUDIT_FAILURES: IntCounter = registered(register_int_counter!(
        "switchyard_audit_write_failures_total",
        "Audit records the store could not keep (the write they describe was answered)."
    ));

    pub(crate) static PUBSUB_DISCONNECTS: IntCounter = registered(register_int_counter!(
        "switchyard_store_subscription_disconnects_total",
        "Times the change subscription was lost."
    ));
}

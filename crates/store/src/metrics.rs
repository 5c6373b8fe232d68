//! The store's Prometheus metrics (default registry, exported by the admin API): whether the
//! shared store answers, its failures, and the change subscription's state.

#![allow(missing_docs)]

use std::sync::LazyLock;

use prometheus::{
    register_int_counter, register_int_counter_vec, register_int_gauge, IntCounter, IntCounterVec,
    IntGauge,
};

// A failed registration is a duplicate name: a programming error the first test catches.
#[allow(clippy::expect_used)]
fn registered<T>(result: prometheus::Result<T>) -> T {
    result.expect("metric names are unique")
}

pub(crate) static STORE_AVAILABLE: LazyLock<IntGauge> = LazyLock::new(|| {
    registered(register_int_gauge!(
        "switchyard_store_available",
        "1 when the last call to the shared store succeeded, 0 while it is unreachable."
    ))
});

pub(crate) static STORE_ERRORS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    registered(register_int_counter_vec!(
        "switchyard_store_errors_total",
        "Failed store calls, by kind (connect, connection, refused).",
        &["kind"]
    ))
});

pub(crate) static PUBSUB_CONNECTED: LazyLock<IntGauge> = LazyLock::new(|| {
    registered(register_int_gauge!(
        "switchyard_store_subscription_connected",
        "1 while the change subscription (Redis Pub/Sub) is up."
    ))
});

pub(crate) static PUBSUB_DISCONNECTS: LazyLock<IntCounter> = LazyLock::new(|| {
    registered(register_int_counter!(
        "switchyard_store_subscription_disconnects_total",
        "Times the change subscription was lost."
    ))
});

pub(crate) fn register_all() {
    LazyLock::force(&STORE_AVAILABLE);
    LazyLock::force(&STORE_ERRORS);
    LazyLock::force(&PUBSUB_CONNECTED);
    LazyLock::force(&PUBSUB_DISCONNECTS);
}

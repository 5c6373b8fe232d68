//! The filters' metrics, in the default registry.

#![allow(missing_docs)]

use prometheus::{
    register_histogram, register_int_counter, register_int_counter_vec, register_int_gauge,
    Histogram, IntCounter, IntCounterVec, IntGauge,
};
use switchyard_metrics::registered;

switchyard_metrics::declare_metrics! {
    pub(crate) static FAILURES: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_filter_failures_total",
        "Filters stopped, by app, filter and reason: deadline (a callback over its CPU \
         deadline), memory (over its cap), trap, start (refused its configuration or could \
         not start), stalled (paused with nothing to resume it), lost (its instance stopped \
         under the request). Series exist only for apps with filters.",
        &["app", "filter", "reason"]
    ));

    pub(crate) static CALLBACKS: IntCounter = registered(register_int_counter!(
        "switchyard_filter_callbacks_total",
        "Callbacks into filters, added by each instance in batches of 64 and when it ends."
    ));

    pub(crate) static YIELDS: IntCounter = registered(register_int_counter!(
        "switchyard_filter_yields_total",
        "Times a callback still running at a tick gave its thread to other requests."
    ));

    pub(crate) static INSTANCES: IntGauge = registered(register_int_gauge!(
        "switchyard_filter_instances",
        "Filter instances alive, over every app and thread."
    ));

    pub(crate) static HTTP_CALLS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_filter_http_calls_total",
        "Calls filters dispatched (proxy_http_call), by result: answered, failed.",
        &["result"]
    ));

    pub(crate) static COMPILE_SECONDS: Histogram = registered(register_histogram!(
        "switchyard_filter_compile_seconds",
        "Time to compile a module, or load it from the disk cache.",
        vec![0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0]
    ));

    pub(crate) static SHARED_DATA_KEYS: IntGauge = registered(register_int_gauge!(
        "switchyard_filter_shared_data_keys",
        "Keys held in the filters' shared data, over every app (at most 1,024 an app)."
    ));
}

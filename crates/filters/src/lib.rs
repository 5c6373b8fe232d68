//! Switchyard's proxy-wasm host: per-app filters written against the proxy-wasm ABI v0.2.1
//! (the one Envoy, Kong's ngx_wasm_module, APISIX and MOSN run), on wasmtime.
//!
//! A filter is a module (compiled once per router, [`FilterEngine::compile`]) set on an app
//! with its configuration ([`Plugin`]); a request runs through its app's filters with a
//! [`RequestFilters`]. Each callback has a CPU deadline, each instance a memory cap; a
//! filter that breaks either, or traps, is stopped and its request answered 500 or let
//! through (`fail_open`), and it never holds its thread past a tick: other apps' requests
//! on the thread run between its ticks.

mod abi;
mod deadline;
mod engine;
mod exchange;
mod hostcalls;
mod metrics;
mod plugin;
mod request;
mod shared_data;

pub use engine::{CompiledModule, EngineSettings, FilterEngine};
pub use exchange::{
    HttpCall, HttpCallAnswer, LocalResponse, RequestFacts, RequestHead, ResponseHead,
};
pub use plugin::{FailureKind, Limits, Plugin, PluginStats};
pub use request::{HttpCalls, RequestFilters, Verdict};
pub use shared_data::{MAX_KEYS_PER_APP, MAX_VALUE_BYTES};

/// The filters' metrics, for the reference.
pub fn metric_docs() -> Vec<switchyard_metrics::MetricDoc> {
    metrics::documented()
}

/// Registers the filters' metrics (exported at zero before their first use).
pub fn register_metrics() {
    metrics::register_all();
}

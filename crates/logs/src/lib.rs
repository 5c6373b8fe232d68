//! Access-log shipping: the router batches its access-log records (at most 64 KiB a batch)
//! and delivers them, acknowledged, to `switchyard logd`, which writes one file per app and
//! rotates them. Memory and disk on the router side are bounded; what cannot be delivered
//! waits in an on-disk spool and what cannot be spooled is dropped and counted, never
//! slowing the proxy.

mod files;
pub mod frame;
mod logd;
mod metrics;
mod outbox;
mod shipper;
mod spool;

pub use files::FilePolicy;
pub use logd::{run as run_logd, LogdConfig, SyncPolicy};
pub use shipper::{Batcher, ShipConfig, Shipper};

/// The stream (and logd's directory) of the admin API's audit records, shipped beside the
/// access logs: no app name starts with `_`.
pub const AUDIT_STREAM: &str = "_audit";

/// What each metric of this crate is, for the reference (`switchyard reference`).
pub fn metric_docs() -> Vec<switchyard_metrics::MetricDoc> {
    metrics::documented()
}

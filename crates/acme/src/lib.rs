//! Certificates for every opted-in app's domains, ordered from an ACME CA by one router of
//! the fleet at a time (the holder of the store's lease), answered for HTTP-01 by every
//! router (the challenges are in the store), stored like uploaded certificates so every
//! router serves them on the next handshake.

mod ari;
mod http_client;
mod issuer;
mod metrics;
mod order;

pub use issuer::{AcmeSettings, ChallengeKind, Issuer, LETS_ENCRYPT_ORDERS_PER_3H};

/// What each metric of this crate is, for the reference (`switchyard reference`).
pub fn metric_docs() -> Vec<switchyard_metrics::MetricDoc> {
    metrics::documented()
}

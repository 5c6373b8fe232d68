//! The issuer's Prometheus metrics (default registry, exported by the admin API).

#![allow(missing_docs)]

use prometheus::{
    register_gauge, register_int_counter_vec, register_int_gauge, register_int_gauge_vec, Gauge,
    IntCounterVec, IntGauge, IntGaugeVec,
};
use switchyard_metrics::registered;

switchyard_metrics::declare_metrics! {
    pub(crate) static ORDERS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_acme_orders_total",
        "ACME orders this router made, by result (issued, failed, deferred: held back by the \
         CA's limits kept locally).",
        &["result"]
    ));

    pub(crate) static DOMAINS: IntGaugeVec = registered(register_int_gauge_vec!(
        "switchyard_acme_domains",
        "Domains of opted-in apps by ACME state, as of the lease holder's last round.",
        &["state"]
    ));

    pub(crate) static SOONEST_EXPIRY_DAYS: Gauge = registered(register_gauge!(
        "switchyard_acme_soonest_expiry_days",
        "Days until the soonest end of validity among ACME-issued certificates."
    ));

    pub(crate) static LEASE_HELD: IntGauge = registered(register_int_gauge!(
        "switchyard_acme_lease_held",
        "1 while this router holds the fleet's issuing lease."
    ));
}

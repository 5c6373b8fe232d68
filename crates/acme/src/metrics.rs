//! The issuer's Prometheus metrics (default registry, exported by the admin API).

#![allow(missing_docs)]

use prometheus::{
    register_int_counter_vec, register_int_gauge, register_int_gauge_vec, IntCounterVec, IntGauge,
    IntGaugeVec,
};
use switchyard_metrics::{known_gauge, registered, KnownGauge};

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

    pub(crate) static SOONEST_EXPIRY_DAYS: KnownGauge = registered(known_gauge(
        "switchyard_acme_soonest_expiry_days",
        "Days until the soonest end of validity among ACME-issued certificates, as the \
         fleet's lease holder last counted them; absent on a router that does not hold the \
         lease or has seen no issued certificate (not 0, which would read as expired)."
    ));

    pub(crate) static LEASE_HELD: IntGauge = registered(register_int_gauge!(
        "switchyard_acme_lease_held",
        "1 while this router holds the fleet's issuing lease."
    ));
}

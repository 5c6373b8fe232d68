//! Prometheus metrics of both sides, in the default registry: the router's admin API and
//! `logd --metrics` expose it. `logd`'s per-app series are bounded by the apps it has seen.

#![allow(missing_docs)]

use prometheus::{
    register_histogram, register_int_counter, register_int_counter_vec, register_int_gauge,
    Histogram, IntCounter, IntCounterVec, IntGauge,
};
use switchyard_metrics::registered;

switchyard_metrics::declare_metrics! {
    pub(crate) static SHIP_RECORDS: IntCounter = registered(register_int_counter!(
        "switchyard_log_ship_records_total",
        "Access-log records put into batches for the log services."
    ));

    pub(crate) static SHIP_BATCHES: IntCounter = registered(register_int_counter!(
        "switchyard_log_ship_batches_total",
        "Batches made."
    ));

    pub(crate) static SHIP_BYTES: IntCounter = registered(register_int_counter!(
        "switchyard_log_ship_bytes_total",
        "Bytes of batches sent (resends included)."
    ));

    pub(crate) static SHIP_ACKNOWLEDGED: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_log_ship_acknowledged_total",
        "Batches answered by a log service: stored, or refused as malformed.",
        &["status"]
    ));

    pub(crate) static SHIP_ACKNOWLEDGED_RECORDS: IntCounter = registered(register_int_counter!(
        "switchyard_log_ship_acknowledged_records_total",
        "Records in batches a log service acknowledged as stored."
    ));

    pub(crate) static SHIP_SPILLED: IntCounter = registered(register_int_counter!(
        "switchyard_log_ship_spilled_batches_total",
        "Batches written to the on-disk spool because the memory buffer was full or the spool \
         already held older batches."
    ));

    pub(crate) static SHIP_RESENT: IntCounter = registered(register_int_counter!(
        "switchyard_log_ship_resent_batches_total",
        "Batches sent again after a connection ended before their acknowledgement."
    ));

    pub(crate) static SHIP_DROPPED: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_log_ship_dropped_records_total",
        "Records lost: memory buffer and spool both full, a spool write failed, or the log \
         service refused the batch.",
        &["reason"]
    ));

    pub(crate) static SHIP_BUFFERED_BYTES: IntGauge = registered(register_int_gauge!(
        "switchyard_log_ship_buffer_bytes",
        "Bytes of batches waiting in memory."
    ));

    pub(crate) static SHIP_SPOOL_BYTES: IntGauge = registered(register_int_gauge!(
        "switchyard_log_ship_spool_bytes",
        "Bytes of batches waiting in the on-disk spool."
    ));

    pub(crate) static SHIP_CONNECTED: IntGauge = registered(register_int_gauge!(
        "switchyard_log_ship_connected",
        "1 while connected to a log service."
    ));

    pub(crate) static SPOOL_DAMAGED: IntCounter = {
    registered(register_int_counter!(
        "switchyard_log_ship_spool_damaged_total",
        "Spool segments cut short by a damaged frame (a crash mid-write); their rest is lost."
    ))
    };

    pub(crate) static LOGD_LINES: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_logd_lines_total",
        "Lines written, by app.",
        &["app"]
    ));

    pub(crate) static LOGD_BYTES: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_logd_bytes_total",
        "Bytes written, by app.",
        &["app"]
    ));

    pub(crate) static LOGD_BATCHES: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_logd_batches_total",
        "Batches received: stored, duplicate (stored before, acknowledged again) or refused.",
        &["result"]
    ));

    pub(crate) static LOGD_WRITE_FAILURES: IntCounter = registered(register_int_counter!(
        "switchyard_logd_write_failures_total",
        "Groups of batches that could not be written (a full or failing disk): none of them \
         is acknowledged, so the routers keep them and send them again."
    ));

    pub(crate) static LOGD_ROTATIONS: IntCounterVec = registered(register_int_counter_vec!(
        "switchyard_logd_rotations_total",
        "File rotations, by reason (size, time).",
        &["reason"]
    ));

    pub(crate) static LOGD_WRITE_SECONDS: Histogram = registered(register_histogram!(
        "switchyard_logd_write_seconds",
        "Time to write and sync one group of batches before acknowledging them.",
        vec![0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0]
    ));

    pub(crate) static LOGD_TORN_TAILS: IntCounter = registered(register_int_counter!(
        "switchyard_logd_torn_lines_cut_total",
        "Unfinished last lines cut from a file when opening it: a crash of logd mid-write."
    ));

    pub(crate) static LOGD_QUEUE: IntGauge = registered(register_int_gauge!(
        "switchyard_logd_queue_batches",
        "Batches received and waiting for the writer."
    ));

    pub(crate) static LOGD_CONNECTIONS: IntGauge = registered(register_int_gauge!(
        "switchyard_logd_connections",
        "Routers connected."
    ));
}

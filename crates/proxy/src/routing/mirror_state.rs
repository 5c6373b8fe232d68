//! Live mirroring state of one app, kept with its route (the `mirror` stage uses it).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use prometheus::IntGauge;

use crate::metrics;

/// Live mirroring state of one app, kept with its route. The in-flight count outlives
/// route rebuilds (a change to the app) so the cap holds across them.
#[derive(Debug)]
pub(crate) struct MirrorState {
    in_flight: Arc<AtomicU32>,
    next_backend: AtomicUsize,
    in_flight_gauge: IntGauge,
}

impl MirrorState {
    /// State for `app`, continuing the count of the route it replaces.
    pub(crate) fn new(app: &str, previous: Option<&MirrorState>) -> Self {
        Self {
            in_flight: previous.map_or_else(Default::default, |p| p.in_flight.clone()),
            next_backend: AtomicUsize::new(0),
            in_flight_gauge: metrics::MIRROR_IN_FLIGHT.with_label_values(&[app]),
        }
    }

    pub(crate) fn try_acquire(&self, cap: u32) -> Option<CopyInFlight> {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            })
            .ok()?;
        self.in_flight_gauge.inc();
        Some(CopyInFlight {
            count: self.in_flight.clone(),
            gauge: self.in_flight_gauge.clone(),
        })
    }

    pub(crate) fn pick(&self, backends: &[SocketAddr]) -> Option<SocketAddr> {
        let turn = self.next_backend.fetch_add(1, Ordering::Relaxed);
        backends.get(turn % backends.len().max(1)).copied()
    }
}

/// One copy counted against the app's `max_in_flight` until dropped.
pub(crate) struct CopyInFlight {
    count: Arc<AtomicU32>,
    gauge: IntGauge,
}

impl Drop for CopyInFlight {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
        self.gauge.dec();
    }
}

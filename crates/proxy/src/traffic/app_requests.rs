//! `switchyard_requests_total{app,class}`: requests answered, per app and status class.
//!
//! A `prometheus` child per (app, class) costs about 750 bytes (each copies the metric's
//! description and its label pairs), a third of a cached app's memory at 100,000 apps, and
//! every answer found its child by hashing the app's name under a lock. Here an app has one
//! slot of six counters, created with its first route and kept by every later version of it,
//! which the request path increments directly; the exposition walks the table at scrape
//! time. The table holds one slot per app that had a route built and was not deleted since
//! (routing/deleted_apps.rs), so it is bounded by the stored apps.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, LabelPair, Metric, MetricFamily, MetricType};

use crate::metrics::{status_class_index, STATUS_CLASSES};

const NAME: &str = "switchyard_requests_total";
const HELP: &str = "Requests answered, by app and status class (1xx..5xx).";
/// Upper bounds (ms) of the per-app duration buckets; a last bucket holds the slower.
pub(crate) const DURATION_BOUNDS_MS: [u64; 12] =
    [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10_000];

/// One app's answered requests, a counter per status class in [`STATUS_CLASSES`]' order,
/// and how long they took in coarse buckets (for the traffic history's p99 per app). The
/// buckets are `u32` and wrap: only differences between two samples are read, and a
/// bucket takes more than 4 billion answers between two samples only in theory. 52 bytes
/// beside the counters, and 60 for its costs and its fair share, for every app with a route.
#[derive(Debug, Default)]
pub(crate) struct AppRequests {
    by_class: [AtomicU64; STATUS_CLASSES.len()],
    by_duration: [AtomicU32; DURATION_BOUNDS_MS.len() + 1],
    /// What the app costs the router (CPU, bytes, what it holds open).
    pub(crate) cost: AppCost,
}

impl AppRequests {
    /// Counts one answer with `status` (0 when nothing was sent) that took `elapsed`;
    /// `None` for an upgraded connection (a WebSocket), whose lifetime says nothing of
    /// how fast the app answers.
    pub(crate) fn record(&self, status: u16, elapsed: Option<Duration>) {
        self.by_class[status_class_index(status)].fetch_add(1, Ordering::Relaxed);
        if let Some(elapsed) = elapsed {
            let ms = elapsed.as_millis() as u64;
            let bucket = DURATION_BOUNDS_MS.partition_point(|&bound| bound < ms.max(1));
            self.by_duration[bucket].fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl AppRequests {
    /// The counters, one per status class in [`STATUS_CLASSES`]' order.
    pub(crate) fn by_class(&self) -> &[AtomicU64; STATUS_CLASSES.len()] {
        &self.by_class
    }

    /// The duration buckets, bounded by [`DURATION_BOUNDS_MS`].
    pub(crate) fn by_duration(&self) -> &[AtomicU32; DURATION_BOUNDS_MS.len() + 1] {
        &self.by_duration
    }
}

/// One app's costs, in its traffic slot (measured by `cost.rs`).
#[derive(Debug, Default)]
pub(crate) struct AppCost {
    /// CPU nanoseconds spent on its behalf (event loops and worker pool).
    pub(crate) cpu_ns: AtomicU64,
    /// Request body bytes read from its clients.
    pub(crate) client_bytes_in: AtomicU64,
    /// Answer body bytes sent to its clients.
    pub(crate) client_bytes_out: AtomicU64,
    /// Client connections charged to it, open now.
    pub(crate) connections: AtomicI64,
    /// WebSockets (upgraded connections) relayed for it, open now.
    pub(crate) websockets: AtomicI64,
    /// Its requests under way.
    pub(crate) in_flight: AtomicI64,
    /// Its place in the fair share (isolation/fair_share.rs).
    pub(crate) share: AppShare,
}

/// An app's cost counters read at one moment: two readings subtract to what the app used
/// between them (the per-app series' scrapes, the usage ledger's minutes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CostReading {
    pub(crate) cpu_ns: u64,
    pub(crate) requests: u64,
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
}

impl CostReading {
    pub(crate) fn of(app: &AppRequests) -> Self {
        let cost = &app.cost;
        CostReading {
            cpu_ns: cost.cpu_ns.load(Ordering::Relaxed),
            requests: (app.by_class().iter())
                .map(|c| c.load(Ordering::Relaxed))
                .sum(),
            bytes_in: cost.client_bytes_in.load(Ordering::Relaxed),
            bytes_out: cost.client_bytes_out.load(Ordering::Relaxed),
        }
    }

    /// What was used from `earlier` to this reading.
    pub(crate) fn since(self, earlier: CostReading) -> CostReading {
        CostReading {
            cpu_ns: self.cpu_ns.saturating_sub(earlier.cpu_ns),
            requests: self.requests.saturating_sub(earlier.requests),
            bytes_in: self.bytes_in.saturating_sub(earlier.bytes_in),
            bytes_out: self.bytes_out.saturating_sub(earlier.bytes_out),
        }
    }

    pub(crate) fn add(&mut self, other: CostReading) {
        self.cpu_ns += other.cpu_ns;
        self.requests += other.requests;
        self.bytes_in += other.bytes_in;
        self.bytes_out += other.bytes_out;
    }

    pub(crate) fn is_zero(self) -> bool {
        self == CostReading::default()
    }
}

/// What the fair share keeps of an app in its slot: read by the request path only while
/// its event loop is saturated.
#[derive(Debug, Default)]
pub(crate) struct AppShare {
    /// The app's `cpu_weight` (0 until its route is built: taken as 1).
    pub(crate) weight: AtomicU32,
    /// Whether its CPU over the last seconds is above its share (written by the sampler).
    pub(crate) over: AtomicBool,
    /// The sampler's round in which it was last charged CPU (`cost::charged_recently`).
    pub(crate) charged_in_round: AtomicU32,
}

impl AppCost {
    /// What the app holds now: connections, WebSockets, requests in flight.
    pub(crate) fn held(&self) -> [i64; 3] {
        [
            self.connections.load(Ordering::Relaxed),
            self.websockets.load(Ordering::Relaxed),
            self.in_flight.load(Ordering::Relaxed),
        ]
    }
}

/// Every app's slot, and the exposition of them all.
pub(crate) struct RequestCounts {
    apps: Mutex<HashMap<Box<str>, Arc<AppRequests>>>,
    /// Requests no app took (unknown hosts, refused before routing), shown as `app=""`.
    unrouted: Arc<AppRequests>,
    desc: Desc,
}

/// The process's table, registered with the default registry when first used (before
/// that it has nothing to show: the registry leaves out a family without samples).
pub(crate) static REQUEST_COUNTS: LazyLock<Arc<RequestCounts>> = LazyLock::new(|| {
    let counts = Arc::new(RequestCounts::new());
    let collector = RequestCountsCollector(counts.clone());
    switchyard_metrics::registered(prometheus::register(Box::new(collector)));
    counts
});

// The name and help are constants checked by the first test that touches metrics.
#[allow(clippy::expect_used)]
fn described() -> Desc {
    Desc::new(
        NAME.into(),
        HELP.into(),
        vec!["app".into(), "class".into()],
        HashMap::new(),
    )
    .expect("a valid metric name")
}

impl RequestCounts {
    pub(crate) fn new() -> Self {
        Self {
            apps: Mutex::new(HashMap::new()),
            unrouted: Arc::default(),
            desc: described(),
        }
    }

    /// The slot of the app named `app`, created on first use; every version of the app's
    /// route shares it.
    pub(crate) fn for_app(&self, app: &str) -> Arc<AppRequests> {
        let mut apps = self.apps.lock();
        if let Some(slot) = apps.get(app) {
            return slot.clone();
        }
        let slot = Arc::<AppRequests>::default();
        apps.insert(app.into(), slot.clone());
        slot
    }

    /// Whether `app` has a slot: a route of it was built here, so it may have series.
    pub(crate) fn has(&self, app: &str) -> bool {
        self.apps.lock().contains_key(app)
    }

    /// Drops the slots of those of `apps` (deleted) that no route holds: the names of those
    /// dropped, and of those kept because a route holds them (an app built again under that
    /// name, or a request still under way on the deleted one). Names without a slot are in
    /// neither.
    pub(crate) fn forget_unheld(
        &self,
        apps: &HashSet<String>,
    ) -> (HashSet<String>, HashSet<String>) {
        let (mut forgotten, mut held) = (HashSet::new(), HashSet::new());
        self.apps.lock().retain(|app, slot| {
            if !apps.contains(app.as_ref()) {
                return true;
            }
            if Arc::strong_count(slot) > 1 {
                held.insert(app.to_string());
                return true;
            }
            forgotten.insert(app.to_string());
            false
        });
        (forgotten, held)
    }

    /// Calls `visit` with every app's slot (under the table's lock: keep it short).
    pub(crate) fn each_app(&self, mut visit: impl FnMut(&str, &AppRequests)) {
        for (app, counts) in self.apps.lock().iter() {
            visit(app, counts);
        }
    }

    /// The slot of requests no app took.
    pub(crate) fn unrouted(&self) -> &AppRequests {
        &self.unrouted
    }

    fn family(&self) -> MetricFamily {
        let mut metrics = Vec::new();
        let mut add = |app: &str, counts: &AppRequests| {
            for (class, count) in STATUS_CLASSES.iter().zip(&counts.by_class) {
                let count = count.load(Ordering::Relaxed);
                // As with Prometheus children, a pair appears once it has counted something.
                if count > 0 {
                    metrics.push(counter(app, class, count));
                }
            }
        };
        add("", &self.unrouted);
        for (app, counts) in self.apps.lock().iter() {
            add(app, counts);
        }
        let mut family = MetricFamily::default();
        family.set_name(NAME.into());
        family.set_help(HELP.into());
        family.set_field_type(MetricType::COUNTER);
        family.set_metric(metrics.into());
        family
    }
}

fn counter(app: &str, class: &str, count: u64) -> Metric {
    let label = |name: &str, value: &str| {
        let mut pair = LabelPair::default();
        pair.set_name(name.into());
        pair.set_value(value.into());
        pair
    };
    let mut value = Counter::default();
    value.set_value(count as f64);
    let mut metric = Metric::default();
    metric.set_label(vec![label("app", app), label("class", class)].into());
    metric.set_counter(value);
    metric
}

/// The registry holds this handle; the table itself stays where the request path reaches it.
struct RequestCountsCollector(Arc<RequestCounts>);

/// What the table exports, for the reference (`switchyard reference`).
pub(crate) fn documented() -> Vec<switchyard_metrics::MetricDoc> {
    switchyard_metrics::describe(&RequestCountsCollector(REQUEST_COUNTS.clone()))
}

impl Collector for RequestCountsCollector {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        vec![self.0.family()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{Encoder, Registry, TextEncoder};

    #[test]
    fn the_exposition_lists_each_app_and_class_that_counted() {
        let counts = Arc::new(RequestCounts::new());
        let took = Some(Duration::from_millis(3));
        counts.for_app("web").record(200, took);
        counts.for_app("web").record(204, took);
        counts.for_app("web").record(503, took);
        counts.for_app("idle");
        counts.unrouted().record(404, took);
        let registry = Registry::new();
        assert!(registry
            .register(Box::new(RequestCountsCollector(counts.clone())))
            .is_ok());
        let mut text = Vec::new();
        assert!(TextEncoder::new()
            .encode(&registry.gather(), &mut text)
            .is_ok());
        let text = String::from_utf8_lossy(&text);
        assert!(
            text.contains("# TYPE switchyard_requests_total counter"),
            "{text}"
        );
        assert!(
            text.contains("switchyard_requests_total{app=\"web\",class=\"2xx\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("switchyard_requests_total{app=\"web\",class=\"5xx\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("switchyard_requests_total{app=\"\",class=\"4xx\"} 1"),
            "{text}"
        );
        assert!(!text.contains("app=\"idle\""), "{text}");
        assert!(!text.contains("class=\"3xx\""), "{text}");
    }

    #[test]
    fn every_version_of_an_app_counts_in_one_slot() {
        let counts = RequestCounts::new();
        let first = counts.for_app("web");
        let second = counts.for_app("web");
        first.record(200, Some(Duration::ZERO));
        second.record(200, Some(Duration::from_secs(20)));
        second.record(101, None);
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(first.by_class[1].load(Ordering::Relaxed), 2);
        assert_eq!(first.by_class[0].load(Ordering::Relaxed), 1);
        // Under a millisecond in the first bucket, past the last bound in the extra one.
        assert_eq!(first.by_duration[0].load(Ordering::Relaxed), 1);
        assert_eq!(
            first.by_duration[DURATION_BOUNDS_MS.len()].load(Ordering::Relaxed),
            1
        );
        let timed: u32 = first
            .by_duration
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .sum();
        assert_eq!(timed, 2, "the WebSocket is counted, not timed");
    }
}

//! What each app costs, exported without a series per app: the apps that cost the most
//! over the last minutes by name, every other app summed as `app="_other"`.
//!
//! Counters must never go down, and an app moves in and out of the top as traffic shifts.
//! So an app's series, once shown, counts only what it used while shown: what it used while
//! not shown went to `_other`, whose counter only ever adds. An app's series stays shown
//! for as long as it is among the top [`top_apps`] by CPU over the last
//! [`RANKING_WINDOW`] to twice that, or its place is needed by a costlier app, so a
//! scraper sees at most twice `top_apps` series of each family. The table of what went to
//! `_other` has an entry per app with a traffic slot, bounded like it by the stored apps.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

use super::app_requests::{CostReading, REQUEST_COUNTS};
use super::cost::UNATTRIBUTED_NS;

/// The label every app outside the top is summed under.
pub(crate) const OTHER: &str = "_other";

/// How far back an app's cost ranks it.
const RANKING_WINDOW: Duration = Duration::from_secs(300);

static TOP_APPS: AtomicUsize = AtomicUsize::new(20);

/// How many apps are shown by name (`--usage-top-apps`).
pub fn set_top_apps(apps: usize) {
    TOP_APPS.store(apps.max(1), Ordering::Relaxed);
}

fn top_apps() -> usize {
    TOP_APPS.load(Ordering::Relaxed)
}

#[derive(Default)]
struct Shown {
    /// Apps shown by name.
    named: HashSet<Box<str>>,
    /// Per app: its counters at the last scrape, and what of them went to `_other`.
    apps: HashMap<Box<str>, (CostReading, CostReading)>,
    /// `_other`'s counters.
    other: CostReading,
    /// Each app's CPU counter at the start of the current and of the previous window.
    window_marks: [HashMap<Box<str>, u64>; 2],
    window_started: Option<Instant>,
}

struct AppCosts {
    shown: Mutex<Shown>,
    descs: Vec<Desc>,
}

const CPU: &str = "switchyard_app_cpu_seconds_total";
const BYTES: &str = "switchyard_app_client_bytes_total";
const CONNECTIONS: &str = "switchyard_app_connections";
const WEBSOCKETS: &str = "switchyard_app_websockets";
const IN_FLIGHT: &str = "switchyard_app_in_flight_requests";
const UNATTRIBUTED: &str = "switchyard_unattributed_cpu_seconds_total";

/// The families, their help and labels.
const FAMILIES: [(&str, &str, &[&str]); 6] = [
    (
        CPU,
        "CPU seconds the router spent for an app (event loops and worker pool): the costliest \
         apps of the last minutes by name, the others as app=\"_other\".",
        &["app"],
    ),
    (
        BYTES,
        "Bytes an app's clients sent (direction=\"in\") and were sent (\"out\"), apps as in \
         switchyard_app_cpu_seconds_total.",
        &["app", "direction"],
    ),
    (
        CONNECTIONS,
        "Client connections charged to an app (by their latest request), open now.",
        &["app"],
    ),
    (
        WEBSOCKETS,
        "WebSockets relayed for an app, open now.",
        &["app"],
    ),
    (IN_FLIGHT, "An app's requests under way.", &["app"]),
    (
        UNATTRIBUTED,
        "CPU seconds of the event loops and the pool no app was charged (accepting, timers, \
         connections that never routed a request).",
        &[],
    ),
];

// The names and help are constants, checked by the first test that touches metrics.
#[allow(clippy::expect_used)]
static APP_COSTS: LazyLock<Arc<AppCosts>> = LazyLock::new(|| {
    let descs = (FAMILIES.iter())
        .map(|(name, help, labels)| {
            let labels = labels.iter().map(|l| l.to_string()).collect();
            Desc::new(name.to_string(), help.to_string(), labels, HashMap::new())
                .expect("a valid metric")
        })
        .collect();
    let costs = Arc::new(AppCosts {
        shown: Mutex::new(Shown::default()),
        descs,
    });
    let collector = AppCostCollector(costs.clone());
    switchyard_metrics::registered(prometheus::register(Box::new(collector)));
    costs
});

/// Registers the families (they are read at scrape time from the apps' slots).
pub fn register() {
    LazyLock::force(&APP_COSTS);
}

/// The families' documentation, for the metrics reference.
pub(crate) fn documented() -> Vec<switchyard_metrics::MetricDoc> {
    switchyard_metrics::describe(&AppCostCollector(APP_COSTS.clone()))
}

/// One scrape: the apps shown updated, their series and `_other`'s.
fn scrape(shown: &mut Shown) -> Vec<(Box<str>, CostReading, [i64; 3])> {
    let now = Instant::now();
    let mut read: Vec<(Box<str>, CostReading, [i64; 3])> = Vec::new();
    REQUEST_COUNTS.each_app(|app, slot| {
        let held = slot.cost.held();
        read.push((app.into(), CostReading::of(slot), held));
    });
    // The ranking: CPU since the start of the previous window (RANKING_WINDOW to twice it).
    let rotate = shown
        .window_started
        .is_none_or(|started| now.duration_since(started) >= RANKING_WINDOW);
    if rotate {
        let current = (read.iter())
            .map(|(app, counted, _)| (app.clone(), counted.cpu_ns))
            .collect();
        let previous = std::mem::replace(&mut shown.window_marks[1], current);
        shown.window_marks[0] = previous;
        shown.window_started = Some(now);
    }
    let recent = |app: &str, cpu_ns: u64| {
        let mark = (shown.window_marks[0].get(app)).copied().unwrap_or(0);
        cpu_ns.saturating_sub(mark)
    };
    let mut ranked: Vec<(u64, &str)> = (read.iter())
        .map(|(app, counted, _)| (recent(app, counted.cpu_ns), app.as_ref()))
        .filter(|(cost, _)| *cost > 0)
        .collect();
    ranked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    let top: Vec<&str> = ranked
        .iter()
        .take(top_apps())
        .map(|(_, app)| *app)
        .collect();
    for app in &top {
        shown.named.insert((*app).into());
    }
    if shown.named.len() > 2 * top_apps() {
        let rank: HashMap<&str, u64> = ranked.iter().map(|(cost, app)| (*app, *cost)).collect();
        let mut named: Vec<Box<str>> = shown.named.drain().collect();
        named.sort_by_key(|app| std::cmp::Reverse(rank.get(app.as_ref()).copied().unwrap_or(0)));
        named.truncate(2 * top_apps());
        shown.named = named.into_iter().collect();
    }
    let mut apps = HashMap::with_capacity(read.len());
    for (app, counted, _) in &read {
        let (before, mut to_other) = shown.apps.remove(app).unwrap_or_default();
        if !shown.named.contains(app) {
            let added = counted.since(before);
            shown.other.add(added);
            to_other.add(added);
        }
        apps.insert(app.clone(), (*counted, to_other));
    }
    // Apps whose slots are gone (deleted) leave the table; `_other` keeps what they added.
    shown.apps = apps;
    shown.named.retain(|app| shown.apps.contains_key(app));
    read
}

struct AppCostCollector(Arc<AppCosts>);

impl Collector for AppCostCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.0.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut shown = self.0.shown.lock();
        let read = scrape(&mut shown);
        let mut families: Vec<Vec<Metric>> = vec![Vec::new(); FAMILIES.len()];
        let mut other_held = [0i64; 3];
        for (app, counted, held) in &read {
            if !shown.named.contains(app) {
                for (sum, value) in other_held.iter_mut().zip(held) {
                    *sum += value;
                }
                continue;
            }
            let to_other = shown.apps.get(app).map(|(_, o)| *o).unwrap_or_default();
            let own = counted.since(to_other);
            push_series(&mut families, app, own, *held);
        }
        let other = shown.other;
        push_series(&mut families, OTHER, other, other_held);
        families[5].push(counter(
            &[],
            UNATTRIBUTED_NS.load(Ordering::Relaxed) as f64 / 1e9,
        ));
        (FAMILIES.iter().zip(families))
            .map(|((name, help, _), metrics)| {
                let mut family = MetricFamily::default();
                family.set_name(name.to_string());
                family.set_help(help.to_string());
                let gauge = !name.ends_with("_total");
                family.set_field_type(if gauge {
                    MetricType::GAUGE
                } else {
                    MetricType::COUNTER
                });
                family.set_metric(metrics.into());
                family
            })
            .collect()
    }
}

fn push_series(families: &mut [Vec<Metric>], app: &str, used: CostReading, held: [i64; 3]) {
    families[0].push(counter(&[("app", app)], used.cpu_ns as f64 / 1e9));
    families[1].push(counter(
        &[("app", app), ("direction", "in")],
        used.bytes_in as f64,
    ));
    families[1].push(counter(
        &[("app", app), ("direction", "out")],
        used.bytes_out as f64,
    ));
    for (family, value) in families[2..5].iter_mut().zip(held) {
        family.push(gauge(&[("app", app)], value as f64));
    }
}

fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    (pairs.iter())
        .map(|(name, value)| {
            let mut pair = LabelPair::default();
            pair.set_name(name.to_string());
            pair.set_value(value.to_string());
            pair
        })
        .collect()
}

fn counter(pairs: &[(&str, &str)], value: f64) -> Metric {
    let mut counter = Counter::default();
    counter.set_value(value);
    let mut metric = Metric::default();
    metric.set_label(labels(pairs).into());
    metric.set_counter(counter);
    metric
}

fn gauge(pairs: &[(&str, &str)], value: f64) -> Metric {
    let mut gauge = Gauge::default();
    gauge.set_value(value);
    let mut metric = Metric::default();
    metric.set_label(labels(pairs).into());
    metric.set_gauge(gauge);
    metric
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_app_leaving_the_top_never_makes_a_counter_go_down() {
        set_top_apps(1);
        let mut shown = Shown::default();
        let (heavy, light) = (
            REQUEST_COUNTS.for_app("cost-metrics-heavy"),
            REQUEST_COUNTS.for_app("cost-metrics-light"),
        );
        heavy.cost.cpu_ns.fetch_add(10_000, Ordering::Relaxed);
        light.cost.cpu_ns.fetch_add(10, Ordering::Relaxed);
        scrape(&mut shown);
        assert!(shown.named.contains("cost-metrics-heavy"));
        let other_before = shown.other.cpu_ns;
        // The light app turns costlier: it is shown, and `_other` keeps what it had added.
        light.cost.cpu_ns.fetch_add(1_000_000, Ordering::Relaxed);
        shown.window_started = None;
        scrape(&mut shown);
        shown.window_started = None;
        scrape(&mut shown);
        assert!(shown.named.contains("cost-metrics-light"));
        assert!(shown.other.cpu_ns >= other_before);
        let (counted, to_other) = shown.apps["cost-metrics-light"];
        let own = counted.since(to_other).cpu_ns;
        assert_eq!(
            own + to_other.cpu_ns,
            1_000_010,
            "nothing counted twice or lost"
        );
        set_top_apps(20);
    }
}

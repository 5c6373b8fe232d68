//! The last 15 minutes of each busy app's traffic at 10 s resolution: what `switchyard top`
//! and `GET /v1/stats/apps` show, from the per-app counters the request path already keeps
//! (`app_requests.rs`). A task samples them every 10 s; the request path does no more work.
//!
//! Bounded: only apps that answered a request in the window are kept (an app idle for the
//! whole window is dropped), at most `max_apps` of them (more are counted as refused, not
//! tracked), each a ring of 90 samples of three `u32` (answers, 4xx, 5xx) — about 1.2 KB an
//! app with its name and map entry, 12 MB for 10,000 busy apps. Its size is a metric.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::metrics;
use crate::routing::app_requests::{AppRequests, RequestCounts, REQUEST_COUNTS};
use crate::shutdown::ShutdownWatch;

/// Time between samples.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// Samples kept per app: 15 minutes.
const SAMPLES: usize = 90;
/// Samples in a minute, the span apps are ranked by.
const MINUTE: usize = 6;
/// Approximate bytes one tracked app costs beyond its samples (name, map entries).
const APP_OVERHEAD_BYTES: usize = 160;

/// One 10 s interval of one app: answers, then those with 4xx and 5xx.
type Sample = [u32; 3];

struct AppTraffic {
    /// Oldest first; the last is the latest interval.
    samples: VecDeque<Sample>,
    /// The sample that last added to it.
    sampled_at: u64,
}

impl AppTraffic {
    fn idle(&self) -> bool {
        self.samples.iter().all(|s| s[0] == 0)
    }

    fn sum(&self, last: usize) -> Sample {
        self.samples.iter().rev().take(last).fold([0; 3], |acc, s| {
            [acc[0] + s[0], acc[1] + s[1], acc[2] + s[2]]
        })
    }
}

#[derive(Default)]
struct HistoryState {
    /// Cumulative counts seen at the last sample, per app that ever answered.
    seen: HashMap<Box<str>, [u64; 3]>,
    apps: HashMap<Box<str>, AppTraffic>,
    samples_taken: u64,
}

/// How to order the busiest apps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrafficOrder {
    /// Most answers in the last minute first.
    Traffic,
    /// Most 5xx in the last minute first.
    Errors,
}

/// The history and its bound.
pub struct TrafficHistory {
    state: Mutex<HistoryState>,
    max_apps: usize,
}

impl TrafficHistory {
    /// An empty history keeping at most `max_apps` busy apps.
    pub fn new(max_apps: usize) -> Self {
        metrics::HISTORY_CAPACITY.set(max_apps as i64);
        Self {
            state: Mutex::new(HistoryState::default()),
            max_apps,
        }
    }

    /// Samples every [`SAMPLE_EVERY`] until shutdown.
    pub async fn run(&self, mut shutdown: ShutdownWatch) {
        let mut ticks = tokio::time::interval(SAMPLE_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => self.sample(),
                _ = shutdown.changed() => return,
            }
        }
    }

    /// Takes one sample of every app's counters.
    pub fn sample(&self) {
        self.sample_from(&REQUEST_COUNTS);
    }

    fn sample_from(&self, requests_by_app: &RequestCounts) {
        let mut counts: Vec<(Box<str>, [u64; 3])> = Vec::new();
        requests_by_app.each_app(|app, requests| {
            let totals = totals(requests);
            if totals[0] > 0 {
                counts.push((app.into(), totals));
            }
        });
        let mut state = self.state.lock();
        let state = &mut *state;
        state.samples_taken += 1;
        let tick = state.samples_taken;
        let mut refused = 0u64;
        for (app, totals) in counts {
            // Counters start at zero with the process, and an app's first answer makes it
            // appear here: an app not seen before answered all of its count since.
            let previous = state.seen.insert(app.clone(), totals).unwrap_or([0; 3]);
            let delta = [0, 1, 2].map(|i| {
                totals[i]
                    .saturating_sub(previous[i])
                    .min(u64::from(u32::MAX)) as u32
            });
            if let Some(traffic) = state.apps.get_mut(&app) {
                push(traffic, delta);
                traffic.sampled_at = tick;
            } else if delta[0] == 0 {
                // Not in the history and still quiet: nothing to keep.
            } else if state.apps.len() >= self.max_apps {
                refused += 1;
            } else {
                let mut traffic = AppTraffic {
                    samples: VecDeque::with_capacity(SAMPLES),
                    sampled_at: tick,
                };
                push(&mut traffic, delta);
                state.apps.insert(app, traffic);
            }
        }
        // An app whose counters were not seen (deleted) gets a zero interval; an app whose
        // whole window is zero goes.
        for traffic in state.apps.values_mut() {
            if traffic.sampled_at != tick {
                push(traffic, [0; 3]);
                traffic.sampled_at = tick;
            }
        }
        state.apps.retain(|_, traffic| !traffic.idle());
        metrics::HISTORY_REFUSED.inc_by(refused);
        metrics::HISTORY_APPS.set(state.apps.len() as i64);
        metrics::HISTORY_BYTES.set(bytes(&state.apps) as i64);
    }

    /// The busiest `limit` apps by `order`, each with its rates and its series.
    pub fn busiest(&self, order: TrafficOrder, limit: usize) -> Value {
        self.listed(order, limit, |_| true)
    }

    /// [`TrafficHistory::busiest`]'s answer for `app` alone.
    pub fn of_app(&self, app: &str) -> Value {
        self.listed(TrafficOrder::Traffic, 1, |name| name == app)
    }

    fn listed(&self, order: TrafficOrder, limit: usize, wanted: impl Fn(&str) -> bool) -> Value {
        let state = self.state.lock();
        let mut rows: Vec<(&Box<str>, &AppTraffic, Sample)> = state
            .apps
            .iter()
            .filter(|(app, _)| wanted(app))
            .map(|(app, traffic)| (app, traffic, traffic.sum(MINUTE)))
            .collect();
        match order {
            TrafficOrder::Traffic => rows.sort_by(|a, b| b.2[0].cmp(&a.2[0]).then(a.0.cmp(b.0))),
            TrafficOrder::Errors => rows.sort_by(|a, b| b.2[2].cmp(&a.2[2]).then(a.0.cmp(b.0))),
        }
        let interval = SAMPLE_EVERY.as_secs_f64();
        let apps: Vec<Value> = rows
            .into_iter()
            .take(limit)
            .map(|(app, traffic, minute)| {
                let latest = traffic.samples.back().copied().unwrap_or_default();
                let window = traffic.samples.len().clamp(1, MINUTE) as f64 * interval;
                json!({
                    "app": app.as_ref(),
                    "rps_10s": f64::from(latest[0]) / interval,
                    "rps_1m": f64::from(minute[0]) / window,
                    "error_ratio_1m": ratio(minute[2], minute[0]),
                    "client_error_ratio_1m": ratio(minute[1], minute[0]),
                    "requests": traffic.samples.iter().map(|s| s[0]).collect::<Vec<_>>(),
                    "errors": traffic.samples.iter().map(|s| s[2]).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({
            "resolution_s": SAMPLE_EVERY.as_secs(),
            "window_s": SAMPLE_EVERY.as_secs() * SAMPLES as u64,
            "tracked_apps": state.apps.len(),
            "max_apps": self.max_apps,
            "memory_bytes": bytes(&state.apps),
            "apps": apps,
        })
    }
}

fn push(traffic: &mut AppTraffic, sample: Sample) {
    if traffic.samples.len() == SAMPLES {
        traffic.samples.pop_front();
    }
    traffic.samples.push_back(sample);
}

fn totals(requests: &AppRequests) -> [u64; 3] {
    let by_class = requests.by_class();
    let all = by_class.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    [
        all,
        by_class[3].load(Ordering::Relaxed),
        by_class[4].load(Ordering::Relaxed),
    ]
}

fn ratio(part: u32, whole: u32) -> f64 {
    if whole == 0 {
        0.0
    } else {
        f64::from(part) / f64::from(whole)
    }
}

fn bytes(apps: &HashMap<Box<str>, AppTraffic>) -> usize {
    apps.iter()
        .map(|(app, traffic)| {
            app.len()
                + APP_OVERHEAD_BYTES
                + traffic.samples.capacity() * std::mem::size_of::<Sample>()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_apps_are_kept_in_order_idle_ones_dropped_and_the_bound_holds() {
        let counts = RequestCounts::new();
        let history = TrafficHistory::new(2);
        let busy = counts.for_app("busy");
        let failing = counts.for_app("failing");
        let late = counts.for_app("late");
        busy.record(200);
        failing.record(503);
        history.sample_from(&counts);
        for _ in 0..50 {
            busy.record(200);
        }
        for _ in 0..10 {
            failing.record(503);
        }
        late.record(404);
        history.sample_from(&counts);
        let by_traffic = history.busiest(TrafficOrder::Traffic, 10);
        let apps: Vec<&str> = by_traffic["apps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["app"].as_str())
            .collect();
        assert_eq!(
            apps,
            ["busy", "failing"],
            "the third is over the bound: {by_traffic}"
        );
        assert_eq!(by_traffic["apps"][0]["requests"], json!([1, 50]));
        assert_eq!(by_traffic["apps"][0]["rps_10s"], 5.0);
        let by_errors = history.busiest(TrafficOrder::Errors, 1);
        assert_eq!(by_errors["apps"][0]["app"], "failing", "{by_errors}");
        assert_eq!(by_errors["apps"][0]["error_ratio_1m"], 1.0);
        assert_eq!(by_errors["apps"][0]["rps_10s"], 1.0);
        assert!(by_errors["memory_bytes"].as_u64() > Some(0));
        // Fifteen minutes of nothing: every app leaves the history.
        for _ in 0..SAMPLES {
            history.sample_from(&counts);
        }
        assert_eq!(
            history.busiest(TrafficOrder::Traffic, 10)["tracked_apps"],
            0
        );
    }
}

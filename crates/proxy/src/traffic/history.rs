//! The last 15 minutes of each busy app's traffic at 10 s resolution: what `switchyard top`,
//! the dashboard and `GET /v1/stats/apps` show, from the per-app counters the request path
//! already keeps (`app_requests.rs`). A task samples them every 10 s; the request path does
//! no more work.
//!
//! A report also reads the counters as they are now: the interval in progress (since the
//! last sample) counts in the last minute's figures and ranks, so an app that just started
//! answering is listed at once, not at the next sample; the series hold whole samples only.
//!
//! Bounded: only apps that answered a request in the window are kept (an app idle for the
//! whole window is dropped), at most `max_apps` of them (more are counted as refused, not
//! tracked), each a ring of 90 samples (answers, 4xx, 5xx, CPU µs, the p99's duration
//! bucket: 20 bytes) — about 2 KB an app with its name and map entries, 20 MB for 10,000
//! busy apps.
//! Its size is a metric.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use switchyard_model::{AppTrafficReport, TrafficReport};

use crate::metrics;
use crate::shutdown::ShutdownWatch;
use crate::traffic::app_requests::{
    AppRequests, RequestCounts, DURATION_BOUNDS_MS, REQUEST_COUNTS,
};

/// Time between samples.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// Samples kept per app: 15 minutes.
const SAMPLES: usize = 90;
/// Samples in a minute, the span apps are ranked by.
const MINUTE: usize = 6;
/// Approximate bytes one tracked app costs beyond its samples (name, map entries, the
/// counters read at the last sample).
const APP_OVERHEAD_BYTES: usize = 220;
const DURATION_BUCKETS: usize = DURATION_BOUNDS_MS.len() + 1;
/// A sample's p99 bucket when the app answered nothing in it.
const NO_ANSWERS: u8 = u8::MAX;

/// One 10 s interval of one app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    answers: u32,
    client_errors: u32,
    server_errors: u32,
    /// CPU microseconds the router spent for the app (`cost.rs`).
    cpu_us: u32,
    /// The duration bucket holding the 99th percentile.
    p99_bucket: u8,
}

impl Sample {
    const QUIET: Self = Self {
        answers: 0,
        client_errors: 0,
        server_errors: 0,
        cpu_us: 0,
        p99_bucket: NO_ANSWERS,
    };
}

/// What an app's counters read at a sample.
#[derive(Clone, Copy)]
struct Reading {
    /// Answers, 4xx, 5xx, cumulative since the process started.
    totals: [u64; 3],
    /// CPU nanoseconds, cumulative.
    cpu_ns: u64,
    /// Cumulative and wrapping.
    durations: [u32; DURATION_BUCKETS],
}

impl Reading {
    const ZERO: Self = Self {
        totals: [0; 3],
        cpu_ns: 0,
        durations: [0; DURATION_BUCKETS],
    };
}

struct AppTraffic {
    /// Oldest first; the last is the latest interval.
    samples: VecDeque<Sample>,
    /// The sample that last added to it.
    sampled_at: u64,
}

impl AppTraffic {
    fn idle(&self) -> bool {
        self.samples.iter().all(|s| s.answers == 0)
    }

    /// Answers, 4xx and 5xx over the `last` samples, and the slowest p99 bucket among them.
    fn sum(&self, last: usize) -> Sample {
        self.samples
            .iter()
            .rev()
            .take(last)
            .fold(Sample::QUIET, |acc, s| add(acc, *s))
    }
}

#[derive(Default)]
struct HistoryState {
    /// Counters read at the last sample, per app that ever answered.
    seen: HashMap<Box<str>, Reading>,
    apps: HashMap<Box<str>, AppTraffic>,
    samples_taken: u64,
    /// When the last sample was taken (or the history made).
    sampled_at: Option<Instant>,
}

/// How to order the busiest apps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrafficOrder {
    /// Most answers in the last minute first.
    Traffic,
    /// Most 5xx in the last minute first.
    Errors,
    /// Most CPU in the last minute first.
    Cpu,
}

/// The history and its bound.
pub struct TrafficHistory {
    state: Mutex<HistoryState>,
    max_apps: usize,
    /// The counters sampled (the process's table but in tests).
    counts: Arc<RequestCounts>,
}

impl TrafficHistory {
    /// An empty history keeping at most `max_apps` busy apps.
    pub fn new(max_apps: usize) -> Self {
        Self::of(max_apps, REQUEST_COUNTS.clone())
    }

    fn of(max_apps: usize, counts: Arc<RequestCounts>) -> Self {
        metrics::HISTORY_CAPACITY.set(max_apps as i64);
        Self {
            state: Mutex::new(HistoryState::default()),
            max_apps,
            counts,
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
        self.sample_from(&self.counts);
    }

    fn sample_from(&self, requests_by_app: &RequestCounts) {
        let mut readings: Vec<(Box<str>, Reading)> = Vec::new();
        requests_by_app.each_app(|app, requests| {
            let reading = read(requests);
            if reading.totals[0] > 0 {
                readings.push((app.into(), reading));
            }
        });
        let mut state = self.state.lock();
        let state = &mut *state;
        state.samples_taken += 1;
        state.sampled_at = Some(Instant::now());
        let tick = state.samples_taken;
        let mut refused = 0u64;
        for (app, reading) in readings {
            // Counters start at zero with the process, and an app's first answer makes it
            // appear here: an app not seen before answered all of its count since.
            let previous = match state.seen.get_mut(&app) {
                Some(seen) => std::mem::replace(seen, reading),
                None => {
                    state.seen.insert(app.clone(), reading);
                    Reading::ZERO
                }
            };
            let interval = difference(&previous, &reading);
            if let Some(traffic) = state.apps.get_mut(&app) {
                push(traffic, interval);
                traffic.sampled_at = tick;
            } else if interval.answers == 0 {
                // Not in the history and still quiet: nothing to keep.
            } else if state.apps.len() >= self.max_apps {
                refused += 1;
            } else {
                let mut traffic = AppTraffic {
                    samples: VecDeque::with_capacity(SAMPLES),
                    sampled_at: tick,
                };
                push(&mut traffic, interval);
                state.apps.insert(app, traffic);
            }
        }
        // An app whose counters were not seen (deleted) gets a quiet interval; an app whose
        // whole window is quiet goes.
        for traffic in state.apps.values_mut() {
            if traffic.sampled_at != tick {
                push(traffic, Sample::QUIET);
                traffic.sampled_at = tick;
            }
        }
        state.apps.retain(|_, traffic| !traffic.idle());
        metrics::HISTORY_REFUSED.inc_by(refused);
        metrics::HISTORY_APPS.set(state.apps.len() as i64);
        metrics::HISTORY_BYTES.set(bytes(&state.apps) as i64);
    }

    /// The busiest `limit` apps by `order`, each with its rates and its series.
    pub fn busiest(&self, order: TrafficOrder, limit: usize) -> TrafficReport {
        self.listed(order, limit, |_| true)
    }

    /// [`TrafficHistory::busiest`]'s answer for `app` alone.
    pub fn of_app(&self, app: &str) -> TrafficReport {
        self.listed(TrafficOrder::Traffic, 1, |name| name == app)
    }

    fn listed(
        &self,
        order: TrafficOrder,
        limit: usize,
        wanted: impl Fn(&str) -> bool,
    ) -> TrafficReport {
        let mut live: HashMap<Box<str>, Reading> = HashMap::new();
        self.counts.each_app(|app, requests| {
            if wanted(app) {
                live.insert(app.into(), read(requests));
            }
        });
        let state = self.state.lock();
        // The interval in progress, per app: its counters now less those at the last sample.
        let in_progress = |app: &str| -> Sample {
            match live.get(app) {
                Some(now) => difference(state.seen.get(app).unwrap_or(&Reading::ZERO), now),
                None => Sample::QUIET,
            }
        };
        let elapsed = (state.sampled_at)
            .map_or(SAMPLE_EVERY, |at| at.elapsed().min(SAMPLE_EVERY))
            .as_secs_f64();
        static NO_TRAFFIC: AppTraffic = AppTraffic {
            samples: VecDeque::new(),
            sampled_at: 0,
        };
        let mut rows: Vec<(&str, &AppTraffic, Sample, Sample)> = state
            .apps
            .iter()
            .filter(|(app, _)| wanted(app))
            .map(|(app, traffic)| {
                let now = in_progress(app);
                (app.as_ref(), traffic, add(traffic.sum(MINUTE), now), now)
            })
            .collect();
        // Apps that started answering since the last sample, within the history's bound.
        let mut room = self.max_apps.saturating_sub(state.apps.len());
        for app in live.keys() {
            let now = in_progress(app);
            if now.answers > 0 && !state.apps.contains_key(app) && room > 0 {
                room -= 1;
                rows.push((app.as_ref(), &NO_TRAFFIC, now, now));
            }
        }
        let key = |sample: &Sample| match order {
            TrafficOrder::Traffic => sample.answers,
            TrafficOrder::Errors => sample.server_errors,
            TrafficOrder::Cpu => sample.cpu_us,
        };
        rows.sort_by(|a, b| key(&b.2).cmp(&key(&a.2)).then(a.0.cmp(b.0)));
        let interval = SAMPLE_EVERY.as_secs_f64();
        let apps: Vec<AppTrafficReport> = rows
            .into_iter()
            .take(limit)
            .map(|(app, traffic, minute, now)| {
                let latest = traffic.samples.back().copied().unwrap_or(Sample::QUIET);
                // The last 10 s: the sample in progress once it spans a second, else the
                // last whole one.
                let (recent, recent_s) = match elapsed >= 1.0 || traffic.samples.is_empty() {
                    true => (now, elapsed.max(0.001)),
                    false => (latest, interval),
                };
                let window =
                    traffic.samples.len().min(MINUTE) as f64 * interval + elapsed.max(0.001);
                AppTrafficReport {
                    app: app.to_string(),
                    rps_10s: f64::from(recent.answers) / recent_s,
                    rps_1m: f64::from(minute.answers) / window,
                    error_ratio_1m: ratio(minute.server_errors, minute.answers),
                    client_error_ratio_1m: ratio(minute.client_errors, minute.answers),
                    p99_ms_10s: p99_ms(recent.p99_bucket),
                    p99_ms_1m: p99_ms(minute.p99_bucket),
                    cpu_ms_per_s_1m: f64::from(minute.cpu_us) / 1000.0 / window,
                    cpu_ms: traffic.samples.iter().map(|s| s.cpu_us / 1000).collect(),
                    requests: traffic.samples.iter().map(|s| s.answers).collect(),
                    errors: traffic.samples.iter().map(|s| s.server_errors).collect(),
                    p99_ms: traffic
                        .samples
                        .iter()
                        .map(|s| p99_ms(s.p99_bucket))
                        .collect(),
                }
            })
            .collect();
        TrafficReport {
            resolution_s: SAMPLE_EVERY.as_secs(),
            window_s: SAMPLE_EVERY.as_secs() * SAMPLES as u64,
            tracked_apps: state.apps.len(),
            max_apps: self.max_apps,
            memory_bytes: bytes(&state.apps),
            apps,
        }
    }
}

/// Two intervals' counts together, the slower p99.
fn add(a: Sample, b: Sample) -> Sample {
    Sample {
        answers: a.answers.saturating_add(b.answers),
        client_errors: a.client_errors.saturating_add(b.client_errors),
        server_errors: a.server_errors.saturating_add(b.server_errors),
        cpu_us: a.cpu_us.saturating_add(b.cpu_us),
        p99_bucket: slower(a.p99_bucket, b.p99_bucket),
    }
}

fn push(traffic: &mut AppTraffic, sample: Sample) {
    if traffic.samples.len() == SAMPLES {
        traffic.samples.pop_front();
    }
    traffic.samples.push_back(sample);
}

fn read(requests: &AppRequests) -> Reading {
    let by_class = requests.by_class();
    let by_duration = requests.by_duration();
    Reading {
        totals: [
            by_class.iter().map(|c| c.load(Ordering::Relaxed)).sum(),
            by_class[3].load(Ordering::Relaxed),
            by_class[4].load(Ordering::Relaxed),
        ],
        cpu_ns: requests.cost.cpu_ns.load(Ordering::Relaxed),
        durations: std::array::from_fn(|i| by_duration[i].load(Ordering::Relaxed)),
    }
}

/// The interval between two readings of one app.
fn difference(before: &Reading, after: &Reading) -> Sample {
    let count = |i: usize| {
        after.totals[i]
            .saturating_sub(before.totals[i])
            .min(u64::from(u32::MAX)) as u32
    };
    let durations: [u32; DURATION_BUCKETS] =
        std::array::from_fn(|i| after.durations[i].wrapping_sub(before.durations[i]));
    Sample {
        answers: count(0),
        client_errors: count(1),
        server_errors: count(2),
        cpu_us: (after.cpu_ns.saturating_sub(before.cpu_ns) / 1000).min(u64::from(u32::MAX)) as u32,
        p99_bucket: p99_bucket(&durations),
    }
}

/// The smallest duration bucket with at least 99% of the answers at or below it.
fn p99_bucket(durations: &[u32; DURATION_BUCKETS]) -> u8 {
    let total: u64 = durations.iter().map(|&d| u64::from(d)).sum();
    if total == 0 {
        return NO_ANSWERS;
    }
    let wanted = (total * 99).div_ceil(100);
    let mut below = 0u64;
    for (bucket, &count) in durations.iter().enumerate() {
        below += u64::from(count);
        if below >= wanted {
            return bucket as u8;
        }
    }
    (DURATION_BUCKETS - 1) as u8
}

fn slower(a: u8, b: u8) -> u8 {
    match (a, b) {
        (NO_ANSWERS, other) | (other, NO_ANSWERS) => other,
        (a, b) => a.max(b),
    }
}

/// A bucket's upper bound in ms; the open last bucket reads as its lower bound, 10,000
/// ("10 s or more"); `None` without answers.
fn p99_ms(bucket: u8) -> Option<u64> {
    match bucket {
        NO_ANSWERS => None,
        bucket => Some(DURATION_BOUNDS_MS[usize::from(bucket).min(DURATION_BOUNDS_MS.len() - 1)]),
    }
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
    use serde_json::{json, Value};

    fn busiest(history: &TrafficHistory, order: TrafficOrder, limit: usize) -> Value {
        serde_json::to_value(history.busiest(order, limit)).expect("JSON")
    }

    #[test]
    fn busy_apps_are_kept_in_order_idle_ones_dropped_and_the_bound_holds() {
        let counts = Arc::new(RequestCounts::new());
        let history = TrafficHistory::of(2, counts.clone());
        let busy = counts.for_app("busy");
        let failing = counts.for_app("failing");
        let late = counts.for_app("late");
        let fast = Some(Duration::from_micros(300));
        let slow = Some(Duration::from_millis(40));
        busy.record(200, fast);
        failing.record(503, slow);
        history.sample_from(&counts);
        for _ in 0..50 {
            busy.record(200, fast);
        }
        for _ in 0..10 {
            failing.record(503, slow);
        }
        late.record(404, fast);
        history.sample_from(&counts);
        let by_traffic = busiest(&history, TrafficOrder::Traffic, 10);
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
        let by_errors = busiest(&history, TrafficOrder::Errors, 1);
        assert_eq!(by_errors["apps"][0]["app"], "failing", "{by_errors}");
        assert_eq!(by_errors["apps"][0]["error_ratio_1m"], 1.0);
        assert_eq!(by_errors["apps"][0]["rps_10s"], 1.0);
        assert_eq!(
            by_errors["apps"][0]["p99_ms_10s"], 50,
            "40 ms is in the ≤ 50 ms bucket"
        );
        assert_eq!(by_traffic["apps"][0]["p99_ms"], json!([1, 1]));
        assert!(by_errors["memory_bytes"].as_u64() > Some(0));
        // Fifteen minutes of nothing: every app leaves the history.
        for _ in 0..SAMPLES {
            history.sample_from(&counts);
        }
        assert_eq!(
            busiest(&history, TrafficOrder::Traffic, 10)["tracked_apps"],
            0
        );
    }

    #[test]
    fn the_p99_bucket_is_the_one_holding_the_99th_percentile() {
        let mut durations = [0u32; DURATION_BUCKETS];
        assert_eq!(p99_bucket(&durations), NO_ANSWERS);
        durations[0] = 99;
        durations[5] = 1;
        assert_eq!(p99_bucket(&durations), 0, "99 of 100 at most 1 ms");
        durations[5] = 2;
        assert_eq!(p99_bucket(&durations), 5);
        durations[DURATION_BUCKETS - 1] = 1000;
        assert_eq!(p99_ms(p99_bucket(&durations)), Some(10_000), "10 s or more");
        assert_eq!(slower(NO_ANSWERS, 3), 3);
        assert_eq!(slower(4, 3), 4);
    }
}

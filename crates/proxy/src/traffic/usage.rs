//! Each app's usage for a platform's billing (`GET /v1/usage`): CPU, requests and bytes
//! since the router started, or since a time in the last hour, read from the counters the
//! request path keeps (`cost`, `app_requests`).
//!
//! Usage since a time needs the counters' past: once a minute the ledger keeps what each
//! app used in that minute (only apps that used something, so a quiet fleet keeps nearly
//! nothing), [`MINUTES_KEPT`] minutes of them. A `since` inside that hour is answered to
//! the minute (the minute that holds `since` counts whole); before the router started, the
//! totals since it started; anything else is refused, naming the field. Nothing survives a
//! restart here: the counters' history is Prometheus's (`switchyard_app_cpu_seconds_total`
//! and the other series of `cost_metrics`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use switchyard_model::{AppUsageReport, UsageReport};

use super::app_requests::{CostReading, REQUEST_COUNTS};
use super::cost::UNATTRIBUTED_NS;
use crate::shutdown::ShutdownWatch;

/// Minutes of per-app usage kept for `since`.
pub(crate) const MINUTES_KEPT: usize = 60;

/// How often the ledger closes a minute.
const MINUTE: Duration = Duration::from_secs(60);

/// Most apps one page lists.
pub(crate) const MOST_PER_PAGE: usize = 1000;

/// One closed minute: what each app that used anything used in it.
struct Minute {
    began_unix: u64,
    used: Vec<(Box<str>, CostReading)>,
}

#[derive(Default)]
struct Ledger {
    /// Each app's counters when the last minute closed.
    at_last_close: HashMap<Box<str>, CostReading>,
    last_close_unix: u64,
    minutes: VecDeque<Minute>,
}

/// The usage ledger.
pub struct UsageLedger {
    started_unix: u64,
    ledger: Mutex<Ledger>,
}

impl Default for UsageLedger {
    fn default() -> Self {
        Self::new()
    }
}

impl UsageLedger {
    /// A ledger whose counters start now.
    pub fn new() -> Self {
        let now = unix_now();
        UsageLedger {
            started_unix: now,
            ledger: Mutex::new(Ledger {
                last_close_unix: now,
                ..Ledger::default()
            }),
        }
    }

    /// Closes a minute every [`MINUTE`] until shutdown.
    pub async fn run(&self, mut shutdown: ShutdownWatch) {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + MINUTE, MINUTE);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => self.close_minute(unix_now()),
                _ = shutdown.changed() => return,
            }
        }
    }

    fn close_minute(&self, now_unix: u64) {
        let mut now = HashMap::new();
        REQUEST_COUNTS.each_app(|app, slot| {
            now.insert(Box::<str>::from(app), CostReading::of(slot));
        });
        let mut ledger = self.ledger.lock();
        let used = (now.iter())
            .filter_map(|(app, counters)| {
                let before = ledger.at_last_close.get(app).copied().unwrap_or_default();
                let used = counters.since(before);
                (!used.is_zero()).then(|| (app.clone(), used))
            })
            .collect();
        let began_unix = ledger.last_close_unix;
        ledger.minutes.push_back(Minute { began_unix, used });
        while ledger.minutes.len() > MINUTES_KEPT {
            ledger.minutes.pop_front();
        }
        // Deleted apps' slots are gone from the table: they leave the ledger with them.
        ledger.at_last_close = now;
        ledger.last_close_unix = now_unix;
    }

    /// The usage of every app since `since_unix` (the router's start when `None`), a page
    /// of at most `limit` apps by name after `after`.
    pub fn report(
        &self,
        since_unix: Option<u64>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<UsageReport, String> {
        let limit = limit.clamp(1, MOST_PER_PAGE);
        let mut live: Vec<(Box<str>, CostReading, [i64; 3])> = Vec::new();
        REQUEST_COUNTS.each_app(|app, slot| {
            live.push((app.into(), CostReading::of(slot), slot.cost.held()));
        });
        let ledger = self.ledger.lock();
        let (from_unix, earlier) = match since_unix {
            None => (self.started_unix, None),
            Some(since) if since <= self.started_unix => (self.started_unix, None),
            Some(since) => {
                let oldest =
                    (ledger.minutes.front()).map_or(ledger.last_close_unix, |m| m.began_unix);
                if since < oldest {
                    return Err(format!(
                        "since: usage is kept per minute for the last {MINUTES_KEPT} minutes \
                         (from {oldest}) and in total since the router started ({}): {since} is \
                         in neither",
                        self.started_unix
                    ));
                }
                // The minutes that began at or after `since`, and the one holding it.
                let kept = (ledger.minutes.iter()).filter(|m| m.began_unix + 60 > since);
                let from = kept
                    .clone()
                    .map(|m| m.began_unix)
                    .min()
                    .unwrap_or(ledger.last_close_unix);
                let mut before: HashMap<&str, CostReading> = HashMap::new();
                for minute in kept {
                    for (app, used) in &minute.used {
                        before.entry(app.as_ref()).or_default().add(*used);
                    }
                }
                // Counters at `from`: those at the last close less what the minutes since
                // `from` added.
                let at_from = (ledger.at_last_close.iter())
                    .map(|(app, counters)| {
                        let added = before.get(app.as_ref()).copied().unwrap_or_default();
                        (app.clone(), counters.since(added))
                    })
                    .collect::<HashMap<_, _>>();
                (from, Some(at_from))
            }
        };
        drop(ledger);
        live.sort_by(|a, b| a.0.cmp(&b.0));
        let mut apps = Vec::new();
        let mut next = None;
        for (app, counters, [connections, websockets, in_flight]) in live {
            if after.is_some_and(|after| app.as_ref() <= after) {
                continue;
            }
            let used = match &earlier {
                Some(at_from) => counters.since(at_from.get(&app).copied().unwrap_or_default()),
                None => counters,
            };
            if used.is_zero() && connections == 0 && websockets == 0 && in_flight == 0 {
                continue;
            }
            if apps.len() == limit {
                next = apps.last().map(|last: &AppUsageReport| last.app.clone());
                break;
            }
            apps.push(AppUsageReport {
                app: app.to_string(),
                cpu_seconds: used.cpu_ns as f64 / 1e9,
                requests: used.requests,
                client_bytes_in: used.bytes_in,
                client_bytes_out: used.bytes_out,
                connections,
                websockets,
                in_flight,
            });
        }
        Ok(UsageReport {
            since_unix: from_unix,
            started_unix: self.started_unix,
            unattributed_cpu_seconds: UNATTRIBUTED_NS.load(Ordering::Relaxed) as f64 / 1e9,
            apps,
            next,
        })
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_since_a_minute_counts_only_the_minutes_after_it() {
        let slot = REQUEST_COUNTS.for_app("usage-ledger-test");
        let ledger = UsageLedger::new();
        let start = ledger.started_unix;
        slot.cost.cpu_ns.fetch_add(5_000_000, Ordering::Relaxed);
        ledger.close_minute(start + 60);
        slot.cost.cpu_ns.fetch_add(2_000_000, Ordering::Relaxed);
        ledger.close_minute(start + 120);
        slot.cost.cpu_ns.fetch_add(1_000_000, Ordering::Relaxed);
        let find = |report: UsageReport| {
            (report.apps.into_iter())
                .find(|a| a.app == "usage-ledger-test")
                .map(|a| (a.cpu_seconds * 1e3).round() as u64)
        };
        let total = ledger.report(None, None, 1000).expect("report");
        assert_eq!(find(total), Some(8));
        let since = ledger.report(Some(start + 70), None, 1000).expect("report");
        assert_eq!(since.since_unix, start + 60);
        assert_eq!(find(since), Some(3));
        let refused = ledger.report(Some(start + 1), None, 1000);
        assert!(refused.is_ok(), "the first minute is kept");
    }

    #[test]
    fn pages_follow_each_other_by_name() {
        for name in ["page-a", "page-b", "page-c"] {
            let slot = REQUEST_COUNTS.for_app(name);
            slot.cost.cpu_ns.fetch_add(1, Ordering::Relaxed);
        }
        let ledger = UsageLedger::new();
        let first = ledger.report(None, Some("page-"), 2).expect("report");
        let names: Vec<_> = first.apps.iter().map(|a| a.app.as_str()).collect();
        assert_eq!(names, ["page-a", "page-b"]);
        assert_eq!(first.next.as_deref(), Some("page-b"));
        let second = ledger
            .report(None, first.next.as_deref(), 2)
            .expect("report");
        assert_eq!(second.apps.first().map(|a| a.app.as_str()), Some("page-c"));
    }
}

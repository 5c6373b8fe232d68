//! The last changes this router applied to its routes, for the operator asking "what
//! changed just before the errors began": a ring of fixed size, the oldest dropped first,
//! filled by the change follower as it applies each event.

use std::collections::VecDeque;
use std::time::Duration;

use parking_lot::Mutex;
use switchyard_model::{AppliedChange, Change, RecentChangesReport};

use crate::metrics;
use crate::wall_clock::unix_ms;

/// Changes kept: a deploy storm of a few hundred apps stays visible whole.
pub(crate) const RECENT_CHANGES_KEPT: usize = 500;
/// Domains kept per change; an app with more shows the first ones and the count.
const DOMAINS_SHOWN: usize = 8;

/// The ring of the last [`RECENT_CHANGES_KEPT`] changes.
pub struct RecentChanges {
    kept: Mutex<VecDeque<AppliedChange>>,
}

impl Default for RecentChanges {
    fn default() -> Self {
        metrics::RECENT_CHANGES_CAPACITY.set(RECENT_CHANGES_KEPT as i64);
        Self {
            kept: Mutex::new(VecDeque::with_capacity(RECENT_CHANGES_KEPT)),
        }
    }
}

impl RecentChanges {
    /// Notes a store event applied in `took`; `missed` events are covered by it (a resync
    /// after the follower fell behind).
    pub fn record(&self, change: &Change, took: Duration, missed: u64) {
        let (kind, subject, domains, detail) = match change {
            Change::App { name, domains } => {
                ("app", name.as_str(), domains.as_slice(), String::new())
            }
            Change::Cert { domain } => ("cert", domain.as_str(), &[][..], String::new()),
            Change::CachePurge { app, path, prefix } => {
                let what = if *prefix { "every path under" } else { "path" };
                (
                    "cache_purge",
                    app.as_str(),
                    &[][..],
                    format!("{what} {path}"),
                )
            }
            Change::Filter { name } => (
                "filter",
                name.as_str(),
                &[][..],
                "the filter's module loaded again; its apps' routes rebuilt".to_string(),
            ),
            Change::WafReload { .. } => (
                "waf_reload",
                "",
                &[][..],
                "the WAF's rule files loaded again".to_string(),
            ),
            Change::Resync => {
                let missed = if missed > 0 {
                    format!("{missed} events missed: ")
                } else {
                    String::new()
                };
                let detail = format!("{missed}every cached route revalidated");
                ("resync", "", &[][..], detail)
            }
        };
        self.push(kind, subject, domains, detail, took);
    }

    /// Notes that `app`'s backend names resolved to new addresses and its routes were rebuilt.
    pub fn record_new_addresses(&self, app: &str, took: Duration) {
        let detail = "backend names resolved to new addresses".to_string();
        self.push("backend_addresses", app, &[], detail, took);
    }

    fn push(
        &self,
        kind: &'static str,
        subject: &str,
        domains: &[String],
        detail: String,
        took: Duration,
    ) {
        let change = AppliedChange {
            at_unix_ms: unix_ms(),
            kind,
            subject: subject.to_string(),
            domains: domains.iter().take(DOMAINS_SHOWN).cloned().collect(),
            domains_total: domains.len(),
            detail,
            apply_us: took.as_micros().min(u64::MAX as u128) as u64,
        };
        let mut kept = self.kept.lock();
        if kept.len() == RECENT_CHANGES_KEPT {
            kept.pop_front();
        }
        kept.push_back(change);
        metrics::RECENT_CHANGES.set(kept.len() as i64);
    }

    /// The latest `limit` changes, newest first.
    pub fn latest(&self, limit: usize) -> Vec<AppliedChange> {
        self.kept.lock().iter().rev().take(limit).cloned().collect()
    }

    /// `GET /v1/changes`'s answer.
    pub fn report(&self, limit: usize) -> RecentChangesReport {
        RecentChangesReport {
            changes: self.latest(limit),
            kept_at_most: RECENT_CHANGES_KEPT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_latest_newest_first_and_bounds_domains() {
        let changes = RecentChanges::default();
        for n in 0..RECENT_CHANGES_KEPT + 3 {
            changes.record(
                &Change::App {
                    name: format!("app-{n}"),
                    domains: (0..20).map(|d| format!("d{d}.test")).collect(),
                },
                Duration::from_micros(7),
                0,
            );
        }
        let latest = changes.latest(usize::MAX);
        assert_eq!(latest.len(), RECENT_CHANGES_KEPT);
        assert_eq!(
            latest[0].subject,
            format!("app-{}", RECENT_CHANGES_KEPT + 2)
        );
        assert_eq!(latest.last().map(|c| c.subject.as_str()), Some("app-3"));
        assert_eq!(latest[0].domains.len(), DOMAINS_SHOWN);
        assert_eq!(latest[0].domains_total, 20);
        assert_eq!(latest[0].apply_us, 7);

        changes.record(&Change::Resync, Duration::ZERO, 12);
        changes.record(
            &Change::CachePurge {
                app: "shop".into(),
                path: "/news".into(),
                prefix: true,
            },
            Duration::ZERO,
            0,
        );
        let latest = changes.latest(2);
        assert_eq!(latest[0].kind, "cache_purge");
        assert_eq!(latest[0].detail, "every path under /news");
        assert_eq!(latest[1].kind, "resync");
        assert!(latest[1].detail.starts_with("12 events missed"));
    }
}

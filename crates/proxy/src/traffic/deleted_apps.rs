//! A deleted app's metric series leave the exposition with it. Without this every app this
//! router ever served kept its per-app series and its request-count slot for the life of
//! the process, so a platform that creates and deletes apps all day grew its scrapes and
//! its memory without bound. The route cache tells what it sees — an app deleted, an app
//! routed again (created anew under the name) — and this module decides when the series
//! go: in batches, [`FORGET_EVERY`] after the first deletion noted (or at once when the set
//! is full), on the blocking pool. Forgetting walks every per-app series once, about what
//! one scrape costs, so a tenant deleting a thousand apps at once costs one walk, not a
//! thousand.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::JoinHandle;

use crate::metrics;
use crate::traffic::app_requests::REQUEST_COUNTS;

/// How often noted deletions are forgotten.
pub(crate) const FORGET_EVERY: Duration = Duration::from_secs(30);
/// Most deletions noted between two batches; the one that fills the set has the batch
/// forgotten at once.
const MOST_NOTED: usize = 65_536;

/// Apps deleted since the last batch was forgotten.
#[derive(Debug, Default)]
pub(crate) struct DeletedApps {
    /// Shared with the batches, the one due and the one under way (which notes again the
    /// apps it had to keep).
    noted: Arc<Mutex<Noted>>,
}

#[derive(Debug, Default)]
struct Noted {
    apps: HashSet<String>,
    /// A batch is due: a task waits [`FORGET_EVERY`] to forget what is noted by then.
    batch_due: bool,
}

impl DeletedApps {
    /// Notes that `app` was deleted. The first note starts the wait for the next batch; the
    /// one that fills the set has the batch forgotten at once.
    pub(crate) fn note(&self, app: &str) {
        let (full, start_wait) = {
            let mut noted = self.noted.lock();
            noted.apps.insert(app.to_string());
            metrics::DELETED_APPS_NOTED.set(noted.apps.len() as i64);
            let start_wait = !std::mem::replace(&mut noted.batch_due, true);
            (noted.apps.len() >= MOST_NOTED, start_wait)
        };
        if full {
            // Not waited for: the batch runs beside the change follower.
            let _batch = self.forget_noted();
        } else if start_wait {
            let deleted = Self {
                noted: self.noted.clone(),
            };
            tokio::spawn(async move {
                tokio::time::sleep(FORGET_EVERY).await;
                let _batch = deleted.forget_noted();
            });
        }
    }

    /// `app` has a route again: created anew under the name, its series are the new app's.
    pub(crate) fn routed_again(&self, app: &str) {
        let mut noted = self.noted.lock();
        if noted.apps.remove(app) {
            metrics::DELETED_APPS_NOTED.set(noted.apps.len() as i64);
        }
    }

    /// Whether `app` waits for the next batch.
    #[cfg(test)]
    pub(crate) fn is_noted(&self, app: &str) -> bool {
        self.noted.lock().apps.contains(app)
    }

    /// Forgets the series of every app noted so far, on the blocking pool, without waiting:
    /// the caller goes on meanwhile. An app whose slot requests under way still hold is
    /// noted again for the next batch, so the series those requests add as they finish
    /// leave too. The batch's handle, when there is one, for a caller that waits for it.
    pub(crate) fn forget_noted(&self) -> Option<JoinHandle<()>> {
        let apps = {
            let mut noted = self.noted.lock();
            noted.batch_due = false;
            std::mem::take(&mut noted.apps)
        };
        metrics::DELETED_APPS_NOTED.set(0);
        if apps.is_empty() {
            return None;
        }
        let deleted = Self {
            noted: self.noted.clone(),
        };
        Some(tokio::task::spawn_blocking(move || {
            let held = forget(apps);
            for app in held {
                deleted.note(&app);
            }
        }))
    }
}

/// Drops the request-count slots and every per-app series of those of `apps` that nothing
/// holds, and answers the others: their slots are held by requests under way (or by the
/// route of an app created again under the name, not cached here).
fn forget(apps: HashSet<String>) -> HashSet<String> {
    let (gone, held) = REQUEST_COUNTS.forget_unheld(&apps);
    metrics::forget_apps(&gone);
    metrics::DELETED_APPS_FORGOTTEN.inc_by(gone.len() as u64);
    held
}

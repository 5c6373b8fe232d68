//! A deleted app's metric series leave the exposition with it. Without this every app this
//! router ever served kept its per-app series and its request-count slot for the life of
//! the process, so a platform that creates and deletes apps all day grew its scrapes and
//! its memory without bound. Deletions are noted as the change follower applies them and
//! forgotten in batches, every [`FORGET_EVERY`], on the blocking pool: forgetting walks
//! every per-app series once, about what one scrape costs, so a tenant deleting a thousand
//! apps at once costs one walk, not a thousand.

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
    /// Shared with the batch under way, which notes again the apps it had to keep.
    noted: Arc<Mutex<HashSet<String>>>,
}

impl DeletedApps {
    /// Notes that `app` was deleted; whether that filled the set (the batch is then to be
    /// forgotten now).
    pub(crate) fn note(&self, app: &str) -> bool {
        let mut noted = self.noted.lock();
        noted.insert(app.to_string());
        metrics::DELETED_APPS_NOTED.set(noted.len() as i64);
        noted.len() >= MOST_NOTED
    }

    /// Whether `app` waits for the next batch.
    #[cfg(test)]
    pub(crate) fn is_noted(&self, app: &str) -> bool {
        self.noted.lock().contains(app)
    }

    /// Forgets the series of every app noted so far, on the blocking pool, without waiting:
    /// the change follower that calls it goes on applying changes meanwhile. An app
    /// `routed` says has a route again was created anew and its series are the new app's;
    /// one whose slot requests under way still hold is noted again for the next batch, so
    /// the series those requests add as they finish leave too.
    pub(crate) fn forget_noted(&self, routed: impl Fn(&str) -> bool) -> Option<JoinHandle<()>> {
        let mut apps = std::mem::take(&mut *self.noted.lock());
        apps.retain(|app| !routed(app));
        metrics::DELETED_APPS_NOTED.set(0);
        if apps.is_empty() {
            return None;
        }
        let noted = self.noted.clone();
        Some(tokio::task::spawn_blocking(move || {
            let held = forget(apps);
            if !held.is_empty() {
                let mut noted = noted.lock();
                noted.extend(held);
                metrics::DELETED_APPS_NOTED.set(noted.len() as i64);
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

//! A deleted app's metric series leave the exposition with it. Without this every app this
//! router ever served kept its per-app series and its request-count slot for the life of
//! the process, so a platform that creates and deletes apps all day grew its scrapes and
//! its memory without bound. Deletions are noted as the change follower applies them and
//! forgotten in batches, every [`FORGET_EVERY`], on the blocking pool: forgetting walks
//! every per-app series once, about what one scrape costs, so a tenant deleting a thousand
//! apps at once costs one walk, not a thousand.

use std::collections::HashSet;
use std::time::Duration;

use parking_lot::Mutex;

use crate::metrics;
use crate::routing::app_requests::REQUEST_COUNTS;

/// How often noted deletions are forgotten.
pub(crate) const FORGET_EVERY: Duration = Duration::from_secs(30);
/// Most deletions noted between two batches; the one that fills the set has the batch
/// forgotten at once.
const MOST_NOTED: usize = 65_536;

/// Apps deleted since the last batch was forgotten.
#[derive(Debug, Default)]
pub(crate) struct DeletedApps {
    noted: Mutex<HashSet<String>>,
}

impl DeletedApps {
    /// Notes that `app` was deleted; when that fills the set, the batch is forgotten now.
    pub(crate) fn note(&self, app: &str) {
        let full = {
            let mut noted = self.noted.lock();
            noted.insert(app.to_string());
            metrics::DELETED_APPS_NOTED.set(noted.len() as i64);
            noted.len() >= MOST_NOTED
        };
        if full {
            self.forget_noted();
        }
    }

    /// Forgets the series of every app noted so far, on the blocking pool, without waiting:
    /// the change follower that calls it goes on applying changes meanwhile.
    pub(crate) fn forget_noted(&self) {
        let apps = std::mem::take(&mut *self.noted.lock());
        metrics::DELETED_APPS_NOTED.set(0);
        if !apps.is_empty() {
            tokio::task::spawn_blocking(move || forget(&apps));
        }
    }
}

/// Drops the request-count slots and every per-app series of those of `apps` that no route
/// holds: an app created again under the same name since has a route holding its slot, and
/// keeps its series. A request under way when its app was deleted may add a series back.
pub(crate) fn forget(apps: &HashSet<String>) {
    let gone = REQUEST_COUNTS.forget_unheld(apps);
    metrics::forget_apps(&gone);
    metrics::DELETED_APPS_FORGOTTEN.inc_by(gone.len() as u64);
}

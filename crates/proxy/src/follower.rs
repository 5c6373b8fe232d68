//! Applies the store's change events to the route cache, in order, as they arrive.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use switchyard_model::Change;
use tokio::sync::broadcast::{error::RecvError, Receiver};
use tokio::sync::Mutex;

use crate::metrics;
use crate::route_cache::RouteCache;

/// The background service that keeps the route cache in step with the store.
pub struct ChangeFollower {
    routes: Arc<RouteCache>,
    // Subscribed when the router is built, before any request fills the cache, so no change
    // can fall between a fill and the subscription.
    changes: Mutex<Receiver<Change>>,
}

impl ChangeFollower {
    /// A follower applying `changes` to `routes`.
    pub fn new(routes: Arc<RouteCache>, changes: Receiver<Change>) -> Self {
        Self {
            routes,
            changes: Mutex::new(changes),
        }
    }
}

#[async_trait]
impl BackgroundService for ChangeFollower {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut changes = self.changes.lock().await;
        loop {
            let change = tokio::select! {
                change = changes.recv() => change,
                _ = shutdown.changed() => return,
            };
            match change {
                Ok(change) => {
                    let started = Instant::now();
                    self.routes.apply(&change).await;
                    metrics::ROUTE_CHANGES.inc();
                    log::debug!("applied {change:?} in {:?}", started.elapsed());
                }
                Err(RecvError::Lagged(missed)) => {
                    log::warn!("missed {missed} change events; revalidating the route cache");
                    metrics::ROUTE_RESYNCS.inc();
                    self.routes.apply(&Change::Resync).await;
                }
                Err(RecvError::Closed) => return,
            }
        }
    }
}

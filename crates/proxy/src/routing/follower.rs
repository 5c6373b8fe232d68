//! Applies the store's change events to the route and certificate caches, in order, as they
//! arrive.

use std::sync::Arc;
use std::time::Instant;

use crate::shutdown::ShutdownWatch;
use switchyard_model::Change;
use switchyard_store::Subscription;
use tokio::sync::broadcast::{error::RecvError, Receiver};
use tokio::sync::{watch, Mutex};

use crate::metrics;
use crate::routing::drain::ConnectionDrain;
use crate::routing::names::BackendNames;
use crate::routing::recent_changes::RecentChanges;
use crate::routing::route_cache::RouteCache;
use crate::stage::waf::Inspector;
use crate::tls::cert_cache::CertCache;

/// The background service that keeps the caches in step with the store.
pub struct ChangeFollower {
    routes: Arc<RouteCache>,
    certs: Option<Arc<CertCache>>,
    drain: Arc<ConnectionDrain>,
    // Subscribed when the router is built, before any request fills the cache, so no change
    // can fall between a fill and the subscription.
    changes: Mutex<Receiver<Change>>,
    // How many of the store's events (counted from its first) the caches have applied.
    applied: watch::Sender<u64>,
    // Backend names whose addresses change: their apps' routes are rebuilt here, in turn
    // with the store's changes, so a rebuild never overwrites a newer version of an app.
    names: Option<Arc<BackendNames>>,
    recent: Arc<RecentChanges>,
    waf: Option<Arc<Inspector>>,
}

impl ChangeFollower {
    /// A follower applying `changes` to `routes` and, with an HTTPS listener, `certs`, then
    /// handing each to `drain` to review the connections it concerns.
    pub fn new(
        routes: Arc<RouteCache>,
        certs: Option<Arc<CertCache>>,
        drain: Arc<ConnectionDrain>,
        changes: Subscription,
    ) -> Self {
        Self {
            routes,
            certs,
            drain,
            changes: Mutex::new(changes.changes),
            applied: watch::Sender::new(changes.position),
            names: None,
            recent: Arc::default(),
            waf: None,
        }
    }

    /// The changes this follower applied lately.
    pub fn recent_changes(&self) -> Arc<RecentChanges> {
        self.recent.clone()
    }

    /// Also rebuilds the routes whose backend names resolve to new addresses.
    pub fn with_backend_names(mut self, names: Arc<BackendNames>) -> Self {
        self.names = Some(names);
        self
    }

    /// Also loads the WAF's rules again when another router of the fleet did.
    pub fn with_waf(mut self, waf: Arc<Inspector>) -> Self {
        self.waf = Some(waf);
        self
    }

    /// Rebuilds the routes of apps whose names changed, then reviews their connections as
    /// after a scale: addresses that left are drained like removed backends.
    fn apply_new_addresses(&self, names: &BackendNames) {
        for app in names.take_changed_apps() {
            let started = Instant::now();
            self.routes.rebuild_with_new_addresses(&app);
            self.recent.record_new_addresses(&app, started.elapsed());
            self.drain.on_change(&Change::App {
                name: app,
                domains: Vec::new(),
            });
        }
    }

    /// Watches how many store events (the store's [`announced`] count) have been applied.
    ///
    /// [`announced`]: switchyard_store::Store::announced
    pub fn applied(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    async fn apply(&self, change: &Change) {
        if let (Change::WafReload { reload }, Some(waf)) = (change, &self.waf) {
            waf.follow_reload(*reload);
        }
        self.routes.apply(change).await;
        if let Some(certs) = &self.certs {
            certs.apply(change).await;
        }
        self.drain.on_change(change);
    }

    /// Runs until `shutdown` changes.
    pub async fn run(&self, mut shutdown: ShutdownWatch) {
        let mut changes = self.changes.lock().await;
        loop {
            let names_changed = async {
                match &self.names {
                    Some(names) => names.changed().await,
                    None => std::future::pending().await,
                }
            };
            let change = tokio::select! {
                change = changes.recv() => change,
                _ = names_changed => {
                    if let Some(names) = &self.names {
                        self.apply_new_addresses(names);
                    }
                    continue;
                }
                _ = shutdown.changed() => return,
            };
            match change {
                Ok(change) => {
                    if change == Change::Resync {
                        metrics::ROUTE_RESYNCS.inc();
                    }
                    let started = Instant::now();
                    self.apply(&change).await;
                    self.applied.send_modify(|applied| *applied += 1);
                    metrics::ROUTE_CHANGES.inc();
                    let took = started.elapsed();
                    self.recent.record(&change, took, 0);
                    log::debug!("applied {change:?} in {took:?}");
                }
                Err(RecvError::Lagged(missed)) => {
                    log::warn!("missed {missed} change events; revalidating the caches");
                    metrics::ROUTE_RESYNCS.inc();
                    let started = Instant::now();
                    self.apply(&Change::Resync).await;
                    self.recent
                        .record(&Change::Resync, started.elapsed(), missed);
                    // The resync read the store after every missed event was announced.
                    self.applied.send_modify(|applied| *applied += missed);
                }
                Err(RecvError::Closed) => return,
            }
        }
    }
}

//! The admin API as one of the router's background tasks, so it starts and stops with it,
//! and what the admin API asks of the router's own parts (purges, WAF reloads, progress).

use std::future::Future;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use switchyard_admin::{
    AdminState, AdminTls, AppsBy, AuditSink, BackendNamesView, ChangeLog, HostExplainer,
    LocalCaches, SharedCache, TrafficView, WafControl,
};
use switchyard_proxy::{
    AccessLog, BackendNames, CacheRedis, Inspector, RecentChanges, RouteCache, ShutdownWatch,
    TrafficHistory, TrafficOrder, UsageLedger,
};
use switchyard_store::{Store, StoreError};
use tokio::sync::watch;

/// Serves the admin API on a listener bound at start-up, until the router stops.
pub(crate) async fn serve_admin(
    listener: TcpListener,
    state: AdminState,
    tls: Option<Arc<AdminTls>>,
    shutdown: ShutdownWatch,
) {
    serve_until_stopped("admin API", listener, shutdown, |listener, stop| {
        switchyard_admin::serve(listener, state, tls, stop)
    })
    .await;
}

/// Serves /metrics, /healthz and /readyz, without a token, on the metrics listener until
/// the router stops.
pub(crate) async fn serve_metrics(
    listener: TcpListener,
    store: Arc<dyn Store>,
    shutdown: ShutdownWatch,
) {
    serve_until_stopped("metrics listener", listener, shutdown, |listener, stop| {
        switchyard_admin::serve_metrics(listener, store, stop)
    })
    .await;
}

/// Runs `serve` on `listener` (bound at start-up) until `shutdown` changes; what stops it
/// early is logged under `name`.
async fn serve_until_stopped<F, S>(
    name: &str,
    listener: TcpListener,
    mut shutdown: ShutdownWatch,
    serve: S,
) where
    S: FnOnce(tokio::net::TcpListener, std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) -> F,
    F: Future<Output = std::io::Result<()>>,
{
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => {
            log::error!("{name} cannot start: {e}");
            return;
        }
    };
    let stop = Box::pin(async move {
        let _ = shutdown.changed().await;
    });
    if let Err(e) = serve(listener, stop).await {
        log::error!("{name} stopped: {e}");
    }
}

/// Purges of apps whose responses live in the cache Redis, made by the router that receives
/// the purge.
pub(crate) struct CacheRedisPurge(pub(crate) Arc<CacheRedis>);

#[async_trait]
impl SharedCache for CacheRedisPurge {
    async fn purge(&self, app: &str, path: &str, prefix: bool) -> Result<(u64, bool), String> {
        let report = self
            .0
            .purge_shared(app, path, prefix)
            .await
            .map_err(|e| e.to_string())?;
        Ok((report.deleted, report.complete))
    }
}

/// Uploads to `/v1/filters` compiled on the router's own filter engine.
pub(crate) struct FilterCompile(pub(crate) Arc<switchyard_proxy::FilterModules>);

impl switchyard_admin::FilterCheck for FilterCompile {
    fn check(&self, module: &[u8]) -> Result<(), String> {
        self.0.engine().check(module)
    }
}

/// `POST /v1/waf/reload` through the router's WAF.
pub(crate) struct WafReload(pub(crate) Arc<Inspector>);

impl WafControl for WafReload {
    fn reload(&self) -> Result<(usize, u64), String> {
        self.0.reload_here().map_err(|e| e.to_string())
    }
}

/// Audit records shipped with the access logs, where they go to logd.
pub(crate) struct AuditToLogs(pub(crate) AccessLog);

impl AuditSink for AuditToLogs {
    fn ship(&self, record: &switchyard_model::AuditRecord) {
        if let Ok(line) = serde_json::to_string(record) {
            self.0.record_audit(line);
        }
    }
}

/// The router's backend names, as `GET /v1/apps/{name}` shows them.
pub(crate) struct NamesView(pub(crate) Arc<BackendNames>);

impl BackendNamesView for NamesView {
    fn describe(&self, app: &switchyard_model::App) -> Vec<switchyard_model::ResolvedBackend> {
        self.0.describe(app)
    }
}

/// `GET /v1/explain` from the routing view this router's requests use.
pub(crate) struct RouteExplainer {
    pub(crate) routes: Arc<RouteCache>,
    /// Where apps with the shared cache store keep their copies.
    pub(crate) cache_redis: Option<Arc<CacheRedis>>,
}

#[async_trait]
impl HostExplainer for RouteExplainer {
    async fn explain(
        &self,
        host: &str,
        path: &str,
        method: &str,
    ) -> Result<switchyard_model::Explanation, StoreError> {
        let redis = self.cache_redis.as_deref();
        switchyard_proxy::explain_host(&self.routes, redis, host, path, method).await
    }
}

/// `GET /v1/stats/apps` from the router's traffic history.
pub(crate) struct Changes(pub(crate) Arc<RecentChanges>);

impl ChangeLog for Changes {
    fn recent(&self, limit: usize) -> switchyard_model::RecentChangesReport {
        self.0.report(limit)
    }
}

/// The router's traffic history and usage ledger, for the admin API.
pub(crate) struct Traffic(pub(crate) Arc<TrafficHistory>, pub(crate) Arc<UsageLedger>);

impl TrafficView for Traffic {
    fn busiest(&self, order: AppsBy, limit: usize) -> switchyard_model::TrafficReport {
        let order = match order {
            AppsBy::Traffic => TrafficOrder::Traffic,
            AppsBy::Errors => TrafficOrder::Errors,
            AppsBy::Cpu => TrafficOrder::Cpu,
        };
        self.0.busiest(order, limit)
    }

    fn of_app(&self, app: &str) -> switchyard_model::TrafficReport {
        self.0.of_app(app)
    }

    fn usage(
        &self,
        since_unix: Option<u64>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<switchyard_model::UsageReport, String> {
        self.1.report(since_unix, after, limit)
    }
}

/// Longest an admin write waits for this router's caches to apply it. Applying reads the
/// store; past this the write (already durable) is answered anyway and lands moments later.
const LOCAL_APPLY_WAIT: Duration = Duration::from_secs(2);

/// How far this router's change follower has got, for admin writes to wait on.
pub(crate) struct FollowerProgress(pub(crate) watch::Receiver<u64>);

#[async_trait]
impl LocalCaches for FollowerProgress {
    async fn caught_up(&self, announced: u64) {
        let mut applied = self.0.clone();
        let waited = tokio::time::timeout(
            LOCAL_APPLY_WAIT,
            applied.wait_for(|applied| *applied >= announced),
        )
        .await;
        if !matches!(waited, Ok(Ok(_))) {
            log::warn!(
                "a write was answered before this router applied it (change {announced} not \
                 applied within {LOCAL_APPLY_WAIT:?})"
            );
        }
    }
}

//! Switchyard's admin REST API: JSON over HTTP, written against the [`Store`] only. Every
//! write goes to the store, and the proxy learns about it from the store's change events —
//! this crate never touches the request path directly.

mod answers;
mod api_doc;
mod audit;
mod auth;
mod error;
mod filters;
mod handlers;
mod import;
mod page_fetch;
mod progress;
mod sync;
mod tls;
mod tokens;
mod ui;

use std::future::Future;
use std::sync::Arc;

use aide::axum::routing::{delete_with, get_with, post_with, put_with};
use aide::axum::ApiRouter;
use aide::openapi::OpenApi;
use async_trait::async_trait;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use switchyard_store::{Store, StoreError};
use tokio::net::TcpListener;

pub use api_doc::document as openapi_document;
pub use audit::{AuditSink, DEFAULT_AUDIT_RETENTION};
pub use error::ApiError;
pub use filters::FilterCheck;
pub use tls::AdminTls;

/// Largest request body accepted (an app with a thousand domains fits comfortably).
const MAX_BODY_BYTES: usize = 1024 * 1024;

/// The response cache a fleet shares (the cache Redis): purged once, by the router that
/// receives the purge, rather than by every router on the change event.
#[async_trait]
pub trait SharedCache: Send + Sync {
    /// Deletes `app`'s responses stored for `path` (or under it with `prefix`). Returns the
    /// number deleted and whether the whole keyspace was scanned.
    async fn purge(&self, app: &str, path: &str, prefix: bool) -> Result<(u64, bool), String>;
}

/// The router's WAF, for reloading its rules without a restart.
pub trait WafControl: Send + Sync {
    /// Loads the rule files again and swaps them in; blocking. Returns how many rules were
    /// loaded and the reload's id for the fleet's announcement, or why they did not load
    /// (the rules in use stay).
    fn reload(&self) -> Result<(usize, u64), String>;
}

/// The caches of the router serving this API. A write answers once they have applied it, so
/// the caller's next request through this router is routed by what it just wrote.
#[async_trait]
pub trait LocalCaches: Send + Sync {
    /// Waits, within a bound of its own, until the caches have applied the store's first
    /// `announced` change events.
    async fn caught_up(&self, announced: u64);
}

/// What this router resolved its apps' backend names to.
pub trait BackendNamesView: Send + Sync {
    /// One entry per named backend of `app`: its state, addresses and last error.
    fn describe(&self, app: &switchyard_model::App) -> Vec<switchyard_model::ResolvedBackend>;
}

/// The router's own answer to "where does this host go, and why".
#[async_trait]
pub trait HostExplainer: Send + Sync {
    /// The app, the rule (exact or which wildcard), the stages that act and the backend
    /// the next request would take, for `host`, `path` and `method`.
    async fn explain(
        &self,
        host: &str,
        path: &str,
        method: &str,
    ) -> Result<switchyard_model::Explanation, StoreError>;
}

/// What the busiest apps are ranked by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppsBy {
    /// Answers in the last minute.
    Traffic,
    /// 5xx in the last minute.
    Errors,
    /// The router's CPU spent for them in the last minute.
    Cpu,
}

/// The router's recent traffic per app.
pub trait TrafficView: Send + Sync {
    /// The busiest `limit` apps by `order`.
    fn busiest(&self, order: AppsBy, limit: usize) -> switchyard_model::TrafficReport;
    /// The same for one app (`apps` empty when it had no traffic in the window).
    fn of_app(&self, app: &str) -> switchyard_model::TrafficReport;
    /// Every app's usage since `since_unix` (since the router started when `None`), a page
    /// of at most `limit` apps by name after `after`; an error naming `since` when the
    /// router cannot tell usage since then.
    fn usage(
        &self,
        since_unix: Option<u64>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<switchyard_model::UsageReport, String>;
}

/// The change events this router applied lately.
pub trait ChangeLog: Send + Sync {
    /// The latest `limit` changes, newest first, and how many the log keeps.
    fn recent(&self, limit: usize) -> switchyard_model::RecentChangesReport;
}

/// What the handlers share.
#[derive(Clone)]
pub struct AdminState {
    store: Arc<dyn Store>,
    token: Option<Arc<str>>,
    shared_cache: Option<Arc<dyn SharedCache>>,
    waf: Option<Arc<dyn WafControl>>,
    local_caches: Option<Arc<dyn LocalCaches>>,
    backend_names: Option<Arc<dyn BackendNamesView>>,
    explainer: Option<Arc<dyn HostExplainer>>,
    traffic: Option<Arc<dyn TrafficView>>,
    changes: Option<Arc<dyn ChangeLog>>,
    /// Whether writes from a browser (the dashboard) are accepted.
    ui_writes: bool,
    /// Held while a backup is taken: one at a time.
    backup_running: Arc<tokio::sync::Mutex<()>>,
    /// Held while a sync (`PUT /v1/apps`) runs: one at a time on this router.
    sync_running: Arc<tokio::sync::Mutex<()>>,
    /// Audit records kept in the store.
    audit_retention: usize,
    /// Where audit records are shipped besides the store.
    audit_sink: Option<Arc<dyn AuditSink>>,
    /// Compiles uploaded filter modules.
    filter_check: Option<Arc<dyn filters::FilterCheck>>,
}

impl AdminState {
    /// State over `store`; with a `token`, every call but `/healthz` needs it as a bearer token.
    pub fn new(store: Arc<dyn Store>, token: Option<String>) -> Self {
        Self {
            store,
            token: token.map(Arc::from),
            shared_cache: None,
            waf: None,
            local_caches: None,
            backend_names: None,
            explainer: None,
            traffic: None,
            changes: None,
            ui_writes: false,
            backup_running: Arc::default(),
            sync_running: Arc::default(),
            audit_retention: DEFAULT_AUDIT_RETENTION,
            audit_sink: None,
            filter_check: None,
        }
    }

    /// Keeps the newest `records` of the audit log.
    pub fn with_audit_retention(mut self, records: usize) -> Self {
        self.audit_retention = records;
        self
    }

    /// Ships every audit record to `sink` too (the router's log shipping).
    pub fn with_audit_sink(mut self, sink: Arc<dyn AuditSink>) -> Self {
        self.audit_sink = Some(sink);
        self
    }

    /// `GET /v1/changes` answers from `changes`.
    pub fn with_change_log(mut self, changes: Arc<dyn ChangeLog>) -> Self {
        self.changes = Some(changes);
        self
    }

    /// Accepts writes from the dashboard (calls made by a browser, which names its page's
    /// `Origin`); off, the dashboard is read-only and such writes get 403. Tools that send
    /// no `Origin` (the CLI, curl, automation) are not concerned.
    pub fn with_ui_writes(mut self, allowed: bool) -> Self {
        self.ui_writes = allowed;
        self
    }

    /// `GET /v1/apps/{name}` shows what `names` resolved the app's backend names to.
    pub fn with_backend_names(mut self, names: Arc<dyn BackendNamesView>) -> Self {
        self.backend_names = Some(names);
        self
    }

    /// `GET /v1/explain` answers from `explainer`.
    pub fn with_explainer(mut self, explainer: Arc<dyn HostExplainer>) -> Self {
        self.explainer = Some(explainer);
        self
    }

    /// `GET /v1/stats/apps` answers from `traffic`.
    pub fn with_traffic(mut self, traffic: Arc<dyn TrafficView>) -> Self {
        self.traffic = Some(traffic);
        self
    }

    /// Writes answer once `caches` have applied them.
    pub fn with_local_caches(mut self, caches: Arc<dyn LocalCaches>) -> Self {
        self.local_caches = Some(caches);
        self
    }

    /// Called after a successful write: its change event is announced by now.
    async fn applied_locally(&self) {
        if let Some(caches) = &self.local_caches {
            caches.caught_up(self.store.announced()).await;
        }
    }

    /// `POST /v1/waf/reload` reloads `waf`'s rules.
    pub fn with_waf(mut self, waf: Arc<dyn WafControl>) -> Self {
        self.waf = Some(waf);
        self
    }

    /// Purges of apps whose cache store is `redis` go to `cache`.
    pub fn with_shared_cache(mut self, cache: Arc<dyn SharedCache>) -> Self {
        self.shared_cache = Some(cache);
        self
    }
}

/// The routes anyone may call: nothing in them is secret.
fn public_routes() -> ApiRouter<AdminState> {
    ApiRouter::new()
        .api_route("/healthz", get_with(handlers::healthz, api_doc::healthz))
        .api_route("/readyz", get_with(handlers::readyz, api_doc::readyz))
        .api_route(
            "/v1/openapi.json",
            get_with(handlers::openapi, api_doc::openapi),
        )
        .api_route(
            "/v1/schema/app.json",
            get_with(handlers::app_schema, api_doc::app_schema),
        )
}

/// The routes behind the token.
fn protected_routes() -> ApiRouter<AdminState> {
    ApiRouter::new()
        .api_route(
            "/v1/apps",
            get_with(handlers::list_apps, api_doc::list_apps)
                .put_with(sync::sync_apps, api_doc::sync_apps)
                .layer(DefaultBodyLimit::max(import::MAX_IMPORT_BYTES)),
        )
        .api_route(
            "/v1/import/apps",
            post_with(import::import_apps, api_doc::import_apps)
                .layer(DefaultBodyLimit::max(import::MAX_IMPORT_BYTES)),
        )
        .api_route(
            "/v1/apps/{name}",
            put_with(handlers::put_app, api_doc::put_app)
                .get_with(handlers::get_app, api_doc::get_app)
                .delete_with(handlers::delete_app, api_doc::delete_app),
        )
        .api_route(
            "/v1/apps/{name}/backends",
            put_with(handlers::put_backends, api_doc::put_backends),
        )
        .api_route(
            "/v1/apps/{name}/cache",
            delete_with(handlers::purge_cache, api_doc::purge_cache),
        )
        .api_route(
            "/v1/waf/reload",
            post_with(handlers::reload_waf, api_doc::reload_waf),
        )
        .api_route(
            "/v1/certs",
            get_with(handlers::list_certs, api_doc::list_certs),
        )
        .api_route(
            "/v1/acme",
            get_with(handlers::acme_status, api_doc::acme_status),
        )
        .api_route(
            "/v1/store",
            get_with(handlers::store_status, api_doc::store_status),
        )
        .api_route(
            "/v1/store/backup",
            get_with(handlers::store_backup, api_doc::store_backup),
        )
        .api_route("/v1/explain", get_with(handlers::explain, api_doc::explain))
        .api_route(
            "/v1/stats/apps",
            get_with(handlers::busiest_apps, api_doc::busiest_apps),
        )
        .api_route("/v1/usage", get_with(handlers::usage, api_doc::usage))
        .api_route(
            "/v1/changes",
            get_with(handlers::recent_changes, api_doc::recent_changes),
        )
        .api_route(
            "/v1/ui/settings",
            get_with(ui::settings, api_doc::ui_settings),
        )
        .api_route(
            "/v1/certs/{domain}",
            put_with(handlers::put_cert, api_doc::put_cert)
                .get_with(handlers::get_cert, api_doc::get_cert)
                .delete_with(handlers::delete_cert, api_doc::delete_cert),
        )
        .api_route("/metrics", get_with(handlers::metrics, api_doc::metrics))
        .api_route(
            "/v1/tokens",
            post_with(tokens::create, api_doc::create_token)
                .get_with(tokens::list, api_doc::list_tokens),
        )
        .api_route(
            "/v1/tokens/{id}",
            delete_with(tokens::revoke, api_doc::revoke_token),
        )
        .api_route("/v1/audit", get_with(audit::read, api_doc::read_audit))
        .api_route(
            "/v1/filters",
            get_with(filters::list, api_doc::list_filters),
        )
        .api_route(
            "/v1/filters/{name}",
            put_with(filters::put, api_doc::put_filter)
                .get_with(filters::get, api_doc::get_filter)
                .delete_with(filters::delete, api_doc::delete_filter)
                .layer(DefaultBodyLimit::max(filters::MAX_MODULE_BYTES)),
        )
}

/// Every documented route, as the OpenAPI document describes them.
fn documented_routes() -> ApiRouter<AdminState> {
    public_routes().merge(protected_routes())
}

/// The admin API's routes.
pub fn router(state: AdminState) -> Router {
    // The document is made apart (`api_doc::document`) from the same route lists.
    let mut unused = OpenApi::default();
    // Outermost first: who calls and may they (auth), not from a read-only dashboard, then
    // the audit record of what the call changed.
    let protected = protected_routes()
        .finish_api(&mut unused)
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            audit::record_writes,
        ))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            refuse_browser_writes,
        ))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ));
    public_routes()
        .finish_api(&mut unused)
        .route("/ui", get(ui::to_index))
        .route("/ui/", get(ui::index))
        .route("/ui/app.js", get(ui::script))
        .route("/ui/style.css", get(ui::style))
        .merge(protected)
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(json_rejections))
        .with_state(state)
}

/// The metrics listener's routes: `/metrics` (with its `app` filter), `/healthz` and
/// `/readyz`, no token, nothing else, as Traefik's metrics entry point and HAProxy's stats
/// socket serve scrapers and load balancers apart from the API that changes the fleet.
pub fn metrics_router(store: Arc<dyn Store>) -> Router {
    Router::new()
        .route("/metrics", get(handlers::metrics))
        .route("/healthz", get(handlers::healthz))
        .route("/readyz", get(handlers::readyz))
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(middleware::from_fn(json_rejections))
        .with_state(AdminState::new(store, None))
}

/// Serves [`metrics_router`] on `listener` until `shutdown` completes.
pub async fn serve_metrics(
    listener: TcpListener,
    store: Arc<dyn Store>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, metrics_router(store))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Serves the admin API on `listener` until `shutdown` completes, over TLS when `tls` is
/// given.
pub async fn serve(
    listener: TcpListener,
    state: AdminState,
    tls: Option<Arc<AdminTls>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if let Some(tls) = tls {
        return tls::serve(listener, router(state), tls, shutdown).await;
    }
    // The client's address goes into each audit record.
    let service = router(state).into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, service)
        .with_graceful_shutdown(shutdown)
        .await
}

/// A browser names the page a call comes from in `Origin` on every write (fetch sends it for
/// any method but GET and HEAD); a write that carries one comes from the dashboard, or from
/// another page holding the token, and is refused unless the dashboard may write.
async fn refuse_browser_writes(
    State(state): State<AdminState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let method = request.method();
    let reads = method == axum::http::Method::GET || method == axum::http::Method::HEAD;
    if !reads && !state.ui_writes && request.headers().contains_key(axum::http::header::ORIGIN) {
        return Err(ApiError::Forbidden {
            message: "the dashboard is read-only: writes from a browser need the router's \
                      admin_ui_writes setting on (--admin-ui-writes on)"
                .into(),
            field: "origin",
        });
    }
    Ok(next.run(request).await)
}

/// Largest plain-text rejection turned into a JSON error; axum's are one line.
const MAX_REJECTION_TEXT: usize = 4096;

/// axum's extractors answer what they refuse (an oversized body, a query or path that does
/// not parse) in plain text; give every such answer the API's JSON shape.
async fn json_rejections(request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let limit = if path == "/v1/import/apps" || path == "/v1/apps" {
        import::MAX_IMPORT_BYTES
    } else {
        MAX_BODY_BYTES
    };
    let response = next.run(request).await;
    let status = response.status();
    if status == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::TooLarge { limit }.into_response();
    }
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !status.is_client_error() || is_json {
        return response;
    }
    let text = axum::body::to_bytes(response.into_body(), MAX_REJECTION_TEXT)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    ApiError::Rejected { status, text }.into_response()
}

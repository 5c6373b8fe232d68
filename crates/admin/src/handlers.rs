//! One function per admin route. Bodies are taken as raw bytes and parsed by the model, so
//! malformed JSON and invalid fields get the same JSON error shape.

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use prometheus::{Encoder, TextEncoder};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use std::time::{SystemTime, UNIX_EPOCH};

use switchyard_model::{
    entity_tag_of, parse_app_spec, parse_backends_spec, parse_certificate_spec, AcmeStatus, App,
    AppName, CacheStore, CertificateInfo, CertificateUpload, Change, Domain, Explanation, IfMatch,
    RecentChangesReport, TrafficReport, UsageReport, ValidationError,
};

use crate::answers::{
    AcmeLease, AcmeOverview, AppsPage, CertsPage, Health, ListedCert, Purged, Readiness, ShownApp,
    ShownCert, ShownStore, Tagged, WafReloaded,
};
use crate::api_doc::{AppFile, AppPath, BackendsBody, DomainPath, JsonBody};
use crate::{AdminState, ApiError, AppsBy};
use switchyard_store::acme;

const DEFAULT_PAGE: usize = 1000;
const MAX_PAGE: usize = 10_000;

pub(crate) async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// `GET /readyz`: 200 once this router can route by its store's apps, 503 before. A Redis
/// store away after that keeps it ready: it routes from memory, and a fleet whose routers
/// all left their load balancer at once over a Redis outage would be down for nothing.
pub(crate) async fn readyz(State(state): State<AdminState>) -> Response {
    readiness(state.store.status()).into_response()
}

fn readiness(store: switchyard_store::StoreStatus) -> (StatusCode, Json<Readiness>) {
    let status = match store.kind {
        "embedded" if store.available => "ready",
        "embedded" => "handed-over",
        _ if store.available || store.last_sync_unix.is_some() => "ready",
        _ => "starting",
    };
    let code = if status == "ready" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let answer = Readiness {
        status,
        store: store.kind,
        store_available: store.available,
    };
    (code, Json(answer))
}

/// `GET /v1/store/backup`: a consistent copy of the embedded store, taken while it serves,
/// one at a time (each reads and writes the whole store).
pub(crate) async fn store_backup(State(state): State<AdminState>) -> Result<Response, ApiError> {
    let Ok(_one_at_a_time) = state.backup_running.clone().try_lock_owned() else {
        return Err(ApiError::Conflict {
            message: "a backup is being taken: try again once it ends".into(),
            field: "store",
        });
    };
    let Some(backup) = state.store.backup().await? else {
        return Err(ApiError::Conflict {
            message: "the Redis store is backed up by Redis itself (RDB snapshots or AOF): see \
                      docs/operations.md, \"Backups\""
                .into(),
            field: "store",
        });
    };
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let headers = [
        (header::CONTENT_TYPE, "application/octet-stream".to_string()),
        (header::CONTENT_LENGTH, backup.bytes.to_string()),
        (
            header::CONTENT_DISPOSITION,
            format!("attachment; filename=\"switchyard-store-{stamp}.redb\""),
        ),
        (
            header::HeaderName::from_static("x-switchyard-apps"),
            backup.contents.apps.to_string(),
        ),
        (
            header::HeaderName::from_static("x-switchyard-certificates"),
            backup.contents.certificates.to_string(),
        ),
    ];
    Ok((headers, file_body(tokio::fs::File::from_std(backup.file))).into_response())
}

/// `file` sent in chunks, never whole in memory.
fn file_body(file: tokio::fs::File) -> axum::body::Body {
    const CHUNK: usize = 256 * 1024;
    let chunks = futures_util::stream::unfold(Some(file), |file| async move {
        let mut file = file?;
        let mut chunk = bytes::BytesMut::with_capacity(CHUNK);
        match tokio::io::AsyncReadExt::read_buf(&mut file, &mut chunk).await {
            Ok(0) => None,
            Ok(_) => Some((Ok(chunk.freeze()), Some(file))),
            Err(e) => Some((Err(e), None)),
        }
    });
    axum::body::Body::from_stream(chunks)
}

/// This API's OpenAPI document, generated from its routes (`api_doc`).
pub(crate) async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::api_doc::DOCUMENT.as_str(),
    )
        .into_response()
}

/// The JSON Schema of app files, made from the model's types
/// (`switchyard_model::app_file_schema`).
pub(crate) async fn app_schema() -> Json<Value> {
    Json(switchyard_model::app_file_schema())
}

pub(crate) async fn not_found() -> ApiError {
    ApiError::NotFound {
        what: "no such admin endpoint".into(),
        field: "path",
    }
}

pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

pub(crate) async fn put_app(
    State(state): State<AdminState>,
    Path(AppPath { name }): Path<AppPath>,
    headers: HeaderMap,
    JsonBody(body, ..): JsonBody<AppFile>,
) -> Result<Tagged<App>, ApiError> {
    let spec = parse_json(&body)?;
    let mut app = parse_app_spec(&name, &spec)?;
    crate::page_fetch::fill_maintenance_page(&mut app).await?;
    let precondition = if_match(&headers)?;
    let stored = state.store.put_app_if(app, precondition.as_ref()).await?;
    state.applied_locally().await;
    Ok(Tagged(Some(entity_tag_of(&stored)), Json(stored)))
}

/// The request's `If-Match`, if it has one.
fn if_match(headers: &HeaderMap) -> Result<Option<IfMatch>, ApiError> {
    let Some(value) = headers.get(header::IF_MATCH) else {
        return Ok(None);
    };
    let value = value.to_str().map_err(|_| {
        ApiError::Invalid(ValidationError::new(
            "if-match",
            "If-Match must be `*` or entity tags in ASCII",
        ))
    })?;
    Ok(Some(IfMatch::parse(value)))
}

pub(crate) async fn get_app(
    State(state): State<AdminState>,
    Path(AppPath { name }): Path<AppPath>,
) -> Result<Tagged<ShownApp>, ApiError> {
    let name = valid_name(&name)?;
    match state.store.get_app(name.as_str()).await? {
        Some(app) => {
            let resolved_backends = state
                .backend_names
                .as_ref()
                .map(|names| names.describe(&app))
                .unwrap_or_default();
            Ok(Tagged(
                Some(entity_tag_of(&app)),
                Json(ShownApp {
                    app,
                    resolved_backends,
                }),
            ))
        }
        None => Err(app_not_found(&name)),
    }
}

pub(crate) async fn delete_app(
    State(state): State<AdminState>,
    Path(AppPath { name }): Path<AppPath>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let name = valid_name(&name)?;
    let precondition = if_match(&headers)?;
    let deleted = (state.store)
        .delete_app_if(name.as_str(), precondition.as_ref())
        .await?;
    if deleted {
        state.applied_locally().await;
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(app_not_found(&name))
    }
}

pub(crate) async fn put_backends(
    State(state): State<AdminState>,
    Path(AppPath { name }): Path<AppPath>,
    headers: HeaderMap,
    JsonBody(body, ..): JsonBody<BackendsBody>,
) -> Result<Tagged<App>, ApiError> {
    let name = valid_name(&name)?;
    let backends = parse_backends_spec(&parse_json(&body)?)?;
    let precondition = if_match(&headers)?;
    let app = (state.store)
        .set_backends_if(name.as_str(), backends, precondition.as_ref())
        .await?;
    state.applied_locally().await;
    Ok(Tagged(Some(entity_tag_of(&app)), Json(app)))
}

/// Longest path a purge names.
const MAX_PURGE_PATH: usize = 1024;

/// `DELETE /v1/apps/{name}/cache`'s query.
#[derive(Deserialize, JsonSchema)]
pub(crate) struct PurgeQuery {
    /// The path whose cached responses go, e.g. `/news` (absolute, at most 1,024 bytes).
    #[schemars(regex(pattern = r"^/[!-~]*$"), length(max = MAX_PURGE_PATH))]
    path: Option<String>,
    /// `true`: every path under it too.
    #[schemars(extend("enum" = ["true", "false"]))]
    prefix: Option<String>,
}

/// `DELETE /v1/apps/{name}/cache?path=/p[&prefix=true]`: every router sharing the store drops
/// the app's cached responses for that path (or under that prefix).
pub(crate) async fn purge_cache(
    State(state): State<AdminState>,
    Path(AppPath { name }): Path<AppPath>,
    Query(query): Query<PurgeQuery>,
) -> Result<Json<Purged>, ApiError> {
    let name = valid_name(&name)?;
    let path = query
        .path
        .filter(|p| {
            p.starts_with('/')
                && p.len() <= MAX_PURGE_PATH
                && p.bytes().all(|b| b.is_ascii_graphic())
        })
        .ok_or_else(|| {
            ValidationError::new("path", "is required: an absolute path such as /news")
        })?;
    let prefix = match query.prefix.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(ValidationError::new("prefix", "must be true or false").into()),
    };
    let Some(app) = state.store.get_app(name.as_str()).await? else {
        return Err(app_not_found(&name));
    };
    let cache_store = app.cache.as_ref().map(|c| c.store);
    if cache_store == Some(CacheStore::RedisVersioned) {
        // The router keeps nothing of these apps: their pages are versioned by the app in
        // the cache Redis, and only a new version makes a page stale.
        return Err(ApiError::Conflict {
            message: format!(
                "app '{name}' keeps its cache itself (redis-versioned): the router holds no copy \
                 to purge; bump the URL's version instead (HINCRBY resource_versions URL 1)"
            ),
            field: "cache.store",
        });
    }
    if cache_store == Some(CacheStore::Redis) {
        let Some(shared) = &state.shared_cache else {
            return Err(ApiError::SharedCacheUnavailable(
                "this router has no --cache-redis".into(),
            ));
        };
        let (deleted, complete) = shared
            .purge(name.as_str(), &path, prefix)
            .await
            .map_err(ApiError::SharedCacheUnavailable)?;
        return Ok(Json(Purged {
            app: name.to_string(),
            purged: path,
            prefix,
            deleted: Some(deleted),
            complete: Some(complete),
        }));
    }
    state
        .store
        .purge_cache(name.as_str(), &path, prefix)
        .await?;
    state.applied_locally().await;
    Ok(Json(Purged {
        app: name.to_string(),
        purged: path,
        prefix,
        deleted: None,
        complete: None,
    }))
}

/// `POST /v1/waf/reload`: loads the WAF's rule files again and swaps them in; on an error
/// (400 naming `rules`, with libmodsecurity's file, line and reason) the rules in use stay.
/// Once loaded here, every router sharing the store is told to load its own again.
pub(crate) async fn reload_waf(
    State(state): State<AdminState>,
) -> Result<Json<WafReloaded>, ApiError> {
    let Some(waf) = state.waf.clone() else {
        return Err(ApiError::Conflict {
            message: "this router runs without the WAF (--waf off)".into(),
            field: "waf",
        });
    };
    let reloaded = tokio::task::spawn_blocking(move || waf.reload())
        .await
        .map_err(|e| ApiError::Unavailable(format!("the reload did not finish: {e}")))?;
    let (count, reload) = reloaded.map_err(|reason| ValidationError::new("rules", reason))?;
    state
        .store
        .tell_every_router(Change::WafReload { reload })
        .await
        .map_err(|e| {
            ApiError::Unavailable(format!(
                "the rules are loaded on this router ({count} rules), but the other routers \
                 sharing the store could not be told to load theirs: {e}"
            ))
        })?;
    Ok(Json(WafReloaded { rules: count }))
}

/// A page's query.
#[derive(Deserialize, JsonSchema)]
pub(crate) struct ListQuery {
    /// List entries after this one (the previous page's `next_after`).
    after: Option<String>,
    /// Page size (default 1,000).
    #[schemars(range(min = 1, max = MAX_PAGE))]
    limit: Option<usize>,
}

pub(crate) async fn list_apps(
    State(state): State<AdminState>,
    Query(query): Query<ListQuery>,
) -> Result<Json<AppsPage>, ApiError> {
    let limit = page_limit(query.limit, DEFAULT_PAGE, MAX_PAGE)?;
    let page = state.store.list_apps(query.after.as_deref(), limit).await?;
    Ok(Json(AppsPage {
        apps: page.apps,
        next_after: page.next_after,
    }))
}

pub(crate) async fn put_cert(
    State(state): State<AdminState>,
    Path(DomainPath { domain }): Path<DomainPath>,
    headers: HeaderMap,
    JsonBody(body, ..): JsonBody<CertificateUpload>,
) -> Result<Tagged<CertificateInfo>, ApiError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let cert = parse_certificate_spec(&domain, &parse_json(&body)?, now)?;
    let precondition = if_match(&headers)?;
    let info = state.store.put_cert_if(cert, precondition.as_ref()).await?;
    state.applied_locally().await;
    Ok(Tagged(Some(entity_tag_of(&info)), Json(info)))
}

pub(crate) async fn get_cert(
    State(state): State<AdminState>,
    Path(DomainPath { domain }): Path<DomainPath>,
) -> Result<Tagged<ShownCert>, ApiError> {
    let domain = valid_domain(&domain)?;
    let acme = acme::domain(state.store.as_ref(), domain.as_str()).await?;
    match (state.store.get_cert(domain.as_str()).await?, acme) {
        (Some(cert), acme) => Ok(Tagged(
            Some(entity_tag_of(&cert.info)),
            Json(ShownCert::Stored {
                info: cert.info,
                acme,
            }),
        )),
        // Ordered but not issued yet (or failing): its state says where it stands.
        (None, Some(acme)) => Ok(Tagged(
            None,
            Json(ShownCert::Ordered {
                domain: domain.to_string(),
                acme,
            }),
        )),
        (None, None) => Err(cert_not_found(&domain)),
    }
}

/// `GET /v1/store`: the store's kind and location, and for Redis the subscription, the last
/// revision seen and how long ago this router was last known in step.
pub(crate) async fn store_status(State(state): State<AdminState>) -> Json<ShownStore> {
    let status = state.store.status();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let seconds_since_last_sync = status.last_sync_unix.map(|last| (now - last).max(0));
    Json(ShownStore {
        status,
        seconds_since_last_sync,
    })
}

/// `GET /v1/explain`'s query.
#[derive(Deserialize, JsonSchema)]
pub(crate) struct ExplainQuery {
    /// The Host a client sends (a port is allowed).
    host: Option<String>,
    /// The request path (default `/`).
    #[schemars(regex(pattern = "^/"))]
    path: Option<String>,
    /// The request method (default GET).
    #[schemars(regex(pattern = "^[A-Z]+$"))]
    method: Option<String>,
}

/// `GET /v1/explain?host=H[&path=P][&method=M]`: which app serves the host, by which rule,
/// which stages act on such a request, and which backend the next one would take — this
/// router's own view.
pub(crate) async fn explain(
    State(state): State<AdminState>,
    Query(query): Query<ExplainQuery>,
) -> Result<Json<Explanation>, ApiError> {
    let host = query
        .host
        .as_deref()
        .filter(|host| !host.is_empty())
        .ok_or_else(|| ValidationError::new("host", "missing: the Host to explain"))?;
    let path = query.path.as_deref().unwrap_or("/");
    if !path.starts_with('/') {
        return Err(ValidationError::new("path", "must start with '/'").into());
    }
    let method = query.method.as_deref().unwrap_or("GET");
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(ValidationError::new("method", "an HTTP method in capitals, e.g. GET").into());
    }
    let Some(explainer) = &state.explainer else {
        return Err(ApiError::Unavailable(
            "this admin API is not attached to a router".into(),
        ));
    };
    Ok(Json(explainer.explain(host, path, method).await?))
}

/// Most apps one stats answer lists.
const MAX_STATS_APPS: usize = 1000;

/// `GET /v1/stats/apps`' query.
#[derive(Deserialize, JsonSchema)]
pub(crate) struct StatsQuery {
    /// `traffic` (the default), `errors` (5xx) or `cpu` (the router's CPU spent for it).
    #[schemars(extend("enum" = ["traffic", "errors", "cpu"]))]
    sort: Option<String>,
    /// Apps listed (default 20).
    #[schemars(with = "Option<usize>", range(min = 1, max = MAX_STATS_APPS))]
    limit: Option<String>,
    /// One app's entry only (`apps` empty when it had no traffic in the window).
    #[schemars(regex(pattern = AppName::PATTERN))]
    app: Option<String>,
}

/// `GET /v1/stats/apps?sort=traffic|errors|cpu&limit=N` (or `?app=NAME`): the busiest apps of
/// the last minute, each with its last 15 minutes at 10 s resolution.
pub(crate) async fn busiest_apps(
    State(state): State<AdminState>,
    Query(query): Query<StatsQuery>,
) -> Result<Json<TrafficReport>, ApiError> {
    let order = match query.sort.as_deref() {
        None | Some("traffic") => AppsBy::Traffic,
        Some("errors") => AppsBy::Errors,
        Some("cpu") => AppsBy::Cpu,
        Some(_) => return Err(ValidationError::new("sort", "traffic, errors or cpu").into()),
    };
    let limit = limit_in(query.limit.as_deref(), 20, MAX_STATS_APPS)?;
    let Some(traffic) = &state.traffic else {
        return Err(ApiError::Unavailable(
            "this admin API is not attached to a router".into(),
        ));
    };
    if let Some(app) = &query.app {
        return Ok(Json(traffic.of_app(valid_name(app)?.as_str())));
    }
    Ok(Json(traffic.busiest(order, limit)))
}

/// Most apps one usage page lists.
const MAX_USAGE_PAGE: usize = 1000;

/// `GET /v1/usage`'s query.
#[derive(Deserialize, JsonSchema)]
pub(crate) struct UsageQuery {
    /// Usage since this time, in Unix seconds (default: since the router started); within
    /// the last hour it is answered to the minute.
    since: Option<String>,
    /// List apps after this one (the previous page's `next`).
    after: Option<String>,
    /// Page size (default 1,000).
    #[schemars(with = "Option<usize>", range(min = 1, max = MAX_USAGE_PAGE))]
    limit: Option<String>,
}

/// `GET /v1/usage?since=T&after=APP&limit=N`: what every app used of this router (CPU,
/// requests, bytes; connections, WebSockets and requests held now), by app name, paged.
pub(crate) async fn usage(
    State(state): State<AdminState>,
    Query(query): Query<UsageQuery>,
) -> Result<Json<UsageReport>, ApiError> {
    let limit = limit_in(query.limit.as_deref(), MAX_USAGE_PAGE, MAX_USAGE_PAGE)?;
    let since = match query.since.as_deref() {
        None => None,
        Some(text) => {
            Some((text.parse::<u64>()).map_err(|_| ValidationError::new("since", "Unix seconds"))?)
        }
    };
    let Some(traffic) = &state.traffic else {
        return Err(ApiError::Unavailable(
            "this admin API is not attached to a router".into(),
        ));
    };
    let report = traffic.usage(since, query.after.as_deref(), limit);
    Ok(Json(report.map_err(|why| {
        let reason = why.strip_prefix("since: ").unwrap_or(&why).to_string();
        ValidationError::new("since", reason)
    })?))
}

/// `GET /v1/acme`'s query.
#[derive(Deserialize, JsonSchema)]
pub(crate) struct AcmeQuery {
    /// List entries after this one (the previous page's `next_after`).
    after: Option<String>,
    /// Page size (default 1,000).
    #[schemars(range(min = 1, max = MAX_PAGE))]
    limit: Option<usize>,
    /// Only domains in these states, comma-separated (pending, validating, issued, failed,
    /// unsupported). One call then reads at most 10,000 records: a page may hold fewer than
    /// `limit` domains, with a `next_after` to go on from.
    status: Option<String>,
}

/// Most ACME records one filtered `GET /v1/acme` reads before answering with what it found
/// and where to go on: a bound on one call's work whatever the number of domains.
const MAX_ACME_SCAN: usize = 10_000;

/// `GET /v1/acme[?status=failed,pending…]`: who issues, and the domains' ACME states, a
/// page at a time; with `status`, only domains in those states (an operator's "what is
/// failing"), reading at most [`MAX_ACME_SCAN`] records per call.
pub(crate) async fn acme_status(
    State(state): State<AdminState>,
    Query(query): Query<AcmeQuery>,
) -> Result<Json<AcmeOverview>, ApiError> {
    let limit = page_limit(query.limit, DEFAULT_PAGE, MAX_PAGE)?;
    let wanted = match query.status.as_deref() {
        None => None,
        Some(list) => Some(
            list.split(',')
                .map(|name| {
                    AcmeStatus::ALL
                        .into_iter()
                        .find(|status| status.label() == name)
                        .ok_or_else(|| {
                            ValidationError::new(
                                "status",
                                format!(
                                    "'{name}' is not one of pending, validating, issued, \
                                     failed, unsupported"
                                ),
                            )
                        })
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    let store = state.store.as_ref();
    let (domains, next_after, scanned) = match wanted {
        None => {
            let (domains, next) = acme::domains(store, query.after.as_deref(), limit).await?;
            let scanned = domains.len();
            (domains, next, scanned)
        }
        Some(wanted) => {
            let mut found = Vec::new();
            // The last record looked at: the next call goes on after it.
            let mut cursor = query.after;
            let mut scanned = 0;
            let mut read_all = false;
            'scan: while scanned < MAX_ACME_SCAN {
                let read = (MAX_ACME_SCAN - scanned).min(DEFAULT_PAGE);
                let (page, next) = acme::domains(store, cursor.as_deref(), read).await?;
                for domain in page {
                    scanned += 1;
                    cursor = Some(domain.domain.clone());
                    if wanted.contains(&domain.status) {
                        found.push(domain);
                        if found.len() == limit {
                            break 'scan;
                        }
                    }
                }
                if next.is_none() {
                    read_all = true;
                    break;
                }
            }
            (found, cursor.filter(|_| !read_all), scanned)
        }
    };
    let lease = store
        .acme_lease_holder()
        .await?
        .map(|(holder, fencing_token)| AcmeLease {
            holder,
            fencing_token,
        });
    Ok(Json(AcmeOverview {
        lease,
        domains,
        next_after,
        scanned,
    }))
}

pub(crate) async fn delete_cert(
    State(state): State<AdminState>,
    Path(DomainPath { domain }): Path<DomainPath>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let domain = valid_domain(&domain)?;
    let precondition = if_match(&headers)?;
    let deleted = (state.store)
        .delete_cert_if(domain.as_str(), precondition.as_ref())
        .await?;
    if deleted {
        state.applied_locally().await;
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(cert_not_found(&domain))
    }
}

/// `GET /v1/certs`' query.
#[derive(Deserialize, JsonSchema)]
pub(crate) struct CertListQuery {
    /// List entries after this one (the previous page's `next_after`; by expiry, an opaque
    /// cursor).
    after: Option<String>,
    /// Page size: by domain at most 10,000 (default 1,000), by expiry at most 1,000
    /// (default 100).
    #[schemars(range(min = 1, max = MAX_PAGE))]
    limit: Option<usize>,
    /// `domain` (the default) or `expiry`: soonest end of validity first, from the store's
    /// expiry index; each certificate then carries `acme`, its ACME state (null for an
    /// uploaded one).
    #[schemars(extend("enum" = ["domain", "expiry"]))]
    order: Option<String>,
}

/// Certificates one page by expiry lists unless asked otherwise: the dashboard's page.
const DEFAULT_EXPIRY_PAGE: usize = 100;
/// Most certificates one page by expiry lists: each carries its ACME state, one store read.
const MAX_EXPIRY_PAGE: usize = 1000;
/// ACME states read at once for a page by expiry.
const ACME_READS_IN_FLIGHT: usize = 32;

/// `GET /v1/certs[?order=domain|expiry][&after][&limit]`: by domain (the default), or by
/// expiry, soonest first, each with its ACME state (null for an uploaded certificate).
pub(crate) async fn list_certs(
    State(state): State<AdminState>,
    Query(query): Query<CertListQuery>,
) -> Result<Json<CertsPage>, ApiError> {
    match query.order.as_deref() {
        None | Some("domain") => {
            let limit = page_limit(query.limit, DEFAULT_PAGE, MAX_PAGE)?;
            let page = state
                .store
                .list_certs(query.after.as_deref(), limit)
                .await?;
            let certs = page
                .certs
                .into_iter()
                .map(|info| ListedCert { info, acme: None })
                .collect();
            Ok(Json(CertsPage {
                certs,
                next_after: page.next_after,
            }))
        }
        Some("expiry") => {
            let limit = page_limit(query.limit, DEFAULT_EXPIRY_PAGE, MAX_EXPIRY_PAGE)?;
            let page = state
                .store
                .list_certs_by_expiry(query.after.as_deref(), limit)
                .await?;
            let domains: Vec<String> = page.certs.iter().map(|c| c.domain.clone()).collect();
            let states: Vec<_> = futures_util::stream::iter(domains)
                .map(|domain| {
                    let store = state.store.clone();
                    async move { acme::domain(store.as_ref(), &domain).await }
                })
                .buffered(ACME_READS_IN_FLIGHT)
                .collect()
                .await;
            let mut certs = Vec::with_capacity(page.certs.len());
            for (info, acme) in page.certs.into_iter().zip(states) {
                certs.push(ListedCert {
                    info,
                    acme: Some(acme?),
                });
            }
            Ok(Json(CertsPage {
                certs,
                next_after: page.next_after,
            }))
        }
        Some(_) => Err(ValidationError::new("order", "must be domain or expiry").into()),
    }
}

/// `GET /v1/changes`' query.
#[derive(Deserialize, JsonSchema)]
pub(crate) struct ChangesQuery {
    /// Changes listed (default 50).
    #[schemars(with = "Option<usize>", range(min = 1, max = MAX_CHANGES_SHOWN))]
    limit: Option<String>,
}

/// `GET /v1/changes[?limit=N]`: the store changes this router applied lately, newest first.
pub(crate) async fn recent_changes(
    State(state): State<AdminState>,
    Query(query): Query<ChangesQuery>,
) -> Result<Json<RecentChangesReport>, ApiError> {
    let limit = limit_in(query.limit.as_deref(), 50, MAX_CHANGES_SHOWN)?;
    let Some(changes) = &state.changes else {
        return Err(ApiError::Unavailable(
            "this admin API is not attached to a router".into(),
        ));
    };
    Ok(Json(changes.recent(limit)))
}

/// Most changes one `GET /v1/changes` lists (the log keeps fewer).
const MAX_CHANGES_SHOWN: usize = 1000;

/// `GET /metrics`, or with `?app=NAME` only the series labelled with that app (the
/// dashboard's app page reads its cache, WAF, mirror and status figures this way without
/// fetching every app's series).
pub(crate) async fn metrics(Query(query): Query<MetricsQuery>) -> Result<Response, ApiError> {
    let mut families = prometheus::gather();
    if let Some(app) = &query.app {
        let app = valid_name(app)?;
        families = only_app(families, app.as_str());
    }
    Ok(encode_metrics(&families))
}

/// `GET /metrics`' query.
#[derive(Deserialize, JsonSchema)]
pub(crate) struct MetricsQuery {
    /// Only the series labelled with this app.
    #[schemars(regex(pattern = AppName::PATTERN))]
    app: Option<String>,
}

/// The families' series whose `app` label is `app`; families left empty are dropped.
fn only_app(
    families: Vec<prometheus::proto::MetricFamily>,
    app: &str,
) -> Vec<prometheus::proto::MetricFamily> {
    families
        .into_iter()
        .filter_map(|mut family| {
            let kept: Vec<prometheus::proto::Metric> = family
                .take_metric()
                .into_iter()
                .filter(|metric| {
                    metric
                        .get_label()
                        .iter()
                        .any(|pair| pair.get_name() == "app" && pair.get_value() == app)
                })
                .collect();
            if kept.is_empty() {
                return None;
            }
            family.set_metric(kept.into());
            Some(family)
        })
        .collect()
}

fn encode_metrics(families: &[prometheus::proto::MetricFamily]) -> Response {
    let mut text = Vec::new();
    if let Err(e) = TextEncoder::new().encode(families, &mut text) {
        log::error!("cannot encode metrics: {e}");
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// The query's `limit`: `default` when absent, refused unless an integer from 1 to `max`.
pub(crate) fn limit_in(
    given: Option<&str>,
    default: usize,
    max: usize,
) -> Result<usize, ValidationError> {
    match given {
        None => Ok(default),
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| ValidationError::new("limit", format!("an integer from 1 to {max}"))),
    }
}

/// A page's size: `default` when not given, refused unless from 1 to `max`.
fn page_limit(given: Option<usize>, default: usize, max: usize) -> Result<usize, ValidationError> {
    let limit = given.unwrap_or(default);
    if limit == 0 || limit > max {
        return Err(ValidationError::new(
            "limit",
            format!("must be from 1 to {max}"),
        ));
    }
    Ok(limit)
}

fn valid_domain(domain: &str) -> Result<Domain, ValidationError> {
    Domain::parse(domain).map_err(|m| ValidationError::new("domain", m))
}

fn cert_not_found(domain: &Domain) -> ApiError {
    ApiError::NotFound {
        what: format!("no certificate is stored for '{domain}'"),
        field: "domain",
    }
}

fn parse_json(body: &[u8]) -> Result<Value, ValidationError> {
    serde_json::from_slice(body)
        .map_err(|e| ValidationError::new("body", format!("invalid JSON: {e}")))
}

fn valid_name(name: &str) -> Result<AppName, ValidationError> {
    AppName::parse(name).map_err(|m| ValidationError::new("name", m))
}

fn app_not_found(name: &AppName) -> ApiError {
    ApiError::NotFound {
        what: format!("app '{name}' does not exist"),
        field: "name",
    }
}

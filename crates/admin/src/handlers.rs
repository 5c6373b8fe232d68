//! One function per admin route. Bodies are taken as raw bytes and parsed by the model, so
//! malformed JSON and invalid fields get the same JSON error shape.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use prometheus::{Encoder, TextEncoder};
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::{SystemTime, UNIX_EPOCH};

use switchyard_model::{
    parse_app_spec, parse_backends_spec, parse_certificate_spec, AcmeStatus, AppName, CacheStore,
    Change, Domain, ValidationError,
};

use crate::{AdminState, ApiError};
use switchyard_store::acme;

const DEFAULT_PAGE: usize = 1000;
const MAX_PAGE: usize = 10_000;

pub(crate) async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// This API's OpenAPI 3 document (`crates/admin/openapi.json`).
pub(crate) async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        include_str!("../openapi.json"),
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
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let spec = parse_json(&body)?;
    let mut app = parse_app_spec(&name, &spec)?;
    crate::page_fetch::fill_maintenance_page(&mut app).await?;
    let stored = state.store.put_app(app).await?;
    state.applied_locally().await;
    Ok(Json(json!(stored)))
}

pub(crate) async fn get_app(
    State(state): State<AdminState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let name = valid_name(&name)?;
    match state.store.get_app(name.as_str()).await? {
        Some(app) => {
            let mut shown = json!(app);
            let resolved = state
                .backend_names
                .as_ref()
                .map(|names| names.describe(&app))
                .unwrap_or_default();
            if !resolved.is_empty() {
                shown["resolved_backends"] = Value::Array(resolved);
            }
            Ok(Json(shown))
        }
        None => Err(app_not_found(&name)),
    }
}

pub(crate) async fn delete_app(
    State(state): State<AdminState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let name = valid_name(&name)?;
    if state.store.delete_app(name.as_str()).await? {
        state.applied_locally().await;
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(app_not_found(&name))
    }
}

pub(crate) async fn put_backends(
    State(state): State<AdminState>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let name = valid_name(&name)?;
    let backends = parse_backends_spec(&parse_json(&body)?)?;
    let app = state.store.set_backends(name.as_str(), backends).await?;
    state.applied_locally().await;
    Ok(Json(json!(app)))
}

/// `DELETE /v1/apps/{name}/cache?path=/p[&prefix=true]`: every router sharing the store drops
/// the app's cached responses for that path (or under that prefix).
pub(crate) async fn purge_cache(
    State(state): State<AdminState>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let name = valid_name(&name)?;
    let path = query
        .get("path")
        .filter(|p| {
            p.starts_with('/') && p.len() <= 1024 && p.bytes().all(|b| b.is_ascii_graphic())
        })
        .ok_or_else(|| {
            ValidationError::new("path", "is required: an absolute path such as /news")
        })?;
    let prefix = match query.get("prefix").map(String::as_str) {
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
            .purge(name.as_str(), path, prefix)
            .await
            .map_err(ApiError::SharedCacheUnavailable)?;
        return Ok(Json(json!({
            "app": name, "purged": path, "prefix": prefix,
            "deleted": deleted, "complete": complete,
        })));
    }
    state.store.purge_cache(name.as_str(), path, prefix).await?;
    state.applied_locally().await;
    Ok(Json(json!({"app": name, "purged": path, "prefix": prefix})))
}

/// `POST /v1/waf/reload`: loads the WAF's rule files again and swaps them in; on an error
/// (400 naming `rules`, with libmodsecurity's file, line and reason) the rules in use stay.
/// Once loaded here, every router sharing the store is told to load its own again.
pub(crate) async fn reload_waf(State(state): State<AdminState>) -> Result<Json<Value>, ApiError> {
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
    Ok(Json(json!({"rules": count})))
}

#[derive(Deserialize)]
pub(crate) struct ListQuery {
    after: Option<String>,
    limit: Option<usize>,
}

pub(crate) async fn list_apps(
    State(state): State<AdminState>,
    Query(query): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(query.limit, DEFAULT_PAGE, MAX_PAGE)?;
    let page = state.store.list_apps(query.after.as_deref(), limit).await?;
    Ok(Json(
        json!({"apps": page.apps, "next_after": page.next_after}),
    ))
}

pub(crate) async fn put_cert(
    State(state): State<AdminState>,
    Path(domain): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let cert = parse_certificate_spec(&domain, &parse_json(&body)?, now)?;
    let info = state.store.put_cert(cert).await?;
    state.applied_locally().await;
    Ok(Json(json!(info)))
}

pub(crate) async fn get_cert(
    State(state): State<AdminState>,
    Path(domain): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let domain = valid_domain(&domain)?;
    let acme = acme::domain(state.store.as_ref(), domain.as_str()).await?;
    match (state.store.get_cert(domain.as_str()).await?, acme) {
        (Some(cert), acme) => {
            let mut shown = json!(cert.info);
            shown["acme"] = json!(acme);
            Ok(Json(shown))
        }
        // Ordered but not issued yet (or failing): its state says where it stands.
        (None, Some(acme)) => Ok(Json(json!({"domain": domain.as_str(), "acme": acme}))),
        (None, None) => Err(cert_not_found(&domain)),
    }
}

/// `GET /v1/store`: the store's kind and location, and for Redis the subscription, the last
/// revision seen and how long ago this router was last known in step.
pub(crate) async fn store_status(State(state): State<AdminState>) -> Json<Value> {
    let status = state.store.status();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut shown = json!(status);
    if let Some(last) = status.last_sync_unix {
        shown["seconds_since_last_sync"] = json!((now - last).max(0));
    }
    Json(shown)
}

/// `GET /v1/explain?host=H[&path=P][&method=M]`: which app serves the host, by which rule,
/// which stages act on such a request, and which backend the next one would take — this
/// router's own view.
pub(crate) async fn explain(
    State(state): State<AdminState>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let host = query
        .get("host")
        .filter(|host| !host.is_empty())
        .ok_or_else(|| ValidationError::new("host", "missing: the Host to explain"))?;
    let path = query.get("path").map_or("/", String::as_str);
    if !path.starts_with('/') {
        return Err(ValidationError::new("path", "must start with '/'").into());
    }
    let method = query.get("method").map_or("GET", String::as_str);
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

/// `GET /v1/stats/apps?sort=traffic|errors&limit=N` (or `?app=NAME`): the busiest apps of
/// the last minute, each with its last 15 minutes at 10 s resolution.
pub(crate) async fn busiest_apps(
    State(state): State<AdminState>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let by_errors = match query.get("sort").map(String::as_str) {
        None | Some("traffic") => false,
        Some("errors") => true,
        Some(_) => return Err(ValidationError::new("sort", "traffic or errors").into()),
    };
    let limit = limit_in(&query, 20, MAX_STATS_APPS)?;
    let Some(traffic) = &state.traffic else {
        return Err(ApiError::Unavailable(
            "this admin API is not attached to a router".into(),
        ));
    };
    if let Some(app) = query.get("app") {
        return Ok(Json(traffic.of_app(valid_name(app)?.as_str())));
    }
    Ok(Json(traffic.busiest(by_errors, limit)))
}

#[derive(Deserialize)]
pub(crate) struct AcmeQuery {
    after: Option<String>,
    limit: Option<usize>,
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
) -> Result<Json<Value>, ApiError> {
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
        .map(|(holder, token)| json!({"holder": holder, "fencing_token": token}));
    Ok(Json(json!({
        "lease": lease,
        "domains": domains,
        "next_after": next_after,
        "scanned": scanned,
    })))
}

pub(crate) async fn delete_cert(
    State(state): State<AdminState>,
    Path(domain): Path<String>,
) -> Result<StatusCode, ApiError> {
    let domain = valid_domain(&domain)?;
    if state.store.delete_cert(domain.as_str()).await? {
        state.applied_locally().await;
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(cert_not_found(&domain))
    }
}

#[derive(Deserialize)]
pub(crate) struct CertListQuery {
    after: Option<String>,
    limit: Option<usize>,
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
) -> Result<Json<Value>, ApiError> {
    match query.order.as_deref() {
        None | Some("domain") => {
            let limit = page_limit(query.limit, DEFAULT_PAGE, MAX_PAGE)?;
            let page = state
                .store
                .list_certs(query.after.as_deref(), limit)
                .await?;
            Ok(Json(
                json!({"certs": page.certs, "next_after": page.next_after}),
            ))
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
            for (cert, acme) in page.certs.iter().zip(states) {
                let mut shown = json!(cert);
                shown["acme"] = json!(acme?);
                certs.push(shown);
            }
            Ok(Json(json!({"certs": certs, "next_after": page.next_after})))
        }
        Some(_) => Err(ValidationError::new("order", "must be domain or expiry").into()),
    }
}

/// `GET /v1/changes[?limit=N]`: the store changes this router applied lately, newest first.
pub(crate) async fn recent_changes(
    State(state): State<AdminState>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let limit = limit_in(&query, 50, MAX_CHANGES_SHOWN)?;
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
pub(crate) async fn metrics(
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let mut families = prometheus::gather();
    if let Some(app) = query.get("app") {
        let app = valid_name(app)?;
        families = only_app(families, app.as_str());
    }
    Ok(encode_metrics(&families))
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
fn limit_in(
    query: &HashMap<String, String>,
    default: usize,
    max: usize,
) -> Result<usize, ValidationError> {
    match query.get("limit") {
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

//! The audit log: every write through the admin API recorded — when, by which token, from
//! which address, what it changed (field by field, before → after) and how it was answered
//! — in the store (so a fleet's routers share one log), bounded by `--audit-retention`, and
//! handed to the router's log shipping when it has one. `GET /v1/audit` reads it.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use axum::Json;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use switchyard_model::{field_changes, AuditPage, AuditQuery, AuditRecord, ValidationError};

use crate::auth::{app_in_path, Caller, ANONYMOUS_ID};
use crate::progress::AuditLater;
use crate::{AdminState, ApiError};

/// Records kept when the router is not told otherwise.
pub const DEFAULT_AUDIT_RETENTION: usize = 100_000;
/// Most records one `GET /v1/audit` answers.
const MAX_AUDIT_PAGE: usize = 1000;

/// Where audit records go besides the store: the router's log shipping.
pub trait AuditSink: Send + Sync {
    /// Takes one record; never blocks the write it describes.
    fn ship(&self, record: &AuditRecord);
}

/// What a handler says it changed, when a before → after of one record cannot say it (a
/// token made, a bulk import).
#[derive(Clone)]
pub(crate) struct AuditDetail(pub(crate) Value);

/// What a write's path names, read before and after the write.
enum Subject {
    App(String),
    Cert(String),
    Other,
}

impl Subject {
    fn of(path: &str) -> Self {
        if let Some(app) = app_in_path(path) {
            return Self::App(app.to_string());
        }
        match path.strip_prefix("/v1/certs/") {
            Some(domain) if !domain.is_empty() => Self::Cert(domain.to_string()),
            _ => Self::Other,
        }
    }

    fn app(&self) -> Option<String> {
        match self {
            Self::App(name) => Some(name.clone()),
            _ => None,
        }
    }

    /// The record as stored now (`null` when there is none or it cannot be read: the diff
    /// then shows it appearing or going).
    async fn read(&self, state: &AdminState) -> Value {
        match self {
            Self::App(name) => match state.store.get_app(name).await {
                Ok(Some(app)) => serde_json::to_value(app).unwrap_or_default(),
                _ => Value::Null,
            },
            Self::Cert(domain) => match state.store.get_cert(domain).await {
                Ok(Some(cert)) => serde_json::to_value(cert.info).unwrap_or_default(),
                _ => Value::Null,
            },
            Self::Other => Value::Null,
        }
    }
}

/// Records each write that passed authentication, whatever its answer.
pub(crate) async fn record_writes(
    State(state): State<AdminState>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method().clone();
    if method == Method::GET || method == Method::HEAD {
        return next.run(request).await;
    }
    let token = request
        .extensions()
        .get::<Caller>()
        .map_or_else(|| ANONYMOUS_ID.to_string(), |caller| caller.id.clone());
    let client = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "unknown".to_string(), |info| info.0.to_string());
    let path = request.uri().path().to_string();
    let shown_path = match request.uri().query() {
        Some(query) => format!("{path}?{query}"),
        None => path.clone(),
    };
    let subject = Subject::of(&path);
    let before = subject.read(&state).await;
    let response = next.run(request).await;
    let mut record = AuditRecord {
        cursor: String::new(),
        at_ms: 0,
        token,
        client,
        method: method.to_string(),
        path: shown_path,
        app: subject.app(),
        change: Value::Object(Default::default()),
        status: response.status().as_u16(),
    };
    let later = response
        .extensions()
        .get::<AuditLater>()
        .and_then(|later| later.0.lock().ok()?.take());
    if let Some(outcome) = later {
        // A streamed write: recorded once its last line says how it ended.
        tokio::spawn(async move {
            if let Ok((status, change)) = outcome.await {
                record.status = status;
                record.change = change;
            }
            keep(&state, record).await;
        });
        return response;
    }
    record.change = match response.extensions().get::<AuditDetail>() {
        Some(detail) => detail.0.clone(),
        None if response.status().is_success() => {
            field_changes(&before, &subject.read(&state).await)
        }
        None => record.change,
    };
    keep(&state, record).await;
    response
}

/// Stamps `record`, ships it where the router ships its logs, and keeps it in the store.
async fn keep(state: &AdminState, mut record: AuditRecord) {
    record.at_ms = unix_ms(SystemTime::now());
    if let Some(sink) = &state.audit_sink {
        sink.ship(&record);
    }
    let what = format!("{} {}", record.method, record.path);
    if let Err(e) =
        switchyard_store::audit::record(state.store.as_ref(), record, state.audit_retention).await
    {
        log::warn!("audit record of {what} not kept: {e}");
    }
}

/// `GET /v1/audit`'s query.
#[derive(Deserialize, JsonSchema)]
pub(crate) struct AuditParams {
    /// Only the writes to this app.
    app: Option<String>,
    /// Only the writes since then: seconds since the epoch, or a span back from now
    /// (`90s`, `15m`, `2h`, `7d`).
    since: Option<String>,
    /// The `next` of the page before: only older records.
    before: Option<String>,
    /// Records listed (default 100).
    #[schemars(with = "Option<usize>", range(min = 1, max = MAX_AUDIT_PAGE))]
    limit: Option<String>,
}

/// `GET /v1/audit`: the writes recorded, newest first, paged with `before`.
pub(crate) async fn read(
    State(state): State<AdminState>,
    Query(params): Query<AuditParams>,
) -> Result<Json<AuditPage>, ApiError> {
    let limit = crate::handlers::limit_in(params.limit.as_deref(), 100, MAX_AUDIT_PAGE)?;
    let since_ms = params
        .since
        .as_deref()
        .map(|text| since(text, SystemTime::now()))
        .transpose()?;
    if let Some(before) = &params.before {
        if before.is_empty() || before.len() > 64 || before.contains(char::is_whitespace) {
            return Err(ValidationError::new("before", "the `next` of an earlier page").into());
        }
    }
    let query = AuditQuery {
        app: params.app,
        since_ms,
        before: params.before,
        limit,
    };
    Ok(Json(state.store.audit(&query).await?))
}

/// `since` as milliseconds since the epoch: seconds since the epoch, or a span back from
/// `now`.
fn since(text: &str, now: SystemTime) -> Result<u64, ValidationError> {
    let refused = || {
        ValidationError::new(
            "since",
            format!(
                "`{text}`: seconds since the epoch, or a span back from now (90s, 15m, 2h, 7d)"
            ),
        )
    };
    if let Ok(seconds) = text.parse::<u64>() {
        return seconds.checked_mul(1000).ok_or_else(refused);
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(refused)?;
    let (count, unit) = text.split_at(split);
    let count: u64 = count.parse().map_err(|_| refused())?;
    let unit_seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(refused()),
    };
    let back = Duration::from_secs(count.checked_mul(unit_seconds).ok_or_else(refused)?);
    Ok(unix_ms(now.checked_sub(back).unwrap_or(UNIX_EPOCH)))
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_epoch_seconds_or_a_span_back() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(since("1700000000", now), Ok(1_700_000_000_000));
        assert_eq!(since("15m", now), Ok((1_000_000 - 900) * 1000));
        assert_eq!(since("2h", now), Ok((1_000_000 - 7200) * 1000));
        assert_eq!(since("90d", now), Ok(0));
        for bad in ["", "m", "15x", "-5m", "1.5h", "yesterday"] {
            assert_eq!(
                since(bad, now).map_err(|e| e.field),
                Err("since".into()),
                "{bad}"
            );
        }
    }
}

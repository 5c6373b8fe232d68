//! Stage waf: requests of apps with a `waf` option are inspected with the OWASP Core Rule Set
//! on the worker pool before anything else is done for them (cache, mirror, backend).
//!
//! A body with a declared length within the app's `max_body_bytes` is read first and
//! inspected with the request; Pingora's replay buffer then sends it to the backend, so it
//! is held once. Larger bodies, and bodies of unknown length, pass uninspected (counted).
//! `block` answers 403 when the rules block; `detect` only logs. An inspection the pool
//! cannot start or finish by `timeout_ms` follows `on_overload`: pass, or 503.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use http::header;
use parking_lot::RwLock;
use pingora::proxy::Session;
use switchyard_model::{WafMode, WafOverload};
use switchyard_waf::{Request, RuleFiles, Waf, WafError};

use crate::context::RequestCtx;
use crate::metrics;
use crate::respond::LocalAnswer;
use crate::worker_pool::{PoolRefusal, WorkerPool};

/// The rule sets and the threads that run them.
#[derive(Debug)]
pub struct Inspector {
    /// Swapped whole by a reload; inspections under way keep the set they started with.
    waf: RwLock<Arc<Waf>>,
    files: RuleFiles,
    pool: Arc<WorkerPool>,
}

impl Inspector {
    /// Loads the rules from `files` (refusing with the reason if they do not load);
    /// inspections run on `pool`.
    pub fn load(files: RuleFiles, pool: Arc<WorkerPool>) -> Result<Self, WafError> {
        let waf = Waf::load(&files)?;
        Ok(Self {
            waf: RwLock::new(Arc::new(waf)),
            files,
            pool,
        })
    }

    /// Rules loaded.
    pub fn rule_count(&self) -> usize {
        self.waf.read().rule_count()
    }

    /// Loads the rule files again (a changed exclusion or custom rule) and swaps them in
    /// without a restart. Blocking: a full load takes about a tenth of a second. On an
    /// error the rules in use stay.
    pub fn reload(&self) -> Result<usize, WafError> {
        let fresh = Arc::new(Waf::load(&self.files)?);
        let count = fresh.rule_count();
        *self.waf.write() = fresh;
        log::info!("WAF rules reloaded: {count} rules");
        Ok(count)
    }
}

/// What the stage decided: `None` lets the request go on.
pub(crate) async fn inspect(
    session: &mut Session,
    ctx: &mut RequestCtx,
    inspector: Option<&Inspector>,
) -> pingora::Result<Option<LocalAnswer>> {
    let Some(route) = ctx.route.clone() else {
        return Ok(None);
    };
    let Some(policy) = route.app.waf else {
        return Ok(None);
    };
    let app = route.app.name.as_str();
    let deadline = Instant::now() + Duration::from_millis(policy.timeout_ms);
    let Some(inspector) = inspector else {
        report_no_waf(app);
        return Ok(overloaded(app, policy.on_overload));
    };
    let body = read_inspectable_body(session, policy.max_body_bytes).await?;
    if body.is_none() && !session.is_body_empty() {
        metrics::WAF_BODY_UNINSPECTED
            .with_label_values(&[app])
            .inc();
    }
    let request = OwnedRequest::of(session, body);
    let waf = inspector.waf.read().clone();
    let paranoia = policy.paranoia;
    let verdict = inspector
        .pool
        .run("waf", deadline, move || {
            let headers: Vec<(&[u8], &[u8])> = request
                .headers
                .iter()
                .map(|(name, value)| (name.as_slice(), value.as_slice()))
                .collect();
            waf.inspect(&request.as_waf_request(&headers), paranoia)
        })
        .await;
    let verdict = match verdict {
        Ok(verdict) => verdict,
        Err(refusal) => {
            log::warn!(
                "request {}: app {app}: WAF inspection {} ({}); {}",
                ctx.request_id,
                match refusal {
                    PoolRefusal::Full => "refused, the worker pool is full",
                    PoolRefusal::TimedOut => "missed its deadline",
                },
                policy.timeout_ms,
                match policy.on_overload {
                    WafOverload::Open => "passed uninspected",
                    WafOverload::Closed => "answered 503",
                }
            );
            return Ok(overloaded(app, policy.on_overload));
        }
    };
    for found in &verdict.matches {
        log::warn!(
            "request {}: app {app}: WAF rule {} matched: {}",
            ctx.request_id,
            found.id,
            found.message
        );
    }
    let blocked = verdict.block_status.is_some() && policy.mode == WafMode::Block;
    let result = if blocked {
        "blocked"
    } else if verdict.matches.is_empty() && verdict.block_status.is_none() {
        "pass"
    } else {
        "matched"
    };
    metrics::WAF_INSPECTIONS
        .with_label_values(&[app, result])
        .inc();
    Ok(blocked.then_some(LocalAnswer::WafBlocked))
}

fn overloaded(app: &str, policy: WafOverload) -> Option<LocalAnswer> {
    let (result, answer) = match policy {
        WafOverload::Open => ("overload_passed", None),
        WafOverload::Closed => ("overload_refused", Some(LocalAnswer::WafOverloaded)),
    };
    metrics::WAF_INSPECTIONS
        .with_label_values(&[app, result])
        .inc();
    answer
}

/// An app asks for the WAF but this router runs without one (`--waf off`). Said once.
fn report_no_waf(app: &str) {
    static REPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !REPORTED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        log::warn!(
            "app {app} asks for the WAF but this router runs without it (--waf off); its \
             requests follow on_overload"
        );
    }
}

/// The whole body when its declared length is within `limit`; `None` otherwise (nothing
/// read). Reading it here makes Pingora replay it to the backend from its buffer.
async fn read_inspectable_body(
    session: &mut Session,
    limit: u64,
) -> pingora::Result<Option<bytes::Bytes>> {
    let declared = session
        .req_header()
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let Some(length) = declared.filter(|&n| n > 0 && n <= limit) else {
        return Ok(None);
    };
    session.enable_retry_buffering();
    let mut body = BytesMut::with_capacity(length as usize);
    while let Some(chunk) = session.read_request_body().await? {
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body.freeze()))
}

/// What the worker thread needs, copied off the session.
struct OwnedRequest {
    client_ip: String,
    client_port: u16,
    server_port: u16,
    method: String,
    uri: String,
    http_version: &'static str,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    body: Option<bytes::Bytes>,
}

impl OwnedRequest {
    fn of(session: &Session, body: Option<bytes::Bytes>) -> Self {
        let request = session.req_header();
        let client = session.client_addr().and_then(|a| a.as_inet());
        let server_port = session
            .server_addr()
            .and_then(|a| a.as_inet())
            .map_or(0, |a| a.port());
        Self {
            client_ip: client.map_or_else(String::new, |a| a.ip().to_string()),
            client_port: client.map_or(0, |a| a.port()),
            server_port,
            method: request.method.as_str().to_string(),
            uri: request
                .uri
                .path_and_query()
                .map_or("/", |pq| pq.as_str())
                .to_string(),
            http_version: match request.version {
                http::Version::HTTP_2 => "2.0",
                http::Version::HTTP_10 => "1.0",
                _ => "1.1",
            },
            headers: request
                .headers
                .iter()
                .map(|(name, value)| (name.as_str().as_bytes().to_vec(), value.as_bytes().to_vec()))
                .collect(),
            body,
        }
    }

    fn as_waf_request<'a>(&'a self, headers: &'a [(&'a [u8], &'a [u8])]) -> Request<'a> {
        Request {
            client_ip: &self.client_ip,
            client_port: self.client_port,
            server_port: self.server_port,
            method: &self.method,
            uri: &self.uri,
            http_version: self.http_version,
            headers,
            body: self.body.as_deref(),
        }
    }
}

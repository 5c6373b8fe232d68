//! Stage waf: requests of apps with a `waf` option are inspected with the OWASP Core Rule Set
//! on the worker pool.
//!
//! Small bodies (a declared length within 64 KiB and the app's `max_body_bytes`) are read
//! first and inspected with the request before anything else is done for it; Pingora's replay
//! buffer then sends them to the backend. Larger bodies, and bodies of unknown length, are
//! spooled to an unlinked file as they arrive and held back from the backend until the first
//! `max_body_bytes` of them are inspected from that file: memory holds one copy at most (the
//! one libmodsecurity makes while inspecting, then the one sent on). What comes past
//! `max_body_bytes` streams on uninspected (counted), as ModSecurity's ProcessPartial does.
//! Before such a body is read, the request's headers are inspected on their own, so that an
//! attack in the URL or headers is refused before the upload and before a backend is asked.
//!
//! `block` answers 403 when the rules block; `detect` only logs. An inspection the pool
//! cannot start or finish by `timeout_ms`, or a body the spool has no room for, follows
//! `on_overload`: pass, or 503.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header;
use parking_lot::RwLock;
use pingora::proxy::Session;
use pingora::{Error, ErrorType};
use switchyard_model::{Waf as WafPolicy, WafMode, WafOverload};
use switchyard_waf::{Body, Request, RuleFiles, Verdict, Waf, WafError};

use crate::context::RequestCtx;
use crate::metrics;
use crate::respond::LocalAnswer;
use crate::worker_pool::{PoolRefusal, WorkerPool};

/// Bodies of a declared length up to this are read into memory and inspected before the
/// request goes on: Pingora's replay buffer, which then sends them, holds 64 KiB.
const IN_MEMORY_BODY: u64 = 64 * 1024;

/// Where large bodies wait for their inspection, and how much disk they may use at once.
#[derive(Debug, Clone)]
pub struct SpoolSettings {
    /// A directory on a local disk; files are unlinked as they are made.
    pub dir: PathBuf,
    /// Bytes of all bodies being spooled at once; past it, `on_overload` applies.
    pub budget_bytes: u64,
}

/// The rule sets, the threads that run them and the spool for large bodies.
#[derive(Debug)]
pub struct Inspector {
    /// Swapped whole by a reload; inspections under way keep the set they started with.
    waf: RwLock<Arc<Waf>>,
    files: RuleFiles,
    pool: Arc<WorkerPool>,
    spool: Arc<SpoolBudget>,
}

impl Inspector {
    /// Loads the rules from `files` (refusing with the reason if they do not load);
    /// inspections run on `pool`, large bodies are spooled as `spool` says.
    pub fn load(
        files: RuleFiles,
        pool: Arc<WorkerPool>,
        spool: SpoolSettings,
    ) -> Result<Self, WafError> {
        let waf = Waf::load(&files)?;
        metrics::WAF_SPOOL_BUDGET.set(i64::try_from(spool.budget_bytes).unwrap_or(i64::MAX));
        Ok(Self {
            waf: RwLock::new(Arc::new(waf)),
            files,
            pool,
            spool: Arc::new(SpoolBudget {
                settings: spool,
                used: AtomicU64::new(0),
            }),
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

    /// Runs one inspection on the pool, by `deadline`.
    async fn run(
        &self,
        request: OwnedRequest,
        paranoia: u8,
        deadline: Instant,
    ) -> Result<Verdict, PoolRefusal> {
        let waf = self.waf.read().clone();
        self.pool
            .run("waf", deadline, move || {
                let headers: Vec<(&[u8], &[u8])> = request
                    .headers
                    .iter()
                    .map(|(name, value)| (name.as_slice(), value.as_slice()))
                    .collect();
                waf.inspect(&request.as_waf_request(&headers), paranoia)
            })
            .await
    }
}

/// Request-filter part: what the stage decided now. `None` lets the request go on (a large
/// body is then inspected as it arrives, by [`on_body`]).
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
    let allowed = Duration::from_millis(policy.timeout_ms);
    let deadline = Instant::now() + allowed;
    let Some(inspector) = inspector else {
        report_no_waf(app);
        return Ok(overloaded(app, policy.on_overload));
    };
    // No body, or none to inspect; or a small one, read now: inspected with the request.
    let declared = declared_length(session);
    let body = if session.is_body_empty() || policy.max_body_bytes == 0 {
        if !session.is_body_empty() {
            metrics::WAF_BODY_UNINSPECTED
                .with_label_values(&[app])
                .inc();
        }
        Some(BodyCopy::Absent)
    } else if declared.is_some_and(|n| n <= IN_MEMORY_BODY.min(policy.max_body_bytes)) {
        Some(BodyCopy::Bytes(read_small_body(session).await?))
    } else {
        None
    };
    if let Some(body) = body {
        let request = OwnedRequest::of(session, body);
        let verdict = inspector.run(request, policy.paranoia, deadline).await;
        return Ok(judge(ctx, app, &policy, allowed, verdict));
    }
    // A large body: the headers alone first, when a match could refuse the request.
    if policy.mode == WafMode::Block {
        let request = OwnedRequest::of(session, BodyCopy::Absent);
        if let Ok(verdict) = inspector.run(request, policy.paranoia, deadline).await {
            if verdict.block_status.is_some() {
                return Ok(judge(ctx, app, &policy, allowed, Ok(verdict)));
            }
        }
    }
    ctx.waf_spool = Some(BodySpool {
        request: OwnedRequest::of(session, BodyCopy::Absent),
        policy,
        reservation: Reservation {
            budget: inspector.spool.clone(),
            bytes: 0,
        },
        file: None,
        written: 0,
    });
    Ok(None)
}

/// Request-body part, for a body being spooled: each piece goes to the spool and is held
/// back (an empty piece goes on); at the end of the body (or once `max_body_bytes` are in) the spooled part is
/// inspected, then sent on whole, or the request is refused (an error carrying the answer
/// for `fail_to_proxy`).
pub(crate) async fn on_body(
    ctx: &mut RequestCtx,
    body: &mut Option<Bytes>,
    end_of_stream: bool,
    inspector: Option<&Inspector>,
) -> pingora::Result<()> {
    let (Some(spool), Some(inspector)) = (ctx.waf_spool.as_mut(), inspector) else {
        return Ok(());
    };
    let mut past_limit = None;
    if let Some(mut piece) = body.take() {
        let room = spool.policy.max_body_bytes.saturating_sub(spool.written);
        if piece.len() as u64 > room {
            past_limit = Some(piece.split_off(room as usize));
        }
        if let Err(refusal) = spool.append(piece.clone()).await {
            log::warn!("request {}: WAF spool: {refusal}", ctx.request_id);
            return give_up_spooling(ctx, body, piece, past_limit).await;
        }
    }
    if past_limit.is_none() && !end_of_stream {
        // Held back. Empty, not `None`: Pingora takes `None` for the end of the body.
        *body = Some(Bytes::new());
        return Ok(());
    }
    let Some(spool) = ctx.waf_spool.take() else {
        return Ok(());
    };
    let app = ctx.app_name().to_string();
    if past_limit.is_some() {
        metrics::WAF_BODY_UNINSPECTED
            .with_label_values(&[&app])
            .inc();
    }
    // The CRS takes time in proportion to the body (about 1.4 ms per KiB of form here), so
    // a spooled body gets `timeout_ms` per 64 KiB inspected.
    let pieces = spool.written.div_ceil(IN_MEMORY_BODY).max(1);
    let allowed = Duration::from_millis(spool.policy.timeout_ms.saturating_mul(pieces));
    let deadline = Instant::now() + allowed;
    let BodySpool {
        mut request,
        policy,
        reservation,
        file,
        written,
    } = spool;
    request.body = file.clone().map_or(BodyCopy::Absent, BodyCopy::Spooled);
    let verdict = inspector.run(request, policy.paranoia, deadline).await;
    if let Some(answer) = judge(ctx, &app, &policy, allowed, verdict) {
        return refuse(ctx, answer, "refused by the WAF after its body");
    }
    let held = read_back(file, written).await?;
    drop(reservation);
    *body = Some(concat(held, past_limit));
    Ok(())
}

/// A retry of the upstream connection replays the body from its start: start the spool over.
pub(crate) fn on_new_attempt(ctx: &mut RequestCtx) {
    if let Some(spool) = ctx.waf_spool.as_mut() {
        spool.written = 0;
    }
}

/// The spool cannot take the body (disk budget, a write error): `on_overload` decides
/// between sending what was held back and the rest uninspected, or 503.
async fn give_up_spooling(
    ctx: &mut RequestCtx,
    body: &mut Option<Bytes>,
    piece: Bytes,
    past_limit: Option<Bytes>,
) -> pingora::Result<()> {
    let Some(spool) = ctx.waf_spool.take() else {
        return Ok(());
    };
    if let Some(answer) = overloaded(ctx.app_name(), spool.policy.on_overload) {
        return refuse(ctx, answer, "no room to spool the body for the WAF");
    }
    let held = read_back(spool.file, spool.written).await?;
    *body = Some(concat(concat(held, Some(piece)), past_limit));
    Ok(())
}

/// Refuses a request already on its way to the backend: the error stops the proxying, and
/// `fail_to_proxy` sends `answer`.
fn refuse(ctx: &mut RequestCtx, answer: LocalAnswer, why: &'static str) -> pingora::Result<()> {
    ctx.refused_with = Some(answer);
    Err(Error::explain(ErrorType::HTTPStatus(answer.status()), why))
}

fn concat(head: Bytes, tail: Option<Bytes>) -> Bytes {
    match tail {
        None => head,
        Some(tail) if head.is_empty() => tail,
        Some(tail) => {
            let mut whole = BytesMut::with_capacity(head.len() + tail.len());
            whole.extend_from_slice(&head);
            whole.extend_from_slice(&tail);
            whole.freeze()
        }
    }
}

/// The verdict's consequences: logs, counts, and the answer when the request is refused.
fn judge(
    ctx: &RequestCtx,
    app: &str,
    policy: &WafPolicy,
    allowed: Duration,
    verdict: Result<Verdict, PoolRefusal>,
) -> Option<LocalAnswer> {
    let verdict = match verdict {
        Ok(verdict) => verdict,
        Err(refusal) => {
            log::warn!(
                "request {}: app {app}: WAF inspection {} ({} ms allowed); {}",
                ctx.request_id,
                match refusal {
                    PoolRefusal::Full => "refused, the worker pool is full",
                    PoolRefusal::TimedOut => "missed its deadline",
                },
                allowed.as_millis(),
                match policy.on_overload {
                    WafOverload::Open => "passed uninspected",
                    WafOverload::Closed => "answered 503",
                }
            );
            return overloaded(app, policy.on_overload);
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
    blocked.then_some(LocalAnswer::WafBlocked)
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

fn declared_length(session: &Session) -> Option<u64> {
    session
        .req_header()
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// The whole (small) body. Reading it here makes Pingora replay it to the backend from its
/// buffer.
async fn read_small_body(session: &mut Session) -> pingora::Result<Bytes> {
    session.enable_retry_buffering();
    let mut body = BytesMut::new();
    while let Some(chunk) = session.read_request_body().await? {
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// Disk the spools of all requests may use at once.
#[derive(Debug)]
struct SpoolBudget {
    settings: SpoolSettings,
    used: AtomicU64,
}

impl SpoolBudget {
    fn reserve(&self, bytes: u64) -> bool {
        let reserved = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes)
                    .filter(|&total| total <= self.settings.budget_bytes)
            })
            .is_ok();
        if reserved {
            metrics::WAF_SPOOL_BYTES.add(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        reserved
    }

    fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        metrics::WAF_SPOOL_BYTES.sub(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
}

/// The part of the spool budget one request holds, given back when it is dropped (the body
/// sent on, refused, or the request gone).
struct Reservation {
    budget: Arc<SpoolBudget>,
    /// The most this request has written.
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

/// One request's body on its way to inspection.
pub(crate) struct BodySpool {
    /// The request without its body, kept to be inspected with it.
    request: OwnedRequest,
    policy: WafPolicy,
    reservation: Reservation,
    /// Made on the first piece, in the spool directory, already unlinked.
    file: Option<Arc<File>>,
    /// Bytes of the body in the file.
    written: u64,
}

impl std::fmt::Debug for BodySpool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodySpool")
            .field("written", &self.written)
            .field("reserved", &self.reservation.bytes)
            .finish_non_exhaustive()
    }
}

impl BodySpool {
    /// Writes `piece` after what is spooled, off the event loop.
    async fn append(&mut self, piece: Bytes) -> Result<(), String> {
        let end = self.written + piece.len() as u64;
        let budget = &self.reservation.budget;
        if end > self.reservation.bytes {
            if !budget.reserve(end - self.reservation.bytes) {
                return Err(format!(
                    "the spool is full ({} KiB in use of {} KiB)",
                    budget.used.load(Ordering::Relaxed) >> 10,
                    budget.settings.budget_bytes >> 10
                ));
            }
            self.reservation.bytes = end;
        }
        let file = self.file.clone();
        let dir = budget.settings.dir.clone();
        let offset = self.written;
        let file = tokio::task::spawn_blocking(move || -> std::io::Result<Arc<File>> {
            let file = match file {
                Some(file) => file,
                None => Arc::new(tempfile::tempfile_in(&dir)?),
            };
            file.write_all_at(&piece, offset)?;
            Ok(file)
        })
        .await
        .map_err(|e| format!("the spool writer failed: {e}"))?
        .map_err(|e| {
            format!(
                "cannot write in {}: {e}",
                self.reservation.budget.settings.dir.display()
            )
        })?;
        self.file = Some(file);
        self.written = end;
        Ok(())
    }
}

/// The first `written` bytes of a spool file, read back in one piece to be sent on.
async fn read_back(file: Option<Arc<File>>, written: u64) -> pingora::Result<Bytes> {
    let Some(file) = file else {
        return Ok(Bytes::new());
    };
    let length = written as usize;
    tokio::task::spawn_blocking(move || -> std::io::Result<Bytes> {
        let mut body = vec![0u8; length];
        file.read_exact_at(&mut body, 0)?;
        Ok(Bytes::from(body))
    })
    .await
    .map_err(|e| Error::because(ErrorType::InternalError, "WAF spool reader", e))?
    .map_err(|e| Error::because(ErrorType::InternalError, "reading the WAF spool", e))
}

/// The body as the worker thread gets it.
enum BodyCopy {
    Absent,
    Bytes(Bytes),
    Spooled(Arc<File>),
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
    body: BodyCopy,
}

impl OwnedRequest {
    fn of(session: &Session, body: BodyCopy) -> Self {
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
            body: match &self.body {
                BodyCopy::Absent => Body::Absent,
                BodyCopy::Bytes(bytes) => Body::Bytes(bytes),
                BodyCopy::Spooled(file) => Body::Spooled(file),
            },
        }
    }
}

//! Stage waf: requests of apps with a `waf` option are inspected with the OWASP Core Rule Set
//! on the worker pool.
//!
//! Small bodies (a declared length within 64 KiB and the app's `max_body_bytes`) are read
//! first and inspected with the request before anything else is done for it, then sent to
//! the backend from the copy read. Larger bodies, and bodies of unknown length, are
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
//!
//! One module, entered by the pipeline in two phases: `policy_of` in the request phase
//! (whether the request will wait for the pool), `inspect::inspect` in the body phase (the
//! body pulled from the client, inspected and held back). This file holds the decisions
//! (what to inspect when, the verdict, the spool).

pub(crate) mod inspect;

use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header;
use parking_lot::RwLock;
use switchyard_model::{Waf as WafPolicy, WafMode, WafOverload};
use switchyard_waf::{Body, Request, RuleFiles, Verdict, Waf, WafError};

use crate::byte_budget::ByteBudget;
use crate::context::RequestCtx;
use crate::isolation::worker_pool::{PoolRefusal, WorkerPool};
use crate::metrics;
use crate::respond::Reason;

/// Bodies of a declared length up to this are read into memory and inspected before the
/// request goes on (a small upload in one piece; the WAF of nginx reads as much in memory).
pub(crate) const IN_MEMORY_BODY: u64 = 64 * 1024;

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
    reloads: Reloads,
    pool: Arc<WorkerPool>,
    spool: Arc<SpoolBudget>,
}

/// Which reload the rules in use come from, for the fleet's announcements of reloads.
#[derive(Debug, Default)]
struct Reloads {
    /// The id of the last reload made or followed here (0: none yet).
    last: AtomicU64,
    /// A load announced by the fleet is waiting for the one under way.
    waiting: AtomicBool,
    /// Held by the load under way.
    loading: parking_lot::Mutex<()>,
}

#[derive(Debug, Clone, Copy)]
enum ReloadOrigin {
    /// This router's admin API.
    Api,
    /// Another router's, announced through the store.
    Fleet,
}

impl ReloadOrigin {
    fn label(self) -> &'static str {
        match self {
            Self::Api => "api",
            Self::Fleet => "fleet",
        }
    }
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
            reloads: Reloads::default(),
            pool,
            spool: Arc::new(SpoolBudget {
                bytes: ByteBudget::new(spool.budget_bytes, metrics::WAF_SPOOL_BYTES.clone()),
                settings: spool,
            }),
        })
    }

    /// Rules loaded.
    pub fn rule_count(&self) -> usize {
        self.waf.read().rule_count()
    }

    /// Loads the rule files again (a changed exclusion or custom rule) and swaps them in
    /// without a restart, for this router's admin API. Blocking: a full load takes about a
    /// tenth of a second. On an error the rules in use stay. Returns the rule count and the
    /// id under which the reload is announced to the fleet ([`Change::WafReload`]), which
    /// this router then does not load a second time.
    ///
    /// [`Change::WafReload`]: switchyard_model::Change::WafReload
    pub fn reload_here(&self) -> Result<(usize, u64), WafError> {
        let count = self.load_again(ReloadOrigin::Api)?;
        let id = rand::random::<u64>();
        self.reloads.last.store(id, Ordering::Release);
        Ok((count, id))
    }

    /// A reload announced to the fleet: loads the rule files again on a blocking thread,
    /// unless the rules in use come from that very reload (this router made it, or heard
    /// it already). At most one load waits behind the one under way: it reads the files
    /// as they are when it starts, which covers every announcement made before.
    pub fn follow_reload(self: &Arc<Self>, id: u64) {
        if self.reloads.last.swap(id, Ordering::AcqRel) == id
            || self.reloads.waiting.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let inspector = self.clone();
        tokio::task::spawn_blocking(move || {
            let _one_at_a_time = inspector.reloads.loading.lock();
            inspector.reloads.waiting.store(false, Ordering::Release);
            if let Err(e) = inspector.load_again(ReloadOrigin::Fleet) {
                log::error!(
                    "the WAF reload announced to the fleet does not load here; the rules in \
                     use stay: {e}"
                );
            }
        });
    }

    fn load_again(&self, origin: ReloadOrigin) -> Result<usize, WafError> {
        let loaded = Waf::load(&self.files);
        let result = if loaded.is_ok() { "loaded" } else { "refused" };
        metrics::WAF_RELOADS
            .with_label_values(&[origin.label(), result])
            .inc();
        let fresh = Arc::new(loaded?);
        let count = fresh.rule_count();
        *self.waf.write() = fresh;
        log::info!("WAF rules reloaded ({}): {count} rules", origin.label());
        Ok(count)
    }

    /// A spool for the body of `request`, drawing on the shared disk budget.
    pub(crate) fn start_spool(&self, request: OwnedRequest, policy: WafPolicy) -> BodySpool {
        BodySpool {
            request,
            policy,
            reservation: Reservation {
                budget: self.spool.clone(),
                bytes: 0,
            },
            file: None,
            written: 0,
        }
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

/// The app's WAF policy, when its requests are inspected.
pub(crate) fn policy_of(ctx: &RequestCtx) -> Option<WafPolicy> {
    ctx.route.as_ref().and_then(|route| route.app.waf)
}

/// How a protected request's body is inspected, decided from its head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyInspection {
    /// No body, or none to inspect (`max_body_bytes` 0, counted as uninspected): the head
    /// is inspected alone.
    None,
    /// A declared length within memory's share: read whole, inspected with the head.
    InMemory,
    /// Larger, or of unknown length: the head alone first (block mode), then the body
    /// spooled up to `max_body_bytes` and inspected before any of it goes on.
    Spooled,
}

/// The way `policy` inspects a body; `declared` is its Content-Length.
pub(crate) fn body_inspection(
    app: &str,
    policy: &WafPolicy,
    has_body: bool,
    declared: Option<u64>,
) -> BodyInspection {
    if !has_body {
        BodyInspection::None
    } else if policy.max_body_bytes == 0 {
        metrics::WAF_BODY_UNINSPECTED
            .with_label_values(&[app])
            .inc();
        BodyInspection::None
    } else if declared.is_some_and(|n| n <= IN_MEMORY_BODY.min(policy.max_body_bytes)) {
        BodyInspection::InMemory
    } else {
        BodyInspection::Spooled
    }
}

/// Inspects `request` (with whatever body it carries) and judges: the answer when the
/// request is refused. Without a rule set, the app's `on_overload` decides.
pub(crate) async fn inspect_now(
    ctx: &RequestCtx,
    inspector: Option<&Inspector>,
    policy: WafPolicy,
    request: OwnedRequest,
) -> Option<Reason> {
    let app = ctx.app_name();
    let Some(inspector) = inspector else {
        report_no_waf(app);
        return overloaded(app, policy.on_overload);
    };
    let (allowed, verdict) = run_within_allowance(ctx, inspector, &policy, request).await;
    judge(ctx, app, &policy, allowed, verdict)
}

/// Runs the inspection within what the app's `timeout_ms` leaves the request once the time
/// it was held is taken off (`heavy_allowance`): that time, and the verdict.
async fn run_within_allowance(
    ctx: &RequestCtx,
    inspector: &Inspector,
    policy: &WafPolicy,
    request: OwnedRequest,
) -> (Duration, Result<Verdict, PoolRefusal>) {
    let allowed = ctx
        .weight
        .heavy_allowance(Duration::from_millis(policy.timeout_ms));
    let verdict = inspector
        .run(request, policy.paranoia, Instant::now() + allowed)
        .await;
    (allowed, verdict)
}

/// Before a large body is read: the head alone, when a match could refuse the request.
/// Only a block is acted on; anything else waits for the body's inspection.
pub(crate) async fn refuse_on_head(
    ctx: &RequestCtx,
    inspector: &Inspector,
    policy: WafPolicy,
    request: OwnedRequest,
) -> Option<Reason> {
    if policy.mode != WafMode::Block {
        return None;
    }
    let (allowed, verdict) = run_within_allowance(ctx, inspector, &policy, request).await;
    match verdict {
        Ok(verdict) if verdict.block_status.is_some() => {
            judge(ctx, ctx.app_name(), &policy, allowed, Ok(verdict))
        }
        _ => None,
    }
}

/// Why a spooled body does not go on.
#[derive(Debug)]
pub(crate) enum SpoolRefusal {
    /// Refused by the rules, or by `on_overload` (no room, inspection overloaded).
    Answer(Reason),
    /// What was spooled could not be read back.
    Unreadable(std::io::Error),
}

/// The verdict's consequences: logs, counts, and the answer when the request is refused.
fn judge(
    ctx: &RequestCtx,
    app: &str,
    policy: &WafPolicy,
    allowed: Duration,
    verdict: Result<Verdict, PoolRefusal>,
) -> Option<Reason> {
    let verdict = match verdict {
        Ok(verdict) => verdict,
        Err(refusal) => {
            log::warn!(
                "request {}: app {app}: WAF inspection {} ({} ms allowed); {}",
                ctx.request_id,
                match refusal {
                    PoolRefusal::Full => "refused, the worker pool is full",
                    PoolRefusal::WouldMissDeadline => {
                        "refused, the work queued ahead would make it miss its deadline"
                    }
                    PoolRefusal::Shed => {
                        "shed from the queue, the work that came to be ahead of it would \
                         have made it miss its deadline"
                    }
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
    blocked.then_some(Reason::WafBlocked)
}

fn overloaded(app: &str, policy: WafOverload) -> Option<Reason> {
    let (result, answer) = match policy {
        WafOverload::Open => ("overload_passed", None),
        WafOverload::Closed => ("overload_refused", Some(Reason::WafOverloaded)),
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

/// Disk the spools of all requests may use at once, and where they are.
#[derive(Debug)]
struct SpoolBudget {
    settings: SpoolSettings,
    bytes: ByteBudget,
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
        self.budget.bytes.release(self.bytes);
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
    /// Cuts `piece` at `max_body_bytes`: what lies past it is returned, to go on
    /// uninspected.
    pub(crate) fn split_past_limit(&self, piece: &mut Bytes) -> Option<Bytes> {
        let room = self.policy.max_body_bytes.saturating_sub(self.written);
        (piece.len() as u64 > room).then(|| piece.split_off(room as usize))
    }

    /// The body is in (or `max_body_bytes` of it, `past_limit` telling that more came):
    /// inspects it from the file and judges ([`inspect_spooled`]); what was spooled, read
    /// back, when it may go on.
    pub(crate) async fn finish(
        self,
        ctx: &RequestCtx,
        inspector: &Inspector,
        past_limit: bool,
    ) -> Result<Bytes, SpoolRefusal> {
        let Self {
            request,
            policy,
            reservation,
            file,
            written,
        } = self;
        let body = file.clone().map(|file| (file, written));
        let refused = inspect_spooled(ctx, inspector, policy, request, body, past_limit).await;
        if let Some(answer) = refused {
            return Err(SpoolRefusal::Answer(answer));
        }
        let held = read_back(file, written).await;
        drop(reservation);
        held.map_err(SpoolRefusal::Unreadable)
    }

    /// The spool could not take a piece (disk budget, a write error): `on_overload`
    /// decides between sending on what was held back, uninspected, and 503.
    pub(crate) async fn give_up(self, ctx: &RequestCtx) -> Result<Bytes, SpoolRefusal> {
        if let Some(answer) = overloaded(ctx.app_name(), self.policy.on_overload) {
            return Err(SpoolRefusal::Answer(answer));
        }
        read_back(self.file, self.written)
            .await
            .map_err(SpoolRefusal::Unreadable)
    }

    /// Writes `piece` after what is spooled, off the event loop.
    pub(crate) async fn append(&mut self, piece: Bytes) -> Result<(), String> {
        let end = self.written + piece.len() as u64;
        let budget = &self.reservation.budget;
        if end > self.reservation.bytes {
            if !budget.bytes.reserve(end - self.reservation.bytes) {
                return Err(format!(
                    "the spool is full ({} KiB in use of {} KiB)",
                    budget.bytes.used() >> 10,
                    budget.bytes.limit() >> 10
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

/// Inspects a request whose body request buffering spooled: the rules read the first
/// `max_body_bytes` of its file where it is (no spool of the WAF's own, nothing read back:
/// the body goes on from the same file). The answer when the request is refused.
pub(crate) async fn inspect_buffered_spool(
    ctx: &RequestCtx,
    inspector: &Inspector,
    policy: WafPolicy,
    request: OwnedRequest,
    file: Arc<File>,
    length: u64,
) -> Option<Reason> {
    let inspected = length.min(policy.max_body_bytes);
    let past_limit = inspected < length;
    inspect_spooled(
        ctx,
        inspector,
        policy,
        request,
        Some((file, inspected)),
        past_limit,
    )
    .await
}

/// Inspects `request` with the first bytes of a file as its body (`None`: no body came)
/// and judges; `past_limit`: more came than the rules see (counted). The CRS takes time in
/// proportion to the body (about 1.4 ms per KiB of form here), so a spooled body gets
/// `timeout_ms` per 64 KiB inspected.
async fn inspect_spooled(
    ctx: &RequestCtx,
    inspector: &Inspector,
    policy: WafPolicy,
    mut request: OwnedRequest,
    body: Option<(Arc<File>, u64)>,
    past_limit: bool,
) -> Option<Reason> {
    let app = ctx.app_name();
    if past_limit {
        metrics::WAF_BODY_UNINSPECTED
            .with_label_values(&[app])
            .inc();
    }
    let inspected = body.as_ref().map_or(0, |(_, length)| *length);
    let pieces = inspected.div_ceil(IN_MEMORY_BODY).max(1);
    let allowed = ctx.weight.heavy_allowance(Duration::from_millis(
        policy.timeout_ms.saturating_mul(pieces),
    ));
    request.body = body.map_or(BodyCopy::Absent, |(file, length)| {
        BodyCopy::Spooled(file, length)
    });
    let verdict = inspector
        .run(request, policy.paranoia, Instant::now() + allowed)
        .await;
    judge(ctx, app, &policy, allowed, verdict)
}

/// The first `written` bytes of a spool file, read back in one piece to be sent on.
async fn read_back(file: Option<Arc<File>>, written: u64) -> std::io::Result<Bytes> {
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
    .map_err(std::io::Error::other)?
}

/// The body as the worker thread gets it.
#[derive(Clone)]
enum BodyCopy {
    Absent,
    Bytes(Bytes),
    /// The first bytes of a file.
    Spooled(Arc<File>, u64),
}

/// Where a request came from and where it arrived, as the rules see them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Endpoints {
    pub(crate) client: Option<SocketAddr>,
    pub(crate) server_port: u16,
}

/// What the worker thread needs, copied off the request.
#[derive(Clone)]
pub(crate) struct OwnedRequest {
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
    /// The request's head, as the client sent it, without its body.
    pub(crate) fn head_only(head: &http::request::Parts, endpoints: Endpoints) -> Self {
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = head
            .headers
            .iter()
            .map(|(name, value)| (name.as_str().as_bytes().to_vec(), value.as_bytes().to_vec()))
            .collect();
        // HTTP/2 carries the host in `:authority`; the rules look for a Host header.
        if !head.headers.contains_key(header::HOST) {
            if let Some(authority) = head.uri.authority() {
                headers.push((b"host".to_vec(), authority.as_str().as_bytes().to_vec()));
            }
        }
        Self {
            client_ip: endpoints
                .client
                .map_or_else(String::new, |a| a.ip().to_string()),
            client_port: endpoints.client.map_or(0, |a| a.port()),
            server_port: endpoints.server_port,
            method: head.method.as_str().to_string(),
            uri: head
                .uri
                .path_and_query()
                .map_or("/", |pq| pq.as_str())
                .to_string(),
            http_version: match head.version {
                http::Version::HTTP_2 => "2.0",
                http::Version::HTTP_3 => "3.0",
                http::Version::HTTP_10 => "1.0",
                _ => "1.1",
            },
            headers,
            body: BodyCopy::Absent,
        }
    }

    /// The same request with its whole body.
    pub(crate) fn with_body(mut self, body: Bytes) -> Self {
        self.body = BodyCopy::Bytes(body);
        self
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
                BodyCopy::Spooled(file, length) => Body::Spooled(file, *length),
            },
        }
    }
}

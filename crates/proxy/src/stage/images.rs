//! Stage images: `GET {prefix}{width}x{height}/{path}` of an app with the `images` option
//! answers the original at `/{path}` resized. The original comes from the app's static root
//! when a file is there, else from one of its backends (over a connection pool of its
//! own, with the client's requests' attempts: a backend that cannot be reached is marked
//! down and another tried within the app's `retries`, and the connection is in the table
//! a drain reads); the resize runs on the worker pool under the app's deadline. Query: `fit=contain`
//! (default) or `cover`, `format=jpeg|png|webp` (default: the original's).
//!
//! Outcomes: a malformed or over-limit request is 400; an original that is not a usable
//! image (or over `max_source_bytes`) 422; an original the app does not answer with 200 keeps
//! the app's status; a pool that is full or too slow 503 with `Retry-After`.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Version};
use http_body_util::{BodyExt, Empty};
use switchyard_model::Images;
use tokio::io::AsyncReadExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::app_files;
use crate::context::RequestCtx;
use crate::forwarded;
use crate::isolation::worker_pool::{PoolRefusal, WorkerPool};
use crate::metrics;
use crate::respond::{Reason, Refusal};
use crate::routing::connections::{ConnectionTable, ShutdownRequest};
use crate::thumbnail::{self, Encoding, Fit, Resize};
use crate::upstream::attempt::{self, SideConnectFailure};
use crate::upstream::outbound::{ConnectError, SideBody, SideConnection, SidePool};

/// Idle connections kept to backends for fetching originals, per thread, all apps together.
const FETCH_POOL_SIZE: usize = 256;
/// Resize requests under way (fetching or resizing) per worker thread, all apps together.
/// Each holds its original in memory (up to the app's `max_source_bytes`), and one the pool
/// could not start before its deadline would have been fetched for nothing; the others wait
/// for a place (holding nothing but their connection) until their deadline.
const IN_FLIGHT_PER_WORKER: usize = 8;
/// Requests waiting for a place, per place; past that they are refused at once with 503.
const WAITING_PER_PLACE: usize = 64;

/// What the images stage needs from the router: the admission shared by all threads and
/// this thread's own connections.
pub(crate) struct ImageStage {
    admission: Arc<Admission>,
    originals: SidePool,
}

/// The worker pool and the bound on resize requests under way, for all threads together.
struct Admission {
    pool: Arc<WorkerPool>,
    places: Arc<Semaphore>,
    waiting: AtomicUsize,
    max_waiting: usize,
}

impl ImageStage {
    pub(crate) fn new(pool: Arc<WorkerPool>) -> Self {
        let places = pool.threads() * IN_FLIGHT_PER_WORKER;
        Self {
            admission: Arc::new(Admission {
                pool,
                places: Arc::new(Semaphore::new(places)),
                waiting: AtomicUsize::new(0),
                max_waiting: places * WAITING_PER_PLACE,
            }),
            originals: originals_pool(),
        }
    }

    /// The stage for another thread: the same admission, its own idle connections (a
    /// connection pooled by one thread and reused by another is the churn bench/ENGINE.md
    /// describes).
    pub(crate) fn for_another_thread(&self) -> Self {
        Self {
            admission: self.admission.clone(),
            originals: originals_pool(),
        }
    }

    /// Closes this thread's connections for originals idle for too long.
    pub(crate) fn sweep_idle(&self) {
        self.originals.sweep();
    }

    /// A place among the requests under way, if the pool would take its task now.
    async fn admit(&self, deadline: Instant) -> Result<OwnedSemaphorePermit, PoolRefusal> {
        let place = self.wait_for_place(deadline).await?;
        // Refused before its original is fetched: beside an overloaded pool the event loops
        // would otherwise spend their time fetching originals only to have them refused.
        match self.admission.pool.refuses_now("images", deadline) {
            Some(refusal) => Err(refusal),
            None => Ok(place),
        }
    }

    /// A place, waiting for one until `deadline`; refused at once when too many already wait
    /// or the wait would pass the deadline, and timed out when it passes all the same.
    async fn wait_for_place(&self, deadline: Instant) -> Result<OwnedSemaphorePermit, PoolRefusal> {
        let admission = &self.admission;
        if let Ok(place) = admission.places.clone().try_acquire_owned() {
            return Ok(place);
        }
        // Counted while waiting, also if the request is dropped mid-wait.
        let waiting = Waiting::enter(&admission.waiting);
        // Refused now rather than at the deadline: too many wait, or the resizes they
        // and the pool's queue stand for would end past it.
        if waiting.ahead >= admission.max_waiting {
            return Err(PoolRefusal::Full);
        }
        if admission
            .pool
            .would_miss("images", waiting.ahead + 1, deadline)
        {
            return Err(PoolRefusal::WouldMissDeadline);
        }
        match tokio::time::timeout_at(deadline.into(), admission.places.clone().acquire_owned())
            .await
        {
            Ok(Ok(place)) => Ok(place),
            // The semaphore is never closed; a closed one could not admit anyone either.
            Ok(Err(_)) => Err(PoolRefusal::Full),
            Err(_) => Err(PoolRefusal::TimedOut),
        }
    }
}

fn originals_pool() -> SidePool {
    SidePool::new(
        FETCH_POOL_SIZE,
        metrics::SIDE_IDLE_CONNECTIONS.with_label_values(&["images"]),
    )
}

/// One request waiting for a place.
struct Waiting<'a> {
    count: &'a AtomicUsize,
    /// Requests that were waiting already.
    ahead: usize,
}

impl<'a> Waiting<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        let ahead = count.fetch_add(1, Ordering::AcqRel);
        Self { count, ahead }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A resize request, parsed from the path and query.
#[derive(Debug, PartialEq, Eq)]
struct Asked {
    resize: Resize,
    original_path: String,
}

/// What the stage answers a resize request with.
pub(crate) enum ImageAnswer {
    /// The resized image.
    Resized {
        content_type: &'static str,
        body: Bytes,
        /// The original's `Cache-Control`, passed on.
        cache_control: Option<String>,
    },
    /// A refusal: 400, 422, the app's status for the original, 503 (from an overloaded
    /// pool, with a `Retry-After`).
    Refused(Refusal),
}

/// Whether the request asks its app's images option for a resized image.
pub(crate) fn wants_resize(ctx: &RequestCtx, request: &http::request::Parts) -> bool {
    ctx.route
        .as_ref()
        .and_then(|route| route.app.images.as_ref())
        .is_some_and(|images| {
            (request.method == Method::GET || request.method == Method::HEAD)
                && request.uri.path().starts_with(&images.prefix)
        })
}

/// The answer to `request` when it asks for a resized image of an app with the `images`
/// option; `None` for every other request.
pub(crate) async fn resize_for(
    stage: Option<&ImageStage>,
    connections: &Arc<ConnectionTable>,
    ctx: &mut RequestCtx,
    request: &http::request::Parts,
    client_ip: Option<IpAddr>,
) -> Option<ImageAnswer> {
    if !wants_resize(ctx, request) {
        return None;
    }
    let route = ctx.route.clone()?;
    let images = route.app.images.as_ref()?;
    let app = route.app.name.as_str();
    let refused =
        |reason: Reason, text: String| ImageAnswer::Refused(Refusal::explained(reason, text));
    let asked = match parse(images, request.uri.path(), request.uri.query()) {
        Ok(asked) => asked,
        Err(reason) => {
            count(app, "bad_request");
            return Some(refused(Reason::ImageBadRequest, reason));
        }
    };
    let Some(stage) = stage else {
        count(app, "overloaded");
        return Some(ImageAnswer::Refused(Reason::ImagesUnavailable.into()));
    };
    let deadline = Instant::now()
        + ctx
            .weight
            .heavy_allowance(Duration::from_millis(images.timeout_ms));
    let _place = match stage.admit(deadline).await {
        Ok(place) => place,
        Err(refusal) => return Some(refuse_for_now(app, refusal)),
    };
    let fetched = fetch_original(
        stage,
        connections,
        client_ip,
        ctx,
        images,
        &asked.original_path,
    );
    let original = match fetched.await {
        Ok(original) => original,
        Err(failure) => {
            count(app, failure.label);
            return Some(ImageAnswer::Refused(failure.refusal));
        }
    };
    let resize = asked.resize;
    let pieces = original.pieces;
    let outcome = stage
        .admission
        .pool
        .run("images", deadline, move || {
            thumbnail::resize(&joined(pieces), resize)
        })
        .await;
    let resized = match outcome {
        Ok(Ok(resized)) => resized,
        Ok(Err(unprocessable)) => {
            count(app, "unprocessable");
            log::info!(
                "request {}: app {app}: image {} not resized: {unprocessable}",
                ctx.request_id,
                asked.original_path
            );
            return Some(refused(
                Reason::ImageUnprocessable,
                unprocessable.to_string(),
            ));
        }
        Err(refusal) => return Some(refuse_for_now(app, refusal)),
    };
    count(app, "resized");
    log::debug!(
        "request {}: app {app}: {} resized to {}x{} ({} bytes)",
        ctx.request_id,
        asked.original_path,
        resized.width,
        resized.height,
        resized.bytes.len()
    );
    Some(ImageAnswer::Resized {
        content_type: resized.encoding.content_type(),
        body: Bytes::from(resized.bytes),
        cache_control: original.cache_control,
    })
}

/// 503 with `Retry-After`: no place among the requests under way, a full pool queue, or a
/// missed deadline.
fn refuse_for_now(app: &str, refusal: PoolRefusal) -> ImageAnswer {
    count(app, "overloaded");
    ImageAnswer::Refused(match refusal {
        PoolRefusal::Full | PoolRefusal::WouldMissDeadline | PoolRefusal::Shed => {
            Reason::ImageWorkersBusy.into()
        }
        PoolRefusal::TimedOut => Refusal::explained(
            Reason::ImageWorkersBusy,
            "the image could not be resized in time, try again shortly".into(),
        ),
    })
}

fn count(app: &str, result: &str) {
    metrics::IMAGE_REQUESTS
        .with_label_values(&[app, result])
        .inc();
}

/// `{width}x{height}/{path}` after the prefix, and the query's `fit` and `format`.
fn parse(images: &Images, path: &str, query: Option<&str>) -> Result<Asked, String> {
    let rest = &path[images.prefix.len()..];
    let (size, original) = rest
        .split_once('/')
        .ok_or_else(|| format!("expected {}WIDTHxHEIGHT/PATH", images.prefix))?;
    let (width, height) = size
        .split_once('x')
        .ok_or_else(|| format!("size {size:?} is not WIDTHxHEIGHT"))?;
    let side = |text: &str, limit: u32, name: &str| -> Result<u32, String> {
        match text.parse::<u32>() {
            Ok(n) if text.len() <= 5 && (1..=limit).contains(&n) => Ok(n),
            _ => Err(format!("{name} must be a whole number from 1 to {limit}")),
        }
    };
    let width = side(width, images.max_width, "width")?;
    let height = side(height, images.max_height, "height")?;
    if original.is_empty() {
        return Err("the original's path is missing".into());
    }
    let (mut fit, mut encoding) = (Fit::Contain, None);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=').unwrap_or((pair, "")) {
            ("fit", "contain") => fit = Fit::Contain,
            ("fit", "cover") => fit = Fit::Cover,
            ("fit", other) => return Err(format!("fit {other:?} must be contain or cover")),
            ("format", name) => {
                encoding = Some(
                    Encoding::from_name(name)
                        .ok_or_else(|| format!("format {name:?} must be jpeg, png or webp"))?,
                )
            }
            // Other parameters (cache busters) are the client's own.
            _ => {}
        }
    }
    Ok(Asked {
        resize: Resize {
            width,
            height,
            fit,
            encoding,
            quality: images.quality,
        },
        original_path: format!("/{original}"),
    })
}

struct Original {
    /// The original as it arrived: joined on the pool, not on an event loop, where copying
    /// half a megabyte per thumbnail was the loops' largest cost beside busy image clients.
    /// The pieces keep hyper's read buffers alive: at most `max_source_bytes` of data plus
    /// the unused end of the last buffer (hyper's client reads at most 408 KiB at a time).
    pieces: Vec<Bytes>,
    cache_control: Option<String>,
}

/// The pieces of an original in one buffer; a single piece is taken as it is.
fn joined(pieces: Vec<Bytes>) -> Bytes {
    match <[Bytes; 1]>::try_from(pieces) {
        Ok([piece]) => piece,
        Err(pieces) => pieces.concat().into(),
    }
}

/// Why an original could not be had: the refusal the client gets, and the result label
/// `switchyard_image_requests_total` counts.
struct FetchFailure {
    refusal: Refusal,
    label: &'static str,
}

impl FetchFailure {
    fn new(reason: Reason, text: impl Into<String>, label: &'static str) -> Self {
        Self {
            refusal: Refusal::explained(reason, text.into()),
            label,
        }
    }

    fn too_large(limit: u64) -> Self {
        Self::new(
            Reason::ImageUnprocessable,
            format!("the original is larger than max_source_bytes ({limit})"),
            "unprocessable",
        )
    }
}

async fn fetch_original(
    stage: &ImageStage,
    connections: &Arc<ConnectionTable>,
    client_ip: Option<IpAddr>,
    ctx: &mut RequestCtx,
    images: &Images,
    path: &str,
) -> Result<Original, FetchFailure> {
    if let Some(original) = from_static_root(ctx, images, path).await? {
        return Ok(original);
    }
    from_backend(stage, connections, client_ip, ctx, images, path).await
}

async fn from_static_root(
    ctx: &RequestCtx,
    images: &Images,
    path: &str,
) -> Result<Option<Original>, FetchFailure> {
    let Some(root) = ctx.route.as_ref().and_then(|r| r.app.static_root.clone()) else {
        return Ok(None);
    };
    let Some(relative) = app_files::relative_path(path) else {
        return Ok(None);
    };
    let Some((file, length, _)) =
        app_files::open_under(std::path::Path::new(&root), &relative).await
    else {
        return Ok(None);
    };
    if length > images.max_source_bytes {
        return Err(FetchFailure::too_large(images.max_source_bytes));
    }
    let mut body = Vec::with_capacity(length as usize);
    file.take(images.max_source_bytes + 1)
        .read_to_end(&mut body)
        .await
        .map_err(|e| {
            FetchFailure::new(
                Reason::ImageOriginalUnreadable,
                format!("cannot read the original: {e}"),
                "fetch_failed",
            )
        })?;
    if body.len() as u64 > images.max_source_bytes {
        return Err(FetchFailure::too_large(images.max_source_bytes));
    }
    Ok(Some(Original {
        pieces: vec![Bytes::from(body)],
        cache_control: None,
    }))
}

async fn from_backend(
    stage: &ImageStage,
    connections: &Arc<ConnectionTable>,
    client_ip: Option<IpAddr>,
    ctx: &mut RequestCtx,
    images: &Images,
    path: &str,
) -> Result<Original, FetchFailure> {
    let (connect_timeout, read_timeout) =
        ctx.route
            .as_ref()
            .map_or((Duration::from_secs(5), Duration::from_secs(60)), |route| {
                let timeouts = &route.app.timeouts;
                (
                    Duration::from_millis(timeouts.connect_ms),
                    Duration::from_millis(timeouts.read_ms),
                )
            });
    let request = original_request(ctx, client_ip, path)?;
    // As the client's own requests go: a backend that cannot be reached is marked down
    // and another tried within the app's retries, and the connection is in the table a
    // drain reads, so a backend removed mid-fetch is let go by its deadline.
    let mut connection = attempt::connect_side(ctx, &stage.originals, connect_timeout)
        .await
        .map_err(|failure| match failure {
            SideConnectFailure::NoBackend(reason) => {
                FetchFailure::new(reason, "the app has no reachable container", "fetch_failed")
            }
            SideConnectFailure::Connect(ConnectError::TimedOut) => late(),
            SideConnectFailure::Connect(e) => unreachable(&e),
        })?;
    let shutdown = Arc::new(ShutdownRequest::default());
    attempt::register_connection(ctx, connections, shutdown.clone());
    let original = tokio::select! {
        original = read_original(request, &mut connection, images, read_timeout) => original,
        () = shutdown.requested() => Err(FetchFailure {
            refusal: Reason::ImageOriginalCut.into(),
            label: "fetch_failed",
        }),
    };
    // The backend is no longer this request's while the image is resized: not counted in
    // flight for it, not found by a drain.
    ctx.release_attempt();
    let original = original?;
    stage.originals.put(connection);
    Ok(original)
}

/// The original could not be had from the app: 502, mapped as every upstream failure is
/// (`Refusal::upstream_failed`), the detail in the log rather than in the client's body.
fn unreachable(e: &dyn std::fmt::Display) -> FetchFailure {
    log::warn!("images: the original could not be fetched: {e}");
    FetchFailure {
        refusal: Refusal::upstream_failed(false),
        label: "fetch_failed",
    }
}

/// The app did not send the original in time: 504, as for any upstream.
fn late() -> FetchFailure {
    FetchFailure {
        refusal: Refusal::upstream_failed(true),
        label: "fetch_failed",
    }
}

/// The request for an original, with the forwarding fields the client's own would carry.
fn original_request(
    ctx: &RequestCtx,
    client_ip: Option<IpAddr>,
    path: &str,
) -> Result<Request<SideBody>, FetchFailure> {
    let mut request = Request::builder()
        .method(Method::GET)
        .uri(path)
        .version(Version::HTTP_11)
        .body(Empty::new().map_err(|never| match never {}).boxed_unsync())
        .map_err(|e| unreachable(&e))?;
    let headers = request.headers_mut();
    if let Some(host) = ctx
        .host
        .as_deref()
        .and_then(|h| HeaderValue::from_str(h).ok())
    {
        headers.insert(http::header::HOST, host);
    }
    headers.insert(http::header::ACCEPT, HeaderValue::from_static("image/*"));
    forwarded::set_forwarded_headers(client_ip, headers, &ctx.hop(http::Version::HTTP_11));
    Ok(request)
}

/// Sends `request` on `connection` and reads the original whole, within `read_timeout`
/// for the answer's head and again for its body.
async fn read_original(
    request: Request<SideBody>,
    connection: &mut SideConnection,
    images: &Images,
    read_timeout: Duration,
) -> Result<Original, FetchFailure> {
    let response = tokio::time::timeout(read_timeout, connection.sender.send_request(request))
        .await
        .map_err(|_| late())?
        .map_err(|e| unreachable(&e))?;
    let status = response.status().as_u16();
    if status != 200 {
        return Err(FetchFailure {
            refusal: Refusal::explained(
                Reason::ImageOriginalRefused,
                format!("the app answered {status} for the original"),
            )
            .with_apps_status(status),
            label: "fetch_failed",
        });
    }
    let declared: Option<u64> = response
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    if declared.is_some_and(|n| n > images.max_source_bytes) {
        return Err(FetchFailure::too_large(images.max_source_bytes));
    }
    let cache_control = response
        .headers()
        .get("cache-control")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut answer = response.into_body();
    // Kept as hyper hands them over (slices of its read buffers, no copy).
    let mut pieces = Vec::new();
    let mut length = 0u64;
    let reading = async {
        while let Some(frame) = answer.frame().await {
            if let Ok(piece) = frame?.into_data() {
                length += piece.len() as u64;
                if length > images.max_source_bytes {
                    return Ok(false);
                }
                pieces.push(piece);
            }
        }
        Ok::<_, hyper::Error>(true)
    };
    let complete = tokio::time::timeout(read_timeout, reading)
        .await
        .map_err(|_| late())?
        .map_err(|e| unreachable(&e))?;
    if !complete {
        return Err(FetchFailure::too_large(images.max_source_bytes));
    }
    Ok(Original {
        pieces,
        cache_control,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn images() -> Images {
        *switchyard_model::parse_app_spec(
            "a",
            &serde_json::json!({"images": {"max_width": 1000, "max_height": 800}}),
        )
        .expect("valid")
        .images
        .expect("images")
    }

    #[test]
    fn sizes_fit_and_format_come_from_the_path_and_query() {
        let asked = parse(
            &images(),
            "/_img/200x100/photos/cat.jpg",
            Some("fit=cover&format=webp&v=3"),
        )
        .expect("valid");
        assert_eq!(asked.original_path, "/photos/cat.jpg");
        assert_eq!((asked.resize.width, asked.resize.height), (200, 100));
        assert_eq!(asked.resize.fit, Fit::Cover);
        assert_eq!(asked.resize.encoding, Some(Encoding::WebP));
        for (path, query) in [
            ("/_img/200/cat.jpg", None),
            ("/_img/200x/cat.jpg", None),
            ("/_img/0x100/cat.jpg", None),
            ("/_img/1001x100/cat.jpg", None),
            ("/_img/100x801/cat.jpg", None),
            ("/_img/-1x100/cat.jpg", None),
            ("/_img/100x100/", None),
            ("/_img/100x100", None),
            ("/_img/100x100/cat.jpg", Some("fit=stretch")),
            ("/_img/100x100/cat.jpg", Some("format=gif")),
        ] {
            assert!(parse(&images(), path, query).is_err(), "{path} {query:?}");
        }
    }

    #[test]
    fn an_original_is_joined_in_order_and_a_single_piece_is_not_copied() {
        let pieces = vec![
            Bytes::from_static(b"\xff\xd8"),
            Bytes::new(),
            Bytes::from_static(b"jpeg"),
        ];
        assert_eq!(&joined(pieces)[..], b"\xff\xd8jpeg");
        let whole = Bytes::from(vec![7u8; 1024]);
        let address = whole.as_ptr();
        assert_eq!(joined(vec![whole]).as_ptr(), address);
    }
}

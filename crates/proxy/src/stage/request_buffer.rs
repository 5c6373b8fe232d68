//! Request buffering: a body is read whole before a backend is chosen and connected, so a
//! slow client (a phone on a bad network, or someone trickling bodies on purpose) never
//! holds one of the app's workers (Puma, Unicorn, gunicorn's sync workers, PHP-FPM) for
//! the length of its upload: the backend gets the body at once, with its length. nginx
//! does this by default (`proxy_request_buffering on`), HAProxy with `option
//! http-buffer-request`.
//!
//! - **Where.** In memory up to `--request-buffer-kb` a request; past that the whole body
//!   goes to an unlinked file in the spool directory (the part in memory written first,
//!   the rest after it through a 256 KiB write-behind, off the event loop). Memory and
//!   spool each draw on a router-wide budget; a body that finds no room is answered 503
//!   with `Retry-After` at once, never made to wait. A body larger than the app's
//!   `max_body_bytes` is 413 where it passes it, as when streamed.
//! - **Deadlines a slow client cannot stretch.** Besides the wait for each read
//!   (`--client-body-timeout-s`), an upload must keep an average pace: after a grace
//!   period it may have taken one second per `min_rate` bytes received (Apache's
//!   mod_reqtimeout counts so), and never more than the whole-body deadline. Past either
//!   it is answered 408. Whatever it held (memory, spool) is given back as it ends.
//! - **Framing.** The backend gets a `Content-Length`: a chunked body of known final size
//!   loses its chunking. Trailers go on where the backend's protocol carries them (HTTP/2)
//!   and are dropped on HTTP/1.1, as they were when streamed and as nginx does.
//! - **`Expect: 100-continue`** is answered by the router itself, when it starts reading
//!   the body (after the head's stages, so a refused request never has its body sent).
//! - **Opt-out.** `"request_buffering": false` on an app, or `streaming_paths` prefixes,
//!   stream as before. An upgrade (WebSocket) has no body to buffer.
//!
//! The body read whole is then the request's body for every stage after: the WAF inspects
//! a body in memory without a copy, the mirror's copy and the backend read the same
//! pieces (`buffered_body`).

use std::cell::Cell;
use std::fs::File;
use std::future::Future as _;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, EXPECT, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderValue};
use http_body::Body as _;
use prometheus::IntCounter;
use tokio::time::Sleep;

use crate::body_read::{poll_with_deadline, BodyError, ReadDeadline};
use crate::buffered_body::{BufferedBody, Stored};
use crate::byte_budget::{BudgetHold, ByteBudget};
use crate::context::RequestCtx;
use crate::metrics;
use crate::request_body::RequestBody;
use crate::respond::{Reason, Refusal};

/// Bytes gathered before each write to a spool file: each write is a hand-off to a
/// blocking thread and back (two context switches and a wake-up of the loop), which perf
/// showed costing more than the copy itself at 64 KiB.
const WRITE_BEHIND: usize = 256 * 1024;

/// The router's settings of request buffering.
#[derive(Debug, Clone)]
pub struct RequestBufferSettings {
    /// Bytes of a body kept in memory; a larger one is spooled.
    pub per_request_bytes: u64,
    /// Bytes all bodies being buffered may hold in memory.
    pub memory_bytes: u64,
    /// Bytes all bodies being buffered may hold in spool files.
    pub spool_bytes: u64,
    /// Where the spool files are made (unlinked at once).
    pub spool_dir: PathBuf,
    /// The pace an upload must keep after its grace period, in bytes a second (0: none).
    pub min_rate: u64,
    /// How long an upload may take before its pace is counted.
    pub grace: Duration,
    /// How long a whole body may take.
    pub deadline: Duration,
}

impl Default for RequestBufferSettings {
    fn default() -> Self {
        Self {
            per_request_bytes: 64 * 1024,
            memory_bytes: 256 << 20,
            spool_bytes: 1 << 30,
            spool_dir: std::env::temp_dir(),
            min_rate: 500,
            grace: Duration::from_secs(20),
            deadline: Duration::from_secs(600),
        }
    }
}

/// Request buffering's settings and budgets, shared by every event loop.
#[derive(Debug)]
pub struct RequestBuffers {
    settings: RequestBufferSettings,
    memory: Arc<ByteBudget>,
    spool: Arc<ByteBudget>,
}

impl RequestBuffers {
    /// The budgets of `settings`, their limits exported.
    pub fn new(settings: RequestBufferSettings) -> Self {
        let gauge = |bytes: u64| i64::try_from(bytes).unwrap_or(i64::MAX);
        metrics::REQUEST_BUFFER_MEMORY_BUDGET.set(gauge(settings.memory_bytes));
        metrics::REQUEST_SPOOL_BUDGET.set(gauge(settings.spool_bytes));
        Self {
            memory: Arc::new(ByteBudget::new(
                settings.memory_bytes,
                metrics::REQUEST_BUFFER_MEMORY.clone(),
            )),
            spool: Arc::new(ByteBudget::new(
                settings.spool_bytes,
                metrics::REQUEST_SPOOL.clone(),
            )),
            settings,
        }
    }
}

/// How a request's body went.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    Memory,
    Spooled,
    Streamed,
    Full,
    TooSlow,
    TimedOut,
    TooLarge,
    Broken,
}

/// The outcomes' labels, in [`Outcome`]'s order.
const OUTCOMES: [&str; 8] = [
    "memory",
    "spooled",
    "streamed",
    "full",
    "too_slow",
    "timed_out",
    "too_large",
    "broken",
];

/// The outcomes' series, looked up once rather than on each body.
static COUNTERS: LazyLock<[IntCounter; 8]> = LazyLock::new(|| {
    OUTCOMES.map(|label| metrics::REQUEST_BUFFER_DECISIONS.with_label_values(&[label]))
});

fn counted(outcome: Outcome) {
    COUNTERS[outcome as usize].inc();
}

/// Reads the body of a request of the route's app whole, unless its path streams: the
/// body is then `incoming`, handed on from memory or the spool, with its length in the
/// head. `read_deadline`: the wait for each read; `bytes_in` counts what came.
pub(crate) async fn read_whole(
    head: &mut http::request::Parts,
    incoming: &mut RequestBody,
    ctx: &mut RequestCtx,
    buffers: &RequestBuffers,
    read_deadline: Duration,
    bytes_in: &Cell<usize>,
) -> Result<(), Refusal> {
    let Some(route) = ctx.route.clone() else {
        return Ok(());
    };
    let app = &route.app;
    if !app.request_buffering.buffers(head.uri.path()) {
        counted(Outcome::Streamed);
        return Ok(());
    }
    let settings = &buffers.settings;
    let pace = Pace {
        started: Instant::now(),
        grace: settings.grace,
        min_rate: (app.request_buffering.min_rate_bytes).unwrap_or(settings.min_rate),
        deadline: (app.request_buffering.deadline_s).map_or(settings.deadline, Duration::from_secs),
        timer: None,
    };
    let limit = (app.limits.as_deref()).and_then(|limits| limits.max_body_bytes);
    // Room for all the body that will stay in memory, when its length is known: grown
    // piece by piece, the buffer would be copied at each doubling.
    let in_memory = ctx
        .declared_length
        .unwrap_or(0)
        .min(settings.per_request_bytes);
    let reading = Reading {
        buffers,
        limit,
        single: None,
        memory: BytesMut::new(),
        expected: in_memory as usize,
        memory_held: BudgetHold::none(buffers.memory.clone()),
        spool: None,
        received: 0,
        trailers: None,
    };
    let body = match reading
        .run(incoming, ReadDeadline::new(read_deadline), pace, bytes_in)
        .await
    {
        Ok(body) => body,
        Err((outcome, reason)) => {
            counted(outcome);
            log::debug!(
                "request {}: its body was not buffered: {outcome:?}",
                ctx.request_id
            );
            return Err(reason.into());
        }
    };
    counted(if body.spooled() {
        Outcome::Spooled
    } else {
        Outcome::Memory
    });
    let length = body.len();
    if ctx.declared_length != Some(length) {
        // Chunked, or an HTTP/2 or HTTP/3 stream without a length: the fields are a map.
        head.headers.remove(TRANSFER_ENCODING);
        head.headers
            .insert(CONTENT_LENGTH, HeaderValue::from(length));
        ctx.declared_length = Some(length);
    }
    // Answered here; the backend gets the body with its head.
    head.headers.remove(EXPECT);
    *incoming = RequestBody::Buffered(Box::new(body));
    Ok(())
}

/// A body being read whole.
struct Reading<'a> {
    buffers: &'a RequestBuffers,
    limit: Option<u64>,
    /// The body's first piece while it is its only one: a body that comes in one piece
    /// (most small ones, read with their head) is kept as it came, with no copy.
    single: Option<Bytes>,
    /// The body while it fits in memory; then what waits to be written to the spool.
    memory: BytesMut,
    /// What of the body will be in memory, when its length is known.
    expected: usize,
    memory_held: BudgetHold,
    spool: Option<Spool>,
    received: u64,
    trailers: Option<HeaderMap>,
}

/// A body past what a request may keep in memory, in its file.
struct Spool {
    file: Arc<File>,
    written: u64,
    held: BudgetHold,
}

type Stopped = (Outcome, Reason);

impl Reading<'_> {
    async fn run(
        mut self,
        incoming: &mut RequestBody,
        mut read_deadline: ReadDeadline,
        mut pace: Pace,
        bytes_in: &Cell<usize>,
    ) -> Result<BufferedBody, Stopped> {
        while !incoming.is_end_stream() {
            let next = std::future::poll_fn(|cx| {
                match poll_with_deadline(incoming, &mut read_deadline, cx, BodyError::Peer) {
                    Poll::Ready(frame) => Poll::Ready(Ok(frame)),
                    Poll::Pending => pace.poll_past(cx, self.received).map(Err),
                }
            });
            let frame = match next.await {
                Ok(Some(Ok(frame))) => frame,
                Ok(None) => break,
                Ok(Some(Err(BodyError::TimedOut(_)))) => {
                    return Err((Outcome::TimedOut, Reason::ClientBodyTimedOut))
                }
                Ok(Some(Err(_))) => return Err((Outcome::Broken, Reason::ClientBodyBroken)),
                Err(()) => return Err((Outcome::TooSlow, Reason::UploadTooSlow)),
            };
            match frame.into_data() {
                Ok(data) => {
                    bytes_in.set(bytes_in.get() + data.len());
                    self.take(data).await?;
                }
                Err(frame) => self.trailers = frame.into_trailers().ok().or(self.trailers),
            }
        }
        self.finish().await
    }

    async fn take(&mut self, data: Bytes) -> Result<(), Stopped> {
        let length = data.len() as u64;
        self.received += length;
        if self.limit.is_some_and(|limit| self.received > limit) {
            return Err((Outcome::TooLarge, Reason::ClientBodyTooLarge));
        }
        let full = (Outcome::Full, Reason::RequestBufferFull);
        let per_request = self.buffers.settings.per_request_bytes;
        if self.spool.is_none() && self.received > per_request {
            let mut held = BudgetHold::none(self.buffers.spool.clone());
            if !held.grow(self.received) {
                return Err(full);
            }
            let dir = self.buffers.settings.spool_dir.clone();
            let file = off_the_loop(move || tempfile::tempfile_in(&dir).map(Arc::new)).await?;
            self.spool = Some(Spool {
                file,
                written: 0,
                held,
            });
        } else if let Some(spool) = self.spool.as_mut() {
            if !spool.held.grow(length) {
                return Err(full);
            }
        }
        if !self.memory_held.grow(length) {
            return Err(full);
        }
        if self.spool.is_none() && self.memory.is_empty() && self.single.is_none() {
            self.single = Some(data);
            return Ok(());
        }
        if let Some(first) = self.single.take() {
            self.memory
                .reserve(self.expected.max(first.len() + data.len()));
            self.memory.extend_from_slice(&first);
        }
        self.memory.extend_from_slice(&data);
        if self.spool.is_some() && self.memory.len() >= WRITE_BEHIND {
            self.write_behind(true).await?;
        }
        Ok(())
    }

    /// Writes what waits in memory to the spool, off the event loop.
    async fn write_behind(&mut self, more_to_come: bool) -> Result<(), Stopped> {
        let Some(spool) = self.spool.as_mut() else {
            return Ok(());
        };
        // Room for the next write and the piece that passes it, so that it never grows.
        let next = if more_to_come { 2 * WRITE_BEHIND } else { 0 };
        let piece = std::mem::replace(&mut self.memory, BytesMut::with_capacity(next)).freeze();
        let (file, offset) = (spool.file.clone(), spool.written);
        let length = piece.len() as u64;
        off_the_loop(move || file.write_all_at(&piece, offset)).await?;
        spool.written += length;
        self.memory_held.release_all();
        Ok(())
    }

    async fn finish(mut self) -> Result<BufferedBody, Stopped> {
        self.write_behind(false).await?;
        let stored = match self.spool.take() {
            Some(spool) => Stored::Spool {
                file: spool.file,
                length: spool.written,
                _held: spool.held,
            },
            None => Stored::Memory {
                data: match self.single.take() {
                    Some(whole) => whole,
                    None => std::mem::take(&mut self.memory).freeze(),
                },
                _held: self.memory_held,
            },
        };
        Ok(BufferedBody::new(stored, self.trailers))
    }
}

/// Runs file work on tokio's blocking threads: a disk that stalls stalls no event loop.
async fn off_the_loop<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, Stopped> {
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(e)) => {
            log::warn!("request buffering: the spool failed: {e}");
            Err((Outcome::Full, Reason::RequestBufferFull))
        }
        Err(e) => {
            log::warn!("request buffering: the spool writer failed: {e}");
            Err((Outcome::Full, Reason::RequestBufferFull))
        }
    }
}

/// The pace an upload must keep: by `grace` plus a second per `min_rate` bytes received,
/// and within `deadline` whatever it received.
struct Pace {
    started: Instant,
    grace: Duration,
    min_rate: u64,
    deadline: Duration,
    /// Made the first time a read waits, moved on when it rings early.
    timer: Option<Pin<Box<Sleep>>>,
}

impl Pace {
    fn due(&self, received: u64) -> Instant {
        let by_pace = match self.min_rate {
            0 => self.deadline,
            rate => self.grace + Duration::from_secs_f64(received as f64 / rate as f64),
        };
        self.started + by_pace.min(self.deadline)
    }

    /// Called while a read waits: ready once the upload is behind its pace.
    fn poll_past(&mut self, cx: &mut Context<'_>, received: u64) -> Poll<()> {
        let due = self.due(received);
        let timer = self.timer.get_or_insert_with(|| {
            Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(
                due,
            )))
        });
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if Instant::now() >= due {
                return Poll::Ready(());
            }
            // Rang at an earlier due time: the bytes since then moved it on.
            timer.as_mut().reset(tokio::time::Instant::from_std(due));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pace_allows_the_grace_and_a_second_per_min_rate_bytes_within_the_deadline() {
        let pace = Pace {
            started: Instant::now(),
            grace: Duration::from_secs(20),
            min_rate: 500,
            deadline: Duration::from_secs(60),
            timer: None,
        };
        let after = |received| pace.due(received).duration_since(pace.started);
        assert_eq!(after(0), Duration::from_secs(20));
        assert_eq!(after(5_000), Duration::from_secs(30));
        assert_eq!(
            after(1 << 30),
            Duration::from_secs(60),
            "never past the deadline"
        );
        let no_minimum = Pace {
            min_rate: 0,
            ..pace
        };
        assert_eq!(
            no_minimum.due(0).duration_since(no_minimum.started),
            Duration::from_secs(60)
        );
    }
}

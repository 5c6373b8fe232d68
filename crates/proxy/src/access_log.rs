//! Stage last, log: one JSON line per request. Lines go through a bounded queue to a writer
//! thread, so a slow disk, a blocked stdout or an unreachable log service never slows the
//! proxy: when the queue is full the record is dropped and counted.

use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use switchyard_logs::{Batcher, ShipConfig, Shipper};

use crate::context::RequestCtx;
use crate::metrics;

/// Records waiting for the writer before new ones are dropped.
pub(crate) const ACCESS_LOG_QUEUE_CAPACITY: usize = 65_536;

/// What the access log needs to know of a request besides its context.
pub(crate) struct Exchange<'a> {
    pub(crate) method: &'a http::Method,
    pub(crate) target: &'a http::Uri,
    pub(crate) version: http::Version,
    pub(crate) bytes_in: usize,
    pub(crate) bytes_out: usize,
    pub(crate) client: Option<std::net::IpAddr>,
}

/// Where access-log lines go.
#[derive(Debug, Clone)]
pub enum AccessLogTarget {
    /// Nowhere.
    Off,
    /// Standard output.
    Stdout,
    /// Appended to a file.
    File(PathBuf),
    /// Batched to log services (`switchyard logd`).
    Ship(ShipConfig),
}

enum Entry {
    Record {
        app: Box<str>,
        line: String,
    },
    /// Ship what is batched now and answer; sent at shutdown.
    Flush(SyncSender<()>),
    /// Reopen the file written to (SIGHUP, SIGUSR1): the lines queued before go to the
    /// file that was open, those after to the file at the path now.
    Reopen,
}

/// Hands access-log lines to the writer thread.
#[derive(Clone)]
pub struct AccessLog {
    queue: Option<SyncSender<Entry>>,
    shipper: Option<Arc<Shipper>>,
}

impl AccessLog {
    /// Starts the writer for `target`. Fails if the file cannot be opened or the shipping
    /// spool cannot be used, so a bad setting is reported at start-up rather than by
    /// silently missing logs.
    pub fn start(target: AccessLogTarget) -> std::io::Result<Self> {
        let (sink, shipper) = match target {
            AccessLogTarget::Off => {
                return Ok(Self {
                    queue: None,
                    shipper: None,
                })
            }
            AccessLogTarget::Stdout => (Sink::Local(local(std::io::stdout()), None), None),
            AccessLogTarget::File(path) => {
                (Sink::Local(local(open_file(&path)?), Some(path)), None)
            }
            AccessLogTarget::Ship(config) => {
                let (shipper, batcher) = Shipper::start(&config)?;
                (Sink::Ship(batcher), Some(Arc::new(shipper)))
            }
        };
        let (queue, entries) = sync_channel(ACCESS_LOG_QUEUE_CAPACITY);
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || write_entries(entries, sink))?;
        Ok(Self {
            queue: Some(queue),
            shipper,
        })
    }

    /// Queues the record of a request described by `exchange`; a full queue drops it,
    /// counted.
    pub(crate) fn record(&self, exchange: &Exchange<'_>, ctx: &RequestCtx, status: u16) {
        let Some(queue) = &self.queue else {
            return;
        };
        let app = ctx.app_name();
        let record = Record {
            time: rfc3339_now(),
            request_id: &ctx.request_id,
            app,
            host: ctx.host.as_deref().unwrap_or(""),
            method: exchange.method.as_str(),
            path: exchange.target.path_and_query().map_or("/", |p| p.as_str()),
            protocol: protocol_name(exchange.version),
            status,
            bytes_in: exchange.bytes_in,
            bytes_out: exchange.bytes_out,
            duration_ms: millis(ctx.started.elapsed()),
            upstream: ctx.tried.last().map(ToString::to_string),
            upstream_ms: ctx.upstream_time.map(millis),
            cpu_us: ctx.cpu.took().map(|took| took.as_micros() as u64),
            attempts: ctx.tried.len(),
            client: exchange.client.map(|ip| ip.to_string()),
            upgraded: ctx.upgraded,
            refused: ctx.refused.map(|reason| reason.label()),
        };
        let Ok(line) = serde_json::to_string(&record) else {
            return;
        };
        let entry = Entry::Record {
            app: app.into(),
            line,
        };
        match queue.try_send(entry) {
            Ok(()) => metrics::ACCESS_LOG_QUEUE.inc(),
            Err(TrySendError::Full(_)) => metrics::ACCESS_LOG_DROPPED.inc(),
            Err(TrySendError::Disconnected(_)) => metrics::ACCESS_LOG_DROPPED.inc(),
        }
    }

    /// Ships one audit record of the admin API (a JSON line) with the access logs, to
    /// logd's `_audit` directory; a local access log (stdout, a file) does not carry them.
    pub fn record_audit(&self, line: String) {
        let (Some(queue), Some(_)) = (&self.queue, &self.shipper) else {
            return;
        };
        let entry = Entry::Record {
            app: switchyard_logs::AUDIT_STREAM.into(),
            line,
        };
        match queue.try_send(entry) {
            Ok(()) => metrics::ACCESS_LOG_QUEUE.inc(),
            Err(_) => metrics::ACCESS_LOG_DROPPED.inc(),
        }
    }

    /// Reopens the access log's file, as logrotate's `postrotate` asks with SIGHUP: the
    /// file moved away gets the lines queued before, the new one every line after. Waits
    /// behind the lines queued (a full queue is written out first); nothing for standard
    /// output or shipping (the log service reopens its own files).
    pub fn reopen(&self) {
        if let Some(queue) = &self.queue {
            let _ = queue.send(Entry::Reopen);
        }
    }

    /// At shutdown, once no request is left: ships what is batched, delivers what it can
    /// within `grace` and keeps the rest in the spool for the next start. Local sinks are
    /// flushed as records arrive and need nothing.
    pub fn finish(&self, grace: Duration) {
        let (Some(queue), Some(shipper)) = (&self.queue, &self.shipper) else {
            return;
        };
        let (done, flushed) = sync_channel(1);
        if queue.send(Entry::Flush(done)).is_ok() {
            let _ = flushed.recv_timeout(grace);
        }
        shipper.finish(grace);
    }
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("enabled", &self.queue.is_some())
            .field("shipping", &self.shipper.is_some())
            .finish()
    }
}

#[derive(Serialize)]
struct Record<'a> {
    time: String,
    request_id: &'a str,
    app: &'a str,
    host: &'a str,
    method: &'a str,
    path: &'a str,
    protocol: &'static str,
    status: u16,
    bytes_in: usize,
    bytes_out: usize,
    duration_ms: f64,
    upstream: Option<String>,
    upstream_ms: Option<f64>,
    /// The router's CPU on the request's behalf, as its task's polls measured it from its
    /// start to the poll that logs it (traffic/cost.rs); a pool job's is in its app's
    /// total, not here.
    cpu_us: Option<u64>,
    attempts: usize,
    client: Option<String>,
    upgraded: bool,
    /// Why the router answered itself (docs/reference/refusals.md); null for the app's
    /// answers.
    refused: Option<&'static str>,
}

enum Sink {
    /// Standard output, or the file at the path (reopened on SIGHUP).
    Local(BufWriter<Box<dyn Write + Send>>, Option<PathBuf>),
    Ship(Batcher),
}

fn local(out: impl Write + Send + 'static) -> BufWriter<Box<dyn Write + Send>> {
    BufWriter::with_capacity(64 * 1024, Box::new(out))
}

fn open_file(path: &Path) -> std::io::Result<std::fs::File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl Sink {
    fn write(&mut self, app: &str, line: &str) {
        metrics::ACCESS_LOG_QUEUE.dec();
        match self {
            Self::Local(out, _) => {
                if writeln!(out, "{line}").is_err() {
                    metrics::ACCESS_LOG_DROPPED.inc();
                }
            }
            Self::Ship(batcher) => batcher.add(app, line.as_bytes()),
        }
    }

    /// After a burst: local lines appear promptly; a batch ships when full or due.
    fn burst_done(&mut self) {
        match self {
            Self::Local(out, _) => {
                let _ = out.flush();
            }
            Self::Ship(batcher) => batcher.tick(),
        }
    }

    fn flush(&mut self) {
        match self {
            Self::Local(out, _) => {
                let _ = out.flush();
            }
            Self::Ship(batcher) => batcher.flush(),
        }
    }

    /// The file at the path again, after what was written to the one open is flushed; the
    /// one open is kept if the path cannot be opened (logged: the lines still go
    /// somewhere).
    fn reopen(&mut self) {
        let Self::Local(out, Some(path)) = self else {
            return;
        };
        let _ = out.flush();
        match open_file(path) {
            Ok(file) => {
                *out = local(file);
                log::info!("access log: reopened {}", path.display());
            }
            Err(e) => log::error!(
                "access log: cannot reopen {} ({e}); still writing to the file open",
                path.display()
            ),
        }
    }

    /// How long the writer may wait for the next line: local lines are flushed after each
    /// burst, so an idle local writer sleeps until a line comes; a batch has a due time.
    fn wait(&self) -> Option<Duration> {
        match self {
            Self::Local(..) => None,
            Self::Ship(batcher) => Some(batcher.next_tick().max(Duration::from_millis(1))),
        }
    }
}

fn write_entries(entries: Receiver<Entry>, mut sink: Sink) {
    loop {
        let next = match sink.wait() {
            Some(wait) => entries.recv_timeout(wait),
            None => entries.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match next {
            Ok(entry) => {
                let mut next = Some(entry);
                // Write the rest of the burst, then flush once.
                while let Some(entry) = next.take() {
                    match entry {
                        Entry::Record { app, line } => sink.write(&app, &line),
                        Entry::Flush(done) => {
                            sink.flush();
                            let _ = done.try_send(());
                        }
                        Entry::Reopen => sink.reopen(),
                    }
                    next = entries.try_recv().ok();
                }
                sink.burst_done();
            }
            Err(RecvTimeoutError::Timeout) => sink.burst_done(),
            Err(RecvTimeoutError::Disconnected) => {
                sink.flush();
                return;
            }
        }
    }
}

fn millis(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1_000_000.0).round() / 1_000.0
}

fn protocol_name(version: http::Version) -> &'static str {
    match version {
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_11 => "HTTP/1.1",
        http::Version::HTTP_2 => "HTTP/2",
        http::Version::HTTP_3 => "HTTP/3",
        _ => "other",
    }
}

/// UTC timestamp with milliseconds, e.g. `2026-11-22T15:04:05.123Z`.
fn rfc3339_now() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format_rfc3339(now)
}

/// A time since the epoch as a UTC RFC 3339 timestamp with milliseconds.
pub fn format_rfc3339(since_epoch: Duration) -> String {
    let secs = since_epoch.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        since_epoch.subsec_millis()
    )
}

/// Howard Hinnant's days-to-civil conversion (proleptic Gregorian calendar).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let cases = [
            (0, "1970-01-01T00:00:00.000Z"),
            (951_782_400_500, "2000-02-29T00:00:00.500Z"),
            (1_795_359_845_123, "2026-11-22T15:04:05.123Z"),
        ];
        for (ms, expected) in cases {
            assert_eq!(format_rfc3339(Duration::from_millis(ms)), expected);
        }
    }
}

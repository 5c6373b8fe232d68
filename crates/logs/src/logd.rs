//! `switchyard logd`: receives batches from routers, appends each app's lines to its file,
//! and acknowledges a batch only once it is written (and synced, with `fsync = always`).
//!
//! Connections are read on a small async runtime; one writer thread owns the files and
//! takes batches in groups, so one sync covers every batch of the group. A bounded queue sits
//! between them: when it is full, connections stop being read and routers spool, rather than
//! logd growing without limit. Batches already stored (a router sending again after a lost
//! ack, or after its restart) are recognised by `(sender, seq)` against a watermark kept
//! per sender in `DIR/.logd-senders` and acknowledged without being written twice.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::files::{AppFiles, FilePolicy};
use crate::frame::{self, Ack, AckStatus, BatchHeader, BatchId, BATCH_HEADER_BYTES};
use crate::metrics;

/// Batches read and waiting for the writer; past it, connections wait.
const QUEUE_BATCHES: usize = 1024;
/// Batches one connection may have in the queue before it is no longer read.
const PER_CONNECTION_IN_FLIGHT: usize = 256;
/// Most batches written between two syncs.
const GROUP_BATCHES: usize = 256;
const MAX_CONNECTIONS: usize = 1024;
/// Senders whose watermark is remembered; the least recently seen is forgotten first.
const MAX_SENDERS: usize = 4096;
const STATE_FILE: &str = ".logd-senders";
/// How often the writer looks at file ages when no batch arrives.
const WRITER_TICK: Duration = Duration::from_millis(500);

/// When written lines reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Synced before the acknowledgement: an acknowledged line survives a power loss.
    Always,
    /// Left to the kernel: an acknowledged line survives a crash of logd, not of the machine.
    Never,
}

/// Settings of `switchyard logd`.
#[derive(Debug, Clone)]
pub struct LogdConfig {
    /// Where routers connect.
    pub listen: SocketAddr,
    /// Where per-app directories go.
    pub dir: PathBuf,
    /// Rotation, retention and compression.
    pub files: FilePolicy,
    /// When data is synced.
    pub sync: SyncPolicy,
    /// Prometheus `/metrics` address, if any.
    pub metrics: Option<SocketAddr>,
}

enum Work {
    Batch(Job),
    /// Wakes the writer to look at file ages and SIGHUP when no batch comes.
    Tick,
}

struct Job {
    id: BatchId,
    /// `None` when the payload failed its checksum: refused, in order with the rest.
    payload: Option<Vec<u8>>,
    reply: mpsc::OwnedPermit<Ack>,
}

/// Runs logd until SIGTERM or SIGINT; the queue is written out before it returns.
pub fn run(config: LogdConfig) -> io::Result<()> {
    crate::metrics::register_all();
    let files = AppFiles::new(&config.dir, config.files.clone())?;
    let watermarks = Watermarks::load(&config.dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("logd-net")
        .build()?;
    let listener = runtime.block_on(TcpListener::bind(config.listen))?;
    log::info!(
        "logd listening on {}, writing under {} (sync {:?})",
        listener.local_addr()?,
        config.dir.display(),
        config.sync
    );
    if let Some(address) = config.metrics {
        let metrics_listener = runtime.block_on(TcpListener::bind(address))?;
        runtime.spawn(serve_metrics(metrics_listener));
    }
    let (jobs, queue) = mpsc::channel::<Work>(QUEUE_BATCHES);
    let reopen = Arc::new(AtomicBool::new(false));
    let writer = {
        let (reopen, sync) = (reopen.clone(), config.sync);
        std::thread::Builder::new()
            .name("logd-writer".into())
            .spawn(move || write_batches(queue, files, watermarks, sync, &reopen))?
    };
    let ticks = jobs.clone();
    runtime.spawn(async move {
        let mut interval = tokio::time::interval(WRITER_TICK);
        loop {
            interval.tick().await;
            // A full queue wakes the writer anyway.
            let _ = ticks.try_send(Work::Tick);
        }
    });
    runtime.block_on(async move {
        let accepting = tokio::spawn(accept(listener, jobs));
        watch_signals(reopen).await;
        accepting.abort();
    });
    // Dropping the runtime's tasks drops every sender of the queue: the writer writes what
    // was queued and stops. Batches cut mid-read were not acknowledged; routers resend them.
    runtime.shutdown_timeout(Duration::from_secs(1));
    writer
        .join()
        .map_err(|_| io::Error::other("the writer thread panicked"))?;
    log::info!("logd stopped");
    Ok(())
}

async fn watch_signals(reopen: Arc<AtomicBool>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut hangup), Ok(mut terminate), Ok(mut interrupt)) = (
        signal(SignalKind::hangup()),
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        log::error!("cannot install signal handlers; logd runs until killed");
        return std::future::pending().await;
    };
    loop {
        tokio::select! {
            _ = hangup.recv() => {
                log::info!("SIGHUP: reopening files");
                reopen.store(true, Ordering::Relaxed);
            }
            _ = terminate.recv() => return,
            _ = interrupt.recv() => return,
        }
    }
}

async fn accept(listener: TcpListener, jobs: mpsc::Sender<Work>) {
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                log::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            log::warn!("refusing {peer}: {MAX_CONNECTIONS} connections open");
            continue;
        };
        tokio::spawn(serve_connection(stream, peer, jobs.clone(), permit));
    }
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    jobs: mpsc::Sender<Work>,
    _permit: OwnedSemaphorePermit,
) {
    metrics::LOGD_CONNECTIONS.inc();
    let _ = stream.set_nodelay(true);
    let (read_half, write_half) = stream.into_split();
    let (acks, mut pending) = mpsc::channel::<Ack>(PER_CONNECTION_IN_FLIGHT);
    let answering = tokio::spawn(async move {
        let mut writer = BufWriter::new(write_half);
        while let Some(ack) = pending.recv().await {
            if writer.write_all(&frame::encode_ack(ack)).await.is_err() {
                return;
            }
            if pending.is_empty() && writer.flush().await.is_err() {
                return;
            }
        }
    });
    if let Err(e) = read_batches(read_half, &jobs, acks).await {
        log::warn!("router {peer}: {e}");
    }
    // Acks of batches still queued are written when the writer answers them.
    let _ = answering.await;
    metrics::LOGD_CONNECTIONS.dec();
}

async fn read_batches(
    read_half: tokio::net::tcp::OwnedReadHalf,
    jobs: &mpsc::Sender<Work>,
    acks: mpsc::Sender<Ack>,
) -> Result<(), frame::FrameError> {
    let mut reader = BufReader::with_capacity(frame::MAX_BATCH_BYTES * 2, read_half);
    loop {
        let mut header = [0u8; BATCH_HEADER_BYTES];
        match reader.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let header = BatchHeader::parse(&header)?;
        let mut payload = vec![0; header.length];
        reader.read_exact(&mut payload).await?;
        // The ack's place is reserved first: the writer never waits on a slow router.
        let Ok(reply) = acks.clone().reserve_owned().await else {
            return Ok(());
        };
        let payload = header.matches(&payload).then_some(payload);
        metrics::LOGD_QUEUE.inc();
        if jobs
            .send(Work::Batch(Job {
                id: header.id,
                payload,
                reply,
            }))
            .await
            .is_err()
        {
            return Ok(());
        }
    }
}

fn write_batches(
    mut queue: mpsc::Receiver<Work>,
    mut files: AppFiles,
    mut watermarks: Watermarks,
    sync: SyncPolicy,
    reopen: &AtomicBool,
) {
    // While the syncer makes group N durable, this thread writes group N+1: the disk is
    // never idle waiting for writes, nor writes for the disk. One group waits at most.
    let (to_syncer, synced) = std::sync::mpsc::sync_channel::<Durable>(1);
    let syncer = std::thread::Builder::new()
        .name("logd-sync".into())
        .spawn(move || make_durable(synced));
    let syncer = match syncer {
        Ok(thread) => thread,
        Err(e) => {
            log::error!("cannot start the sync thread: {e}");
            return;
        }
    };
    let mut group = Vec::with_capacity(GROUP_BATCHES);
    // Ends when every sender is gone: the acceptor, the ticker and each connection.
    while let Some(work) = queue.blocking_recv() {
        if reopen.swap(false, Ordering::Relaxed) {
            if let Err(e) = files.reopen_all() {
                log::error!("cannot reopen files: {e}");
            }
        }
        if let Err(e) = files.rotate_aged() {
            log::error!("cannot rotate by age: {e}");
        }
        if let Work::Batch(job) = work {
            group.push(job);
        }
        while group.len() < GROUP_BATCHES {
            match queue.try_recv() {
                Ok(Work::Batch(job)) => group.push(job),
                Ok(Work::Tick) => {}
                Err(_) => break,
            }
        }
        if group.is_empty() {
            continue;
        }
        metrics::LOGD_QUEUE.sub(group.len() as i64);
        let started = Instant::now();
        let acks = match write_group(&mut files, &mut watermarks, &mut group) {
            Ok(acks) => acks,
            Err(e) => {
                // Nothing of the group is acknowledged: routers send it again.
                log::error!("cannot write a group of {} batches: {e}", group.len());
                metrics::LOGD_WRITE_FAILURES.inc();
                group.clear();
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        let durable = Durable {
            files: match sync {
                SyncPolicy::Always => match files.take_unsynced() {
                    Ok(handles) => handles,
                    Err(e) => fatal(&format!("cannot hand files to the sync thread: {e}")),
                },
                SyncPolicy::Never => Vec::new(),
            },
            state: watermarks.snapshot(),
            sync,
            acks,
            started,
        };
        if to_syncer.send(durable).is_err() {
            return;
        }
    }
    drop(to_syncer);
    let _ = syncer.join();
    if let Err(e) = files.sync() {
        log::error!("cannot sync files at shutdown: {e}");
    }
}

/// A written group on its way to the disk: the files it touched, the watermarks after it,
/// and the acks to send once both are durable.
struct Durable {
    files: Vec<std::fs::File>,
    state: Option<(PathBuf, String)>,
    sync: SyncPolicy,
    acks: Vec<(mpsc::OwnedPermit<Ack>, Ack)>,
    started: Instant,
}

fn make_durable(groups: std::sync::mpsc::Receiver<Durable>) {
    for group in groups {
        if let Err(e) = crate::files::sync_concurrently(group.files) {
            fatal(&format!("cannot sync written lines: {e}"));
        }
        if let Some((path, text)) = &group.state {
            if let Err(e) = write_state(path, text, group.sync == SyncPolicy::Always) {
                fatal(&format!("cannot save {}: {e}", path.display()));
            }
        }
        for (reply, ack) in group.acks {
            reply.send(ack);
        }
        metrics::LOGD_WRITE_SECONDS.observe(group.started.elapsed().as_secs_f64());
    }
}

/// A failed sync leaves it unknown what reached the disk, and the in-memory watermarks may
/// already count batches that did not: the only safe course is to stop, unacknowledged, and
/// let a restart (watermarks from the last durable state) take the batches again.
fn fatal(reason: &str) -> ! {
    log::error!("{reason}; stopping without acknowledging, routers will send again");
    std::process::exit(1)
}

/// Writes a group and returns its acks (sent once it is durable).
fn write_group(
    files: &mut AppFiles,
    watermarks: &mut Watermarks,
    group: &mut Vec<Job>,
) -> io::Result<Vec<(mpsc::OwnedPermit<Ack>, Ack)>> {
    let mut statuses = Vec::with_capacity(group.len());
    for job in group.iter() {
        let status = match &job.payload {
            None => {
                metrics::LOGD_BATCHES.with_label_values(&["refused"]).inc();
                AckStatus::Refused
            }
            Some(_) if watermarks.already_stored(job.id) => {
                metrics::LOGD_BATCHES
                    .with_label_values(&["duplicate"])
                    .inc();
                AckStatus::Stored
            }
            Some(payload) => match frame::blocks(payload) {
                Ok(blocks) => {
                    for (app, lines) in blocks {
                        files.append(app, lines)?;
                    }
                    watermarks.stored(job.id);
                    metrics::LOGD_BATCHES.with_label_values(&["stored"]).inc();
                    AckStatus::Stored
                }
                Err(_) => {
                    metrics::LOGD_BATCHES.with_label_values(&["refused"]).inc();
                    AckStatus::Refused
                }
            },
        };
        statuses.push(status);
    }
    Ok(group
        .drain(..)
        .zip(statuses)
        .map(|(job, status)| (job.reply, Ack { id: job.id, status }))
        .collect())
}

/// The highest batch stored per sender; a router sends a sender's batches in order.
struct Watermarks {
    path: PathBuf,
    highest: HashMap<u64, (u64, u64)>,
    changed: bool,
}

impl Watermarks {
    fn load(dir: &Path) -> io::Result<Self> {
        let path = dir.join(STATE_FILE);
        let mut highest = HashMap::new();
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                for line in text.lines() {
                    let mut fields = line.split_whitespace().map(str::parse::<u64>);
                    if let (Some(Ok(sender)), Some(Ok(seq)), Some(Ok(seen))) =
                        (fields.next(), fields.next(), fields.next())
                    {
                        highest.insert(sender, (seq, seen));
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(Self {
            path,
            highest,
            changed: false,
        })
    }

    fn already_stored(&self, id: BatchId) -> bool {
        self.highest
            .get(&id.sender)
            .is_some_and(|&(seq, _)| id.seq <= seq)
    }

    fn stored(&mut self, id: BatchId) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.highest.insert(id.sender, (id.seq, now));
        self.changed = true;
        if self.highest.len() > MAX_SENDERS {
            if let Some(oldest) = self
                .highest
                .iter()
                .min_by_key(|(_, (_, seen))| *seen)
                .map(|(sender, _)| *sender)
            {
                self.highest.remove(&oldest);
            }
        }
    }

    /// The state file's path and text, if anything changed since the last snapshot.
    fn snapshot(&mut self) -> Option<(PathBuf, String)> {
        if !self.changed {
            return None;
        }
        self.changed = false;
        let mut text = String::with_capacity(self.highest.len() * 48);
        for (sender, (seq, seen)) in &self.highest {
            text.push_str(&format!("{sender} {seq} {seen}\n"));
        }
        Some((self.path.clone(), text))
    }
}

/// Replaces the state file atomically (write, sync, rename).
fn write_state(path: &Path, text: &str, durable: bool) -> io::Result<()> {
    let partial = path.with_extension("partial");
    {
        let mut file = std::fs::File::create(&partial)?;
        io::Write::write_all(&mut file, text.as_bytes())?;
        if durable {
            file.sync_data()?;
        }
    }
    std::fs::rename(&partial, path)
}

async fn serve_metrics(listener: TcpListener) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            // One small GET; anything else gets the same answer.
            let mut request = [0u8; 1024];
            let _ = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut request)).await;
            let mut body = Vec::new();
            let encoder = prometheus::TextEncoder::new();
            let _ = prometheus::Encoder::encode(&encoder, &prometheus::gather(), &mut body);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(&body).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermarks_survive_a_restart_and_stay_bounded() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut marks = Watermarks::load(dir.path()).expect("load");
        marks.stored(BatchId { sender: 1, seq: 5 });
        let (path, text) = marks.snapshot().expect("changed");
        write_state(&path, &text, true).expect("save");
        assert!(marks.snapshot().is_none(), "nothing new");
        let mut marks = Watermarks::load(dir.path()).expect("reload");
        assert!(marks.already_stored(BatchId { sender: 1, seq: 5 }));
        assert!(marks.already_stored(BatchId { sender: 1, seq: 2 }));
        assert!(!marks.already_stored(BatchId { sender: 1, seq: 6 }));
        assert!(!marks.already_stored(BatchId { sender: 2, seq: 1 }));
        for sender in 10..(10 + MAX_SENDERS as u64 + 5) {
            marks.stored(BatchId { sender, seq: 1 });
        }
        assert_eq!(marks.highest.len(), MAX_SENDERS);
    }
}

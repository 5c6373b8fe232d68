//! The router's side of log shipping: access-log records are batched (up to 64 KiB or a
//! delay) by the access-log thread, and one sender thread delivers batches in order to the
//! first reachable log service, a window of them in flight, each kept until acknowledged.
//! Nothing here runs on the proxy's event loops: the proxy only hands a record to a bounded
//! queue (see the proxy's access-log stage), so logging never slows a request.

use std::collections::VecDeque;
use std::io::{BufWriter, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::frame::{self, AckStatus, BatchBuilder, BatchId, MAX_BATCH_BYTES};
use crate::metrics;
use crate::outbox::{Outbox, Outgoing};
use crate::spool::Spool;

/// Batches sent and not yet acknowledged, per connection.
const WINDOW: usize = 64;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// A log service that neither acknowledges nor fails for this long is given up on.
const ACK_TIMEOUT: Duration = Duration::from_secs(5);
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);
/// How long the sender sleeps on an empty outbox before checking for shutdown.
const IDLE_POLL: Duration = Duration::from_millis(100);

/// Settings of shipping.
#[derive(Debug, Clone)]
pub struct ShipConfig {
    /// Log services (`HOST:PORT`), tried in order: the first reachable one gets the batches.
    pub services: Vec<String>,
    /// Largest batch payload, at most [`MAX_BATCH_BYTES`].
    pub batch_bytes: usize,
    /// Longest a record waits for its batch to fill.
    pub batch_delay: Duration,
    /// Memory for batches waiting to be sent; past it they go to the spool.
    pub buffer_bytes: usize,
    /// The on-disk spool's directory.
    pub spool_dir: PathBuf,
    /// Most bytes the spool may hold; past it records are dropped and counted.
    pub spool_bytes: u64,
}

/// The record side, owned by the access-log thread: fills batches and queues them.
pub struct Batcher {
    builder: BatchBuilder,
    sender: u64,
    next_seq: u64,
    first_record_at: Option<Instant>,
    batch_bytes: usize,
    batch_delay: Duration,
    outbox: Arc<Outbox>,
}

impl Batcher {
    /// Adds one record of `app` (a JSON line without its newline).
    pub fn add(&mut self, app: &str, line: &[u8]) {
        metrics::SHIP_RECORDS.inc();
        let alone = BatchBuilder::default().size_with(app, line);
        if alone > self.batch_bytes {
            // A record larger than a batch cannot be shipped; it is not worth a special path.
            metrics::SHIP_DROPPED
                .with_label_values(&["too_large"])
                .inc();
            return;
        }
        if self.builder.lines() > 0 && self.builder.size_with(app, line) > self.batch_bytes {
            self.flush();
        }
        self.builder.push(app, line);
        self.first_record_at.get_or_insert_with(Instant::now);
    }

    /// Ships the batch if its oldest record has waited the batch delay.
    pub fn tick(&mut self) {
        if self
            .first_record_at
            .is_some_and(|at| at.elapsed() >= self.batch_delay)
        {
            self.flush();
        }
    }

    /// How long until [`tick`](Self::tick) has something to do.
    pub fn next_tick(&self) -> Duration {
        self.first_record_at.map_or(self.batch_delay, |at| {
            self.batch_delay.saturating_sub(at.elapsed())
        })
    }

    /// Ships the batch being filled, if any.
    pub fn flush(&mut self) {
        if self.builder.lines() == 0 {
            return;
        }
        let id = BatchId {
            sender: self.sender,
            seq: self.next_seq,
        };
        self.next_seq += 1;
        self.first_record_at = None;
        self.outbox.push(self.builder.finish(id));
    }
}

/// The sending side: a thread delivering the outbox.
pub struct Shipper {
    outbox: Arc<Outbox>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Shipper {
    /// Opens the spool (what an earlier run left is sent first) and starts the sender. Fails
    /// when the spool directory cannot be used or no service address resolves, so a bad
    /// setting is reported at start-up rather than by missing logs.
    pub fn start(config: &ShipConfig) -> std::io::Result<(Self, Batcher)> {
        crate::metrics::register_all();
        if config.services.is_empty() {
            return Err(std::io::Error::other("no log service given"));
        }
        for service in &config.services {
            resolve(service)?;
        }
        let spool = Spool::open(&config.spool_dir, config.spool_bytes).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("log spool {}: {e}", config.spool_dir.display()),
            )
        })?;
        let outbox = Arc::new(Outbox::new(spool, config.buffer_bytes));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (outbox, stop, services) = (outbox.clone(), stop.clone(), config.services.clone());
            std::thread::Builder::new()
                .name("log-shipper".into())
                .spawn(move || send_until_stopped(&outbox, &services, &stop))?
        };
        let batcher = Batcher {
            builder: BatchBuilder::default(),
            sender: rand::random(),
            next_seq: 1,
            first_record_at: None,
            batch_bytes: config.batch_bytes.clamp(1024, MAX_BATCH_BYTES),
            batch_delay: config.batch_delay,
            outbox: outbox.clone(),
        };
        Ok((
            Self {
                outbox,
                stop,
                thread: Mutex::new(Some(thread)),
            },
            batcher,
        ))
    }

    /// At shutdown, after the last batch was queued: delivers what it can within `grace`,
    /// then keeps the rest in the spool for the next start.
    pub fn finish(&self, grace: Duration) {
        let deadline = Instant::now() + grace;
        // With no service reachable there is nothing to wait for: the spool keeps it all.
        while metrics::SHIP_CONNECTED.get() == 1
            && !self.outbox.is_empty()
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }
}

fn resolve(service: &str) -> std::io::Result<SocketAddr> {
    service
        .to_socket_addrs()
        .map_err(|e| std::io::Error::new(e.kind(), format!("log service '{service}': {e}")))?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("log service '{service}' has no address")))
}

fn send_until_stopped(outbox: &Outbox, services: &[String], stop: &AtomicBool) {
    let mut unacked: VecDeque<Outgoing> = VecDeque::new();
    let mut current = 0;
    let mut retry = RETRY_MIN;
    let mut outage_reported = false;
    while !stop.load(Ordering::Relaxed) {
        let service = &services[current % services.len()];
        let connected = resolve(service)
            .and_then(|address| TcpStream::connect_timeout(&address, CONNECT_TIMEOUT));
        let stream = match connected {
            Ok(stream) => stream,
            Err(e) => {
                if !outage_reported {
                    log::warn!(
                        "log service {service} unreachable: {e}; batches wait (memory, then spool)"
                    );
                    outage_reported = true;
                }
                current += 1;
                pause(retry, stop);
                retry = (retry * 2).min(RETRY_MAX);
                continue;
            }
        };
        if outage_reported {
            log::info!("log service {service} reached; delivering the backlog");
            outage_reported = false;
        }
        retry = RETRY_MIN;
        metrics::SHIP_CONNECTED.set(1);
        if let Err(e) = deliver(&stream, outbox, &mut unacked, stop) {
            log::warn!(
                "log service {service}: {e}; {} batches will be sent again",
                unacked.len()
            );
            pause(RETRY_MIN, stop);
        }
        metrics::SHIP_CONNECTED.set(0);
    }
    outbox.close(unacked.into());
}

/// Sends on one connection until it fails or shipping stops.
fn deliver(
    stream: &TcpStream,
    outbox: &Outbox,
    unacked: &mut VecDeque<Outgoing>,
    stop: &AtomicBool,
) -> Result<(), frame::FrameError> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(ACK_TIMEOUT))?;
    stream.set_write_timeout(Some(ACK_TIMEOUT))?;
    let mut reader = std::io::BufReader::new(stream.try_clone()?);
    let mut writer = BufWriter::with_capacity(MAX_BATCH_BYTES, stream.try_clone()?);
    for outgoing in unacked.iter() {
        writer.write_all(&outgoing.frame.bytes)?;
        metrics::SHIP_RESENT.inc();
        metrics::SHIP_BYTES.inc_by(outgoing.frame.bytes.len() as u64);
    }
    while !stop.load(Ordering::Relaxed) {
        while unacked.len() < WINDOW {
            let wait = if unacked.is_empty() {
                IDLE_POLL
            } else {
                Duration::ZERO
            };
            let Some(outgoing) = outbox.pop(wait) else {
                break;
            };
            writer.write_all(&outgoing.frame.bytes)?;
            metrics::SHIP_BYTES.inc_by(outgoing.frame.bytes.len() as u64);
            unacked.push_back(outgoing);
        }
        writer.flush()?;
        if unacked.is_empty() {
            continue;
        }
        let ack = frame::read_ack(&mut reader)?;
        let Some(oldest) = unacked.front() else {
            continue;
        };
        if ack.id != oldest.frame.id {
            return Err(frame::FrameError::Malformed("an ack out of order"));
        }
        let Some(done) = unacked.pop_front() else {
            continue;
        };
        match ack.status {
            AckStatus::Stored => {
                metrics::SHIP_ACKNOWLEDGED
                    .with_label_values(&["stored"])
                    .inc();
                metrics::SHIP_ACKNOWLEDGED_RECORDS.inc_by(u64::from(done.frame.lines));
            }
            AckStatus::Refused => {
                log::error!(
                    "the log service refused batch {:?} as malformed; {} records lost",
                    done.frame.id,
                    done.frame.lines
                );
                metrics::SHIP_ACKNOWLEDGED
                    .with_label_values(&["refused"])
                    .inc();
                metrics::SHIP_DROPPED
                    .with_label_values(&["refused"])
                    .inc_by(u64::from(done.frame.lines));
            }
        }
        outbox.acknowledged(&done);
    }
    Ok(())
}

fn pause(duration: Duration, stop: &AtomicBool) {
    let until = Instant::now() + duration;
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
}

//! One thread's idle connections to backends. A connection goes back only when its
//! response has been read to the end, and is taken again only by the thread that made it,
//! whose runtime drives it: nothing here is shared, locked or watched from elsewhere.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::bodies::ForwardBody;
use super::Worker;
use crate::metrics;
use crate::routing::connections::Socket;

/// How long an idle backend connection is kept. Shorter than the usual app-server idle
/// timeouts (60 s and up) so the backend rarely closes first.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a kept connection that is not ready yet may take to become so.
const READY_WAIT: Duration = Duration::from_millis(50);

/// How often expired idle connections are closed when no request comes to take them.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// A connection to a backend, ready for one request at a time.
pub(super) struct BackendConnection {
    pub(super) sender: SendRequest<ForwardBody>,
    /// The socket, for the connection table (drains shut it down by descriptor).
    pub(super) socket: Socket,
    address: SocketAddr,
}

struct Idle {
    connection: BackendConnection,
    since: Instant,
}

/// Why no connection to a backend could be had.
#[derive(Debug)]
pub(super) enum ConnectFailure {
    TimedOut,
    Refused(std::io::Error),
    Other(String),
}

impl ConnectFailure {
    /// The kind, as in `switchyard_upstream_errors_total`.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Self::TimedOut => "connect_timeout",
            Self::Refused(_) => "connect_refused",
            Self::Other(_) => "connect_error",
        }
    }

    pub(super) fn detail(&self) -> String {
        match self {
            Self::TimedOut => "connect timed out".to_string(),
            Self::Refused(e) => e.to_string(),
            Self::Other(e) => e.clone(),
        }
    }
}

/// Idle connections by backend address, at most `limit` in all.
pub(super) struct BackendPool {
    idle: RefCell<HashMap<SocketAddr, Vec<Idle>>>,
    idle_count: Cell<usize>,
    limit: usize,
}

impl BackendPool {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            idle: RefCell::default(),
            idle_count: Cell::new(0),
            limit,
        }
    }

    /// The most recently used idle connection to `address` that still works, or a new one.
    pub(super) async fn get(
        &self,
        address: SocketAddr,
        connect_timeout: Duration,
    ) -> Result<BackendConnection, ConnectFailure> {
        while let Some(idle) = self.take_idle(address) {
            if idle.since.elapsed() >= IDLE_TIMEOUT || idle.connection.sender.is_closed() {
                continue;
            }
            let mut connection = idle.connection;
            if connection.sender.is_ready() {
                return Ok(connection);
            }
            // Its task may not have run since the last answer ended; but a connection still
            // sending the body of a request answered early (a 413 before the upload ended)
            // is not waited for: a new one is quicker than an upload.
            let ready = tokio::time::timeout(READY_WAIT, connection.sender.ready()).await;
            if matches!(ready, Ok(Ok(()))) {
                return Ok(connection);
            }
        }
        connect(address, connect_timeout).await
    }

    /// Keeps `connection`, whose last response was read to the end, for the next request;
    /// closes it when the pool is full.
    pub(super) fn put(&self, connection: BackendConnection) {
        if self.idle_count.get() >= self.limit || connection.sender.is_closed() {
            return;
        }
        self.idle
            .borrow_mut()
            .entry(connection.address)
            .or_default()
            .push(Idle {
                connection,
                since: Instant::now(),
            });
        self.idle_count.set(self.idle_count.get() + 1);
        metrics::HYPER_IDLE_BACKEND_CONNECTIONS.inc();
    }

    fn take_idle(&self, address: SocketAddr) -> Option<Idle> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(&address)?;
        let taken = list.pop();
        if list.is_empty() {
            idle.remove(&address);
        }
        if taken.is_some() {
            self.forget_idle(1);
        }
        taken
    }

    /// Closes the connections idle for too long or closed by their backend.
    fn sweep(&self) {
        let mut idle = self.idle.borrow_mut();
        let before: usize = idle.values().map(Vec::len).sum();
        idle.retain(|_, list| {
            list.retain(|entry| {
                entry.since.elapsed() < IDLE_TIMEOUT && !entry.connection.sender.is_closed()
            });
            !list.is_empty()
        });
        let after: usize = idle.values().map(Vec::len).sum();
        drop(idle);
        self.forget_idle(before - after);
    }

    fn forget_idle(&self, count: usize) {
        self.idle_count.set(self.idle_count.get() - count);
        metrics::HYPER_IDLE_BACKEND_CONNECTIONS.sub(count as i64);
    }
}

/// Closes expired idle connections of `worker`'s pool for as long as its thread runs.
pub(super) async fn sweep_idle(worker: Rc<Worker>) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        worker.pool.sweep();
    }
}

async fn connect(
    address: SocketAddr,
    connect_timeout: Duration,
) -> Result<BackendConnection, ConnectFailure> {
    let stream = match tokio::time::timeout(connect_timeout, TcpStream::connect(address)).await {
        Err(_) => return Err(ConnectFailure::TimedOut),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return Err(ConnectFailure::Refused(e))
        }
        Ok(Err(e)) => return Err(ConnectFailure::Other(e.to_string())),
        Ok(Ok(stream)) => stream,
    };
    let _ = stream.set_nodelay(true);
    let local = stream
        .local_addr()
        .map_err(|e| ConnectFailure::Other(e.to_string()))?;
    let socket = Socket {
        fd: stream.as_raw_fd(),
        local,
    };
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ConnectFailure::Other(e.to_string()))?;
    metrics::HYPER_BACKEND_CONNECTS.inc();
    tokio::task::spawn_local(async move {
        if let Err(e) = connection.with_upgrades().await {
            log::debug!("listener: connection to backend {address} ended: {e}");
        }
    });
    Ok(BackendConnection {
        sender,
        socket,
        address,
    })
}

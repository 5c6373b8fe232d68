//! One thread's connections to backends: made here, kept idle between requests in
//! `idle_connections`, taken again only by the thread that made them, whose runtime drives
//! them: nothing here is shared, locked or watched from elsewhere.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

pub(super) use super::backend_h1::BackendConnection;
use super::EventLoop;
use crate::idle_connections::{IdleConnections, Keepable, SWEEP_EVERY};
use crate::metrics;
use crate::routing::connections::ShutdownRequest;

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

impl Keepable for Box<BackendConnection> {
    fn is_closed(&self) -> bool {
        BackendConnection::is_closed(self)
    }
}

/// Idle connections by backend address, at most `limit` in all.
pub(super) struct BackendPool {
    idle: RefCell<IdleConnections<SocketAddr, Box<BackendConnection>>>,
}

impl BackendPool {
    pub(super) fn new(limit: usize) -> Self {
        let gauge = metrics::IDLE_BACKEND_CONNECTIONS.clone();
        Self {
            idle: RefCell::new(IdleConnections::new(limit, gauge)),
        }
    }

    /// The most recently used idle connection to `address` that still works, or a new one.
    pub(super) async fn get(
        &self,
        address: SocketAddr,
        connect_timeout: Duration,
    ) -> Result<Box<BackendConnection>, ConnectFailure> {
        // Taken only if the backend has not closed it meanwhile (`Keepable`).
        if let Some(connection) = self.idle.borrow_mut().take(&address) {
            return Ok(connection);
        }
        connect(address, connect_timeout).await
    }

    /// Keeps `connection`, whose last response was read to the end, for the next request;
    /// closes it when the pool is full.
    pub(super) fn put(&self, connection: Box<BackendConnection>) {
        self.idle.borrow_mut().put(connection.address, connection);
    }
}

/// Closes expired idle connections of `worker`'s pools (its backends', its mirror copies'
/// and its image originals') for as long as its thread runs.
pub(super) async fn sweep_idle(worker: Rc<EventLoop>) {
    // On the thread's clock: a tokio interval would be the one timer on the thread.
    loop {
        worker.clock.sleep(SWEEP_EVERY).await;
        worker.pool.idle.borrow_mut().sweep();
        worker.mirrors.sweep_idle();
        if let Some(images) = &worker.shared.images {
            images.sweep_idle();
        }
    }
}

async fn connect(
    address: SocketAddr,
    connect_timeout: Duration,
) -> Result<Box<BackendConnection>, ConnectFailure> {
    let stream = match tokio::time::timeout(connect_timeout, TcpStream::connect(address)).await {
        Err(_) => return Err(ConnectFailure::TimedOut),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return Err(ConnectFailure::Refused(e))
        }
        Ok(Err(e)) => return Err(ConnectFailure::Other(e.to_string())),
        Ok(Ok(stream)) => stream,
    };
    let _ = stream.set_nodelay(true);
    metrics::BACKEND_CONNECTS.inc();
    let shutdown = Arc::new(ShutdownRequest::default());
    Ok(BackendConnection::new(stream, address, shutdown))
}

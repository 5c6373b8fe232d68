//! One thread's connections to backends: made here, kept idle between requests in
//! `idle_connections`, taken again only by the thread that made them, whose runtime drives
//! them: nothing here is shared, locked or watched from elsewhere.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

pub(crate) use super::backend_h1::BackendConnection;
use super::failure::ConnectFailure;
use crate::idle_connections::{IdleConnections, Keepable};
use crate::listener::clock::Clock;
use crate::metrics;
use crate::proxy_protocol::Destination;
use crate::routing::connections::ShutdownRequest;

impl Keepable for Box<BackendConnection> {
    fn is_closed(&self) -> bool {
        BackendConnection::is_closed(self)
    }
}

/// Idle connections by destination, at most `limit` in all.
pub(crate) struct BackendPool {
    idle: RefCell<IdleConnections<Destination, Box<BackendConnection>>>,
    /// The thread's deadlines' clock: when each connection was kept, to a tick.
    clock: Rc<Clock>,
}

impl BackendPool {
    pub(crate) fn new(limit: usize, clock: Rc<Clock>) -> Self {
        let gauge = metrics::IDLE_BACKEND_CONNECTIONS.clone();
        Self {
            idle: RefCell::new(IdleConnections::new(limit, gauge)),
            clock,
        }
    }

    /// The most recently used idle connection to `destination` that still works, or a new
    /// one.
    pub(crate) async fn get(
        &self,
        destination: Destination,
        connect_timeout: Duration,
    ) -> Result<Box<BackendConnection>, ConnectFailure> {
        // Taken only if the backend has not closed it meanwhile (`Keepable`).
        let now_ms = self.clock.now_ms();
        if let Some(connection) = self.idle.borrow_mut().take(&destination, now_ms) {
            return Ok(connection);
        }
        connect(destination, connect_timeout).await
    }

    /// Closes the idle connections that have expired.
    pub(crate) fn sweep_idle(&self) {
        self.idle.borrow_mut().sweep(self.clock.now_ms());
    }

    /// Keeps `connection`, whose last response was read to the end, for the next request;
    /// closes it when the pool is full.
    pub(crate) fn put(&self, connection: Box<BackendConnection>) {
        let now_ms = self.clock.now_ms();
        self.idle
            .borrow_mut()
            .put(connection.destination, connection, now_ms);
    }
}

async fn connect(
    destination: Destination,
    connect_timeout: Duration,
) -> Result<Box<BackendConnection>, ConnectFailure> {
    let opening = async {
        let mut stream = TcpStream::connect(destination.backend).await?;
        if let Some(announced) = &destination.announced {
            // Before any request: the header is the connection's first bytes.
            stream.write_all(&announced.header()).await?;
        }
        Ok::<_, std::io::Error>(stream)
    };
    let stream = match tokio::time::timeout(connect_timeout, opening).await {
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
    Ok(BackendConnection::new(stream, destination, shutdown))
}

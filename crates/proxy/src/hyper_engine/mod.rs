//! The request path on hyper: the first part of issue 17's engine change (bench/ENGINE.md).
//! Pingora's own floor costs 1.9–2.2× nginx's CPU per request; a shared-nothing hyper
//! proxy, 1.1–1.3×. This listener serves plain HTTP/1.1 with Switchyard's routing,
//! balancing, retries, passive health, drains, WebSocket relay, access log and metrics on
//! hyper, laid out as nginx's workers are: one thread per worker with its own
//! single-threaded runtime, its own SO_REUSEPORT listening socket and its own pool of idle
//! backend connections, so no request touches state another thread owns.
//!
//! It runs beside the Pingora listeners, on the same routes, so that both engines can be
//! measured in one process and the stages can move over one by one. Apps that use a stage
//! not moved yet (WAF, response cache, images, mirroring, static files) are answered 501
//! here, never served without it; they stay fully served on the Pingora listeners.

mod bodies;
mod pool;
mod relay;
mod service;

use std::cell::Cell;
use std::net::{SocketAddr, TcpListener};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use socket2::{Domain, Socket, Type};
use switchyard_model::ClientTimeouts;
use tokio::sync::watch;

use crate::access_log::AccessLog;
use crate::pipeline::Router;
use crate::route_cache::RouteCache;
use crate::upstream_connections::ConnectionTable;

/// Connections waiting to be accepted, per thread's socket.
const LISTEN_BACKLOG: i32 = 4096;

/// Idle backend connections one thread keeps, over all backends: 4,096 per process on two
/// threads, as the Pingora listeners keep. When full, a connection whose request is done is
/// closed instead of kept.
const IDLE_BACKEND_CONNECTIONS_PER_THREAD: usize = 2048;

/// Largest buffer hyper keeps for one connection's reads: a request head larger than this
/// is refused with 431 (the router's own limit, 32 KiB, is checked when routing).
const MAX_CLIENT_READ_BUFFER: usize = 64 * 1024;

/// When accept fails (out of descriptors), how long a thread waits before trying again, so
/// that it does not spin while the process is at its limit.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// The listening sockets of the hyper listener, one per thread, bound before anything
/// starts so that a taken address is an error at start-up.
pub struct HyperListener {
    address: SocketAddr,
    sockets: Vec<TcpListener>,
}

/// Stops the hyper listener's threads from accepting and asks their connections to finish
/// their current request and close.
pub struct HyperListenerStop(watch::Sender<bool>);

impl HyperListenerStop {
    /// Stops accepting; connections close once their current answer is out.
    pub fn stop(&self) {
        let _ = self.0.send(true);
    }
}

impl HyperListener {
    /// Binds `threads` sockets on `address`, in one SO_REUSEPORT group.
    pub fn bind(address: SocketAddr, threads: usize) -> std::io::Result<Self> {
        let sockets = (0..threads.max(1))
            .map(|_| reuse_port_listener(address))
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Self { address, sockets })
    }

    /// Starts one thread per socket, serving with `router`'s routes, connection table,
    /// access log, redirect port and client deadlines.
    pub fn start(self, router: &Router) -> std::io::Result<HyperListenerStop> {
        let (stop, stopped) = watch::channel(false);
        for (thread, socket) in self.sockets.into_iter().enumerate() {
            let shared = router.shared_with_hyper_listener();
            let stopped = stopped.clone();
            std::thread::Builder::new()
                .name(format!("hyper-listener-{thread}"))
                .spawn(move || {
                    if let Err(e) = run_thread(socket, shared, stopped) {
                        log::error!("hyper listener thread {thread} stopped: {e}");
                    }
                })?;
        }
        log::info!("hyper listener serving http on {}", self.address);
        Ok(HyperListenerStop(stop))
    }
}

/// What every thread of the hyper listener shares with the Pingora listeners.
pub(crate) struct Shared {
    pub(crate) routes: Arc<RouteCache>,
    pub(crate) connections: Arc<ConnectionTable>,
    pub(crate) access_log: AccessLog,
    pub(crate) https_port: Option<u16>,
    pub(crate) client_timeouts: ClientTimeouts,
}

/// One thread's state: the shared parts and its own backend pool.
struct Worker {
    shared: Shared,
    pool: pool::BackendPool,
    open_connections: Cell<usize>,
}

fn run_thread(
    socket: TcpListener,
    shared: Shared,
    mut stopped: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let listener = tokio::net::TcpListener::from_std(socket)?;
        let worker = Rc::new(Worker {
            shared,
            pool: pool::BackendPool::new(IDLE_BACKEND_CONNECTIONS_PER_THREAD),
            open_connections: Cell::new(0),
        });
        tokio::task::spawn_local(pool::sweep_idle(worker.clone()));
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        tokio::task::spawn_local(serve_connection(
                            stream,
                            peer,
                            worker.clone(),
                            stopped.clone(),
                        ));
                    }
                    Err(e) => {
                        log::warn!("hyper listener: accept failed: {e}");
                        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    }
                },
                _ = stopped.changed() => break,
            }
        }
        drop(listener);
        // The process exits once Pingora's grace period is over; until then the connections
        // still open finish their requests on this runtime.
        while worker.open_connections.get() > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    })
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    worker: Rc<Worker>,
    mut stopped: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let _open = OpenConnection::count(&worker);
    let timeouts = worker.shared.client_timeouts;
    let client = peer.ip();
    let service_worker = worker.clone();
    let service =
        service_fn(move |request| service::handle(request, client, service_worker.clone()));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // A kept-alive connection idles, then reads its next head: both within this.
        .header_read_timeout(timeouts.idle + timeouts.header)
        .max_buf_size(MAX_CLIENT_READ_BUFFER);
    let connection = builder
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(connection);
    let outcome = tokio::select! {
        outcome = connection.as_mut() => outcome,
        _ = stopped.changed() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = outcome {
        log::debug!("hyper listener: connection from {peer} ended: {e}");
    }
}

/// Counts a client connection open on its thread while it lives.
struct OpenConnection(Rc<Worker>);

impl OpenConnection {
    fn count(worker: &Rc<Worker>) -> Self {
        worker
            .open_connections
            .set(worker.open_connections.get() + 1);
        Self(worker.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        let open = &self.0.open_connections;
        open.set(open.get().saturating_sub(1));
    }
}

fn reuse_port_listener(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(address), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_tcp_nodelay(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&address.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

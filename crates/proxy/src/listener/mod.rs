//! The listener: HTTP/1.x on the router's own driver (`client_h1`, on `crates/h1`) and
//! HTTP/2 on hyper, in clear and over TLS (certificates by SNI from the certificate cache,
//! rotating ticket keys), and HTTP/3 on quinn and h3 (`h3`) on one thread, laid out as
//! nginx's workers are: one thread per worker with its own single-threaded runtime, its own
//! SO_REUSEPORT listening sockets and its own pool of idle backend connections, so no
//! request touches state another thread owns (bench/ENGINE.md: what a request costs, and
//! why the HTTP/1 path is ours). Each request goes through the phases of
//! `crate::pipeline`; on `--upgrade` the listening sockets are handed to the new process
//! (`handover`).

mod client_h1;
pub(crate) mod clock;
mod connection;
mod h2;
mod h3;
mod handover;
mod quic_steering;
pub(crate) mod read_buffers;
pub(crate) mod relay;
mod send_deadline;
mod tls;

pub use handover::InheritedSockets;
pub use tls::ListenerTls;

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use socket2::{Domain, Socket, Type};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::event_loop::EventLoop;
use crate::isolation::{self, fair_share};
use crate::metrics;
use crate::router::{Router, Shared};
use crate::tls::cert_cache::CertCache;
use crate::traffic::cost;
use connection::{Connection, OpenConnection};
use tls::Accepted;

/// Connections waiting to be accepted, per thread's socket.
const LISTEN_BACKLOG: i32 = 4096;

/// Idle backend connections one thread keeps, over all backends: 4,096 per process on two
/// threads. When full, a connection whose request is done is
/// closed instead of kept.
const IDLE_BACKEND_CONNECTIONS_PER_THREAD: usize = 2048;

/// How often a stopping router looks whether its connections have all closed.
const FINISHED_POLL: Duration = Duration::from_millis(20);

/// When accept fails (out of descriptors), how long a thread waits before trying again, so
/// that it does not spin while the process is at its limit.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// The listening sockets of the listener, one per thread and address, bound before
/// anything starts so that a taken address is an error at start-up.
pub struct Listener {
    threads: usize,
    http: Option<(SocketAddr, Vec<TcpListener>)>,
    https: Option<(SocketAddr, Vec<TcpListener>, Arc<ListenerTls>)>,
    http3: Option<h3::Http3Socket>,
}

/// Stops the listener's threads from accepting and asks their connections to finish
/// their current request and close.
pub struct ListenerStop {
    stop: watch::Sender<bool>,
    offer: handover::Offer,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl ListenerStop {
    /// Stops accepting and closes the listening sockets (a router taking over has its own
    /// copies by now); connections close once their current answer is out.
    pub fn stop(&self) {
        self.offer.withdraw();
        let _ = self.stop.send(true);
    }

    /// Waits, after [`stop`](Self::stop), until every connection has closed or `grace`
    /// has passed; true when all have closed.
    pub fn wait_finished(&self, grace: Duration) -> bool {
        let deadline = std::time::Instant::now() + grace;
        while !self
            .threads
            .iter()
            .all(std::thread::JoinHandle::is_finished)
        {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(FINISHED_POLL);
        }
        true
    }
}

/// One thread's listening sockets: one per address, or more when more were taken over.
#[derive(Default)]
struct ThreadSockets {
    http: Vec<TcpListener>,
    https: Vec<(TcpListener, Arc<ListenerTls>)>,
    http3: Option<h3::Http3Socket>,
}

impl Listener {
    /// A listener run by `threads` threads, on no address yet.
    pub fn new(threads: usize) -> Self {
        Self {
            threads: threads.max(1),
            http: None,
            https: None,
            http3: None,
        }
    }

    /// Serves plain HTTP on `address`: one socket per thread, in one SO_REUSEPORT group,
    /// the sockets `inherited` has for it first.
    pub fn listen_http(
        mut self,
        address: SocketAddr,
        inherited: &mut InheritedSockets,
    ) -> std::io::Result<Self> {
        self.http = Some((address, self.bind(address, inherited)?));
        Ok(self)
    }

    /// Serves HTTPS on `address` with `tls`.
    pub fn listen_https(
        mut self,
        address: SocketAddr,
        tls: ListenerTls,
        inherited: &mut InheritedSockets,
    ) -> std::io::Result<Self> {
        self.https = Some((address, self.bind(address, inherited)?, Arc::new(tls)));
        Ok(self)
    }

    /// Serves HTTP/3 on the UDP `address`, with the certificates `certs` holds (those of
    /// the HTTPS listener). Not handed over on `--upgrade`: the router taking over binds
    /// its own socket beside this one's, and each packet is steered to the router whose
    /// connection it belongs to (`quic_steering`), by the generation `inherited` names.
    /// `early_data`: 0-RTT taken, for safe methods (`h3`).
    pub fn listen_http3(
        mut self,
        address: SocketAddr,
        certs: Arc<CertCache>,
        inherited: &InheritedSockets,
        early_data: bool,
    ) -> std::io::Result<Self> {
        self.http3 = Some(h3::Http3Socket::bind(
            address,
            certs,
            inherited.quic_generation(),
            early_data,
        )?);
        Ok(self)
    }

    /// The sockets for `address`: all those taken over (each may hold queued connections,
    /// so none is closed), and fresh ones until every thread has one.
    fn bind(
        &self,
        address: SocketAddr,
        inherited: &mut InheritedSockets,
    ) -> std::io::Result<Vec<TcpListener>> {
        let mut sockets = inherited.take(address)?;
        if !sockets.is_empty() {
            log::info!("listener took over {} sockets on {address}", sockets.len());
        }
        while sockets.len() < self.threads {
            sockets.push(reuse_port_listener(address)?);
        }
        Ok(sockets)
    }

    /// Starts the threads, serving with `router`'s routes, connection table, access log,
    /// redirect port and client deadlines, and offers the sockets to a router that takes
    /// over from this one (`handover_dir`: the data directory).
    pub fn start(self, router: &Router, handover_dir: &Path) -> std::io::Result<ListenerStop> {
        let (stop, stopped) = watch::channel(false);
        let mut offered = Vec::new();
        let mut per_thread: Vec<ThreadSockets> = (0..self.threads)
            .map(|_| ThreadSockets::default())
            .collect();
        if let Some((address, sockets)) = self.http {
            log::info!("listener serving http on {address}");
            for (i, socket) in sockets.into_iter().enumerate() {
                offered.push((address, socket.try_clone()?));
                per_thread[i % self.threads].http.push(socket);
            }
        }
        if let Some((address, sockets, tls)) = self.https {
            log::info!("listener serving https on {address}");
            for (i, socket) in sockets.into_iter().enumerate() {
                offered.push((address, socket.try_clone()?));
                per_thread[i % self.threads]
                    .https
                    .push((socket, tls.clone()));
            }
        }
        let quic_generation = self.http3.as_ref().map(|http3| http3.generation);
        if let Some(http3) = self.http3 {
            per_thread[0].http3 = Some(http3);
        }
        let offer = handover::offer(handover_dir, offered, quic_generation)?;
        let mut threads = Vec::with_capacity(self.threads);
        for (thread, sockets) in per_thread.into_iter().enumerate() {
            let shared = router.shared_with_listener_threads();
            let stopped = stopped.clone();
            let handle = std::thread::Builder::new()
                .name(format!("hyper-listener-{thread}"))
                .spawn(move || {
                    if let Err(e) = run_thread(sockets, shared, stopped, thread) {
                        log::error!("listener thread {thread} stopped: {e}");
                    }
                })?;
            threads.push(handle);
        }
        Ok(ListenerStop {
            stop,
            offer,
            threads,
        })
    }
}

fn run_thread(
    sockets: ThreadSockets,
    shared: Shared,
    stopped: watch::Receiver<bool>,
    thread: usize,
) -> std::io::Result<()> {
    let mut runtime = tokio::runtime::Builder::new_current_thread();
    runtime.enable_all();
    isolation::watch_event_loop(&mut runtime, thread);
    let runtime = runtime.build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let worker = EventLoop::new(shared, IDLE_BACKEND_CONNECTIONS_PER_THREAD);
        tokio::task::spawn_local(worker.clock.clone().run());
        tokio::task::spawn_local(worker.clone().sweep_idle());
        if cost::attribution_on() {
            tokio::task::spawn_local(cost::reconcile_loop());
        }
        if fair_share::is_on() {
            tokio::task::spawn_local(fair_share::probe_loop());
        }
        let mut accepting = Vec::new();
        for socket in sockets.http {
            let listener = tokio::net::TcpListener::from_std(socket)?;
            accepting.push(tokio::task::spawn_local(accept(
                listener,
                None,
                worker.clone(),
                stopped.clone(),
            )));
        }
        for (socket, tls) in sockets.https {
            let listener = tokio::net::TcpListener::from_std(socket)?;
            accepting.push(tokio::task::spawn_local(accept(
                listener,
                Some(tls),
                worker.clone(),
                stopped.clone(),
            )));
        }
        if let Some(http3) = sockets.http3 {
            let (worker, stopped) = (worker.clone(), stopped.clone());
            accepting.push(tokio::task::spawn_local(async move {
                if let Err(e) = h3::serve(http3, worker, stopped).await {
                    log::error!("listener: HTTP/3 stopped: {e}");
                }
            }));
        }
        for task in accepting {
            let _ = task.await;
        }
        // The connections still open finish their requests on this runtime; the process
        // exits when they all have, or when the shutdown grace is over.
        while worker.open_connections.get() > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    })
}

/// Accepts on one socket until the listener stops; each connection is served by its own
/// task, its TLS handshake included, so a slow handshake never holds the accept loop.
async fn accept(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<ListenerTls>>,
    worker: Rc<EventLoop>,
    mut stopped: watch::Receiver<bool>,
) {
    let listening = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let open = OpenConnection::count(&worker);
                    // A wildcard listener asks the kernel which of its addresses was reached.
                    let reached = if listening.ip().is_unspecified() {
                        stream.local_addr().unwrap_or(listening)
                    } else {
                        listening
                    };
                    let connection = Connection {
                        peer,
                        reached,
                        worker: worker.clone(),
                        stopped: stopped.clone(),
                        _open: open,
                    };
                    match &tls {
                        None => cost::spawn_connection(serve_plain(connection, stream)),
                        Some(tls) => cost::spawn_connection(handshake(connection, stream, tls.clone())),
                    }
                }
                Err(e) => {
                    log::warn!("listener: accept failed: {e}");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            },
            _ = stopped.changed() => return,
        }
    }
}

/// A plain connection: HTTP/2 if it opens with the preface, HTTP/1.x otherwise.
async fn serve_plain(connection: Connection, stream: TcpStream) {
    // The first head is due within the header timeout of the connection's start, the
    // wait for the bytes that tell HTTP/2 from HTTP/1.1 included.
    let deadline =
        (connection.worker.clock).deadline_in(connection.worker.shared.client_timeouts.header);
    let opened = {
        let preface = std::pin::pin!(h2::opens_with_preface(&stream));
        deadline.bound(preface).await
    };
    match opened {
        // Boxed, here and after a handshake: an HTTP/1.x connection's task keeps no room
        // for an HTTP/2 connection's state.
        Ok(Ok(true)) => Box::pin(h2::serve(connection, stream, false)).await,
        Ok(Ok(false)) => client_h1::serve(connection, stream, false, deadline).await,
        Ok(Err(_)) => {}
        Err(_) => metrics::CLIENT_HEAD_TIMEOUTS.inc(),
    }
}

/// A TLS connection: the handshake, then HTTP/2 or HTTP/1.1 as ALPN chose.
async fn handshake(connection: Connection, stream: TcpStream, tls: Arc<ListenerTls>) {
    let header_timeout = connection.worker.shared.client_timeouts.header;
    let deadline = connection.worker.clock.deadline_in(header_timeout);
    match tls.accept(stream, &deadline).await {
        Ok(Accepted::Serve(stream)) if stream.ssl().selected_alpn_protocol() == Some(b"h2") => {
            Box::pin(h2::serve(connection, stream, true)).await;
        }
        Ok(Accepted::AcmeValidation) => {}
        Ok(Accepted::Serve(stream)) => {
            deadline.set_in(header_timeout);
            client_h1::serve(connection, stream, true, deadline).await;
        }
        Err(failure) => log::debug!(
            "listener: TLS handshake with {} not completed: {failure}",
            connection.peer
        ),
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

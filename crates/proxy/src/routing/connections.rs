//! The table of backend connections in use: each with the app, the Host and the backend it
//! serves, so that a change can find the connections it concerns (see `drain`). A request
//! registers its upstream socket once connected and the registration ends with the attempt,
//! so the table holds exactly the connections in use and is bounded by the connections the
//! router accepts (`switchyard_upstream_connections_in_use`).
//!
//! The table never touches a socket: closing one is a request (`ShutdownRequest`) that the
//! socket's owner carries out — hyper's connection task while the connection speaks HTTP,
//! the WebSocket relay after an upgrade. Only the owner knows its descriptor is still that
//! socket's, so a close can never reach a socket that later reused the number.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::metrics;
use crate::routing::route_cache::AppRoute;

/// Shards of the table: a request's register and unregister lock one, so the two threads of
/// the proxy rarely wait on each other.
const SHARDS: usize = 32;

/// Why the router closed a backend connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloseReason {
    /// The app's `drain.removed_backend_s` passed since its backend left the app.
    RemovedBackendDeadline,
    /// The app was deleted, and `--drain-grace-s` passed.
    AppDeleted,
    /// The Host the connection came by now routes to another app or to none, and
    /// `--drain-grace-s` passed.
    DomainMoved,
}

impl CloseReason {
    /// Every reason, for metrics that show each at zero before it happens.
    pub(crate) const ALL: [CloseReason; 3] = [
        CloseReason::RemovedBackendDeadline,
        CloseReason::AppDeleted,
        CloseReason::DomainMoved,
    ];

    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            CloseReason::RemovedBackendDeadline => "removed_backend_deadline",
            CloseReason::AppDeleted => "app_deleted",
            CloseReason::DomainMoved => "domain_moved",
        }
    }
}

/// Connections in use by registration id, for one shard of the ids.
type Shard = Mutex<HashMap<u64, Arc<UpstreamConnection>, ahash::RandomState>>;

/// Every backend connection in use, sharded by registration id.
pub struct ConnectionTable {
    shards: Box<[Shard]>,
    next_id: AtomicU64,
}

impl Default for ConnectionTable {
    fn default() -> Self {
        Self::new()
    }
}

impl ConnectionTable {
    /// An empty table.
    pub fn new() -> Self {
        metrics::register_all();
        for reason in CloseReason::ALL {
            metrics::DRAINED_CONNECTIONS.with_label_values(&[reason.label()]);
        }
        Self {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
            next_id: AtomicU64::new(0),
        }
    }

    /// Records a connection to `backend` made for a request to `route` with Host `host`;
    /// dropping the ticket forgets it.
    pub(crate) fn register(
        self: &Arc<Self>,
        route: Arc<AppRoute>,
        host: &str,
        backend: SocketAddr,
        shutdown: Arc<ShutdownRequest>,
    ) -> ConnectionTicket {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let connection = Arc::new(UpstreamConnection {
            id,
            route,
            host: host.into(),
            backend,
            shutdown,
            state: Mutex::new(ConnectionState::default()),
        });
        self.shard(id).lock().insert(id, connection.clone());
        metrics::UPSTREAM_CONNECTIONS_IN_USE.inc();
        ConnectionTicket {
            table: self.clone(),
            connection,
        }
    }

    /// The connections in use that `wanted` selects.
    pub(crate) fn select(
        &self,
        wanted: impl Fn(&UpstreamConnection) -> bool,
    ) -> Vec<Arc<UpstreamConnection>> {
        let mut selected = Vec::new();
        for shard in self.shards.iter() {
            selected.extend(shard.lock().values().filter(|c| wanted(c)).cloned());
        }
        selected
    }

    /// Number of connections in use.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether no connection is in use.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ids are handed out in sequence, so consecutive registrations take consecutive
    /// shards: as even a spread as hashing gave, without hashing twice per request.
    fn shard(&self, id: u64) -> &Shard {
        &self.shards[(id % SHARDS as u64) as usize]
    }

    fn forget(&self, connection: &UpstreamConnection) {
        self.shard(connection.id).lock().remove(&connection.id);
        metrics::UPSTREAM_CONNECTIONS_IN_USE.dec();
        let mut state = connection.state.lock();
        state.ended = true;
        if state.removed_since.take().is_some() {
            metrics::CONNECTIONS_TO_REMOVED_BACKENDS.dec();
        }
    }
}

/// The router's wish that a backend socket be shut down (both ways), made by a drain and
/// carried out by whoever owns the socket at the time. It outlives any one request: a
/// connection's owner watches it for as long as it holds the socket.
#[derive(Debug, Default)]
pub(crate) struct ShutdownRequest {
    requested: AtomicBool,
    notify: Notify,
}

impl ShutdownRequest {
    /// Asks the owner to shut the socket down.
    pub(crate) fn request(&self) {
        self.requested.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Returns once the shutdown has been asked for (at once if it already was).
    pub(crate) async fn requested(&self) {
        loop {
            // Registered before the flag is read, so a request between the two still wakes it.
            let notified = self.notify.notified();
            if self.requested.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

/// One backend connection in use.
#[derive(Debug)]
pub(crate) struct UpstreamConnection {
    id: u64,
    route: Arc<AppRoute>,
    host: Box<str>,
    backend: SocketAddr,
    shutdown: Arc<ShutdownRequest>,
    state: Mutex<ConnectionState>,
}

#[derive(Debug, Default)]
struct ConnectionState {
    /// Its request is over: nothing is left to close.
    ended: bool,
    /// Since when its backend has been missing from its app.
    removed_since: Option<Instant>,
    /// A timer will look at it again.
    timer: Timers,
    /// Why the router closed it, once it did.
    closed_for: Option<CloseReason>,
}

/// Which timers are armed for a connection: each kind at most once, so that the number of
/// sleeping tasks is bounded by twice the connections in use, whatever the rate of changes.
#[derive(Debug, Default, Clone, Copy)]
struct Timers {
    removed_backend: bool,
    tenancy: bool,
}

/// The kinds of timer a connection can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// Ends it when its removed backend's deadline passes.
    RemovedBackend,
    /// Ends it when the grace after leaving its app's tenancy passes.
    Tenancy,
}

impl UpstreamConnection {
    /// The name of the app the connection serves.
    pub(crate) fn app(&self) -> &str {
        self.route.app.name.as_str()
    }

    /// The Host of the request it was made for (normalised).
    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    /// The backend it is connected to.
    pub(crate) fn backend(&self) -> SocketAddr {
        self.backend
    }

    /// Records that its backend is not in its app's current list; returns since when.
    /// `None` when the request is already over.
    pub(crate) fn mark_backend_removed(&self, now: Instant) -> Option<Instant> {
        let mut state = self.state.lock();
        if state.ended {
            return None;
        }
        if state.removed_since.is_none() {
            state.removed_since = Some(now);
            metrics::CONNECTIONS_TO_REMOVED_BACKENDS.inc();
        }
        state.removed_since
    }

    /// Records that its backend is (again) in its app's current list.
    pub(crate) fn mark_backend_present(&self) {
        if self.state.lock().removed_since.take().is_some() {
            metrics::CONNECTIONS_TO_REMOVED_BACKENDS.dec();
        }
    }

    /// Since when its backend has been missing from its app, if it is.
    pub(crate) fn removed_since(&self) -> Option<Instant> {
        self.state.lock().removed_since
    }

    /// Arms `timer` unless it is armed already or the request is over; true when the caller
    /// must start it.
    pub(crate) fn arm(&self, timer: Timer) -> bool {
        let mut state = self.state.lock();
        let armed = match timer {
            Timer::RemovedBackend => &mut state.timer.removed_backend,
            Timer::Tenancy => &mut state.timer.tenancy,
        };
        if *armed {
            return false;
        }
        *armed = true;
        !state.ended
    }

    /// The timer has run out without closing the connection.
    pub(crate) fn disarm(&self, timer: Timer) {
        let mut state = self.state.lock();
        match timer {
            Timer::RemovedBackend => state.timer.removed_backend = false,
            Timer::Tenancy => state.timer.tenancy = false,
        }
    }

    /// Why the router closed it, if it did: an upgraded connection then ends with a close
    /// frame instead of a bare close.
    pub(crate) fn closed_for(&self) -> Option<CloseReason> {
        self.state.lock().closed_for
    }

    /// Has the socket shut down, which ends the request as if the backend had closed it;
    /// false when its request was already over or the router had closed it already.
    pub(crate) fn close(&self, reason: CloseReason) -> bool {
        {
            let mut state = self.state.lock();
            if state.ended || state.closed_for.is_some() {
                return false;
            }
            state.closed_for = Some(reason);
        }
        self.shutdown.request();
        metrics::DRAINED_CONNECTIONS
            .with_label_values(&[reason.label()])
            .inc();
        log::info!(
            "closed a connection of app {} (Host {}) to backend {}: {}",
            self.app(),
            self.host,
            self.backend,
            reason.label()
        );
        true
    }

    /// The request its socket's owner watches.
    pub(crate) fn shutdown_request(&self) -> &Arc<ShutdownRequest> {
        &self.shutdown
    }
}

/// A connection's place in the table, held by its request's context.
#[derive(Debug)]
pub(crate) struct ConnectionTicket {
    table: Arc<ConnectionTable>,
    connection: Arc<UpstreamConnection>,
}

impl ConnectionTicket {
    /// The registered connection.
    pub(crate) fn connection(&self) -> &UpstreamConnection {
        &self.connection
    }
}

impl Drop for ConnectionTicket {
    fn drop(&mut self) {
        self.table.forget(&self.connection);
    }
}

impl std::fmt::Debug for ConnectionTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionTable")
            .field("connections", &self.len())
            .finish()
    }
}

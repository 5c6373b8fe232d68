//! One event loop's state (one per listener thread): what every thread shares (the
//! router's [`Shared`]) and what is this thread's own: its idle backend connections, its
//! connections to shadow backends and for the cache's revalidations, its clock, its count
//! of open client connections.
//! Not the worker pool's CPU threads (`isolation::worker_pool`).

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use crate::idle_connections::SWEEP_EVERY;
use crate::listener::clock::Clock;
use crate::metrics;
use crate::router::Shared;
use crate::stage::mirror::MirrorClient;
use crate::upstream::outbound::SidePool;
use crate::upstream::pool::BackendPool;

/// Idle connections kept per thread for the cache's background revalidations.
const CACHE_REFRESH_IDLE: usize = 64;
/// Idle connections kept per thread for the calls filters make.
const FILTER_CALLS_IDLE: usize = 64;

pub(crate) struct EventLoop {
    pub(crate) shared: Shared,
    pub(crate) pool: BackendPool,
    /// This thread's connections to shadow backends.
    pub(crate) mirrors: Arc<MirrorClient>,
    /// This thread's connections for the cache's background revalidations, apart from the
    /// client's own backend pool.
    pub(crate) cache_refreshes: Arc<SidePool>,
    /// This thread's connections for the calls apps' filters make.
    pub(crate) filter_calls: SidePool,
    pub(crate) open_connections: Cell<usize>,
    /// The deadlines of this thread's connections and exchanges.
    pub(crate) clock: Rc<Clock>,
}

impl EventLoop {
    /// A thread's loop over `shared`, keeping at most `idle_backend_connections`.
    pub(crate) fn new(shared: Shared, idle_backend_connections: usize) -> Rc<Self> {
        let clock = Clock::new();
        Rc::new(Self {
            shared,
            pool: BackendPool::new(idle_backend_connections, clock.clone()),
            mirrors: Arc::new(MirrorClient::new()),
            cache_refreshes: Arc::new(SidePool::new(
                CACHE_REFRESH_IDLE,
                metrics::SIDE_IDLE_CONNECTIONS.with_label_values(&["cache"]),
            )),
            filter_calls: SidePool::new(
                FILTER_CALLS_IDLE,
                metrics::SIDE_IDLE_CONNECTIONS.with_label_values(&["filter_calls"]),
            ),
            open_connections: Cell::new(0),
            clock,
        })
    }

    /// Closes expired idle connections of this thread's pools (its backends', its mirror
    /// copies' and its image originals') for as long as its thread runs.
    pub(crate) async fn sweep_idle(self: Rc<Self>) {
        // On the thread's clock: a tokio interval would be the one timer on the thread.
        loop {
            self.clock.sleep(SWEEP_EVERY).await;
            self.pool.sweep_idle();
            self.mirrors.sweep_idle();
            self.cache_refreshes.sweep();
            self.filter_calls.sweep();
            if let Some(images) = &self.shared.images {
                images.sweep_idle();
            }
        }
    }
}

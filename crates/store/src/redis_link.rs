//! One lazily made connection to a Redis, shared by every caller, with a deadline on every
//! call and a pause between connection attempts: during an outage a caller waits at most one
//! deadline, and most fail at once instead of each waiting for its own connect timeout.
//! The fleet store and the response cache's Redis both talk to Redis through it.
//!
//! Behind Sentinels the link asks them for the primary whenever it has no connection (at
//! start and after any failure), and follows their `+switch-master` announcements so it
//! moves to a promoted replica within a second even while the old primary still answers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::aio::ConnectionManager;
use tokio::sync::{watch, Mutex};

use crate::metrics;
use crate::redis_target::{RedisTarget, SentinelTarget};

/// After a failed connection attempt, calls fail at once for this long.
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);
/// Pause before trying the next Sentinel when a `+switch-master` subscription fails.
const SENTINEL_WATCH_RETRY: Duration = Duration::from_millis(250);
/// How often the Sentinel watcher checks that its link still exists.
const SENTINEL_WATCH_TICK: Duration = Duration::from_secs(1);

/// Deadlines of a Redis link.
#[derive(Debug, Clone, Copy)]
pub struct RedisTimeouts {
    /// One command, including waiting for a connection being made.
    pub operation: Duration,
    /// Establishing a connection.
    pub connect: Duration,
    /// The longest a call that blocks by design (`WAIT`) may take beyond `operation`.
    pub blocking: Duration,
}

impl Default for RedisTimeouts {
    fn default() -> Self {
        Self {
            operation: Duration::from_millis(500),
            connect: Duration::from_millis(500),
            blocking: Duration::ZERO,
        }
    }
}

/// Why a call did not return a value.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// A recent connection attempt failed; no new one is made before the pause ends.
    #[error("Redis is unreachable ({0})")]
    Paused(String),
    /// Connecting failed now.
    #[error("cannot connect to Redis: {0}")]
    Connect(String),
    /// Redis answered with an error (a script error, a wrong type): the connection is fine.
    #[error("Redis refused: {0}")]
    Refused(String),
    /// The connection broke during the call.
    #[error("Redis: {0}")]
    Lost(String),
    /// No answer within the operation deadline.
    #[error("Redis: no answer within the deadline")]
    TimedOut,
}

impl LinkError {
    /// The metric label of this failure; `None` for calls refused during the pause, which
    /// would otherwise count every request of an outage.
    pub fn kind(&self) -> Option<&'static str> {
        match self {
            Self::Paused(_) => None,
            Self::Connect(_) => Some("connect"),
            Self::Refused(_) => Some("refused"),
            Self::Lost(_) => Some("connection"),
            Self::TimedOut => Some("timeout"),
        }
    }

    /// Whether the link is down (as opposed to Redis refusing one command).
    pub fn is_outage(&self) -> bool {
        !matches!(self, Self::Refused(_))
    }
}

/// The connection state behind the link's lock.
#[derive(Default)]
struct LinkState {
    manager: Option<ConnectionManager>,
    last_failure: Option<Instant>,
    /// Why the last attempt failed, told to the calls refused during the pause.
    last_reason: String,
    /// The server connected to (or last found): `host:port` and its client.
    primary: Option<(String, redis::Client)>,
}

/// A connection to one Redis (or to the primary of a Sentinel-watched set), made on first
/// use and remade after a failure.
pub struct RedisLink {
    shared: Arc<LinkShared>,
}

struct LinkShared {
    target: RedisTarget,
    /// Who uses this link, for log lines and metrics ("route store", "response cache").
    role: &'static str,
    timeouts: RedisTimeouts,
    /// Reconnection attempts the connection manager makes inside one call.
    retries: usize,
    state: Mutex<LinkState>,
    /// Counts the primary's moves; the change follower re-subscribes on each.
    moves: watch::Sender<u64>,
    /// Whether the `+switch-master` watcher runs (started on first use, needing a runtime).
    watching: AtomicBool,
    /// `host:port` of the primary last found, readable without waiting for the state lock.
    primary_address: parking_lot::Mutex<Option<String>>,
}

impl RedisLink {
    /// A link to `url` (`redis://[:password@]host:port/db`, `rediss://`, or
    /// `redis+sentinel://[:password@]host:port[,host:port…]/master/db`); nothing is
    /// connected yet.
    pub fn new(
        url: &str,
        role: &'static str,
        timeouts: RedisTimeouts,
        retries: usize,
    ) -> Result<Self, String> {
        let target = RedisTarget::parse(url)?;
        let mut state = LinkState::default();
        if let RedisTarget::Server(client) = &target {
            let address = client.get_connection_info().addr.to_string();
            state.primary = Some((address, client.clone()));
        }
        let primary_address = state.primary.as_ref().map(|(address, _)| address.clone());
        metrics::register_all();
        Ok(Self {
            shared: Arc::new(LinkShared {
                target,
                role,
                timeouts,
                retries,
                state: Mutex::new(state),
                moves: watch::channel(0).0,
                watching: AtomicBool::new(false),
                primary_address: parking_lot::Mutex::new(primary_address),
            }),
        })
    }

    /// The deadlines this link was made with.
    pub fn timeouts(&self) -> RedisTimeouts {
        self.shared.timeouts
    }

    /// `redis`, or `redis+sentinel` for a link that follows Sentinels.
    pub fn kind(&self) -> &'static str {
        match self.shared.target {
            RedisTarget::Server(_) => "redis",
            RedisTarget::Sentinel(_) => "redis+sentinel",
        }
    }

    /// Where the link points, never with a password: `host:port/db`, or for Sentinels
    /// `sentinel:MASTER@host:port,…/db`.
    pub fn location(&self) -> String {
        match &self.shared.target {
            RedisTarget::Server(client) => {
                let info = client.get_connection_info();
                format!("{}/{}", info.addr, info.redis.db)
            }
            RedisTarget::Sentinel(sentinel) => format!(
                "sentinel:{}@{}/{}",
                sentinel.master(),
                sentinel.sentinels().join(","),
                sentinel.db()
            ),
        }
    }

    /// The server last connected to (for Sentinels: the primary last found), `host:port`.
    pub fn primary(&self) -> Option<String> {
        self.shared.primary_address.lock().clone()
    }

    /// Changes each time the primary moves: a Pub/Sub follower re-subscribes on it.
    pub fn moves(&self) -> watch::Receiver<u64> {
        self.shared.moves.subscribe()
    }

    /// A Pub/Sub connection to the current primary (found first if need be).
    pub async fn pubsub(&self) -> Result<redis::aio::PubSub, LinkError> {
        self.connection().await?;
        let client = {
            let state = self.shared.state.lock().await;
            match &state.primary {
                Some((_, client)) => client.clone(),
                None => return Err(LinkError::Paused(state.last_reason.clone())),
            }
        };
        match tokio::time::timeout(self.shared.timeouts.connect, client.get_async_pubsub()).await {
            Ok(Ok(pubsub)) => Ok(pubsub),
            Ok(Err(e)) => Err(LinkError::Connect(e.to_string())),
            Err(_) => Err(LinkError::Connect("connect timed out".into())),
        }
    }

    /// The shared connection, made now if there is none and the pause is over.
    pub async fn connection(&self) -> Result<ConnectionManager, LinkError> {
        let shared = &self.shared;
        let mut state = shared.state.lock().await;
        if let Some(manager) = &state.manager {
            return Ok(manager.clone());
        }
        if state
            .last_failure
            .is_some_and(|at| at.elapsed() < RECONNECT_PAUSE)
        {
            return Err(LinkError::Paused(state.last_reason.clone()));
        }
        let client = match &shared.target {
            RedisTarget::Server(client) => client.clone(),
            RedisTarget::Sentinel(sentinel) => {
                self.watch_sentinels();
                match sentinel.find_primary(shared.timeouts.connect).await {
                    Ok(primary) => match sentinel.client_for(&primary) {
                        Ok(client) => {
                            shared.adopt_primary(&mut state, primary, client.clone());
                            client
                        }
                        Err(reason) => return Err(shared.connect_failed(&mut state, reason)),
                    },
                    Err(reason) => return Err(shared.connect_failed(&mut state, reason)),
                }
            }
        };
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(shared.timeouts.connect)
            // Each call's own deadline is `call_within`'s; this only has to let the longest
            // through.
            .set_response_timeout(shared.timeouts.operation + shared.timeouts.blocking)
            .set_number_of_retries(shared.retries)
            .set_max_delay(200);
        let attempt = tokio::time::timeout(
            shared.timeouts.connect * 2,
            client.get_connection_manager_with_config(config),
        )
        .await;
        let reason = match attempt {
            Ok(Ok(manager)) => {
                state.manager = Some(manager.clone());
                if state.last_failure.take().is_some() {
                    log::info!("{}: reconnected to Redis", shared.role);
                }
                return Ok(manager);
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "connect timed out".to_string(),
        };
        Err(shared.connect_failed(&mut state, reason))
    }

    /// Runs one call within the operation deadline. A broken connection is dropped so the
    /// next call makes a new one (after the pause); so is one to a server that is no longer
    /// the primary (`READONLY`), so the next call asks the Sentinels again.
    pub async fn call<T, F, Fut>(&self, op: F) -> Result<T, LinkError>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        self.call_within(self.shared.timeouts.operation, op).await
    }

    /// [`RedisLink::call`] with a deadline of its own, for a call that blocks by design
    /// (`WAIT`).
    pub async fn call_within<T, F, Fut>(&self, deadline: Duration, op: F) -> Result<T, LinkError>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let manager = self.connection().await?;
        let error = match tokio::time::timeout(deadline, op(manager)).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) if e.kind() == redis::ErrorKind::ResponseError => {
                return Err(LinkError::Refused(e.to_string()))
            }
            Ok(Err(e)) => LinkError::Lost(e.to_string()),
            Err(_) => LinkError::TimedOut,
        };
        let mut state = self.shared.state.lock().await;
        if state.manager.take().is_some() {
            log::warn!("{}: lost the Redis connection: {error}", self.shared.role);
        }
        state.last_failure = Some(Instant::now());
        state.last_reason = error.to_string();
        Err(error)
    }

    /// Starts, once, the task that follows the Sentinels' `+switch-master` announcements.
    /// It holds the link weakly and ends soon after the link is dropped.
    fn watch_sentinels(&self) {
        if !matches!(self.shared.target, RedisTarget::Sentinel(_))
            || self.shared.watching.swap(true, Ordering::Relaxed)
        {
            return;
        }
        tokio::spawn(watch_sentinels(Arc::downgrade(&self.shared)));
    }
}

impl LinkShared {
    fn connect_failed(&self, state: &mut LinkState, reason: String) -> LinkError {
        if state.last_failure.is_none() {
            log::warn!("{}: cannot connect to Redis: {reason}", self.role);
        }
        state.last_failure = Some(Instant::now());
        state.last_reason.clone_from(&reason);
        LinkError::Connect(reason)
    }

    /// Records the primary found; a different one than before is a move.
    fn adopt_primary(&self, state: &mut LinkState, primary: (String, u16), client: redis::Client) {
        let address = format!("{}:{}", primary.0, primary.1);
        let moved = match &state.primary {
            Some((previous, _)) if *previous == address => false,
            Some((previous, _)) => {
                log::warn!(
                    "{}: the Redis primary moved from {previous} to {address}",
                    self.role
                );
                true
            }
            None => {
                log::info!(
                    "{}: the Sentinels name {address} as the Redis primary",
                    self.role
                );
                false
            }
        };
        *self.primary_address.lock() = Some(address.clone());
        state.primary = Some((address, client));
        if moved {
            metrics::PRIMARY_MOVES.with_label_values(&[self.role]).inc();
            self.moves.send_modify(|moves| *moves += 1);
        }
    }

    /// A Sentinel announced a new primary: drop the connection to the old one and end the
    /// pause, so the next call connects to the new one at once.
    async fn switch_to(&self, sentinel: &SentinelTarget, primary: (String, u16)) {
        let Ok(client) = sentinel.client_for(&primary) else {
            return;
        };
        let mut state = self.state.lock().await;
        let same = state
            .primary
            .as_ref()
            .is_some_and(|(address, _)| *address == format!("{}:{}", primary.0, primary.1));
        if same && state.manager.is_some() {
            return;
        }
        state.manager = None;
        state.last_failure = None;
        self.adopt_primary(&mut state, primary, client);
    }
}

/// Follows `+switch-master` on one Sentinel at a time, moving to the next when it goes
/// away. On each new subscription the primary is asked for again: a switch announced
/// while no Sentinel was followed is not missed.
async fn watch_sentinels(link: Weak<LinkShared>) {
    let mut index = 0;
    loop {
        let Some(shared) = link.upgrade() else { return };
        let RedisTarget::Sentinel(sentinel) = &shared.target else {
            return;
        };
        let count = sentinel.sentinel_count();
        let timeouts = shared.timeouts;
        let client = sentinel.sentinel_client(index % count);
        index += 1;
        drop(shared);
        let Some(client) = client else { return };
        let subscribed = async {
            let mut pubsub = client.get_async_pubsub().await.ok()?;
            pubsub.subscribe("+switch-master").await.ok()?;
            Some(pubsub)
        };
        let Ok(Some(mut pubsub)) = tokio::time::timeout(timeouts.connect, subscribed).await else {
            tokio::time::sleep(SENTINEL_WATCH_RETRY).await;
            continue;
        };
        {
            let Some(shared) = link.upgrade() else { return };
            let RedisTarget::Sentinel(sentinel) = &shared.target else {
                return;
            };
            if let Ok(primary) = sentinel.find_primary(timeouts.connect).await {
                shared.switch_to(sentinel, primary).await;
            }
        }
        let mut messages = pubsub.on_message();
        let mut tick = tokio::time::interval(SENTINEL_WATCH_TICK);
        loop {
            tokio::select! {
                message = messages.next() => {
                    let Some(message) = message else { break };
                    let Ok(payload) = message.get_payload::<String>() else { continue };
                    let Some(shared) = link.upgrade() else { return };
                    let RedisTarget::Sentinel(sentinel) = &shared.target else { return };
                    // "<master name> <old ip> <old port> <new ip> <new port>"
                    let fields: Vec<&str> = payload.split(' ').collect();
                    if let [name, _, _, host, port] = fields[..] {
                        if name == sentinel.master() {
                            if let Ok(port) = port.parse() {
                                shared.switch_to(sentinel, (host.to_string(), port)).await;
                            }
                        }
                    }
                }
                _ = tick.tick() => {
                    if link.strong_count() == 0 {
                        return;
                    }
                }
            }
        }
        tokio::time::sleep(SENTINEL_WATCH_RETRY).await;
    }
}

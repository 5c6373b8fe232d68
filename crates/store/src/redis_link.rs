//! One lazily made connection to a Redis, shared by every caller, with a deadline on every
//! call and a pause between connection attempts: during an outage a caller waits at most one
//! deadline, and most fail at once instead of each waiting for its own connect timeout.
//! The fleet store and the response cache's Redis both talk to Redis through it.

use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use tokio::sync::Mutex;

/// After a failed connection attempt, calls fail at once for this long.
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);

/// Deadlines of a Redis link.
#[derive(Debug, Clone, Copy)]
pub struct RedisTimeouts {
    /// One command, including waiting for a connection being made.
    pub operation: Duration,
    /// Establishing a connection.
    pub connect: Duration,
}

impl Default for RedisTimeouts {
    fn default() -> Self {
        Self {
            operation: Duration::from_millis(500),
            connect: Duration::from_millis(500),
        }
    }
}

/// Why a call did not return a value.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// A recent connection attempt failed; no new one is made before the pause ends.
    #[error("Redis is unreachable")]
    Paused,
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
            Self::Paused => None,
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

#[derive(Default)]
struct LinkState {
    manager: Option<ConnectionManager>,
    last_failure: Option<Instant>,
}

/// A connection to one Redis, made on first use and remade after a failure.
pub struct RedisLink {
    client: redis::Client,
    /// Who uses this link, for log lines ("route store", "response cache").
    role: &'static str,
    timeouts: RedisTimeouts,
    /// Reconnection attempts the connection manager makes inside one call.
    retries: usize,
    state: Mutex<LinkState>,
}

impl RedisLink {
    /// A link to `url` (`redis://[:password@]host:port/db` or `rediss://`); nothing is
    /// connected yet.
    pub fn new(
        url: &str,
        role: &'static str,
        timeouts: RedisTimeouts,
        retries: usize,
    ) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|e| format!("invalid Redis URL: {e}"))?;
        Ok(Self {
            client,
            role,
            timeouts,
            retries,
            state: Mutex::new(LinkState::default()),
        })
    }

    /// The client, for connections the link does not manage (Pub/Sub).
    pub fn client(&self) -> &redis::Client {
        &self.client
    }

    /// The deadlines this link was made with.
    pub fn timeouts(&self) -> RedisTimeouts {
        self.timeouts
    }

    /// The shared connection, made now if there is none and the pause is over.
    pub async fn connection(&self) -> Result<ConnectionManager, LinkError> {
        let mut state = self.state.lock().await;
        if let Some(manager) = &state.manager {
            return Ok(manager.clone());
        }
        if state
            .last_failure
            .is_some_and(|at| at.elapsed() < RECONNECT_PAUSE)
        {
            return Err(LinkError::Paused);
        }
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(self.timeouts.connect)
            .set_response_timeout(self.timeouts.operation)
            .set_number_of_retries(self.retries)
            .set_max_delay(200);
        let attempt = tokio::time::timeout(
            self.timeouts.connect * 2,
            self.client.get_connection_manager_with_config(config),
        )
        .await;
        let reason = match attempt {
            Ok(Ok(manager)) => {
                state.manager = Some(manager.clone());
                if state.last_failure.take().is_some() {
                    log::info!("{}: reconnected to Redis", self.role);
                }
                return Ok(manager);
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "connect timed out".to_string(),
        };
        if state.last_failure.is_none() {
            log::warn!("{}: cannot connect to Redis: {reason}", self.role);
        }
        state.last_failure = Some(Instant::now());
        Err(LinkError::Connect(reason))
    }

    /// Runs one call within the operation deadline. A broken connection is dropped so the
    /// next call makes a new one (after the pause).
    pub async fn call<T, F, Fut>(&self, op: F) -> Result<T, LinkError>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let manager = self.connection().await?;
        let error = match tokio::time::timeout(self.timeouts.operation, op(manager)).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) if e.kind() == redis::ErrorKind::ResponseError => {
                return Err(LinkError::Refused(e.to_string()))
            }
            Ok(Err(e)) => LinkError::Lost(e.to_string()),
            Err(_) => LinkError::TimedOut,
        };
        let mut state = self.state.lock().await;
        if state.manager.take().is_some() {
            log::warn!("{}: lost the Redis connection: {error}", self.role);
        }
        state.last_failure = Some(Instant::now());
        Err(error)
    }
}

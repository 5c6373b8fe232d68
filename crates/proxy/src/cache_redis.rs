//! The response cache's Redis (`--cache-redis`), kept apart from the route store: a cache
//! Redis runs with `maxmemory` and `allkeys-lru`, which must never evict routes.
//!
//! Every call has a short deadline, and any error or timeout is a cache miss: the app
//! answers instead, never a 5xx. After a failed connection attempt the next one waits a
//! moment, so during an outage a request costs at most one attempt's deadline.

use std::time::{Duration, Instant};

use bytes::Bytes;
use redis::aio::ConnectionManager;
use redis::AsyncCommands;
use tokio::sync::Mutex;

use crate::metrics;

/// Pause between connection attempts while the cache Redis is unreachable.
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);
/// The hash of seed 004's layout holding each URL's current version.
const VERSIONS_HASH: &str = "resource_versions";

/// A lazily connected client of the cache Redis.
pub struct CacheRedis {
    client: redis::Client,
    timeout: Duration,
    connection: Mutex<Connection>,
}

#[derive(Default)]
struct Connection {
    manager: Option<ConnectionManager>,
    last_failure: Option<Instant>,
}

impl CacheRedis {
    /// A client for `url` (`redis://` or `rediss://`) whose calls give up after `timeout`.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|e| format!("cache Redis URL: {e}"))?;
        Ok(Self {
            client,
            timeout,
            connection: Mutex::new(Connection::default()),
        })
    }

    /// The body stored for `full_url` at its current version, seed 004's way: `HGET
    /// resource_versions FULL_URL`, then `GET FULL_URL:version=N`. `None` on a miss, an
    /// empty body, or any error.
    pub(crate) async fn versioned_body(&self, full_url: &str) -> Option<Bytes> {
        let mut manager = self.manager().await?;
        let lookup = async {
            let version: Option<String> = manager.hget(VERSIONS_HASH, full_url).await?;
            match version {
                Some(version) => {
                    let key = format!("{full_url}:version={}", version.trim());
                    manager.get::<_, Option<Vec<u8>>>(key).await
                }
                None => Ok(None),
            }
        };
        match tokio::time::timeout(self.timeout, lookup).await {
            Ok(Ok(body)) => body.filter(|b| !b.is_empty()).map(Bytes::from),
            Ok(Err(e)) => {
                self.failed(&format!("{e}")).await;
                None
            }
            Err(_) => {
                metrics::CACHE_REDIS_ERRORS
                    .with_label_values(&["timeout"])
                    .inc();
                None
            }
        }
    }

    async fn manager(&self) -> Option<ConnectionManager> {
        let mut state = self.connection.lock().await;
        if let Some(manager) = &state.manager {
            return Some(manager.clone());
        }
        if state
            .last_failure
            .is_some_and(|at| at.elapsed() < RECONNECT_PAUSE)
        {
            return None;
        }
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(self.timeout)
            .set_response_timeout(self.timeout)
            .set_number_of_retries(0);
        let attempt = tokio::time::timeout(
            self.timeout * 2,
            self.client.get_connection_manager_with_config(config),
        )
        .await;
        match attempt {
            Ok(Ok(manager)) => {
                state.manager = Some(manager.clone());
                state.last_failure = None;
                Some(manager)
            }
            _ => {
                if state.last_failure.is_none() {
                    log::warn!("cache Redis unreachable: cached pages come from the apps");
                }
                state.last_failure = Some(Instant::now());
                metrics::CACHE_REDIS_ERRORS
                    .with_label_values(&["connect"])
                    .inc();
                None
            }
        }
    }

    /// A call failed: drop the connection so the next call makes a fresh one.
    async fn failed(&self, reason: &str) {
        metrics::CACHE_REDIS_ERRORS
            .with_label_values(&["call"])
            .inc();
        let mut state = self.connection.lock().await;
        if state.manager.take().is_some() {
            log::warn!("cache Redis call failed: {reason}");
        }
        state.last_failure = Some(Instant::now());
    }
}

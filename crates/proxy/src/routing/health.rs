//! Active HTTP health checks for apps that ask for them. Only apps in the route cache are
//! probed: an app nobody requested recently has no traffic to protect, and probing every
//! stored app would make the router's cost grow with the platform's size. The route cache
//! keeps the short list of such apps, so a tick costs nothing for apps without checks.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::shutdown::ShutdownWatch;
use switchyard_model::{HealthCheck, ProxyProtocol};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::metrics;
use crate::proxy_protocol::Announced;
use crate::routing::balancer::BackendState;
use crate::routing::route_cache::RouteCache;

const TICK: Duration = Duration::from_millis(100);
/// Probes running at once, across all apps.
const MAX_CONCURRENT_PROBES: usize = 256;

/// The background service that probes backends.
pub struct HealthChecker {
    routes: Arc<RouteCache>,
}

impl HealthChecker {
    /// A checker over the cached routes.
    pub fn new(routes: Arc<RouteCache>) -> Self {
        Self { routes }
    }

    /// Runs until `shutdown` changes.
    pub async fn run(&self, mut shutdown: ShutdownWatch) {
        let permits = Arc::new(Semaphore::new(MAX_CONCURRENT_PROBES));
        let mut next_due: HashMap<(String, SocketAddr), Instant> = HashMap::new();
        let mut ticker = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shutdown.changed() => return,
            }
            let routes = self.routes.health_checked_routes();
            if routes.is_empty() {
                // Nothing to probe: no tick until an app with a check is routed, so an idle
                // router does not wake ten times a second for nothing.
                next_due.clear();
                tokio::select! {
                    () = self.routes.health_check_added() => {}
                    _ = shutdown.changed() => return,
                }
                ticker.reset_immediately();
                continue;
            }
            let now = Instant::now();
            let mut seen = Vec::new();
            for route in routes {
                let Some(check) = route.app.health_check.clone() else {
                    continue;
                };
                let host = route
                    .app
                    .domains
                    .iter()
                    .find(|d| !d.is_wildcard())
                    .map_or_else(|| route.app.name.to_string(), ToString::to_string);
                for backend in route.upstream.backends() {
                    let key = (route.app.name.to_string(), backend.address);
                    let due = next_due.get(&key).is_none_or(|at| *at <= now);
                    seen.push(key.clone());
                    if !due {
                        continue;
                    }
                    let Ok(permit) = permits.clone().try_acquire_owned() else {
                        // All probe slots busy: try again next tick rather than queueing.
                        continue;
                    };
                    next_due.insert(key, now + Duration::from_millis(check.interval_ms));
                    let backend = backend.clone();
                    let (check, host, app) =
                        (check.clone(), host.clone(), route.app.name.to_string());
                    let proxy_protocol = route.app.forwarding.proxy_protocol;
                    tokio::spawn(async move {
                        probe_and_record(&app, &backend, &check, &host, proxy_protocol).await;
                        drop(permit);
                    });
                }
            }
            next_due.retain(|key, _| seen.contains(key));
        }
    }
}

async fn probe_and_record(
    app: &str,
    backend: &BackendState,
    check: &HealthCheck,
    host: &str,
    proxy_protocol: Option<ProxyProtocol>,
) {
    let ok = probe(backend.address, check, host, proxy_protocol).await;
    if let Some(healthy) =
        backend.record_probe(ok, check.healthy_threshold, check.unhealthy_threshold)
    {
        let state = if healthy { "up" } else { "down" };
        log::warn!(
            "app {app}: backend {} is {state} (active health check {})",
            backend.address,
            check.path
        );
        metrics::HEALTH_TRANSITIONS
            .with_label_values(&[app, state])
            .inc();
    }
}

/// One GET of the check path, after the PROXY protocol's "local" header for a backend that
/// reads one; healthy on a 2xx or 3xx status line within the deadline.
pub(crate) async fn probe(
    address: SocketAddr,
    check: &HealthCheck,
    host: &str,
    proxy_protocol: Option<ProxyProtocol>,
) -> bool {
    let deadline = Duration::from_millis(check.timeout_ms);
    let attempt = async {
        let mut stream = TcpStream::connect(address).await.ok()?;
        if let Some(version) = proxy_protocol {
            let own = Announced {
                version,
                ends: None,
            };
            stream.write_all(&own.header()).await.ok()?;
        }
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: switchyard-health-check\r\nConnection: close\r\n\r\n",
            check.path
        );
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 16];
        let mut filled = 0;
        while filled < 12 {
            let n = stream.read(&mut head[filled..]).await.ok()?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        parse_status(&head[..filled])
    };
    matches!(
        tokio::time::timeout(deadline, attempt).await,
        Ok(Some(200..=399))
    )
}

fn parse_status(head: &[u8]) -> Option<u16> {
    let line = std::str::from_utf8(head).ok()?;
    let rest = line.strip_prefix("HTTP/1.")?;
    rest.get(2..5)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_are_parsed() {
        assert_eq!(parse_status(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(parse_status(b"HTTP/1.0 503 x"), Some(503));
        assert_eq!(parse_status(b"SSH-2.0-Open"), None);
        assert_eq!(parse_status(b"HTTP/1.1 2"), None);
    }
}

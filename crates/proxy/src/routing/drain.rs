//! When the router ends a backend connection after a change. No change cuts a connection by
//! itself; only deletion or a domain transfer does, after a grace:
//!
//! - **A backend removed from its app** (scale down, redeploy, address change) gets no new
//!   request (the balancer's concern), but its open connections — WebSockets, downloads,
//!   streams — go on until the client or the backend closes them: the platform decides when a
//!   container dies, not the router. An app that wants otherwise sets
//!   `drain.removed_backend_s`: a connection still open that long after its backend left is
//!   closed (a WebSocket with a close frame 1001, see `websocket_close`).
//! - **An app deleted, or the Host a connection came by now owned by another app or by none**
//!   (a domain moved or dropped): a tenancy boundary. Its connections are closed after
//!   `--drain-grace-s`.
//!
//! Each change is reviewed after the route cache applied it, by reading the current routes,
//! never the change's own content: reviews of consecutive changes may finish in any order and
//! still agree. A timer that runs out looks again before it closes anything, so a backend or
//! a domain given back in the meantime keeps its connections. A store that cannot answer
//! closes nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_model::Change;

use crate::routing::connections::{CloseReason, ConnectionTable, Timer, UpstreamConnection};
use crate::routing::route_cache::{AppRoute, RouteCache};

/// Reviews the connections a change concerns and closes those that must end.
pub struct ConnectionDrain {
    connections: Arc<ConnectionTable>,
    routes: Arc<RouteCache>,
    grace: Duration,
}

/// Where a connection's Host routes now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tenancy {
    /// Still to the connection's app.
    Kept,
    /// The app is gone.
    AppDeleted,
    /// To another app, or to none.
    DomainMoved,
    /// The store could not say.
    Unknown,
}

impl ConnectionDrain {
    /// Drains `connections` by the current state of `routes`; deletions and domain transfers
    /// close connections after `grace`.
    pub fn new(
        connections: Arc<ConnectionTable>,
        routes: Arc<RouteCache>,
        grace: Duration,
    ) -> Self {
        Self {
            connections,
            routes,
            grace,
        }
    }

    /// Reviews, in the background, the connections that `change` may concern. Call it after
    /// the route cache has applied the change.
    pub fn on_change(self: &Arc<Self>, change: &Change) {
        let selected = match change {
            Change::App { name, domains } => self
                .connections
                .select(|c| c.app() == name || domains.iter().any(|d| domain_covers(d, c.host()))),
            Change::Resync => self.connections.select(|_| true),
            Change::Cert { .. }
            | Change::CachePurge { .. }
            | Change::WafReload { .. }
            | Change::Filter { .. } => return,
        };
        if selected.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            log::warn!("no runtime to review connections on after a change; they stay open");
            return;
        };
        let drain = self.clone();
        runtime.spawn(async move { drain.review(selected).await });
    }

    async fn review(self: Arc<Self>, selected: Vec<Arc<UpstreamConnection>>) {
        let mut by_app: HashMap<String, Vec<Arc<UpstreamConnection>>> = HashMap::new();
        for connection in selected {
            by_app
                .entry(connection.app().to_string())
                .or_default()
                .push(connection);
        }
        let now = Instant::now();
        for (app, connections) in by_app {
            let route = match self.routes.app(&app).await {
                Ok(route) => route,
                Err(e) => {
                    log::warn!("cannot review connections of app {app} after a change: {e}");
                    continue;
                }
            };
            let mut owners = HashMap::new();
            for connection in connections {
                if let Some(route) = &route {
                    self.review_backend(&connection, route, now);
                }
                let tenancy = match owners.get(connection.host()) {
                    Some(tenancy) => *tenancy,
                    None => {
                        let tenancy = self.tenancy_of(&connection).await;
                        owners.insert(connection.host().to_string(), tenancy);
                        tenancy
                    }
                };
                if matches!(tenancy, Tenancy::AppDeleted | Tenancy::DomainMoved)
                    && connection.arm(Timer::Tenancy)
                {
                    tokio::spawn(self.clone().end_after_grace(connection));
                }
            }
        }
    }

    /// Notes whether the connection's backend is still listed, and starts the app's deadline
    /// for it when it is not.
    fn review_backend(
        self: &Arc<Self>,
        connection: &Arc<UpstreamConnection>,
        route: &AppRoute,
        now: Instant,
    ) {
        if route.upstream.find(connection.backend()).is_some() {
            connection.mark_backend_present();
            return;
        }
        let Some(removed_since) = connection.mark_backend_removed(now) else {
            return;
        };
        if route.app.drain.removed_backend_s.is_some() && connection.arm(Timer::RemovedBackend) {
            tokio::spawn(
                self.clone()
                    .end_at_deadline(connection.clone(), removed_since),
            );
        }
    }

    async fn tenancy_of(&self, connection: &UpstreamConnection) -> Tenancy {
        match self.routes.resolve(connection.host()).await {
            Ok(Some(route)) if route.app.name.as_str() == connection.app() => Tenancy::Kept,
            Ok(Some(_)) => Tenancy::DomainMoved,
            Ok(None) => match self.routes.app(connection.app()).await {
                Ok(Some(_)) => Tenancy::DomainMoved,
                Ok(None) => Tenancy::AppDeleted,
                Err(_) => Tenancy::Unknown,
            },
            Err(e) => {
                log::warn!(
                    "cannot tell which app serves {} now ({e}); its connections stay open",
                    connection.host()
                );
                Tenancy::Unknown
            }
        }
    }

    async fn end_after_grace(self: Arc<Self>, connection: Arc<UpstreamConnection>) {
        tokio::time::sleep(self.grace).await;
        match self.tenancy_of(&connection).await {
            Tenancy::AppDeleted => {
                connection.close(CloseReason::AppDeleted);
            }
            Tenancy::DomainMoved => {
                connection.close(CloseReason::DomainMoved);
            }
            // Given back within the grace, or nobody can tell: the connection stays.
            Tenancy::Kept | Tenancy::Unknown => {}
        }
        connection.disarm(Timer::Tenancy);
    }

    /// Sleeps until the app's deadline for a removed backend, then closes the connection if
    /// its backend is still missing; a backend added back and removed again meanwhile counts
    /// from its latest removal, and a deadline changed meanwhile is the one applied.
    async fn end_at_deadline(
        self: Arc<Self>,
        connection: Arc<UpstreamConnection>,
        mut removed_since: Instant,
    ) {
        loop {
            let deadline = match self.routes.app(connection.app()).await {
                Ok(Some(route)) if route.upstream.find(connection.backend()).is_none() => {
                    route.app.drain.removed_backend_s
                }
                // Back in the app, the app gone (the tenancy timer's case) or the store away.
                _ => None,
            };
            if let Some(seconds) = deadline {
                let due = removed_since + Duration::from_secs(seconds);
                if Instant::now() >= due {
                    connection.close(CloseReason::RemovedBackendDeadline);
                    return;
                }
                tokio::time::sleep_until(due.into()).await;
                if let Some(since) = connection.removed_since() {
                    removed_since = since;
                    continue;
                }
            }
            connection.disarm(Timer::RemovedBackend);
            // A removal reviewed while this timer was finishing found it armed and started
            // none: take it on.
            match connection.removed_since() {
                Some(since) if since != removed_since && connection.arm(Timer::RemovedBackend) => {
                    removed_since = since;
                }
                _ => return,
            }
        }
    }
}

/// Whether a stored domain (`a.com`, `*.a.com`) routes `host`: wildcards cover any depth, as
/// the route cache resolves them.
fn domain_covers(domain: &str, host: &str) -> bool {
    match domain.strip_prefix('*') {
        Some(suffix) => host.len() > suffix.len() && host.ends_with(suffix),
        None => domain == host,
    }
}

#[cfg(test)]
mod tests {
    use super::domain_covers;

    #[test]
    fn changed_domains_select_the_hosts_they_route() {
        let cases = [
            ("a.com", "a.com", true),
            ("a.com", "b.a.com", false),
            ("*.a.com", "b.a.com", true),
            ("*.a.com", "c.b.a.com", true),
            ("*.a.com", "a.com", false),
            ("*.a.com", "ba.com", false),
        ];
        for (domain, host, covered) in cases {
            assert_eq!(domain_covers(domain, host), covered, "{domain} {host}");
        }
    }
}

//! Idle HTTP/1.1 connections kept for their next request, by target, at most a limit in
//! all: the listener's connections to backends and the router's own (mirror copies, image
//! originals) alike. A connection is kept only once its last response was read to the end;
//! the most recently kept one is taken first; one idle past [`IDLE_TIMEOUT`] or closed by
//! its peer is never handed out, and a sweep every [`SWEEP_EVERY`] closes those no request
//! comes to take. Each thread keeps its own: a connection is taken again only by the thread
//! whose runtime drives it.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use hyper::client::conn::http1::SendRequest;
use prometheus::IntGauge;

/// How long an idle connection is kept. Shorter than the usual app-server idle timeouts
/// (60 s and up) so the other side rarely closes first.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// How often expired idle connections are closed when no request comes to take them.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// How long a kept connection that is not ready yet may take to become so.
const READY_WAIT: Duration = Duration::from_millis(50);

/// A connection that can be kept idle.
pub(crate) trait Keepable {
    /// Whether its peer (or its task) has closed it.
    fn is_closed(&self) -> bool;
}

/// Idle connections `C` by target `K`, counted in a gauge.
pub(crate) struct IdleConnections<K, C> {
    idle: HashMap<K, Vec<(C, Instant)>, ahash::RandomState>,
    count: usize,
    limit: usize,
    gauge: IntGauge,
}

impl<K: Hash + Eq, C: Keepable> IdleConnections<K, C> {
    /// At most `limit` connections, counted in `gauge`.
    pub(crate) fn new(limit: usize, gauge: IntGauge) -> Self {
        Self {
            idle: HashMap::default(),
            count: 0,
            limit,
            gauge,
        }
    }

    /// The most recently kept connection to `target` that may still be used; expired or
    /// closed ones met on the way are closed.
    pub(crate) fn take(&mut self, target: &K) -> Option<C> {
        let list = self.idle.get_mut(target)?;
        let mut found = None;
        let mut taken = 0;
        while let Some((connection, since)) = list.pop() {
            taken += 1;
            if since.elapsed() < IDLE_TIMEOUT && !connection.is_closed() {
                found = Some(connection);
                break;
            }
        }
        // An emptied list stays for the connection this request will give back: removing
        // it and making it again cost a hash, a free and an allocation a request
        // (callgrind). The sweep drops the lists left empty.
        self.forget(taken);
        found
    }

    /// Keeps `connection`, whose last response was read to the end; closes it when full.
    pub(crate) fn put(&mut self, target: K, connection: C) {
        if self.count >= self.limit || connection.is_closed() {
            return;
        }
        self.idle
            .entry(target)
            .or_default()
            .push((connection, Instant::now()));
        self.count += 1;
        self.gauge.inc();
    }

    /// Closes the connections idle for too long or closed by their peer.
    pub(crate) fn sweep(&mut self) {
        let before = self.count;
        let mut kept = 0;
        self.idle.retain(|_, list| {
            list.retain(|(connection, since)| {
                since.elapsed() < IDLE_TIMEOUT && !connection.is_closed()
            });
            kept += list.len();
            !list.is_empty()
        });
        self.forget(before - kept);
    }

    fn forget(&mut self, count: usize) {
        self.count -= count;
        self.gauge.sub(count as i64);
    }
}

impl<K, C> Drop for IdleConnections<K, C> {
    fn drop(&mut self) {
        self.gauge.sub(self.count as i64);
    }
}

/// Whether a kept connection is ready for its next request, waiting a moment for its task
/// to see the end of the last answer. One still sending the body of a request answered
/// early (a 413 before the upload ended) is not waited for: a new one is quicker.
pub(crate) async fn ready<B>(sender: &mut SendRequest<B>) -> bool {
    sender.is_ready()
        || matches!(
            tokio::time::timeout(READY_WAIT, sender.ready()).await,
            Ok(Ok(()))
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept connection as the container sees it: a name, and whether its peer closed it.
    struct Kept(&'static str, bool);

    impl Keepable for Kept {
        fn is_closed(&self) -> bool {
            self.1
        }
    }

    fn gauge() -> IntGauge {
        IntGauge::new("idle_test", "idle connections of one test").expect("gauge")
    }

    #[test]
    fn the_latest_live_connection_is_taken_and_closed_ones_are_never_handed_out() {
        let gauge = gauge();
        let mut idle = IdleConnections::new(3, gauge.clone());
        idle.put("a", Kept("first", false));
        idle.put("a", Kept("second", false));
        idle.put("a", Kept("closed", true));
        idle.put("b", Kept("other", false));
        assert_eq!(gauge.get(), 3, "a closed connection is not kept");
        idle.put("b", Kept("over the limit", false));
        assert_eq!(gauge.get(), 3, "a full pool closes what comes back");
        assert_eq!(idle.take(&"a").map(|k| k.0), Some("second"));
        assert_eq!(idle.take(&"a").map(|k| k.0), Some("first"));
        assert!(idle.take(&"a").is_none());
        assert_eq!(gauge.get(), 1);
        drop(idle);
        assert_eq!(
            gauge.get(),
            0,
            "what a dropped pool held is no longer counted"
        );
    }

    #[test]
    fn a_sweep_closes_what_its_peer_closed_meanwhile() {
        let gauge = gauge();
        let mut idle = IdleConnections::new(8, gauge.clone());
        idle.put("a", Kept("live", false));
        idle.put("b", Kept("live", false));
        if let Some(list) = idle.idle.get_mut(&"b") {
            list[0].0 .1 = true;
        }
        idle.sweep();
        assert_eq!(gauge.get(), 1);
        assert!(idle.take(&"b").is_none());
        assert_eq!(idle.take(&"a").map(|k| k.0), Some("live"));
    }
}

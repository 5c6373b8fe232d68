//! Idle HTTP/1.1 connections kept for their next request, by target, at most a limit in
//! all: the listener's connections to backends and the router's own (mirror copies, image
//! originals) alike. A connection is kept only once its last response was read to the end;
//! the most recently kept one is taken first; one idle past [`IDLE_TIMEOUT`] or closed by
//! its peer is never handed out, and a sweep every [`SWEEP_EVERY`] closes those no request
//! comes to take. Each thread keeps its own: a connection is taken again only by the thread
//! whose runtime drives it.
//!
//! Times are milliseconds on the caller's clock: a listener thread's pool reads its
//! deadlines' clock (`listener::clock`, a tick's precision, no read of the system's), which
//! took two clock reads off every proxied request (callgrind); 30 s give or take a tick.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use hyper::client::conn::http1::SendRequest;
use prometheus::IntGauge;

use crate::listener::clock::millis;

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
    /// Each connection with the millisecond it was kept at.
    idle: HashMap<K, Vec<(C, u64)>, ahash::RandomState>,
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
    pub(crate) fn take(&mut self, target: &K, now_ms: u64) -> Option<C> {
        let list = self.idle.get_mut(target)?;
        let mut found = None;
        let mut taken = 0;
        while let Some((connection, since)) = list.pop() {
            taken += 1;
            if fresh(since, now_ms) && !connection.is_closed() {
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
    pub(crate) fn put(&mut self, target: K, connection: C, now_ms: u64) {
        if self.count >= self.limit || connection.is_closed() {
            return;
        }
        self.idle
            .entry(target)
            .or_default()
            .push((connection, now_ms));
        self.count += 1;
        self.gauge.inc();
    }

    /// Closes the connections idle for too long or closed by their peer.
    pub(crate) fn sweep(&mut self, now_ms: u64) {
        let before = self.count;
        let mut kept = 0;
        self.idle.retain(|_, list| {
            list.retain(|(connection, since)| fresh(*since, now_ms) && !connection.is_closed());
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

/// Whether a connection kept at `since_ms` is not past [`IDLE_TIMEOUT`] at `now_ms`.
fn fresh(since_ms: u64, now_ms: u64) -> bool {
    now_ms.saturating_sub(since_ms) < millis(IDLE_TIMEOUT)
}

/// Milliseconds since `started`, for a pool that keeps its own clock.
pub(crate) fn ms_since(started: Instant) -> u64 {
    millis(started.elapsed())
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
        idle.put("a", Kept("first", false), 0);
        idle.put("a", Kept("second", false), 0);
        idle.put("a", Kept("closed", true), 0);
        idle.put("b", Kept("other", false), 0);
        assert_eq!(gauge.get(), 3, "a closed connection is not kept");
        idle.put("b", Kept("over the limit", false), 0);
        assert_eq!(gauge.get(), 3, "a full pool closes what comes back");
        assert_eq!(idle.take(&"a", 0).map(|k| k.0), Some("second"));
        assert_eq!(idle.take(&"a", 0).map(|k| k.0), Some("first"));
        assert!(idle.take(&"a", 0).is_none());
        assert_eq!(gauge.get(), 1);
        drop(idle);
        assert_eq!(
            gauge.get(),
            0,
            "what a dropped pool held is no longer counted"
        );
    }

    #[test]
    fn a_connection_idle_for_the_timeout_is_not_handed_out() {
        let gauge = gauge();
        let mut idle = IdleConnections::new(8, gauge.clone());
        let timeout = millis(IDLE_TIMEOUT);
        idle.put("a", Kept("kept at 1000", false), 1000);
        assert_eq!(
            idle.take(&"a", 1000 + timeout - 1).map(|k| k.0),
            Some("kept at 1000")
        );
        idle.put("a", Kept("kept at 1000", false), 1000);
        assert!(idle.take(&"a", 1000 + timeout).is_none());
        assert_eq!(gauge.get(), 0, "the expired one was closed");
        idle.put("b", Kept("kept at 0", false), 0);
        idle.sweep(timeout);
        assert_eq!(gauge.get(), 0, "the sweep closes an expired one");
    }

    #[test]
    fn a_sweep_closes_what_its_peer_closed_meanwhile() {
        let gauge = gauge();
        let mut idle = IdleConnections::new(8, gauge.clone());
        idle.put("a", Kept("live", false), 0);
        idle.put("b", Kept("live", false), 0);
        if let Some(list) = idle.idle.get_mut(&"b") {
            list[0].0 .1 = true;
        }
        idle.sweep(0);
        assert_eq!(gauge.get(), 1);
        assert!(idle.take(&"b", 0).is_none());
        assert_eq!(idle.take(&"a", 0).map(|k| k.0), Some("live"));
    }
}

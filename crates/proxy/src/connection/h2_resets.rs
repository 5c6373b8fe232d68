//! HTTP/2 clients that cancel the streams the router has already taken on. The h2 crate
//! answers the cheap form of "rapid reset" (CVE-2023-44487: streams reset before the server
//! accepts them) with GOAWAY; a client that waits until each stream is accepted, so that it
//! has become a backend request, and then resets it, is not limited by anything. Browsers
//! cancel streams too (a page left, a lazy image scrolled away), so only a connection that
//! cancels far more than a page would, within a short window, is closed.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::metrics;

/// Streams a connection may cancel after the router took them on, within [`CANCELLATION_WINDOW`].
pub(crate) const MOST_CANCELLED_STREAMS: u32 = 200;
/// The window [`MOST_CANCELLED_STREAMS`] is counted in.
pub(crate) const CANCELLATION_WINDOW: Duration = Duration::from_secs(10);

/// One HTTP/2 connection's cancellations, and the signal that closes it.
pub(crate) struct Cancellations {
    in_window: AtomicU32,
    window_started: Mutex<Instant>,
    close: Notify,
}

impl Cancellations {
    /// A connection that has cancelled nothing yet.
    pub(crate) fn new() -> Self {
        Self {
            in_window: AtomicU32::new(0),
            window_started: Mutex::new(Instant::now()),
            close: Notify::new(),
        }
    }

    /// Resolves once the connection has cancelled too many streams.
    pub(crate) async fn too_many(&self) {
        self.close.notified().await;
    }

    /// Counts one stream cancelled after it was taken on; the one past the limit within
    /// the window closes the connection.
    pub(crate) fn count_one(&self) {
        {
            let mut started = self.window_started.lock();
            if started.elapsed() > CANCELLATION_WINDOW {
                *started = Instant::now();
                self.in_window.store(0, Ordering::Relaxed);
            }
        }
        let count = self.in_window.fetch_add(1, Ordering::Relaxed) + 1;
        if count == MOST_CANCELLED_STREAMS + 1 {
            metrics::H2_CONNECTIONS_CLOSED_FOR_RESETS.inc();
            self.close.notify_one();
        }
    }
}

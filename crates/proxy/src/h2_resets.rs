//! HTTP/2 clients that cancel the streams the router has already taken on. The h2 crate
//! answers the cheap form of "rapid reset" (CVE-2023-44487: streams reset before the server
//! accepts them) with GOAWAY; a client that waits until each stream is accepted, so that it
//! has become a backend request, and then resets it, is not limited by anything. Browsers
//! cancel streams too (a page left, a lazy image scrolled away), so only a connection that
//! cancels far more than a page would, within a short window, is closed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pingora::protocols::SocketDigest;
use pingora::proxy::Session;
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
    /// the window closes the connection (both engines' HTTP/2 connections count here).
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

/// The HTTP/2 connections open now, by the address of their socket digest: the one thing a
/// request shares with the connection that carries it.
static OPEN: LazyLock<Mutex<HashMap<usize, Arc<Cancellations>>>> = LazyLock::new(Mutex::default);

fn key(digest: &Arc<SocketDigest>) -> usize {
    Arc::as_ptr(digest) as usize
}

/// Watches a connection's cancellations until the returned guard is dropped.
pub(crate) fn watch(digest: &Arc<SocketDigest>) -> Watched {
    let cancellations = Arc::new(Cancellations::new());
    OPEN.lock().insert(key(digest), cancellations.clone());
    Watched {
        key: key(digest),
        cancellations,
    }
}

/// A connection under watch; unregistered on drop.
pub(crate) struct Watched {
    key: usize,
    /// What the connection's task waits on.
    pub(crate) cancellations: Arc<Cancellations>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        OPEN.lock().remove(&self.key);
    }
}

/// One HTTP/2 request taken on; counted as cancelled when dropped before it was answered
/// (Pingora drops a stream's task when its client resets it, so no hook sees the end).
#[derive(Debug)]
pub(crate) struct TakenStream {
    connection: Arc<SocketDigest>,
    answered: bool,
}

impl TakenStream {
    /// For a request that came over HTTP/2; `None` otherwise.
    pub(crate) fn start(session: &Session) -> Option<Self> {
        if !session.is_http2() {
            return None;
        }
        let connection = session.digest()?.socket_digest.clone()?;
        Some(Self {
            connection,
            answered: false,
        })
    }

    /// The request ended; `client_gone`: on a client error (a reset while writing).
    pub(crate) fn ended(&mut self, client_gone: bool) {
        self.answered = !client_gone;
    }
}

impl Drop for TakenStream {
    fn drop(&mut self) {
        if !self.answered {
            cancelled(&self.connection);
        }
    }
}

/// Counts a stream the client of `digest`'s connection cancelled after it was taken on.
fn cancelled(digest: &Arc<SocketDigest>) {
    let Some(cancellations) = OPEN.lock().get(&key(digest)).cloned() else {
        return;
    };
    cancellations.count_one();
}

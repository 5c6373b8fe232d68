//! A deadline for a whole request head. Pingora times out each read of a head on its own
//! (60 s), and on the cleartext port first waits, with no deadline at all, for the bytes that
//! tell HTTP/2 from HTTP/1.1: a client sending a byte now and then, or nothing, holds its
//! connection as long as it likes, and enough of them hold every descriptor the router has.
//! nginx's `client_header_timeout` bounds the whole head; [`HeadDeadline`] does the same around
//! Pingora's HTTP service: a connection still waiting for a head at its deadline is closed.
//!
//! HTTP/2 connections are left to Pingora (their requests run in tasks of their own, and a
//! stream's head arrives in one piece), watched only for streams cancelled by the hundred
//! (`h2_resets`).

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::protocols::{Stream, ALPN};
use pingora::server::ShutdownWatch;
use tokio::time::Instant;

use crate::h2_resets;
use crate::metrics;

/// What an HTTP/2 client sends first (RFC 9113 §3.4).
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

tokio::task_local! {
    /// When the connection handled by this task must have sent its next head; `None` while a
    /// request is under way.
    static HEAD_DUE: Cell<Option<Instant>>;
}

/// Pingora's HTTP service `app`, with a deadline for each request head: `first` from the
/// connection's start for its first request, and `idle + first` from the end of an answer for
/// the next one on a kept-alive connection.
pub struct HeadDeadline<A> {
    app: Arc<A>,
    first: Duration,
}

impl<A> HeadDeadline<A> {
    /// `app` with a deadline of `first` for a connection's first request head.
    pub fn new(app: A, first: Duration) -> Self {
        Self {
            app: Arc::new(app),
            first,
        }
    }
}

/// Called by the proxy once a request's head is read: no deadline while it is handled.
pub(crate) fn head_received() {
    let _ = HEAD_DUE.try_with(|due| due.set(None));
}

/// Called by the proxy once an answer is complete: a kept-alive connection now waits for its
/// next head, for at most `within`.
pub(crate) fn next_head_within(within: Duration) {
    let _ = HEAD_DUE.try_with(|due| due.set(Some(Instant::now() + within)));
}

#[async_trait]
impl<A: HttpServerApp + Send + Sync + 'static> ServerApp for HeadDeadline<A> {
    async fn process_new(
        self: &Arc<Self>,
        mut stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let due = Instant::now() + self.first;
        let http2 = if stream.get_ssl_digest().is_some() {
            matches!(stream.selected_alpn_proto(), Some(ALPN::H2))
        } else if self.app.server_options().is_some_and(|o| o.h2c) {
            // Pingora reads (and puts back) the first bytes itself; reading them here first
            // puts a deadline on that wait.
            let mut first_bytes = [0u8; HTTP2_PREFACE.len()];
            match tokio::time::timeout_at(due, stream.try_peek(&mut first_bytes)).await {
                Ok(Ok(_)) => first_bytes == HTTP2_PREFACE,
                Ok(Err(_)) => return None,
                Err(_) => {
                    metrics::CLIENT_HEAD_TIMEOUTS.inc();
                    return None;
                }
            }
        } else {
            false
        };
        if http2 {
            let Some(digest) = stream.get_socket_digest() else {
                return self.app.process_new(stream, shutdown).await;
            };
            let watched = h2_resets::watch(&digest);
            return tokio::select! {
                reusable = self.app.process_new(stream, shutdown) => reusable,
                // Dropping the connection's task closes it; its streams' tasks then fail.
                _ = watched.cancellations.too_many() => None,
            };
        }
        HEAD_DUE
            .scope(Cell::new(Some(due)), async {
                let work = self.app.process_new(stream, shutdown);
                tokio::pin!(work);
                // While a request is under way there is no deadline; look again one `first`
                // later. A wait that starts meanwhile ends no earlier than that look, since
                // it lasts `idle + first`.
                let mut look_at = due;
                loop {
                    tokio::select! {
                        reusable = &mut work => return reusable,
                        _ = tokio::time::sleep_until(look_at) => {}
                    }
                    match HEAD_DUE.with(Cell::get) {
                        Some(due) if due <= Instant::now() => {
                            metrics::CLIENT_HEAD_TIMEOUTS.inc();
                            return None;
                        }
                        Some(due) => look_at = due,
                        None => look_at = Instant::now() + self.first,
                    }
                }
            })
            .await
    }

    async fn cleanup(&self) {
        self.app.cleanup().await;
    }
}

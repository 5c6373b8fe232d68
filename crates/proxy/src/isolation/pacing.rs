//! The pacing of a client connection refused with `Retry-After`: its next request is read
//! only after a random half to all of that wait.

use std::cell::Cell;
use std::time::Duration;

use http::Version;
use rand::Rng;

use crate::metrics;
use crate::respond::Refusal;

/// Until when a connection's next request waits: the worker pool refused one of its
/// requests and asked the client to come back after `Retry-After`.
#[derive(Debug, Default)]
pub(crate) struct Pacing {
    paced_until: Cell<Option<tokio::time::Instant>>,
}

impl Pacing {
    /// The worker pool refused a request of this connection: when the refusal asks the
    /// client to come back in `Retry-After` seconds, a next request on it before then waits
    /// until then.
    ///
    /// A client that asks again at once on the same connection (wrk does; so does a naive
    /// retry loop) would otherwise keep the event loops answering refusals, tens of
    /// thousands a second, and the light requests sharing the loops wait behind them
    /// (bench/bench_images.py: light p99 11–18 ms beside 400 such connections). Held, each
    /// such connection costs one refusal per `Retry-After` and a timer. A fresh connection
    /// is never held: a careful client is refused in microseconds. HTTP/2 streams are not
    /// held, since one connection carries the light requests of the same page.
    ///
    /// Held for a random half to whole `Retry-After`: connections refused together (a burst
    /// of new ones) and held exactly as long would come back together every `Retry-After`,
    /// and the light requests arriving in each burst wait behind it (bench_waf beside 400
    /// connections: light requests of 5–8 ms once a second). Never past `Retry-After`, so a
    /// client that honours it is not held longer than it waits by itself.
    pub(crate) fn after(&self, refusal: &Refusal) {
        let Some(retry_after_s) = refusal.retry_after_s else {
            return;
        };
        let retry_after = Duration::from_secs(u64::from(retry_after_s));
        let held = retry_after.mul_f64(rand::thread_rng().gen_range(0.5..=1.0));
        self.paced_until
            .set(Some(tokio::time::Instant::now() + held));
    }

    /// Waits out the pool's `Retry-After` if this connection was refused and this request
    /// came too soon (HTTP/1 only); how long it waited.
    pub(crate) async fn wait_out(&self, version: Version) -> Duration {
        let Some(until) = self.paced_until.take() else {
            return Duration::ZERO;
        };
        let now = tokio::time::Instant::now();
        if version >= Version::HTTP_2 || until <= now {
            return Duration::ZERO;
        }
        metrics::PACED_REQUESTS.inc();
        tokio::time::sleep_until(until).await;
        until.saturating_duration_since(now)
    }
}

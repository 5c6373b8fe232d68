//! CPU isolation: heavy work (WAF inspection, image resizing) never slows light requests
//! (everything else) down. This module owns it; `ARCHITECTURE.md` states the contract.
//!
//! - **Light and heavy.** A request is heavy from routing on when it will wait for a
//!   worker (its app inspects it, or it asks for a resized image), light otherwise
//!   ([`RequestWeight::start`]). A light request counts as under way until its answer is
//!   ready ([`RequestWeight::answer_ready`]).
//! - **What each gets.** Event loops run light requests and the light parts of heavy ones,
//!   at normal priority. Heavy work runs on the worker pool (`worker_pool`), whose threads
//!   are `SCHED_IDLE` and, while a light request is under way, give way to any thread
//!   waiting for a CPU (crates/give-way: a timer interrupts a running worker, which
//!   sleeps while others want the CPUs). The event loops are watched while they have work
//!   ([`watch_event_loop`]), so a loop queued behind a worker on its CPU counts too.
//! - **When heavy work is refused.** The pool's queue is bounded; a task refused at once
//!   when the queue is full or when the work ahead would make it miss its deadline, shed
//!   when later work makes that so, dropped at its deadline: each answered 503 with
//!   `Retry-After` by its stage. The deadline is the stage's timeout less the time the
//!   request was held ([`RequestWeight::heavy_allowance`]).
//! - **A refused client waits.** An HTTP/1 connection refused with `Retry-After` has its
//!   next request read after (a random half to all of) that wait (`pacing`), so a client
//!   asking again at once cannot keep the event loops busy answering refusals.

pub(crate) mod fair_share;
mod pacing;
pub(crate) mod worker_pool;

use std::time::Duration;

use switchyard_give_way::LightRequest;
use tokio::runtime::Builder;

pub(crate) use pacing::Pacing;

/// What CPU isolation knows of one request, kept in its context.
#[derive(Debug, Default)]
pub(crate) struct RequestWeight {
    /// How long the router held the request before reading it, its connection paced after
    /// a refusal: the client has waited that long already.
    held: Duration,
    /// Counted among the light requests the workers give way for, while it is one.
    light: Option<LightRequest>,
}

impl RequestWeight {
    /// The request was held `held` before it was read.
    pub(crate) fn held_for(&mut self, held: Duration) {
        self.held = held;
    }

    /// Once routed: a request that will wait for no worker is what the workers give way
    /// for; one that will (`heavy`) is the heavy work itself.
    pub(crate) fn start(&mut self, heavy: bool) {
        if !heavy {
            self.light = Some(LightRequest::start());
        }
    }

    /// Its answer is ready: the workers go on giving way a moment (crates/give-way) while
    /// the loop sends it and the client reads it. A WebSocket or a long download stops
    /// counting here, or the workers would give way for as long as one stays open.
    pub(crate) fn answer_ready(&mut self) {
        self.light = None;
    }

    /// What a heavy stage's `timeout` leaves this request once the time it was held is
    /// taken off: the client counts the hold and the wait for a worker together. Held up
    /// to a second and then admitted for the whole timeout, 20 of 10 s of answers to 400
    /// wrk connections of inspected POSTs (5 s timeouts, the app's too) came after wrk had
    /// given up; none since.
    ///
    /// Never less than half the timeout: a hold is half to all of a second, and an app
    /// whose timeout is shorter would have every request of a client that asks again at
    /// once refused after its hold, held again for that refusal, and so on for as long as
    /// the connection lasts, the pool idle or not.
    pub(crate) fn heavy_allowance(&self, timeout: Duration) -> Duration {
        timeout.saturating_sub(self.held).max(timeout / 2)
    }
}

/// Has the workers watch the event loop `runtime` will run on this thread: they give way
/// to it when it waits on their CPU, looking at it only while it has work.
pub(crate) fn watch_event_loop(runtime: &mut Builder, thread: usize) {
    let watched = match switchyard_give_way::watch_this_thread() {
        Ok(watched) => watched,
        Err(e) => {
            log::warn!("listener thread {thread} not watched by the workers: {e}");
            return;
        }
    };
    runtime
        .on_thread_park(move || watched.parked())
        .on_thread_unpark(move || watched.working());
}

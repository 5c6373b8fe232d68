//! What each app costs the router: the CPU time of the polls made on its behalf, the bytes
//! it moves, the connections, WebSockets and requests it holds.
//!
//! **How the CPU is measured.** Every task that serves clients (a client connection; an
//! HTTP/2 or HTTP/3 stream) runs under a [`Meter`] ([`metered`]): each poll of it is timed
//! with the CPU's time-stamp counter (`quanta`, calibrated to nanoseconds; the monotonic
//! clock where the CPU has no invariant counter) and charged to the app the task serves. One poll never changes thread, and an event loop runs nothing else during it,
//! so the time inside a poll is the CPU the loop spent on that task (unless the kernel
//! preempted the thread mid-poll, which the reconciliation below shows). The thread's own
//! CPU clock is the exact figure, but it is a system call here (546 ns a read on this
//! KVM guest, against 25 ns), so it is read once a second per loop, not around polls,
//! to calibrate them: when a loop's polls measured more than its CPU clock advanced (its
//! thread was preempted mid-poll by another process), the next second's charges are
//! scaled down by that ratio; what a loop spent outside any metered poll (accepting,
//! timers, the idle sweep) is counted as `switchyard_unattributed_cpu_seconds_total`, and
//! the two add up to the loops' CPU. Work on the worker pool (WAF, images) is timed with the pool thread's CPU
//! clock around the job (a job is long beside two reads) and charged to the app that
//! asked for it.
//!
//! **Who pays.** A task's polls go to the app its request was routed to (stage `route`
//! calls [`charge_to`]); what a connection did before its first request was routed (its
//! TLS handshake, reading that request's head) goes to that first request's app; on a
//! keep-alive connection, the work between two requests goes to the earlier one's app. An
//! HTTP/2 or HTTP/3 stream charges its own app, and its connection's framing goes to the
//! app of its first stream. A connection that never routes a request is unattributed.
//!
//! A meter adds its time to the app's shared counter once per millisecond measured or
//! when its app changes, not on every poll: two event loops serving one app would
//! otherwise write one cache line on every poll.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::Duration;

use super::app_requests::AppRequests;

/// Nanoseconds a meter measures before adding them to its app's counter.
const FLUSH_EVERY_NS: u64 = 1_000_000;

/// The poll clock: raw readings, made nanoseconds only when added up.
static CLOCK: LazyLock<quanta::Clock> = LazyLock::new(quanta::Clock::new);

/// `ticks` of [`CLOCK`] in nanoseconds.
fn nanos(ticks: u64) -> u64 {
    CLOCK.delta_as_nanos(0, ticks)
}

/// [`FLUSH_EVERY_NS`] in ticks of [`CLOCK`], so that a poll compares ticks.
static FLUSH_EVERY_TICKS: LazyLock<u64> = LazyLock::new(|| {
    const SPAN: u64 = 1 << 32;
    let ns = nanos(SPAN).max(1);
    (FLUSH_EVERY_NS as u128 * SPAN as u128 / ns as u128) as u64
});

/// How often an event loop compares its thread's CPU clock with what its polls measured.
pub(crate) const LOOP_RECONCILE_EVERY: Duration = Duration::from_secs(1);

/// CPU nanoseconds no app was charged: the event loops outside metered polls, and metered
/// tasks that never routed a request.
pub(crate) static UNATTRIBUTED_NS: AtomicU64 = AtomicU64::new(0);

/// An event loop's metering: one thread-local, read once a poll.
struct LoopMeter {
    /// The meter of the task being polled, if any.
    current: RefCell<Option<Rc<Meter>>>,
    /// Clock ticks spent in metered polls, for the loop's reconciliation.
    polled_ticks: Cell<u64>,
    /// CPU per nanosecond of poll over the loop's last second (at most 1).
    calibration: Cell<f64>,
    /// When the metered poll under way started (0: none is).
    poll_started: Cell<u64>,
}

thread_local! {
    static LOOP: LoopMeter = const {
        LoopMeter {
            current: RefCell::new(None),
            polled_ticks: Cell::new(0),
            calibration: Cell::new(1.0),
            poll_started: Cell::new(0),
        }
    };
}

static ATTRIBUTION: AtomicBool = AtomicBool::new(true);

/// Whether polls are metered (`--cpu-attribution`); off, tasks are spawned as they are and
/// no app is charged CPU (the other costs are still counted). On, the clock is calibrated
/// now (some milliseconds) rather than at the first request.
pub fn set_attribution(on: bool) {
    ATTRIBUTION.store(on, Ordering::Relaxed);
    if on {
        LazyLock::force(&FLUSH_EVERY_TICKS);
    }
}

/// The costs of one task: what its polls took, and the app they go to.
pub(crate) struct Meter {
    app: RefCell<Option<Arc<AppRequests>>>,
    /// Clock ticks measured and not yet added to the app's counter (or waiting for an app).
    unflushed_ticks: Cell<u64>,
    /// Everything measured, in ticks, for a request's own share (the access log's `cpu_us`).
    total_ticks: Cell<u64>,
    /// The connection of a stream: charged to the stream's app when it has none yet.
    connection: Option<Rc<Meter>>,
    /// Whether this meter is a client connection's (counted in its app's `connections`).
    is_connection: bool,
}

impl Meter {
    fn new(connection: Option<Rc<Meter>>) -> Rc<Self> {
        Rc::new(Meter {
            app: RefCell::new(None),
            unflushed_ticks: Cell::new(0),
            total_ticks: Cell::new(0),
            is_connection: connection.is_none(),
            connection,
        })
    }

    /// A client connection's meter.
    pub(crate) fn connection() -> Rc<Self> {
        Meter::new(None)
    }

    /// The meter of a stream of the connection metered by `connection`.
    pub(crate) fn stream(connection: &Rc<Meter>) -> Rc<Self> {
        Meter::new(Some(connection.clone()))
    }

    fn add(&self, ticks: u64) {
        self.total_ticks.set(self.total_ticks.get() + ticks);
        let unflushed = self.unflushed_ticks.get() + ticks;
        self.unflushed_ticks.set(unflushed);
        if unflushed >= *FLUSH_EVERY_TICKS && self.app.borrow().is_some() {
            self.flush();
        }
    }

    fn flush(&self) {
        let measured = nanos(self.unflushed_ticks.replace(0));
        if measured == 0 {
            return;
        }
        let unflushed = (measured as f64 * LOOP.with(|l| l.calibration.get())) as u64;
        match self.app.borrow().as_ref() {
            Some(app) => charge_cpu(app, unflushed),
            None => {
                UNATTRIBUTED_NS.fetch_add(unflushed, Ordering::Relaxed);
            }
        };
    }

    /// Charges this meter's time to `app` from now on (and what it measured before it had
    /// an app).
    fn charge(&self, app: &Arc<AppRequests>) {
        let same = (self.app.borrow().as_ref()).is_some_and(|current| Arc::ptr_eq(current, app));
        if same {
            return;
        }
        if self.app.borrow().is_some() {
            self.flush();
        }
        let previous = self.app.replace(Some(app.clone()));
        if self.is_connection {
            if let Some(previous) = previous {
                previous.cost.connections.fetch_sub(1, Ordering::Relaxed);
            }
            app.cost.connections.fetch_add(1, Ordering::Relaxed);
        }
        self.flush();
        if let Some(connection) = &self.connection {
            if connection.app.borrow().is_none() {
                connection.charge(app);
            }
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        self.flush();
        if self.is_connection {
            if let Some(app) = self.app.get_mut() {
                app.cost.connections.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

/// The task being polled now is serving `app`: its time goes there.
pub(crate) fn charge_to(app: &Arc<AppRequests>) {
    LOOP.with(|l| {
        if let Some(meter) = l.current.borrow().as_ref() {
            meter.charge(app);
        }
    });
}

/// Where the current task's measure stands, to tell a request's own share later
/// ([`RequestCpu::took`]).
pub(crate) fn request_started() -> RequestCpu {
    LOOP.with(|l| match l.current.borrow().as_ref() {
        Some(meter) => RequestCpu {
            meter: Some(meter.clone()),
            from_ticks: meter.total_ticks.get(),
        },
        None => RequestCpu::default(),
    })
}

/// A request's place in its task's measure.
#[derive(Default)]
pub(crate) struct RequestCpu {
    meter: Option<Rc<Meter>>,
    from_ticks: u64,
}

impl RequestCpu {
    /// The CPU its task's polls took since the request started, up to the current poll
    /// (which is not measured until it returns); `None` outside a metered task.
    pub(crate) fn took(&self) -> Option<Duration> {
        let meter = self.meter.as_ref()?;
        let measured = nanos(meter.total_ticks.get().saturating_sub(self.from_ticks));
        let calibrated = measured as f64 * LOOP.with(|l| l.calibration.get());
        Some(Duration::from_nanos(calibrated as u64))
    }
}

impl std::fmt::Debug for RequestCpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestCpu")
            .field("from_ticks", &self.from_ticks)
            .finish()
    }
}

/// The app the task being polled is charged to, for work it hands to another thread.
pub(crate) fn current_app() -> Option<Arc<AppRequests>> {
    LOOP.with(|l| l.current.borrow().as_ref()?.app.borrow().clone())
}

/// How long one poll may run before work that can be cut (compressing an answer held in
/// memory) lets the event loop run others: what a quiet request may wait behind it.
const POLL_SLICE_NS: u64 = 100_000;

static POLL_SLICE_TICKS: LazyLock<u64> =
    LazyLock::new(|| POLL_SLICE_NS * *FLUSH_EVERY_TICKS / FLUSH_EVERY_NS);

/// Whether the metered poll under way has run its slice ([`POLL_SLICE_NS`]); false
/// outside a metered poll.
pub(crate) fn poll_slice_spent() -> bool {
    LOOP.with(|l| {
        let started = l.poll_started.get();
        started != 0 && CLOCK.raw().saturating_sub(started) >= *POLL_SLICE_TICKS
    })
}

/// Whether polls are metered.
pub(crate) fn attribution_on() -> bool {
    ATTRIBUTION.load(Ordering::Relaxed)
}

/// Spawns a client connection's task on this event loop, metered.
pub(crate) fn spawn_connection<F: Future + 'static>(future: F) {
    if !ATTRIBUTION.load(Ordering::Relaxed) {
        tokio::task::spawn_local(future);
        return;
    }
    tokio::task::spawn_local(metered(Meter::connection(), future));
}

/// Spawns a stream's task (HTTP/2, HTTP/3) of the connection being polled, metered on its
/// own and naming the connection's app with its first.
pub(crate) fn spawn_stream<F: Future + 'static>(future: F) {
    let meter = match current_meter() {
        Some(connection) => Meter::stream(&connection),
        None if ATTRIBUTION.load(Ordering::Relaxed) => Meter::connection(),
        None => {
            tokio::task::spawn_local(future);
            return;
        }
    };
    tokio::task::spawn_local(metered(meter, future));
}

/// Spawns a task doing the connection's own work (its handshake's end), charged with it.
pub(crate) fn spawn_for_connection<F: Future + 'static>(future: F) {
    match current_meter() {
        Some(meter) => tokio::task::spawn_local(metered(meter, future)),
        None => tokio::task::spawn_local(future),
    };
}

fn current_meter() -> Option<Rc<Meter>> {
    LOOP.with(|l| l.current.borrow().clone())
}

/// `future`, each of its polls timed and charged through `meter`.
pub(crate) fn metered<F: Future>(meter: Rc<Meter>, future: F) -> Metered<F> {
    Metered {
        meter,
        future: Box::pin(future),
    }
}

/// A future whose polls are timed; see [`metered`].
pub(crate) struct Metered<F> {
    meter: Rc<Meter>,
    // Boxed: the futures metered are large, and this keeps `Metered` movable and `Unpin`
    // without unsafe projection.
    future: Pin<Box<F>>,
}

impl<F: Future> Future for Metered<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Metered { meter, future } = self.get_mut();
        LOOP.with(|l| {
            let started = CLOCK.raw();
            l.poll_started.set(started);
            let outer = l.current.replace(Some(meter.clone()));
            let polled = future.as_mut().poll(cx);
            *l.current.borrow_mut() = outer;
            let took = CLOCK.raw().saturating_sub(started);
            l.poll_started.set(0);
            l.polled_ticks.set(l.polled_ticks.get() + took);
            meter.add(took);
            polled
        })
    }
}

/// Reconciles this event loop's thread CPU clock with its metered polls every
/// [`LOOP_RECONCILE_EVERY`], for as long as the loop runs: the rest is unattributed.
pub(crate) async fn reconcile_loop() {
    let mut cpu_then = thread_cpu_ns();
    let mut polled_then = LOOP.with(|l| l.polled_ticks.get());
    loop {
        tokio::time::sleep(LOOP_RECONCILE_EVERY).await;
        let cpu_now = thread_cpu_ns();
        let polled_now = LOOP.with(|l| l.polled_ticks.get());
        let (cpu, polled) = (
            cpu_now.saturating_sub(cpu_then),
            nanos(polled_now.saturating_sub(polled_then)),
        );
        let calibration = match polled {
            0 => 1.0,
            _ => (cpu as f64 / polled as f64).min(1.0),
        };
        LOOP.with(|l| l.calibration.set(calibration));
        let outside = cpu.saturating_sub((polled as f64 * calibration) as u64);
        UNATTRIBUTED_NS.fetch_add(outside, Ordering::Relaxed);
        (cpu_then, polled_then) = (cpu_now, polled_now);
    }
}

/// Runs `job` (on a pool thread), its CPU time charged to `app`.
pub(crate) fn charged_job<T>(app: Option<&Arc<AppRequests>>, job: impl FnOnce() -> T) -> T {
    let started = thread_cpu_ns();
    let value = job();
    let took = thread_cpu_ns().saturating_sub(started);
    match app {
        Some(app) => charge_cpu(app, took),
        None => {
            UNATTRIBUTED_NS.fetch_add(took, Ordering::Relaxed);
        }
    };
    value
}

/// Adds `ns` to `app`'s CPU, and names it among the apps charged in this round of the fair
/// share's sampler: two relaxed loads when it already is.
fn charge_cpu(app: &Arc<AppRequests>, ns: u64) {
    app.cost.cpu_ns.fetch_add(ns, Ordering::Relaxed);
    if !LISTING_CHARGED.load(Ordering::Relaxed) {
        return;
    }
    let round = SAMPLER_ROUND.load(Ordering::Relaxed);
    let share = &app.cost.share;
    if share.charged_in_round.load(Ordering::Relaxed) != round
        && share.charged_in_round.swap(round, Ordering::Relaxed) != round
    {
        CHARGED_IN_ROUND.lock().push(app.clone());
    }
}

/// The fair share's sampler's round (isolation/fair_share.rs): apps charged CPU in it are
/// listed once in [`CHARGED_IN_ROUND`], so that the sampler reads only apps that cost
/// something lately, never every app.
static SAMPLER_ROUND: AtomicU32 = AtomicU32::new(1);

/// The apps charged CPU since the sampler last took them; at most one entry per app a
/// round, so bounded by the apps that have a route.
static CHARGED_IN_ROUND: parking_lot::Mutex<Vec<Arc<AppRequests>>> =
    parking_lot::Mutex::new(Vec::new());

/// Whether apps are listed as they are charged: only while a sampler takes the list
/// (the fair share on), or it would keep every app ever charged, deleted ones too.
static LISTING_CHARGED: AtomicBool = AtomicBool::new(false);

/// Lists the apps charged CPU from now on, for a sampler that takes them every round.
pub(crate) fn list_charged_apps() {
    LISTING_CHARGED.store(true, Ordering::Relaxed);
}

/// Starts a new round of the sampler and hands over the apps charged in the one that ends.
pub(crate) fn charged_recently() -> Vec<Arc<AppRequests>> {
    SAMPLER_ROUND.fetch_add(1, Ordering::Relaxed);
    std::mem::take(&mut *CHARGED_IN_ROUND.lock())
}

/// The CPU time this thread has used, in nanoseconds.
pub(crate) fn thread_cpu_ns() -> u64 {
    use nix::time::{clock_gettime, ClockId};
    match clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID) {
        Ok(t) => (t.tv_sec() as u64) * 1_000_000_000 + t.tv_nsec() as u64,
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn spin(for_ns: u64) {
        let started = Instant::now();
        while (started.elapsed().as_nanos() as u64) < for_ns {
            std::hint::black_box(0);
        }
    }

    #[test]
    fn a_task_charges_its_app_what_it_measured_before_and_after_routing() {
        let app = Arc::<AppRequests>::default();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let meter = Meter::connection();
        let routed = app.clone();
        runtime.block_on(metered(meter.clone(), async move {
            spin(2_000_000);
            charge_to(&routed);
            assert_eq!(routed.cost.connections.load(Ordering::Relaxed), 1);
            tokio::task::yield_now().await;
            spin(3_000_000);
        }));
        let measured = nanos(meter.total_ticks.get());
        drop(meter);
        let charged = app.cost.cpu_ns.load(Ordering::Relaxed);
        assert!(measured >= 5_000_000, "measured {measured} ns");
        // Flushed in pieces, each made nanoseconds on its own: a nanosecond's rounding each.
        assert!(
            charged.abs_diff(measured) <= 8,
            "everything measured goes to the app: {charged} of {measured}"
        );
        assert_eq!(app.cost.connections.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_stream_charges_its_own_app_and_names_its_connections() {
        let (first, second) = (Arc::<AppRequests>::default(), Arc::<AppRequests>::default());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let connection = Meter::connection();
        for app in [&first, &second] {
            let stream = Meter::stream(&connection);
            let app = app.clone();
            runtime.block_on(metered(stream, async move {
                charge_to(&app);
                spin(1_000_000);
            }));
        }
        let connection_app = connection.app.borrow().clone().expect("charged");
        assert!(Arc::ptr_eq(&connection_app, &first));
        drop(connection_app);
        drop(connection);
        for app in [&first, &second] {
            assert!(app.cost.cpu_ns.load(Ordering::Relaxed) >= 1_000_000);
        }
        assert_eq!(first.cost.connections.load(Ordering::Relaxed), 0);
    }
}

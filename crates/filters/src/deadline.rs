//! The CPU deadline of a filter's callback: wasmtime's epoch interruption ticks every
//! [`TICK`] while a callback runs anywhere in the router (every [`QUIET_TICK`] after a tick
//! that found none running); a callback still running at a
//! tick reads its thread's CPU clock (`CLOCK_THREAD_CPUTIME_ID`) and is stopped once that
//! clock says it is over its deadline, or yields the thread to the other requests on it
//! otherwise. The clock, a system call, is read only at ticks: a callback shorter than a
//! tick never reads it. Time the thread spent descheduled, or running other requests while
//! the callback yielded, is not counted against the filter.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::Duration;

use nix::time::{clock_gettime, ClockId};

/// How often a running callback is looked at.
pub(crate) const TICK: Duration = Duration::from_millis(1);

/// The wait for the next tick when the last found no callback running: a callback that
/// starts then is first looked at within this, then every [`TICK`].
pub(crate) const QUIET_TICK: Duration = Duration::from_millis(5);

/// Ticks with no callback running after which the ticker sleeps until the next callback:
/// an idle router spends nothing on it.
const IDLE_TICKS_BEFORE_PARKING: u32 = 200;

/// Callbacks running, counted per thread (in one of [`LANES`] lanes) so that the event
/// loops do not share one cache line written on every callback; the ticker adds them up.
const LANES: usize = 16;

#[repr(align(64))]
#[derive(Default)]
struct Lane(AtomicUsize);

static NEXT_LANE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static LANE: usize = NEXT_LANE.fetch_add(1, Ordering::Relaxed) % LANES;
}

/// The thread that advances the engine's epoch while callbacks run.
pub(crate) struct Ticker {
    running: [Lane; LANES],
    parked: AtomicBool,
    thread: OnceLock<Thread>,
}

impl Ticker {
    /// Starts the ticker of `engine`.
    pub(crate) fn start(engine: wasmtime::Engine) -> std::io::Result<Arc<Self>> {
        let ticker = Arc::new(Ticker {
            running: Default::default(),
            parked: AtomicBool::new(false),
            thread: OnceLock::new(),
        });
        let ours = ticker.clone();
        let handle = std::thread::Builder::new()
            .name("filter-ticks".into())
            .spawn(move || ours.run(&engine))?;
        let _ = ticker.thread.set(handle.thread().clone());
        Ok(ticker)
    }

    fn run(&self, engine: &wasmtime::Engine) {
        let mut idle = 0;
        loop {
            let running = self.any_running();
            if running {
                idle = 0;
            } else {
                idle += 1;
            }
            if idle > IDLE_TICKS_BEFORE_PARKING {
                self.parked.store(true, Ordering::SeqCst);
                // Pairs with the fence in `callback_starts`: either that callback sees the
                // ticker parked and unparks it, or the ticker sees it running.
                fence(Ordering::SeqCst);
                // A callback that started before `parked` was seen true is caught here.
                if !self.any_running() {
                    std::thread::park();
                }
                self.parked.store(false, Ordering::Release);
                idle = 0;
            }
            // Callbacks last microseconds: a tick that finds none running waits longer for
            // the next (a thread's wake-up a millisecond cost ~2 µs a request at 2,000 req/s).
            std::thread::sleep(if running { TICK } else { QUIET_TICK });
            engine.increment_epoch();
        }
    }

    fn any_running(&self) -> bool {
        self.running
            .iter()
            .any(|lane| lane.0.load(Ordering::Acquire) > 0)
    }

    /// A callback starts: the ticker ticks until the guard is dropped (also when the
    /// callback's future is dropped mid-call).
    pub(crate) fn callback_starts(&self) -> Running<'_> {
        let lane = &self.running[LANE.with(|lane| *lane)].0;
        lane.fetch_add(1, Ordering::AcqRel);
        fence(Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) {
            if let Some(thread) = self.thread.get() {
                thread.unpark();
            }
        }
        Running(lane)
    }
}

/// A callback running, for the ticker.
pub(crate) struct Running<'a>(&'a AtomicUsize);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The CPU time this thread has used, in nanoseconds.
pub(crate) fn thread_cpu_ns() -> u64 {
    match clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID) {
        Ok(t) => (t.tv_sec() as u64) * 1_000_000_000 + t.tv_nsec() as u64,
        Err(_) => 0,
    }
}

/// One callback's CPU, as far as the ticks have measured it.
#[derive(Debug, Default)]
pub(crate) struct CallCpu {
    /// Measured CPU nanoseconds of the callback, from its first tick on.
    pub(crate) used_ns: u64,
    /// The thread's CPU clock when the callback last ran on from a tick (0: not read yet).
    pub(crate) ran_on_at: Arc<AtomicU64>,
    /// Its deadline.
    pub(crate) limit_ns: u64,
    /// It was stopped at its deadline.
    pub(crate) over: bool,
    /// How many times it yielded the thread.
    pub(crate) yields: u32,
}

impl CallCpu {
    pub(crate) fn start(&mut self, limit: Duration) {
        self.used_ns = 0;
        self.ran_on_at.store(0, Ordering::Relaxed);
        self.limit_ns = limit.as_nanos() as u64;
        self.over = false;
        self.yields = 0;
    }

    /// At a tick: whether the callback is over its deadline (counting from the first tick
    /// it was seen at: never more than it used).
    pub(crate) fn at_tick(&mut self) -> bool {
        let now = thread_cpu_ns();
        let since = self.ran_on_at.swap(now, Ordering::Relaxed);
        if since != 0 {
            self.used_ns += now.saturating_sub(since);
        }
        self.over = self.used_ns >= self.limit_ns;
        self.over
    }
}

/// A monotonic clock in nanoseconds (WASI's monotonic clock).
pub(crate) fn monotonic_ns() -> u64 {
    match clock_gettime(ClockId::CLOCK_MONOTONIC) {
        Ok(t) => (t.tv_sec() as u64) * 1_000_000_000 + t.tv_nsec() as u64,
        Err(_) => 0,
    }
}

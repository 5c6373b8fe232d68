//! One listener thread's clock for the request path's deadlines: a tick every [`TICK`] on
//! a timerfd in the thread's epoll set, and for each deadline the millisecond past which
//! it has passed. Setting or moving a deadline is a store, and no request registers a
//! tokio timer.
//!
//! Why not tokio's timers: with any of them registered on a thread, every turn of its loop
//! consults the timer wheel and reads the clock, and a `timeout` moves the future it wraps
//! into itself. On issue 46's floor a tokio timer per connection cost 11% of a request's
//! instructions and these ticks 1% (bench/ENGINE.md, "Deadlines, and what a tokio timer
//! costs"); nginx's `timer_resolution` makes the same trade. A deadline passes at most two
//! ticks after it is due and never before.
//!
//! A thread with no deadline due within the next ticks does not tick: the clock arms its
//! timerfd once for the earliest deadline (or not at all) and sleeps, so 2,000 idle
//! keep-alive connections wake nobody until the first of them times out, as with nginx.
//! The first deadline made or set while it sleeps reads the time and starts the ticks
//! again: a system call or two a tick under traffic, none per request.

use std::cell::{Cell, OnceCell, RefCell};
use std::future::{poll_fn, Future};
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use nix::sys::time::{TimeSpec, TimeValLike};
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};

/// How often the clock ticks: the precision of every deadline on the thread.
pub(crate) const TICK: Duration = Duration::from_millis(100);
const TICK_MS: u64 = TICK.as_millis() as u64;

/// The due time of a deadline that is not set.
const NEVER: u64 = u64::MAX;

/// The clock sleeps when no deadline is due within this many milliseconds of a tick.
const SLEEP_WHEN_NONE_DUE_WITHIN_MS: u64 = 2 * TICK_MS;

/// One thread's clock. The deadlines it watches are those alive (a connection's, an
/// exchange's) and those dropped since the last tick, which each tick forgets: the list
/// is bounded by the thread's connections and exchanges plus one tick's worth of ended
/// ones.
pub(crate) struct Clock {
    started: Instant,
    /// Milliseconds from `started` to the last tick.
    now_ms: Cell<u64>,
    watched: RefCell<Vec<Weak<Watch>>>,
    /// Set by `run`; without it (no timerfd) the clock ticks on a tokio interval and never
    /// sleeps.
    timer: OnceCell<tokio::io::unix::AsyncFd<TickTimer>>,
    /// Not ticking: the timerfd is armed once for the earliest deadline, or not at all,
    /// and `now_ms` is as old as the last tick.
    asleep: Cell<bool>,
}

struct Watch {
    due_ms: Cell<u64>,
    /// The task to wake when the deadline passes; kept from its last look.
    waker: Cell<Option<Waker>>,
}

/// A deadline on a thread's clock, not set until `set_in`.
pub(crate) struct Deadline {
    watch: Rc<Watch>,
    clock: Rc<Clock>,
}

/// A future bounded by a [`Deadline`] ran past it.
#[derive(Debug)]
pub(crate) struct Passed;

impl Clock {
    pub(crate) fn new() -> Rc<Self> {
        Rc::new(Self {
            started: Instant::now(),
            now_ms: Cell::new(0),
            watched: RefCell::new(Vec::new()),
            timer: OnceCell::new(),
            asleep: Cell::new(false),
        })
    }

    /// A deadline on this clock, not set.
    pub(crate) fn deadline(self: &Rc<Self>) -> Deadline {
        // Made while asleep, it would be watched by nobody until the next wake; and the
        // list of dropped ones is forgotten only on ticks.
        self.wake();
        let watch = Rc::new(Watch {
            due_ms: Cell::new(NEVER),
            waker: Cell::new(None),
        });
        self.watched.borrow_mut().push(Rc::downgrade(&watch));
        Deadline {
            watch,
            clock: self.clone(),
        }
    }

    /// A deadline set `after` from now.
    pub(crate) fn deadline_in(self: &Rc<Self>, after: Duration) -> Deadline {
        let deadline = self.deadline();
        deadline.set_in(after);
        deadline
    }

    /// Waits at least `after` (at most two ticks more).
    pub(crate) async fn sleep(self: &Rc<Self>, after: Duration) {
        self.deadline_in(after).passed().await;
    }

    /// Ticks for as long as the thread runs, waking the tasks whose deadlines have passed.
    /// On a timerfd: a tokio interval here would put a timer back on the thread. Should
    /// the timerfd be refused, the interval it is.
    pub(crate) async fn run(self: Rc<Self>) {
        let timer = match tick_timer() {
            Ok(timer) => self.timer.get_or_init(|| timer),
            Err(e) => {
                log::warn!("listener: no timerfd for the deadlines' clock ({e}); ticking on a tokio interval");
                let mut ticks = tokio::time::interval(TICK);
                loop {
                    ticks.tick().await;
                    self.tick();
                }
            }
        };
        loop {
            let mut ready = match timer.readable().await {
                Ok(ready) => ready,
                Err(e) => {
                    log::error!("listener: the deadlines' clock stopped: {e}");
                    return;
                }
            };
            // A read that would block leaves the readiness cleared for the next wait.
            if ready
                .try_io(|timer| timer.get_ref().0.wait().map_err(io::Error::from))
                .is_ok()
            {
                self.tick();
            }
        }
    }

    fn elapsed_ms(&self) -> u64 {
        millis(self.started.elapsed()).min(NEVER - 1)
    }

    /// Milliseconds on this clock: the last tick's while it ticks (no read of the system's
    /// clock), read afresh while it sleeps.
    pub(crate) fn now_ms(&self) -> u64 {
        if self.asleep.get() {
            self.elapsed_ms()
        } else {
            self.now_ms.get()
        }
    }

    fn tick(&self) {
        let now = self.elapsed_ms();
        self.now_ms.set(now);
        let mut earliest_to_come = NEVER;
        self.watched.borrow_mut().retain(|watched| {
            let Some(watch) = watched.upgrade() else {
                return false;
            };
            let due = watch.due_ms.get();
            if due <= now {
                if let Some(waker) = watch.waker.take() {
                    waker.wake();
                }
            } else {
                earliest_to_come = earliest_to_come.min(due);
            }
            true
        });
        if earliest_to_come > now.saturating_add(SLEEP_WHEN_NONE_DUE_WITHIN_MS) {
            self.sleep_until(now, earliest_to_come);
        } else if self.asleep.get() {
            // Woken by its one arming: a deadline is near, tick again.
            self.start_ticking();
        }
    }

    /// Arms the timerfd once for `due` (never, for no deadline) instead of every tick.
    fn sleep_until(&self, now: u64, due: u64) {
        let Some(timer) = self.timer.get() else {
            return;
        };
        let timer = &timer.get_ref().0;
        let armed = if due == NEVER {
            timer.unset()
        } else {
            let after = i64::try_from(due - now).unwrap_or(i64::MAX);
            timer.set(
                Expiration::OneShot(TimeSpec::milliseconds(after)),
                TimerSetTimeFlags::empty(),
            )
        };
        match armed {
            Ok(()) => self.asleep.set(true),
            Err(e) => log::error!("listener: the deadlines' clock could not sleep: {e}"),
        }
    }

    fn start_ticking(&self) {
        let Some(timer) = self.timer.get() else {
            return;
        };
        match tick_every_tick(&timer.get_ref().0) {
            Ok(()) => self.asleep.set(false),
            Err(e) => log::error!("listener: the deadlines' clock could not tick again: {e}"),
        }
    }

    /// Brings a sleeping clock's time up to date and starts its ticks again, before a
    /// deadline is made or set.
    fn wake(&self) {
        if self.asleep.get() {
            self.now_ms.set(self.elapsed_ms());
            self.start_ticking();
        }
    }
}

/// `duration` in whole milliseconds.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl Deadline {
    /// Due `after` from now. The clock's time is the last tick's, up to a tick behind, so
    /// a tick is added: the deadline never passes early.
    pub(crate) fn set_in(&self, after: Duration) {
        self.clock.wake();
        let due = self
            .clock
            .now_ms
            .get()
            .saturating_add(millis(after))
            .saturating_add(TICK_MS);
        self.watch.due_ms.set(due);
    }

    pub(crate) fn has_passed(&self) -> bool {
        self.clock.now_ms.get() >= self.watch.due_ms.get()
    }

    /// Ready once the deadline has passed; until then the clock wakes the task that looked.
    pub(crate) fn poll_passed(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.has_passed() {
            return Poll::Ready(());
        }
        let waker = match self.watch.waker.take() {
            Some(waker) if waker.will_wake(cx.waker()) => waker,
            _ => cx.waker().clone(),
        };
        self.watch.waker.set(Some(waker));
        Poll::Pending
    }

    /// Resolves once the deadline has passed.
    pub(crate) fn passed(&self) -> impl Future<Output = ()> + '_ {
        poll_fn(|cx| self.poll_passed(cx))
    }

    /// `future`'s output, or `Passed` if the deadline passes first. The future is borrowed
    /// pinned where it is, not moved into a wrapper as `tokio::time::timeout` moves it.
    pub(crate) fn bound<'a, F: Future + ?Sized>(
        &'a self,
        mut future: Pin<&'a mut F>,
    ) -> impl Future<Output = Result<F::Output, Passed>> + 'a {
        poll_fn(move |cx| {
            if let Poll::Ready(output) = future.as_mut().poll(cx) {
                return Poll::Ready(Ok(output));
            }
            self.poll_passed(cx).map(|()| Err(Passed))
        })
    }
}

/// A timerfd ticking every [`TICK`], in tokio's epoll set (until the clock first sleeps).
fn tick_timer() -> io::Result<tokio::io::unix::AsyncFd<TickTimer>> {
    let timer = TimerFd::new(
        ClockId::CLOCK_MONOTONIC,
        TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
    )?;
    tick_every_tick(&timer)?;
    // AsyncFd::new is deprecated for types that could close their descriptor while it is
    // registered; TickTimer owns its TimerFd for as long as the AsyncFd holds it.
    #[allow(deprecated)]
    tokio::io::unix::AsyncFd::new(TickTimer(timer))
}

/// Arms `timer` to fire every [`TICK`].
fn tick_every_tick(timer: &TimerFd) -> nix::Result<()> {
    timer.set(
        Expiration::Interval(TimeSpec::milliseconds(TICK_MS as i64)),
        TimerSetTimeFlags::empty(),
    )
}

/// The clock's timerfd, as tokio's AsyncFd takes it (a raw descriptor).
struct TickTimer(TimerFd);

impl AsRawFd for TickTimer {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_local_runtime(test: impl Future<Output = ()>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        tokio::task::LocalSet::new().block_on(&runtime, test);
    }

    #[test]
    fn a_deadline_passes_after_it_is_due_and_never_before() {
        in_local_runtime(async {
            let clock = Clock::new();
            tokio::task::spawn_local(clock.clone().run());
            let started = Instant::now();
            let deadline = clock.deadline_in(Duration::from_millis(250));
            assert!(!deadline.has_passed());
            deadline.passed().await;
            let waited = started.elapsed();
            assert!(waited >= Duration::from_millis(250), "{waited:?}");
            assert!(waited < Duration::from_millis(250) + 3 * TICK, "{waited:?}");
        });
    }

    #[test]
    fn a_bounded_future_that_ends_in_time_gives_its_output_and_one_that_does_not_passes() {
        in_local_runtime(async {
            let clock = Clock::new();
            tokio::task::spawn_local(clock.clone().run());
            let deadline = clock.deadline_in(Duration::from_millis(150));
            let quick = std::pin::pin!(async { 7 });
            assert_eq!(deadline.bound(quick).await.ok(), Some(7));
            let never = std::pin::pin!(std::future::pending::<()>());
            assert!(deadline.bound(never).await.is_err());
        });
    }

    #[test]
    fn with_no_deadline_near_the_clock_sleeps_and_a_deadline_set_then_still_passes_in_time() {
        in_local_runtime(async {
            let clock = Clock::new();
            tokio::task::spawn_local(clock.clone().run());
            // A far deadline, as an idle keep-alive connection's: nothing due near.
            let far = clock.deadline_in(Duration::from_secs(60));
            tokio::time::sleep(3 * TICK).await;
            assert!(clock.asleep.get(), "ticking with nothing due for 60 s");
            let slept_from = clock.now_ms.get();
            tokio::time::sleep(3 * TICK).await;
            assert_eq!(clock.now_ms.get(), slept_from, "ticked while asleep");

            // The time a deadline is set from is read anew, so it passes neither early
            // nor more than two ticks late.
            let started = Instant::now();
            let near = clock.deadline_in(Duration::from_millis(250));
            assert!(!clock.asleep.get());
            near.passed().await;
            let waited = started.elapsed();
            assert!(waited >= Duration::from_millis(250), "{waited:?}");
            assert!(waited < Duration::from_millis(250) + 3 * TICK, "{waited:?}");
            assert!(!far.has_passed());
        });
    }

    #[test]
    fn a_sleeping_clock_wakes_for_its_earliest_deadline() {
        in_local_runtime(async {
            let clock = Clock::new();
            tokio::task::spawn_local(clock.clone().run());
            let started = Instant::now();
            let deadline = clock.deadline_in(Duration::from_millis(700));
            // It sleeps from its first tick, armed once for the deadline.
            tokio::time::sleep(2 * TICK).await;
            assert!(clock.asleep.get());
            deadline.passed().await;
            let waited = started.elapsed();
            assert!(waited >= Duration::from_millis(700), "{waited:?}");
            assert!(waited < Duration::from_millis(700) + 3 * TICK, "{waited:?}");
        });
    }

    #[test]
    fn a_deadline_not_set_never_passes_and_dropped_ones_are_forgotten() {
        in_local_runtime(async {
            let clock = Clock::new();
            tokio::task::spawn_local(clock.clone().run());
            let unset = clock.deadline();
            for _ in 0..100 {
                drop(clock.deadline_in(Duration::from_millis(1)));
            }
            clock.sleep(3 * TICK).await;
            assert!(!unset.has_passed());
            // The sleep's own deadline may wait for the next tick to be forgotten.
            let watched = clock.watched.borrow().len();
            assert!(watched <= 2, "{watched} deadlines watched, 1 alive");
        });
    }
}

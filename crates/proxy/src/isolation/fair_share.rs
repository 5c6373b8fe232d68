//! The fair share: when an event loop is saturated, an app using more than its share of
//! the router's CPU has its new requests wait behind everyone else's, and past a bound
//! refused with 503 and `Retry-After`; apps within their share go on as before. While no
//! loop is saturated nothing changes: admission reads the app's mark (one atomic), and an
//! app over its share only counts its requests under way.
//!
//! - **Saturated.** Each event loop runs a probe ([`probe_loop`]) every 100 ms (every
//!   millisecond while the loop is saturated or has requests waiting): it yields and
//!   measures how long it waits to run again, which is how long everything runnable on
//!   the loop takes, what a quiet app's request arriving now would wait; and it reads the
//!   thread's CPU clock for the part of the last 20 ms the loop ran. The loop is saturated
//!   while that lag is above `--fair-share-lag-ms` or it ran more than 90% of the time, and
//!   clear again once the lag is below half the bound and it ran less than 80%. A heavy
//!   request (one that will wait for a worker) also finds the router saturated while the
//!   worker pool has work queued beyond its threads.
//! - **Shares.** A sampler ([`sample_shares`], every 250 ms) reads the CPU charged to the
//!   apps that cost anything lately (`traffic::cost` lists them as it charges them, so the
//!   sampler never walks every app), keeps each one's rate over the last seconds (an
//!   exponential average, 2 s), and marks an app over its share when its part of the CPU
//!   charged, over those seconds and in the last round alike, is above its `cpu_weight`
//!   over the weights of all the apps charged lately (equal shares by default), with 20%
//!   of slack so that apps at their share are not marked by noise, and it uses a tenth of
//!   a core at least.
//! - **Waiting.** A request of an app marked over its share holds a turn on its loop until
//!   it ends ([`Turn`]). While the loop is saturated, the turns it allows are halved on
//!   each saturated tick (from those running) and grow by one on each clear tick, as a TCP
//!   window does; a request that finds no turn free waits in the loop's queue (after
//!   routing, before any of the app's stages) and gets the next turn that ends or grows, in
//!   order. One still waiting after `--fair-share-queue-ms` is refused with 503 and
//!   `Retry-After`, as is one that finds 4,096 waiting. A request of an app within its share
//!   never waits, queue or not: the loop's time goes to it first.
//!
//! Measured in bench/engines/fair_share.py (bench/FAIR_SHARE.md).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::metrics::{
    FAIR_SHARE_DECISIONS, FAIR_SHARE_FOLLOWED_APPS, FAIR_SHARE_OVER_SHARE_APPS,
    FAIR_SHARE_SATURATED_LOOPS, FAIR_SHARE_WAITING, FAIR_SHARE_WAIT_SECONDS,
};
use crate::respond::{Reason, Refusal};
use crate::shutdown::ShutdownWatch;
use crate::traffic::app_requests::AppRequests;
use crate::traffic::cost;

/// The router-wide settings of the fair share.
#[derive(Debug, Clone, Copy)]
pub struct FairShare {
    /// Whether it is on (`--fair-share`); it needs the CPU attribution.
    pub on: bool,
    /// An event loop whose probe waits longer than this to run again is saturated.
    pub lag_bound: Duration,
    /// How long a request over its app's share may wait before it is refused.
    pub queue_bound: Duration,
}

impl Default for FairShare {
    fn default() -> Self {
        FairShare {
            on: true,
            lag_bound: Duration::from_millis(1),
            queue_bound: Duration::from_millis(1000),
        }
    }
}

static SETTINGS: OnceLock<FairShare> = OnceLock::new();

/// Sets the fair share for the process's life (before the event loops start); off unless
/// the CPU attribution is on, since shares are read from it.
pub fn configure(settings: FairShare) {
    let on = settings.on && cost::attribution_on();
    if settings.on && !on {
        log::warn!("fair share off: it reads each app's CPU, and --cpu-attribution is off");
    }
    if on {
        cost::list_charged_apps();
    }
    let _ = SETTINGS.set(FairShare { on, ..settings });
}

/// Whether the fair share runs (configured on, with the attribution).
pub(crate) fn is_on() -> bool {
    SETTINGS.get().is_some_and(|s| s.on)
}

fn settings() -> FairShare {
    SETTINGS.get().copied().unwrap_or(FairShare {
        on: false,
        ..FairShare::default()
    })
}

/// Requests waiting on one loop's queue at most; one more is refused at once.
const MAX_WAITING_PER_LOOP: usize = 4096;
/// The probe's period while the loop is clear and nothing waits: at 10 ms it cost 2.8k
/// instructions a request at 200 requests a second (bench/engines/fair_share.py), each tick
/// a timer, a yield and a poll of the loop's I/O; saturation is seen within 100 ms.
const PROBE_EVERY: Duration = Duration::from_millis(100);
/// The probe's period while the loop is saturated or requests wait: tokio's timer
/// resolution.
const PROBE_EVERY_WHILE_FULL: Duration = Duration::from_millis(1);
/// How often the sampler reads the apps' CPU.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// The time constant of an app's CPU rate: "the last seconds".
const RATE_OVER: Duration = Duration::from_secs(2);
/// An app is over its share above this many times its share.
const SLACK: f64 = 1.2;
/// Rounds an app stays followed after its last charge (its rate decays meanwhile).
const FOLLOWED_ROUNDS: u32 = 16;

/// One event loop's state: read on the request path, written by the loop's probe.
struct LoopGate {
    saturated: Cell<bool>,
    /// Requests of apps over their share under way on this loop (each holds a [`Turn`]).
    running: Cell<usize>,
    /// How many of them may be under way while the loop is saturated or requests wait:
    /// halved on each saturated tick, one more on each clear one (as TCP's window).
    allowed: Cell<usize>,
    waiting: RefCell<VecDeque<oneshot::Sender<Turn>>>,
}

thread_local! {
    static GATE: LoopGate = const {
        LoopGate {
            saturated: Cell::new(false),
            running: Cell::new(0),
            allowed: Cell::new(usize::MAX),
            waiting: RefCell::new(VecDeque::new()),
        }
    };
}

/// A place among the requests over their app's share under way on this loop, held until
/// the request ends (a WebSocket gives it up once upgraded). Not `Send`: it is this loop's.
#[derive(Debug)]
pub(crate) struct Turn {
    _this_loop: std::marker::PhantomData<*const ()>,
}

impl Turn {
    fn taken(gate: &LoopGate) -> Turn {
        gate.running.set(gate.running.get() + 1);
        Turn {
            _this_loop: std::marker::PhantomData,
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        // `try_with`: a turn dropped as the thread ends finds its loop's state gone.
        let _ = GATE.try_with(|g| {
            g.running.set(g.running.get().saturating_sub(1));
            let_go_in_turn(g);
        });
    }
}

/// A request over its app's share on a saturated loop, waiting its turn.
pub(crate) struct Waiting {
    turn: oneshot::Receiver<Turn>,
    since: Instant,
}

/// Whether the request of `app` goes on now (`Ok(None)`, or `Ok(Some(Admitted::Now))`
/// holding a turn), must wait for one (`Admitted::Waits`, then [`Waiting::turn`]), or is
/// refused at once (the loop's queue is full). `heavy`: it will wait for a worker, so a
/// backlogged pool saturates it too.
pub(crate) fn admit(
    app: &AppRequests,
    heavy: bool,
    pool_backlogged: impl FnOnce() -> bool,
) -> Result<Option<Admitted>, Refusal> {
    if !is_on() || !app.cost.share.over.load(Ordering::Relaxed) {
        return Ok(None);
    }
    GATE.with(|g| {
        let full = g.saturated.get() || (heavy && pool_backlogged());
        let mut waiting = g.waiting.borrow_mut();
        if waiting.is_empty() && (!full || g.running.get() < g.allowed.get()) {
            return Ok(Some(Admitted::Now(Turn::taken(g))));
        }
        if waiting.len() >= MAX_WAITING_PER_LOOP {
            counted(Outcome::Refused);
            return Err(refusal());
        }
        let (release, turn) = oneshot::channel();
        waiting.push_back(release);
        FAIR_SHARE_WAITING.inc();
        counted(Outcome::Queued);
        Ok(Some(Admitted::Waits(Waiting {
            turn,
            since: Instant::now(),
        })))
    })
}

/// What [`admit`] lets a request over its app's share do.
pub(crate) enum Admitted {
    Now(Turn),
    Waits(Waiting),
}

impl Waiting {
    /// Waits for the request's turn, at most `--fair-share-queue-ms`.
    pub(crate) async fn turn(self) -> Result<Turn, Refusal> {
        let released = tokio::time::timeout(settings().queue_bound, self.turn).await;
        FAIR_SHARE_WAIT_SECONDS.observe(self.since.elapsed().as_secs_f64());
        match released {
            Ok(Ok(turn)) => Ok(turn),
            // Timed out (its sender is dropped unsent when its turn comes), or the loop
            // is stopping.
            _ => {
                counted(Outcome::Refused);
                Err(refusal())
            }
        }
    }
}

fn refusal() -> Refusal {
    Refusal::new(Reason::OverShare)
}

/// Watches this event loop for as long as it runs. Each tick measures how long a task
/// that yields waits to run again: everything runnable on the loop, and its I/O, runs
/// first, so this is what a request arriving now would wait (a timer's lateness says the
/// same at the timer's millisecond resolution only).
pub(crate) async fn probe_loop() {
    let bound = settings().lag_bound;
    let mut period = PROBE_EVERY;
    let mut busy = Busy::new();
    loop {
        tokio::time::sleep(period).await;
        let yielded = Instant::now();
        tokio::task::yield_now().await;
        let lag = yielded.elapsed();
        let busy_part = busy.measure();
        let full = GATE.with(|g| {
            let was = g.saturated.get();
            let now = if was {
                lag > bound / 2 || busy_part > CLEAR_BELOW_BUSY
            } else {
                lag > bound || busy_part > SATURATED_ABOVE_BUSY
            };
            if now != was {
                g.saturated.set(now);
                FAIR_SHARE_SATURATED_LOOPS.add(if now { 1 } else { -1 });
            }
            if now {
                // Fewer at once, from what runs now rather than from a limit not reached;
                // down to none: while one request of theirs alone saturates the loop, apps
                // over their share go on only on clear ticks.
                g.allowed.set(g.allowed.get().min(g.running.get()) / 2);
            } else if !g.waiting.borrow().is_empty() {
                g.allowed.set(g.allowed.get().saturating_add(1));
            } else {
                g.allowed.set(usize::MAX);
            }
            let_go_in_turn(g);
            now || !g.waiting.borrow().is_empty()
        });
        period = if full {
            PROBE_EVERY_WHILE_FULL
        } else {
            PROBE_EVERY
        };
    }
}

/// A loop busier than this part of the time is saturated: work arriving finds it running
/// something else almost always, whatever its lag at the probe's instant.
const SATURATED_ABOVE_BUSY: f64 = 0.9;
/// ... and clear again below this.
const CLEAR_BELOW_BUSY: f64 = 0.8;
/// The span the busy part is averaged over.
const BUSY_OVER: Duration = Duration::from_millis(20);

/// The part of the time this thread ran, from its CPU clock (a system call, 0.5 µs here:
/// read once a tick, not a request).
struct Busy {
    cpu_ns: u64,
    at: Instant,
    part: f64,
}

impl Busy {
    fn new() -> Self {
        Busy {
            cpu_ns: cost::thread_cpu_ns(),
            at: Instant::now(),
            part: 0.0,
        }
    }

    fn measure(&mut self) -> f64 {
        let (cpu_ns, at) = (cost::thread_cpu_ns(), Instant::now());
        let wall = at.duration_since(self.at);
        if wall.is_zero() {
            return self.part;
        }
        let ran = cpu_ns.saturating_sub(self.cpu_ns) as f64 / wall.as_nanos() as f64;
        let weight = (wall.as_secs_f64() / BUSY_OVER.as_secs_f64()).min(1.0);
        self.part += (ran.min(1.0) - self.part) * weight;
        (self.cpu_ns, self.at) = (cpu_ns, at);
        self.part
    }
}

/// Gives turns to the requests waiting longest while fewer than allowed run (skipping
/// those that gave up).
fn let_go_in_turn(gate: &LoopGate) {
    let mut waiting = gate.waiting.borrow_mut();
    while gate.running.get() < gate.allowed.get() {
        let Some(release) = waiting.pop_front() else {
            break;
        };
        FAIR_SHARE_WAITING.dec();
        // A request that gave up (its wait bounded) has dropped its receiver.
        if release.is_closed() {
            continue;
        }
        if let Err(unsent) = release.send(Turn::taken(gate)) {
            // Not dropped: its drop would come back here for the queue, borrowed now.
            std::mem::forget(unsent);
            gate.running.set(gate.running.get() - 1);
        }
    }
}

/// One app's CPU rate, followed by the sampler.
struct Followed {
    app: Arc<AppRequests>,
    /// Its CPU counter at the last round; `None` in its first.
    cpu_ns: Option<u64>,
    /// CPU nanoseconds a second, averaged over [`RATE_OVER`].
    rate: f64,
    /// CPU nanoseconds a second over the last round alone.
    latest: f64,
    rounds_uncharged: u32,
}

/// The sampler's state between rounds.
#[derive(Default)]
pub(crate) struct Shares {
    followed: HashMap<usize, Followed>,
    sampled_at: Option<Instant>,
}

/// An app using less than this part of one core, CPU nanoseconds a second, is never over
/// its share: it cannot be what saturates a loop, and once the apps over their share wait,
/// the CPU charged falls, so that a quiet app's part of it rises with no more use of its
/// own (tests/filters.rs caught a quiet app at 2% of a core so marked, and made to wait
/// 50-110 ms behind a spinning filter's turns).
const NEVER_OVER_BELOW: f64 = 0.1e9;

impl Shares {
    /// One round: reads the CPU of the apps charged lately and marks those over their share.
    pub(crate) fn sample(&mut self) {
        self.sample_with(cost::charged_recently(), Instant::now());
    }

    /// A round at `now`, `charged` the apps charged CPU since the last.
    fn sample_with(&mut self, charged: Vec<Arc<AppRequests>>, now: Instant) {
        let elapsed = self
            .sampled_at
            .replace(now)
            .map_or(SAMPLE_EVERY, |then| now.duration_since(then))
            .as_secs_f64()
            .max(1e-3);
        for app in charged {
            let key = Arc::as_ptr(&app) as usize;
            let followed = self.followed.entry(key).or_insert_with(|| Followed {
                cpu_ns: None,
                rate: 0.0,
                latest: 0.0,
                rounds_uncharged: 0,
                app,
            });
            followed.rounds_uncharged = 0;
        }
        let kept = 1.0 - (-elapsed / RATE_OVER.as_secs_f64()).exp();
        let (mut total, mut latest_total, mut weights) = (0.0, 0.0, 0.0);
        self.followed.retain(|_, followed| {
            let cpu_ns = followed.app.cost.cpu_ns.load(Ordering::Relaxed);
            // First seen: its counter so far is no rate.
            let spent =
                (followed.cpu_ns.replace(cpu_ns)).map_or(0, |then| cpu_ns.saturating_sub(then));
            followed.latest = spent as f64 / elapsed;
            followed.rate += (followed.latest - followed.rate) * kept;
            followed.rounds_uncharged += 1;
            if followed.rounds_uncharged > FOLLOWED_ROUNDS {
                followed.app.cost.share.over.store(false, Ordering::Relaxed);
                return false;
            }
            total += followed.rate;
            latest_total += followed.latest;
            weights += weight_of(&followed.app);
            true
        });
        let mut over = 0;
        for followed in self.followed.values() {
            let share = weight_of(&followed.app) / weights.max(1.0);
            // Over on average and in the last round: an app busy a moment ago whose
            // average still outweighs a newcomer's is not the one that saturates the loop
            // now.
            let above = |rate: f64, total: f64| {
                rate > NEVER_OVER_BELOW && total > 0.0 && rate / total > share * SLACK
            };
            let is_over = above(followed.rate, total) && above(followed.latest, latest_total);
            over += i64::from(is_over);
            followed
                .app
                .cost
                .share
                .over
                .store(is_over, Ordering::Relaxed);
        }
        FAIR_SHARE_OVER_SHARE_APPS.set(over);
        FAIR_SHARE_FOLLOWED_APPS.set(self.followed.len() as i64);
    }
}

fn weight_of(app: &AppRequests) -> f64 {
    f64::from(app.cost.share.weight.load(Ordering::Relaxed).max(1))
}

/// Samples the apps' shares every [`SAMPLE_EVERY`] until `shutdown`; returns at once when
/// the fair share is off.
pub async fn sample_shares(mut shutdown: ShutdownWatch) {
    if !is_on() {
        return;
    }
    let mut shares = Shares::default();
    let mut every = tokio::time::interval(SAMPLE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => shares.sample(),
            _ = shutdown.changed() => return,
        }
    }
}

#[derive(Clone, Copy)]
enum Outcome {
    Queued,
    Refused,
}

fn counted(outcome: Outcome) {
    let label = match outcome {
        Outcome::Queued => "queued",
        Outcome::Refused => "refused",
    };
    FAIR_SHARE_DECISIONS.with_label_values(&[label]).inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(weight: u32) -> Arc<AppRequests> {
        let app = Arc::<AppRequests>::default();
        app.cost.share.weight.store(weight, Ordering::Relaxed);
        app
    }

    fn spend(app: &AppRequests, ms: u64) {
        app.cost.cpu_ns.fetch_add(ms * 1_000_000, Ordering::Relaxed);
    }

    fn over(app: &AppRequests) -> bool {
        app.cost.share.over.load(Ordering::Relaxed)
    }

    #[test]
    fn an_app_above_its_weighted_share_is_marked_until_it_stops_costing() {
        let (heavy, quiet, other) = (app(1), app(1), app(1));
        let all = || vec![heavy.clone(), quiet.clone(), other.clone()];
        let mut shares = Shares::default();
        let mut now = Instant::now();
        for app in [&heavy, &quiet, &other] {
            spend(app, 1);
        }
        shares.sample_with(all(), now);
        for _ in 0..8 {
            now += SAMPLE_EVERY;
            spend(&heavy, 200);
            spend(&quiet, 5);
            spend(&other, 5);
            shares.sample_with(all(), now);
        }
        assert!(over(&heavy), "97% of the CPU against a third each");
        assert!(!over(&quiet) && !over(&other));

        // Weighted 100 against 1 and 1, the same use is within its share.
        heavy.cost.share.weight.store(100, Ordering::Relaxed);
        now += SAMPLE_EVERY;
        spend(&heavy, 200);
        shares.sample_with(all(), now);
        assert!(!over(&heavy));

        // Back to 1, then no more CPU: marked, then forgotten once it stops costing.
        heavy.cost.share.weight.store(1, Ordering::Relaxed);
        now += SAMPLE_EVERY;
        spend(&heavy, 200);
        shares.sample_with(all(), now);
        assert!(over(&heavy));
        for _ in 0..=FOLLOWED_ROUNDS {
            now += SAMPLE_EVERY;
            shares.sample_with(Vec::new(), now);
        }
        assert!(!over(&heavy));
        assert!(shares.followed.is_empty());
    }

    #[test]
    fn an_app_busy_a_moment_ago_is_not_marked_when_another_takes_the_cpu() {
        let (earlier, newcomer) = (app(1), app(1));
        let both = || vec![earlier.clone(), newcomer.clone()];
        let mut shares = Shares::default();
        let mut now = Instant::now();
        spend(&earlier, 1);
        spend(&newcomer, 1);
        shares.sample_with(both(), now);
        for _ in 0..8 {
            now += SAMPLE_EVERY;
            spend(&earlier, 200);
            shares.sample_with(both(), now);
        }
        // The newcomer takes the CPU: the earlier app's average still outweighs its own,
        // but in this round it used next to nothing.
        now += SAMPLE_EVERY;
        spend(&earlier, 1);
        spend(&newcomer, 200);
        shares.sample_with(both(), now);
        assert!(!over(&earlier), "busy a moment ago, quiet now");
    }

    #[test]
    fn a_quiet_app_is_not_marked_when_the_app_over_its_share_waits() {
        let (heavy, quiet) = (app(1), app(1));
        let both = || vec![heavy.clone(), quiet.clone()];
        let mut shares = Shares::default();
        let mut now = Instant::now();
        spend(&heavy, 1);
        spend(&quiet, 1);
        shares.sample_with(both(), now);
        for _ in 0..8 {
            now += SAMPLE_EVERY;
            spend(&heavy, 240);
            spend(&quiet, 5);
            shares.sample_with(both(), now);
        }
        assert!(over(&heavy) && !over(&quiet));
        // The heavy app's requests wait: the quiet app's 5 ms are now most of what is
        // charged, and still 2% of the core.
        for _ in 0..8 {
            now += SAMPLE_EVERY;
            spend(&heavy, 1);
            spend(&quiet, 5);
            shares.sample_with(both(), now);
            assert!(!over(&quiet));
        }
    }

    fn running() -> usize {
        GATE.with(|g| g.running.get())
    }

    fn waiting() -> usize {
        GATE.with(|g| g.waiting.borrow().len())
    }

    #[tokio::test(flavor = "current_thread")]
    async fn only_apps_over_their_share_wait_and_only_as_many_run_as_the_loop_allows() {
        let _ = SETTINGS.set(FairShare::default());
        let (heavy, quiet) = (app(1), app(1));
        heavy.cost.share.over.store(true, Ordering::Relaxed);
        let never_backlogged = || false;
        // A clear loop: an app over its share goes on, counted as running.
        let Ok(Some(Admitted::Now(first))) = admit(&heavy, false, never_backlogged) else {
            panic!("a clear loop lets every request go on");
        };
        assert_eq!(running(), 1);
        GATE.with(|g| {
            g.saturated.set(true);
            g.allowed.set(1);
        });
        assert!(matches!(admit(&quiet, false, never_backlogged), Ok(None)));
        let mut waits: Vec<Waiting> = (0..3)
            .map(|_| match admit(&heavy, false, never_backlogged) {
                Ok(Some(Admitted::Waits(waiting))) => waiting,
                _ => panic!("past the allowed, an app over its share waits"),
            })
            .collect();
        let third = waits.pop().expect("three waited");
        drop(waits.pop()); // the second gives up
        let first_waiter = waits.pop().expect("three waited");
        assert_eq!((running(), waiting()), (1, 3));

        // The first turn ends: the first waiter has it, the others wait on.
        drop(first);
        let turn = first_waiter.turn().await.expect("its turn");
        assert_eq!((running(), waiting()), (1, 2));
        // That one ends: the second gave up and uses no turn, the third has it.
        drop(turn);
        assert_eq!((running(), waiting()), (1, 0));
        let last = third.turn().await.expect("its turn");
        drop(last);
        assert_eq!(running(), 0);
        GATE.with(|g| g.saturated.set(false));
    }
}

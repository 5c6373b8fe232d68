//! Worker threads that give way to any thread waiting for a CPU.
//!
//! `SCHED_IDLE` alone does not keep a worker off a CPU that a normal thread waits for. On
//! EEVDF (Linux 6.6 and later) a thread that a wakeup preempted and that has run ahead of
//! its share is not eligible to run again at once; the `SCHED_IDLE` worker then runs on
//! until the next tick (4 ms at HZ=250). `perf sched` on bench/bench_images.py beside 100
//! thumbnail connections (kernel 6.18) showed an event loop runnable for 3.2 ms while a
//! worker ran on its CPU, and the load's nginx and vegeta waiting up to 1.7 and 3.9 ms: the
//! light route's p99 grew from 0.6 ms to 2–3 ms although a waking loop always preempts.
//!
//! So while a worker runs a task and a light request is under way (below), a timer
//! interrupts it every [`CHECK_EVERY`]. The signal
//! handler reads how many threads of the machine are runnable (`/proc/loadavg`, the
//! kernel's instantaneous count) and the state of the threads the router asked to watch,
//! its event loops, while they have work ([`watch_this_thread`], [`Watched`]). While the runnable threads exceed what the CPUs
//! can run beside the workers running tasks, or a watched loop is runnable on the worker's
//! own CPU (the machine-wide count misses a loop queued behind a worker while the other CPU
//! idles: the balancer moves it at a tick), the worker sleeps 100 µs at a time, for at most
//! 20 ms at once
//! (then it runs one period whatever happens, so a host kept busy by others still sees heavy
//! work progress, slowly, and refuse by deadline). What the signal interrupts (libjpeg,
//! libmodsecurity, Rust) just pauses.
//!
//! Counting runnable threads machine-wide rather than per CPU is deliberate: it is what the
//! kernel gives without privilege, and yielding to any runnable thread is `SCHED_IDLE`'s
//! promise. Workers running more tasks than there are CPUs do not take each other for
//! "others": the count of workers running tasks is subtracted first.
//!
//! Workers give way only while a light request is under way ([`LightRequest`]: one that
//! waits for no worker). What waits for a CPU is then, directly or not, what that request
//! waits for: its event loop, the app it went to, the client. With none under way, every
//! request waits for the workers themselves, and pausing them for the load generator or the
//! loops that feed them only delays those requests: the workers then run as `SCHED_IDLE`
//! alone lets them, their timers off (the first light request to start kicks them; they
//! go on giving way for 10 ms after the last one ends, while its client reads). On
//! bench_waf's 10 KB inspected POSTs with no light route, giving way always made 137–154
//! req/s where nginx + ModSecurity made 194–238 in the same runs; giving way to light
//! traffic only, 203–212 beside nginx's 194–207.

use std::time::Duration;

mod sys;

/// How often a worker running a task checks for threads waiting for a CPU.
pub const CHECK_EVERY: Duration = Duration::from_micros(250);

/// How a task paused for other threads.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Paused {
    /// Checks that found others waiting.
    pub times: u64,
    /// Time spent sleeping for them.
    pub slept: Duration,
}

/// A worker thread's check timer, armed while it runs a task beside a light request. Not
/// `Send`: it interrupts the thread that made it.
pub struct GiveWay {
    _timer: sys::Timer,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl std::fmt::Debug for GiveWay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GiveWay").finish_non_exhaustive()
    }
}

impl GiveWay {
    /// The calling thread's timer (installing the process's handler the first time); an
    /// error when the kernel refuses either, when the thread has one already, or when 256
    /// workers have one.
    pub fn for_this_thread() -> Result<Self, String> {
        Ok(Self {
            _timer: sys::Timer::for_this_thread()?,
            _not_send: std::marker::PhantomData,
        })
    }

    /// Runs `task` with the checks on: what it returned, and how it paused for others.
    pub fn run<T>(&self, task: impl FnOnce() -> T) -> (T, Paused) {
        self.run_pausing_at_most(Duration::MAX, task)
    }

    /// Runs `task` with the checks on until it has paused for `budget` in all, then runs it
    /// to its end without pausing (a task that must end by a deadline reserves the time it
    /// needs to run): what it returned, and how it paused for others.
    pub fn run_pausing_at_most<T>(
        &self,
        budget: Duration,
        task: impl FnOnce() -> T,
    ) -> (T, Paused) {
        let running = sys::RunningWorker::enter(budget);
        let value = task();
        drop(running);
        (value, sys::take_paused())
    }
}

/// A light request under way, counted until dropped: while any is, and for a moment after
/// the last one (its client reads the answer), the workers give way. For a request that
/// will wait for no worker, from when the router knows it until its answer is ready.
#[derive(Debug)]
pub struct LightRequest {
    _counted: (),
}

impl LightRequest {
    /// Counts a request; the first of a spell of light traffic kicks the workers running
    /// tasks, whose checks were off.
    pub fn start() -> Self {
        sys::light_request_started();
        Self { _counted: () }
    }
}

impl Drop for LightRequest {
    fn drop(&mut self) {
        sys::light_request_ended();
    }
}

/// Has the calling thread watched by every worker's checks: while it has work and is
/// runnable on the CPU of a worker running a task, that worker gives way. For event loops,
/// which say when they park and wake ([`Watched`]); an error when its stat cannot be opened
/// or too many threads are watched already.
pub fn watch_this_thread() -> Result<Watched, String> {
    sys::watch_this_thread().map(|place| Watched { place })
}

/// A watched thread's word to the workers. Reading a thread's stat costs about 4 µs of
/// kernel time and touches its task's memory from another CPU; the checks read only the
/// stats of threads that have work (an event loop between its wake-up and its next park),
/// the only ones that can wait for a CPU. A parked loop that wakes on a worker's CPU
/// preempts the worker at once (`SCHED_IDLE`), and is working by the time it could be
/// preempted in turn.
#[derive(Debug, Clone, Copy)]
pub struct Watched {
    place: usize,
}

impl Watched {
    /// The thread woke with work: the checks watch its state.
    pub fn working(self) {
        sys::set_working(self.place, true);
    }

    /// The thread is about to park (wait for events): nothing to watch until it wakes.
    pub fn parked(self) {
        sys::set_working(self.place, false);
    }
}

/// The CPU a thread is runnable on, from its `/proc/…/stat` text: `None` unless its state
/// is R (running or waiting to run). Fields after the name (in parentheses, which may hold
/// spaces): state is the 1st, processor the 37th.
fn runnable_on(stat: &[u8]) -> Option<usize> {
    let after_name = stat.get(stat.iter().rposition(|&b| b == b')')? + 1..)?;
    let mut fields = after_name.split(|&b| b == b' ').filter(|f| !f.is_empty());
    if fields.next()? != b"R" {
        return None;
    }
    decimal(fields.nth(35)?)
}

/// The count of runnable threads in `/proc/loadavg`'s text: its 4th field, "R/T".
fn runnable_threads(loadavg: &[u8]) -> Option<usize> {
    let field = loadavg.split(|&b| b == b' ').nth(3)?;
    decimal(field.split(|&b| b == b'/').next()?)
}

/// A non-empty run of ASCII digits as a number (what /proc prints), saturating.
fn decimal(digits: &[u8]) -> Option<usize> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0usize, |n, &digit| {
        digit.is_ascii_digit().then(|| {
            n.saturating_mul(10)
                .saturating_add(usize::from(digit - b'0'))
        })
    })
}

/// Whether, of `runnable` threads, one that is not among the `workers` running tasks waits
/// for one of the `cpus`.
fn others_wait(runnable: usize, workers: usize, cpus: usize) -> bool {
    let others = runnable.saturating_sub(workers);
    others > 0 && others + workers > cpus
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn the_runnable_count_is_the_fourth_field() {
        assert_eq!(runnable_threads(b"0.52 0.58 0.59 3/451 12345\n"), Some(3));
        assert_eq!(
            runnable_threads(b"10.00 9.12 8.00 117/2048 99\n"),
            Some(117)
        );
        assert_eq!(runnable_threads(b"0.52 0.58 0.59 /451 1\n"), None);
        assert_eq!(runnable_threads(b"0.52 0.58\n"), None);
        assert_eq!(runnable_threads(b"0.52 0.58 0.59 x/451 1\n"), None);
        let live = std::fs::read("/proc/loadavg").expect("/proc/loadavg");
        assert!(
            runnable_threads(&live).is_some_and(|n| n >= 1),
            "this thread runs"
        );
    }

    #[test]
    fn a_runnable_thread_is_found_on_its_processor() {
        let running = b"20834 (hyper listener) R 20830 20830 14817 0 -1 4194304 123 0 0 0 0 0 0 0 20 0 1 0 7561588 3133440 374 18446744073709551615 94280131731456 94280131751337 140733261388256 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(runnable_on(running), Some(1));
        let sleeping = b"20834 (cat) S 20830 20830 14817 0 -1 4194304 123 0 0 0 0 0 0 0 20 0 1 0 7561588 3133440 374 18446744073709551615 94280131731456 94280131751337 140733261388256 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(runnable_on(sleeping), None);
        // This thread, reading its own stat, is running on the CPU it is on.
        let own = std::fs::read("/proc/thread-self/stat").expect("stat");
        assert!(
            runnable_on(&own).is_some(),
            "{}",
            String::from_utf8_lossy(&own)
        );
    }

    #[test]
    fn only_threads_beyond_the_cpus_count_as_waiting() {
        assert!(!others_wait(2, 2, 2), "two workers alone on two CPUs");
        assert!(others_wait(3, 2, 2), "a third thread waits");
        assert!(others_wait(3, 1, 2), "two others and a worker on two CPUs");
        assert!(!others_wait(2, 1, 2), "one other and a worker: both run");
        assert!(
            !others_wait(3, 3, 2),
            "workers beyond the CPUs do not make each other nap"
        );
    }

    /// CPU time the calling thread has used.
    fn own_cpu_time() -> Duration {
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
            .map_or(Duration::ZERO, Duration::from)
    }

    /// The two tests that run tasks: one at a time, or one's busy threads make the other pause.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// `count` threads spinning until `stop`.
    fn busy_threads(count: usize, stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
        (0..count)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect()
    }

    /// Runs a 200 ms spinning task on a thread that gives way while `cpus` other threads
    /// spin: how it paused, the CPU time it used and the wall time it took.
    fn spin_beside_busy_cpus(give_way: &GiveWay, cpus: usize) -> (Paused, Duration, Duration) {
        let stop = Arc::new(AtomicBool::new(false));
        let spinners = busy_threads(cpus, &stop);
        let wall = Instant::now();
        let cpu_before = own_cpu_time();
        let ((), paused) = give_way.run(|| {
            while wall.elapsed() < Duration::from_millis(200) {
                std::hint::spin_loop();
            }
        });
        let used = own_cpu_time() - cpu_before;
        let took = wall.elapsed();
        stop.store(true, Ordering::Relaxed);
        for spinner in spinners {
            spinner.join().expect("spinner");
        }
        (paused, used, took)
    }

    #[test]
    fn a_task_pauses_while_other_threads_want_every_cpu_and_finishes() {
        let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let give_way = GiveWay::for_this_thread().expect("timer");
        let cpus = sys::cpus();
        let light = LightRequest::start();
        let (paused, used, took) = spin_beside_busy_cpus(&give_way, cpus);
        drop(light);
        assert!(paused.times > 0, "never gave way: {paused:?}");
        // Sharing fairly, this thread (normal priority) would have had cpus/(cpus+1) of the
        // time; giving way, it runs one check period at least every 20 ms.
        assert!(
            used < took / 4,
            "ran {used:?} of {took:?} beside {cpus} busy threads ({paused:?})"
        );
        // It slept more than it ran. Not "half the wall time": on a host that other
        // processes keep busy too (a test suite beside it), part of the time it waits
        // runnable, neither sleeping nor running (100 ms slept of 200 ms, ran under 50).
        assert!(
            paused.slept > used && paused.slept >= took / 4,
            "{paused:?} and ran {used:?} of {took:?}"
        );
    }

    #[test]
    fn a_task_stops_pausing_once_it_has_slept_its_budget() {
        let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let give_way = GiveWay::for_this_thread().expect("timer");
        let light = LightRequest::start();
        let budget = Duration::from_millis(30);
        let stop = Arc::new(AtomicBool::new(false));
        let spinners = busy_threads(sys::cpus(), &stop);
        let wall = Instant::now();
        let ((), paused) = give_way.run_pausing_at_most(budget, || {
            while wall.elapsed() < Duration::from_millis(200) {
                std::hint::spin_loop();
            }
        });
        stop.store(true, Ordering::Relaxed);
        for spinner in spinners {
            spinner.join().expect("spinner");
        }
        drop(light);
        // Others wanted every CPU throughout: it slept its budget, and no more than one nap
        // past it.
        assert!(paused.slept >= budget / 2, "{paused:?}");
        assert!(paused.slept <= budget + sys::NAP, "{paused:?}");
    }

    #[test]
    fn a_task_runs_on_while_no_light_request_is_under_way() {
        let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let give_way = GiveWay::for_this_thread().expect("timer");
        // One ended before the task starts, long enough ago: no light traffic.
        drop(LightRequest::start());
        std::thread::sleep(sys::LIGHT_TRAFFIC_LINGERS * 2);
        let (paused, _, _) = spin_beside_busy_cpus(&give_way, sys::cpus());
        assert_eq!(paused, Paused::default(), "gave way with no light request");
    }

    #[test]
    fn a_light_request_that_starts_mid_task_makes_the_worker_give_way() {
        let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let give_way = GiveWay::for_this_thread().expect("timer");
        // Started 50 ms into the 200 ms task, which runs unchecked until then: the first
        // light request kicks it.
        let light_starter = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            let light = LightRequest::start();
            std::thread::sleep(Duration::from_millis(300));
            drop(light);
        });
        let (paused, _, took) = spin_beside_busy_cpus(&give_way, sys::cpus());
        light_starter.join().expect("light request");
        assert!(paused.times > 0, "never gave way: {paused:?}");
        assert!(paused.slept >= took / 4, "{paused:?} of {took:?}");
    }

    /// Pins the calling thread to `cpu`.
    fn pin_to(cpu: usize) {
        let mut set = nix::sched::CpuSet::new();
        set.set(cpu).expect("cpu in set");
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).expect("pinned");
    }

    #[test]
    fn a_watched_thread_is_looked_at_only_while_it_works() {
        let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        pin_to(0);
        let stop = Arc::new(AtomicBool::new(false));
        let (told, watched) = std::sync::mpsc::channel();
        let spinner = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                pin_to(0);
                told.send(watch_this_thread().expect("watched"))
                    .expect("told");
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let watched = watched.recv().expect("watched");
        // Working and spinning on this thread's CPU: runnable there, running or waiting.
        assert!(sys::watched_waits_on_cpu(0));
        assert!(!sys::watched_waits_on_cpu(1), "not on another CPU");
        watched.parked();
        assert!(!sys::watched_waits_on_cpu(0), "a parked thread is not read");
        watched.working();
        assert!(sys::watched_waits_on_cpu(0));
        stop.store(true, Ordering::Relaxed);
        spinner.join().expect("spinner");
        // Ended: its stat reads nothing, and the place is never mistaken for a waiting loop.
        // A joined thread's task may linger a moment before the kernel lets it go (the
        // join returns when its id is cleared, before its exit is done): looked at until
        // it is gone, within a second.
        let ended = std::time::Instant::now();
        while sys::watched_waits_on_cpu(0) {
            assert!(
                ended.elapsed() < std::time::Duration::from_secs(1),
                "an ended thread still reads as waiting"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        watched.parked();
    }

    #[test]
    fn a_task_alone_runs_on_and_keeps_its_system_calls() {
        let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let give_way = GiveWay::for_this_thread().expect("timer");
        // The checks run: a light request is under way.
        let _light = LightRequest::start();
        let (mut reader, mut writer) = std::io::pipe().expect("pipe");
        let ((), paused) = give_way.run(|| {
            let writing = std::thread::spawn(move || {
                std::thread::sleep(CHECK_EVERY * 8);
                std::io::Write::write_all(&mut writer, b"x").expect("write");
            });
            // A blocking read across several checks: restarted, never EINTR (a plain read
            // would return ErrorKind::Interrupted).
            let mut byte = [0u8; 1];
            let read = std::io::Read::read(&mut reader, &mut byte);
            assert_eq!(read.expect("read across checks"), 1);
            writing.join().expect("writer");
        });
        assert!(paused.slept < Duration::from_millis(20), "{paused:?}");
    }
}

//! The system calls: the process's signal handler, the per-thread timer and the counts the
//! handler reads. The handler only reads a descriptor opened beforehand, sleeps, sets its
//! own thread's timer and touches atomics and const-initialised thread-locals:
//! async-signal-safe.
//!
//! A worker's timer runs only while a light request is under way: the signals themselves
//! cost (a 10 KB inspection took ~8% more time with the timer firing every 250 µs and the
//! handler returning at once than with no timer). The first light request to start kicks the
//! workers running tasks with the same signal; the handler arms the timer, and disarms it
//! once none is under way.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// One sleep while others wait.
pub(crate) const NAP: Duration = Duration::from_micros(100);
/// The longest a worker sleeps in one check before running one period regardless.
const LONGEST_GIVE_WAY: Duration = Duration::from_millis(20);

/// `/proc/loadavg`, opened once.
static LOADAVG: AtomicI32 = AtomicI32::new(-1);
/// CPUs of the machine (online).
static CPUS: AtomicUsize = AtomicUsize::new(1);
/// Workers running a task and not sleeping in the handler.
static RUNNING_WORKERS: AtomicUsize = AtomicUsize::new(0);
/// Light requests under way ([`crate::LightRequest`]).
static LIGHT_REQUESTS: AtomicUsize = AtomicUsize::new(0);
/// When the last light request ended (monotonic nanoseconds).
static LAST_LIGHT_END_NS: AtomicU64 = AtomicU64::new(0);
/// How long after the last light request ends the workers still give way: its client reads
/// the answer and sends the next request, on this machine's CPUs when it is a neighbour (a
/// sidecar, the bench's vegeta). Stopping at the answer, bench_waf's light p99 beside 100
/// inspected connections went from 1.1–1.3 ms to 2.4–2.7 ms.
pub(crate) const LIGHT_TRAFFIC_LINGERS: Duration = Duration::from_millis(10);
/// Most worker threads with a timer ([`Timer::for_this_thread`] refuses more).
const MOST_WORKERS: usize = 256;
/// Each worker's thread id, 0 for an empty place.
static WORKERS: [AtomicI32; MOST_WORKERS] = [const { AtomicI32::new(0) }; MOST_WORKERS];
/// One past the highest place ever taken: places are taken lowest first, so a kick looks at
/// the pool's few places, not all 256 (the loop over all was 3.6k instructions of every
/// request that began a spell of light traffic, bench/ENGINE.md).
static PLACES_TAKEN: AtomicUsize = AtomicUsize::new(0);
/// Whether each worker runs a task: a kick concerns only such a worker, and a check signal
/// sent just before its timer stopped may arrive after the task, and must then do nothing.
static WORKER_IN_TASK: [AtomicBool; MOST_WORKERS] =
    [const { AtomicBool::new(false) }; MOST_WORKERS];
/// Whether each worker's timer is firing.
static WORKER_ARMED: [AtomicBool; MOST_WORKERS] = [const { AtomicBool::new(false) }; MOST_WORKERS];
/// Whether a kick is on its way to each worker: one is enough.
static KICKED: [AtomicBool; MOST_WORKERS] = [const { AtomicBool::new(false) }; MOST_WORKERS];
/// Most threads [`watch_this_thread`] keeps (event loops: one per core is usual).
const MOST_WATCHED: usize = 64;
/// `/proc/thread-self/stat` of each watched thread, -1 for an empty place.
static WATCHED: [AtomicI32; MOST_WATCHED] = [const { AtomicI32::new(-1) }; MOST_WATCHED];
/// Whether each watched thread has work (between its wake-up and its next park): only then
/// can it wait for a CPU, so only then is its stat read.
static WORKING: [AtomicBool; MOST_WATCHED] = [const { AtomicBool::new(false) }; MOST_WATCHED];
/// The signal the timers send, once the handler is installed.
static SIGNAL: OnceLock<Result<libc::c_int, String>> = OnceLock::new();

thread_local! {
    /// Monotonic nanoseconds before which a check does nothing: after a pause the task runs
    /// one period, even if the timer's signal came again during the pause and waits.
    static RESUMED_UNTIL_NS: Cell<u64> = const { Cell::new(0) };
    static PAUSES: Cell<u64> = const { Cell::new(0) };
    static SLEPT_NS: Cell<u64> = const { Cell::new(0) };
    /// How long the task under way may sleep in all (`SLEPT_NS` counts what it has).
    static PAUSE_BUDGET_NS: Cell<u64> = const { Cell::new(u64::MAX) };
    /// This worker's timer and place, once it has them.
    static OWN_TIMER: Cell<Option<(libc::timer_t, usize)>> = const { Cell::new(None) };
}

#[cfg(test)]
pub(crate) fn watched_waits_on_cpu(cpu: usize) -> bool {
    libc::c_int::try_from(cpu).is_ok_and(watched_waits_on)
}

#[cfg(test)]
pub(crate) fn cpus() -> usize {
    CPUS.load(Ordering::Relaxed)
}

/// What the calling thread's checks paused since the last call.
pub(crate) fn take_paused() -> crate::Paused {
    crate::Paused {
        times: PAUSES.with(|c| c.replace(0)),
        slept: Duration::from_nanos(SLEPT_NS.with(|c| c.replace(0))),
    }
}

/// Counted among the running workers while alive; its checks run while a light request is
/// under way.
pub(crate) struct RunningWorker;

impl RunningWorker {
    pub(crate) fn enter(pause_budget: Duration) -> Self {
        let budget_ns = u64::try_from(pause_budget.as_nanos()).unwrap_or(u64::MAX);
        PAUSE_BUDGET_NS.with(|c| c.set(budget_ns));
        RUNNING_WORKERS.fetch_add(1, Ordering::Relaxed);
        if let Some((_, place)) = OWN_TIMER.with(Cell::get) {
            // In task before looking at the count, and the first light request counts
            // before looking at who is in a task (SeqCst both): either this worker sees
            // the request, or the request's kick reaches this worker.
            WORKER_IN_TASK[place].store(true, Ordering::SeqCst);
            if light_traffic() {
                arm(crate::CHECK_EVERY);
            }
        }
        Self
    }
}

impl Drop for RunningWorker {
    fn drop(&mut self) {
        if let Some((_, place)) = OWN_TIMER.with(Cell::get) {
            // Out of the task first: a kick arriving now must not arm the timer again.
            WORKER_IN_TASK[place].store(false, Ordering::SeqCst);
            arm(Duration::ZERO);
        }
        RUNNING_WORKERS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Sets the calling worker's timer to fire every `period` from now; zero stops it.
/// Async-signal-safe (timer_settime is).
fn arm(period: Duration) {
    let Some((timer, place)) = OWN_TIMER.with(Cell::get) else {
        return;
    };
    let every = libc::timespec {
        tv_sec: period.as_secs() as libc::time_t,
        tv_nsec: period.subsec_nanos() as libc::c_long,
    };
    let spec = libc::itimerspec {
        it_interval: every,
        it_value: every,
    };
    // SAFETY: the timer exists while OWN_TIMER names it; a failure (impossible with a valid
    // id and spec) would only leave the checks as they were.
    unsafe { libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()) };
    WORKER_ARMED[place].store(!period.is_zero(), Ordering::SeqCst);
}

/// Whether workers give way: a light request is under way or ended a moment ago.
fn light_traffic() -> bool {
    LIGHT_REQUESTS.load(Ordering::SeqCst) > 0
        || monotonic_ns()
            < LAST_LIGHT_END_NS
                .load(Ordering::SeqCst)
                .saturating_add(LIGHT_TRAFFIC_LINGERS.as_nanos() as u64)
}

/// Counts a light request; the first kicks the workers running tasks unchecked.
pub(crate) fn light_request_started() {
    if LIGHT_REQUESTS.fetch_add(1, Ordering::SeqCst) > 0 {
        return;
    }
    let Some(Ok(signal)) = SIGNAL.get() else {
        return;
    };
    for place in 0..PLACES_TAKEN.load(Ordering::SeqCst).min(MOST_WORKERS) {
        let tid = WORKERS[place].load(Ordering::SeqCst);
        if tid == 0
            || !WORKER_IN_TASK[place].load(Ordering::SeqCst)
            || WORKER_ARMED[place].load(Ordering::SeqCst)
            || KICKED[place].swap(true, Ordering::AcqRel)
        {
            continue;
        }
        // SAFETY: tgkill has no memory preconditions; a thread that left its task since
        // ignores the signal, and a failure only leaves that worker to its next task.
        unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, *signal) };
    }
}

fn installed_signal() -> Result<libc::c_int, String> {
    SIGNAL.get_or_init(install).clone()
}

fn install() -> Result<libc::c_int, String> {
    // SAFETY: a NUL-terminated path; the descriptor is kept for the process's life.
    let fd = unsafe { libc::open(c"/proc/loadavg".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(format!(
            "/proc/loadavg: {}",
            std::io::Error::last_os_error()
        ));
    }
    if runnable_threads(fd).is_none() {
        return Err("/proc/loadavg has no count of runnable threads".into());
    }
    LOADAVG.store(fd, Ordering::Relaxed);
    // SAFETY: sysconf has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    CPUS.store(
        usize::try_from(online).unwrap_or(1).max(1),
        Ordering::Relaxed,
    );
    // glibc keeps the first real-time signals for itself and SIGRTMIN() is past them;
    // nothing else in the router uses real-time signals.
    let signal = libc::SIGRTMIN() + 2;
    // SAFETY: a zeroed sigaction is valid; the handler is async-signal-safe (module doc).
    let installed = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_check as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // Restarted, so a worker's own system calls never see EINTR because of a check.
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(signal, &action, std::ptr::null_mut())
    };
    if installed != 0 {
        return Err(format!("sigaction: {}", std::io::Error::last_os_error()));
    }
    Ok(signal)
}

/// Keeps the calling thread's `/proc/thread-self/stat` open, so a worker can see it waiting
/// on its own CPU; its place, working from now on. A thread ends with its process here
/// (event loops), so the descriptor is never closed.
pub(crate) fn watch_this_thread() -> Result<usize, String> {
    // SAFETY: a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/proc/thread-self/stat".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(format!(
            "/proc/thread-self/stat: {}",
            std::io::Error::last_os_error()
        ));
    }
    for (index, place) in WATCHED.iter().enumerate() {
        if place
            .compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            WORKING[index].store(true, Ordering::Relaxed);
            return Ok(index);
        }
    }
    // SAFETY: ours, not shared.
    unsafe { libc::close(fd) };
    Err(format!("more than {MOST_WATCHED} threads watched"))
}

pub(crate) fn light_request_ended() {
    LAST_LIGHT_END_NS.store(monotonic_ns(), Ordering::SeqCst);
    LIGHT_REQUESTS.fetch_sub(1, Ordering::SeqCst);
}

/// Notes whether the watched thread in `place` has work.
pub(crate) fn set_working(place: usize, working: bool) {
    if let Some(flag) = WORKING.get(place) {
        flag.store(working, Ordering::Relaxed);
    }
}

/// Whether a watched thread is runnable on `cpu` (which the calling worker holds, so it
/// waits): the state and processor fields of its stat.
fn watched_waits_on(cpu: libc::c_int) -> bool {
    let Ok(cpu) = usize::try_from(cpu) else {
        return false;
    };
    WATCHED.iter().zip(&WORKING).any(|(place, working)| {
        let fd = place.load(Ordering::Relaxed);
        if fd < 0 || !working.load(Ordering::Relaxed) {
            return false;
        }
        let mut text = [0u8; 512];
        // SAFETY: reads at most the buffer's length into it.
        let read = unsafe { libc::pread(fd, text.as_mut_ptr().cast(), text.len(), 0) };
        let Some(text) = usize::try_from(read).ok().and_then(|n| text.get(..n)) else {
            return false;
        };
        crate::runnable_on(text) == Some(cpu)
    })
}

/// The kernel's count of runnable threads, read again from the start of `/proc/loadavg`.
fn runnable_threads(fd: libc::c_int) -> Option<usize> {
    let mut text = [0u8; 128];
    // SAFETY: reads at most the buffer's length into it.
    let read = unsafe { libc::pread(fd, text.as_mut_ptr().cast(), text.len(), 0) };
    crate::runnable_threads(text.get(..usize::try_from(read).ok()?)?)
}

extern "C" fn on_check(_signal: libc::c_int) {
    // Only a worker's own timer or a kick sends the signal: to a thread with a timer.
    let Some((_, place)) = OWN_TIMER.with(Cell::get) else {
        return;
    };
    KICKED[place].store(false, Ordering::Release);
    if !WORKER_IN_TASK[place].load(Ordering::SeqCst) {
        return;
    }
    // SAFETY: errno is this thread's; the interrupted code may be about to read it.
    let errno = unsafe { *libc::__errno_location() };
    check(place);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// The check of a worker running a task, in its signal handler.
fn check(place: usize) {
    let armed = WORKER_ARMED[place].load(Ordering::SeqCst);
    let budget_left_ns = PAUSE_BUDGET_NS
        .with(Cell::get)
        .saturating_sub(SLEPT_NS.with(Cell::get));
    // A task that has slept all its budget runs on, its checks off, until it ends.
    if !light_traffic() || budget_left_ns == 0 {
        if armed {
            arm(Duration::ZERO);
        }
        return;
    }
    if !armed {
        // Kicked by the first light request.
        arm(crate::CHECK_EVERY);
    }
    if monotonic_ns() < RESUMED_UNTIL_NS.with(Cell::get) {
        return;
    }
    let fd = LOADAVG.load(Ordering::Relaxed);
    let mut slept = Duration::ZERO;
    // Until the light traffic stops, too: what still waits then is heavy work.
    let longest = LONGEST_GIVE_WAY.min(Duration::from_nanos(budget_left_ns));
    while slept < longest && light_traffic() {
        let Some(runnable) = runnable_threads(fd) else {
            break;
        };
        let workers = RUNNING_WORKERS.load(Ordering::Relaxed);
        // The machine-wide count first: the loops' stats are read only when it finds no
        // one waiting.
        let others_wait = crate::others_wait(runnable, workers, CPUS.load(Ordering::Relaxed))
            // SAFETY: sched_getcpu has no preconditions.
            || watched_waits_on(unsafe { libc::sched_getcpu() });
        if !others_wait {
            break;
        }
        RUNNING_WORKERS.fetch_sub(1, Ordering::Relaxed);
        let nap = libc::timespec {
            tv_sec: 0,
            tv_nsec: NAP.subsec_nanos() as libc::c_long,
        };
        // SAFETY: nanosleep is async-signal-safe; an early wake-up only shortens the nap.
        unsafe { libc::nanosleep(&nap, std::ptr::null_mut()) };
        RUNNING_WORKERS.fetch_add(1, Ordering::Relaxed);
        slept += NAP;
    }
    if !slept.is_zero() {
        let period = crate::CHECK_EVERY.as_nanos() as u64;
        RESUMED_UNTIL_NS.with(|c| c.set(monotonic_ns().saturating_add(period)));
        PAUSES.with(|c| c.set(c.get() + 1));
        SLEPT_NS.with(|c| c.set(c.get() + slept.as_nanos() as u64));
    }
}

/// CLOCK_MONOTONIC in nanoseconds (clock_gettime is async-signal-safe).
fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes into `now` only.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

/// A POSIX timer that sends the check signal to the thread that made it, and the thread's
/// place among the workers a light request kicks.
pub(crate) struct Timer {
    id: libc::timer_t,
    place: usize,
}

impl Timer {
    /// At most one per thread: the handler knows a thread's timer by the thread.
    pub(crate) fn for_this_thread() -> Result<Self, String> {
        if OWN_TIMER.with(Cell::get).is_some() {
            return Err("this thread has a timer already".into());
        }
        let signal = installed_signal()?;
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let place = WORKERS
            .iter()
            .position(|place| {
                place
                    .compare_exchange(0, tid, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            })
            .ok_or_else(|| format!("more than {MOST_WORKERS} workers give way"))?;
        PLACES_TAKEN.fetch_max(place + 1, Ordering::SeqCst);
        let mut id: libc::timer_t = std::ptr::null_mut();
        // SAFETY: a zeroed sigevent is valid; the timer targets this thread, which owns it.
        let created = unsafe {
            let mut event: libc::sigevent = std::mem::zeroed();
            event.sigev_notify = libc::SIGEV_THREAD_ID;
            event.sigev_signo = signal;
            event.sigev_notify_thread_id = tid;
            libc::timer_create(libc::CLOCK_MONOTONIC, &mut event, &mut id)
        };
        if created != 0 {
            WORKERS[place].store(0, Ordering::Release);
            return Err(format!("timer_create: {}", std::io::Error::last_os_error()));
        }
        OWN_TIMER.with(|c| c.set(Some((id, place))));
        Ok(Self { id, place })
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        // Not `Send` (GiveWay): dropped by the thread that made it, whose OWN_TIMER it is.
        OWN_TIMER.with(|c| c.set(None));
        // SAFETY: deleted once, by its owner.
        unsafe { libc::timer_delete(self.id) };
        WORKER_IN_TASK[self.place].store(false, Ordering::SeqCst);
        WORKERS[self.place].store(0, Ordering::Release);
    }
}

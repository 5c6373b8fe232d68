//! The system calls: the process's signal handler, the per-thread timer and the counts the
//! handler reads. The handler only reads a descriptor opened beforehand, sleeps and touches
//! atomics and const-initialised thread-locals: async-signal-safe.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// One sleep while others wait.
const NAP: Duration = Duration::from_micros(100);
/// The longest a worker sleeps in one check before running one period regardless.
const LONGEST_GIVE_WAY: Duration = Duration::from_millis(20);

/// `/proc/loadavg`, opened once.
static LOADAVG: AtomicI32 = AtomicI32::new(-1);
/// CPUs of the machine (online).
static CPUS: AtomicUsize = AtomicUsize::new(1);
/// Workers running a task and not sleeping in the handler.
static RUNNING_WORKERS: AtomicUsize = AtomicUsize::new(0);
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
    /// Whether this thread is running a task: a check signal sent just before the timer
    /// stopped may arrive after the task, and must then do nothing.
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
    /// Monotonic nanoseconds before which a check does nothing: after a pause the task runs
    /// one period, even if the timer's signal came again during the pause and waits.
    static RESUMED_UNTIL_NS: Cell<u64> = const { Cell::new(0) };
    static PAUSES: Cell<u64> = const { Cell::new(0) };
    static SLEPT_NS: Cell<u64> = const { Cell::new(0) };
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

/// Counted among the running workers while alive.
pub(crate) struct RunningWorker;

impl RunningWorker {
    pub(crate) fn enter() -> Self {
        RUNNING_WORKERS.fetch_add(1, Ordering::Relaxed);
        IN_TASK.with(|c| c.set(true));
        Self
    }
}

impl Drop for RunningWorker {
    fn drop(&mut self) {
        IN_TASK.with(|c| c.set(false));
        RUNNING_WORKERS.fetch_sub(1, Ordering::Relaxed);
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
    if !IN_TASK.with(Cell::get) || monotonic_ns() < RESUMED_UNTIL_NS.with(Cell::get) {
        return;
    }
    // SAFETY: errno is this thread's; the interrupted code may be about to read it.
    let errno = unsafe { *libc::__errno_location() };
    let fd = LOADAVG.load(Ordering::Relaxed);
    let mut slept = Duration::ZERO;
    while slept < LONGEST_GIVE_WAY {
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
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
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

/// A POSIX timer that sends the check signal to the thread that made it.
pub(crate) struct Timer {
    id: libc::timer_t,
}

impl Timer {
    pub(crate) fn for_this_thread() -> Result<Self, String> {
        let signal = installed_signal()?;
        let mut id: libc::timer_t = std::ptr::null_mut();
        // SAFETY: a zeroed sigevent is valid; the timer targets this thread, which owns it.
        let created = unsafe {
            let mut event: libc::sigevent = std::mem::zeroed();
            event.sigev_notify = libc::SIGEV_THREAD_ID;
            event.sigev_signo = signal;
            event.sigev_notify_thread_id = libc::gettid();
            libc::timer_create(libc::CLOCK_MONOTONIC, &mut event, &mut id)
        };
        if created != 0 {
            return Err(format!("timer_create: {}", std::io::Error::last_os_error()));
        }
        Ok(Self { id })
    }

    /// Fires every `period` from now; zero stops it.
    pub(crate) fn every(&self, period: Duration) {
        let every = libc::timespec {
            tv_sec: period.as_secs() as libc::time_t,
            tv_nsec: period.subsec_nanos() as libc::c_long,
        };
        let spec = libc::itimerspec {
            it_interval: every,
            it_value: every,
        };
        // SAFETY: the timer exists until drop; a failure (impossible with a valid id and
        // spec) would only leave the checks as they were.
        unsafe { libc::timer_settime(self.id, 0, &spec, std::ptr::null_mut()) };
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        // SAFETY: deleted once, by its owner.
        unsafe { libc::timer_delete(self.id) };
    }
}

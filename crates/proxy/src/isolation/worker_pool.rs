//! A fixed set of threads for CPU-bound work (WAF inspection), so the event loops never run
//! it and never block waiting for it: a WAF or an image resize on the event loop makes every
//! other request on that loop wait.
//!
//! The queue is bounded: a task that finds it full is refused at once. So is a task that
//! would miss its deadline: the pool keeps each stage's recent run times and the work queued
//! ahead, and a task whose expected end is past its deadline is refused before it is queued
//! (the caller answers 503 with Retry-After in microseconds, rather than after the deadline).
//! The work ahead is counted in wall time, pauses included: a worker that gives way to
//! other threads takes longer than its CPU time, and a queue estimated in CPU time admitted
//! tasks that then ran out of time (bench_images' refusal probe beside 400 connections).
//! Wall time grows when the loops are busy, and refusals keep loops busy; that loop is
//! broken elsewhere — a refused HTTP/1 connection waits out (a random half to all of) its
//! Retry-After before its next request is read (`crate::pipeline`), a wait taken off that
//! request's deadline — and a free worker is judged by CPU time alone.
//! Every task carries a deadline: a task still queued at its deadline is dropped unrun, and
//! the waiting request stops waiting at the deadline whatever the task is doing. The queue
//! is judged again each time a worker takes a task: runs that gave way take longer than the
//! estimate that admitted what waits behind them, and a queued task whose deadline the work
//! now ahead of it would pass is shed, unrun, and its request refused at once — a 503 with
//! `Retry-After` seconds before the deadline, and a worker's time spent on a task that can
//! still make it. What a refusal or a missed deadline means is the calling stage's decision.
//!
//! Workers are scheduled `SCHED_IDLE` by default and give way (crates/give-way): while light
//! requests are under way they run only on CPU no other thread wants, so a saturated pool
//! cannot delay a light request (seed 001); with none, nothing waits but heavy work, and
//! they run as `SCHED_IDLE` lets them. A running task gives way only while its deadline
//! leaves room: once twice its stage's CPU time is all that is left, it runs to its end.
//! `SCHED_IDLE` alone lets a worker run on to the next tick while a preempted loop waits;
//! nice 10 (the setting before it, still `--pool-sched nice` for hosts that other processes
//! keep busy) gives the workers a share and lets a waking worker preempt a loop. The
//! benchmarks compare them, and pinning, outside the settings (`SWITCHYARD_BENCH_POOL`:
//! bench/bench_waf.py, bench/bench_images.py).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use switchyard_give_way::GiveWay;
use thread_priority::{
    set_current_thread_priority, set_thread_priority_and_policy, thread_native_id,
    NormalThreadSchedulePolicy, ThreadPriority, ThreadPriorityValue, ThreadSchedulePolicy,
};
use tokio::sync::oneshot;

use crate::metrics;

/// Niceness of `nice` and `pinned` workers (on the `thread-priority` crate's 0–99 scale, 22
/// is nice 10).
const WORKER_PRIORITY: u8 = 22;
/// Weight of the newest run in a stage's running averages of run times: about the last 20
/// runs count, so one task that paused long does not swing the admission of the next ones.
const RUN_TIME_SMOOTHING: f64 = 0.05;
/// Share of the time left before its deadline that a task's expected end may use. The
/// estimate is an average, and beside light traffic a run's wall time swings with the CPU the
/// loops leave the workers (crates/give-way): with 85%, 400 connections of 50 KB inspected
/// POSTs beside 500 light req/s had 177–217 admitted tasks miss their 5 s deadline in 12 s;
/// with half, 35–77, and no fewer inspected (26–29 a second against 19–25: the queue stays
/// full, only shorter).
const DEADLINE_HEADROOM: f64 = 0.5;

/// CPU time a running task keeps in hand before its deadline, in multiples of its stage's
/// average: its pauses for light traffic stop once only that much time is left, and it runs
/// to its end. An admitted task that gave way past its deadline was answered 503 at the
/// deadline after its work was done: the "never a timeout" of issue 22 broken by the pool's
/// own courtesy (0–3 a row in bench_waf beside the light route).
const CPU_KEPT_BEFORE_DEADLINE: f64 = 2.0;

/// How worker threads share the CPU with the event loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolScheduling {
    /// `SCHED_IDLE`, and while light requests are under way a worker running a task pauses
    /// while other threads wait for a CPU (no privilege needed).
    Idle,
    /// `SCHED_IDLE` alone.
    IdleKernel,
    /// nice 10.
    Nice,
    /// nice 10, all workers on the last core.
    Pinned,
}

/// Why a task produced no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PoolRefusal {
    /// The queue was full: the task was never queued.
    Full,
    /// The work queued ahead would make it miss its deadline: never queued.
    WouldMissDeadline,
    /// Queued, then dropped unrun before its deadline: the work that came to be ahead of it
    /// would have ended past it.
    Shed,
    /// The deadline passed, queued or running.
    TimedOut,
}

struct Task {
    stage: &'static str,
    queued_at: Instant,
    deadline: Instant,
    /// Its expected wall time, counted in [`Queue::backlog_ns`] until it ends.
    estimate_ns: u64,
    /// Does the work, or sheds it; what it returns hands the result (or the refusal) to the
    /// waiting request, called once the pool has counted the task out, so that the caller's
    /// next task finds it so.
    run: Box<dyn FnOnce(Order) -> Delivery + Send>,
}

/// What a worker does with a task it took from the queue.
enum Order {
    Run,
    Shed,
}

/// Hands a task's result over.
type Delivery = Box<dyn FnOnce() + Send>;

struct Queue {
    tasks: Mutex<VecDeque<Task>>,
    ready: Condvar,
    capacity: usize,
    threads: usize,
    /// Tasks queued or running.
    in_pool: AtomicUsize,
    /// Expected wall time of every task queued or running.
    backlog_ns: AtomicU64,
    /// Each stage's running averages of run time.
    run_times: Mutex<HashMap<&'static str, RunTimes>>,
}

/// A stage's recent runs: what a task costs (CPU time) and how long it holds a worker
/// (wall time, which adds the pauses for other threads).
#[derive(Debug, Clone, Copy, Default)]
struct RunTimes {
    cpu_ns: f64,
    wall_ns: f64,
}

impl Queue {
    fn run_times(&self, stage: &'static str) -> RunTimes {
        self.run_times
            .lock()
            .get(stage)
            .copied()
            .unwrap_or_default()
    }

    fn record_run(&self, stage: &'static str, cpu: Duration, wall: Duration) {
        let (cpu, wall) = (cpu.as_nanos() as f64, wall.as_nanos() as f64);
        let mut run_times = self.run_times.lock();
        let average = run_times.entry(stage).or_insert(RunTimes {
            cpu_ns: cpu,
            wall_ns: wall,
        });
        average.cpu_ns += RUN_TIME_SMOOTHING * (cpu - average.cpu_ns);
        average.wall_ns += RUN_TIME_SMOOTHING * (wall - average.wall_ns);
    }

    /// Whether a task of `stage`, after `ahead` more of its kind that wait outside the pool,
    /// is expected to end too late for `deadline`. While a worker is free the task is judged
    /// by its CPU time alone: after a spell of slow runs (a host busy with other work) the
    /// pool must still admit a task now and then to learn that it is fast again, or the
    /// inflated wall-time average would refuse everything for good.
    fn would_miss(&self, times: RunTimes, ahead: usize, deadline: Instant) -> bool {
        let threads = self.threads.max(1);
        let in_pool = self.in_pool.load(Ordering::Relaxed);
        if times.cpu_ns <= 0.0 {
            // Never timed: nothing to judge a wait by, so only a free worker takes one (its
            // first runs teach the pool). Queueing every task of an untimed stage let a
            // freshly started router's first burst in whole (400 wrk connections of 50 KB
            // inspected POSTs, about 50 a second run) and 130–165 of them then waited out
            // their 5 s deadline; none since.
            return in_pool.saturating_add(ahead) >= threads;
        }
        let expected_ns = if in_pool.saturating_add(ahead) < threads {
            times.cpu_ns
        } else {
            let queued =
                self.backlog_ns.load(Ordering::Relaxed) as f64 + times.wall_ns * ahead as f64;
            queued / threads as f64 + times.wall_ns
        };
        let left = deadline.saturating_duration_since(Instant::now());
        expected_ns > left.as_nanos() as f64 * DEADLINE_HEADROOM
    }

    /// Takes the queued tasks whose deadline can no longer be met out of `tasks`, in order,
    /// as a worker becomes free at `now`: the first would start at once and is judged by its
    /// CPU time (as a free worker judges a new task, so that a spell of slow runs cannot shed
    /// everything and leave the pool nothing to learn from), each later one after the
    /// expected wall time of the tasks kept ahead of it, shared among the workers. The work
    /// already running is left out, so the judgement leans towards keeping a task. Tasks
    /// whose deadline has passed are dropped without a word: their requests stopped waiting.
    fn shed_unreachable(&self, tasks: &mut VecDeque<Task>, now: Instant) -> Vec<Task> {
        let mut shed = Vec::new();
        if tasks.is_empty() {
            return shed;
        }
        // Lock order: `tasks`, then `run_times`; `run_times` is never held while `tasks`
        // is taken.
        let run_times = self.run_times.lock();
        let threads = self.threads.max(1) as f64;
        let mut ahead_ns = 0.0;
        let mut next = 0;
        // Queued tasks are mostly of one stage: one look-up per run of them, as the lock
        // is held while the queue (up to its capacity) is walked.
        let mut last_stage: Option<(&'static str, RunTimes)> = None;
        while let Some(task) = tasks.get(next) {
            let times = match last_stage {
                Some((stage, times)) if stage == task.stage => times,
                _ => {
                    let times = run_times.get(task.stage).copied().unwrap_or_default();
                    last_stage = Some((task.stage, times));
                    times
                }
            };
            let run_ns = if next == 0 {
                times.cpu_ns
            } else {
                times.wall_ns
            };
            let left_ns = task.deadline.saturating_duration_since(now).as_nanos() as f64;
            if task.deadline > now && ahead_ns / threads + run_ns <= left_ns {
                ahead_ns += times.wall_ns;
                next += 1;
                continue;
            }
            let Some(task) = tasks.remove(next) else {
                break;
            };
            if task.deadline > now {
                shed.push(task);
            } else {
                self.leave(task.estimate_ns);
            }
        }
        shed
    }

    /// A task ran or was dropped: it no longer holds a place or counts in the backlog.
    fn leave(&self, estimate_ns: u64) {
        self.backlog_ns.fetch_sub(estimate_ns, Ordering::Relaxed);
        self.in_pool.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The pool; cheap to share behind an `Arc`. Its threads live as long as the process.
pub struct WorkerPool {
    /// `None`: no threads, tasks run on the caller's event loop (the pool's absence, for
    /// benchmarks).
    queue: Option<Arc<Queue>>,
    threads: usize,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("threads", &self.threads)
            .field("capacity", &self.queue.as_ref().map(|q| q.capacity))
            .finish()
    }
}

impl WorkerPool {
    /// Starts `threads` workers sharing a queue of at most `capacity` tasks.
    pub fn new(
        threads: usize,
        capacity: usize,
        scheduling: PoolScheduling,
    ) -> std::io::Result<Self> {
        metrics::register_all();
        let threads = threads.max(1);
        let queue = Arc::new(Queue {
            tasks: Mutex::new(VecDeque::with_capacity(capacity)),
            ready: Condvar::new(),
            capacity: capacity.max(1),
            threads,
            in_pool: AtomicUsize::new(0),
            backlog_ns: AtomicU64::new(0),
            run_times: Mutex::new(HashMap::new()),
        });
        for n in 0..threads {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("switchyard-worker-{n}"))
                .spawn(move || {
                    schedule_this_worker(scheduling);
                    let give_way = (scheduling == PoolScheduling::Idle)
                        .then(|| {
                            GiveWay::for_this_thread()
                                .inspect_err(|e| {
                                    log::warn!(
                                        "pool worker cannot give way to threads waiting for \
                                         a CPU ({e}): SCHED_IDLE alone"
                                    )
                                })
                                .ok()
                        })
                        .flatten();
                    work(&queue, give_way.as_ref())
                })?;
        }
        metrics::POOL_THREADS.set(threads as i64);
        Ok(Self {
            queue: Some(queue),
            threads,
        })
    }

    /// A pool that starts no thread: every task runs at once on the event loop that asks,
    /// blocking it, as a router without a pool would. It exists so that benchmarks can show
    /// what the pool saves; `threads` only sizes admission (the
    /// images stage's places), like a real pool of that size.
    pub fn inline(threads: usize) -> Self {
        metrics::register_all();
        log::warn!(
            "CPU-heavy stages run inline on the event loops (SWITCHYARD_BENCH_POOL=inline): for \
             benchmarks only, light requests wait behind every inspection and resize"
        );
        Self {
            queue: None,
            threads: threads.max(1),
        }
    }

    /// How many worker threads run tasks.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Whether tasks wait for a worker (more queued or running than there are threads).
    pub(crate) fn has_backlog(&self) -> bool {
        self.queue
            .as_ref()
            .is_some_and(|queue| queue.in_pool.load(Ordering::Relaxed) > queue.threads)
    }

    /// Whether `ahead` more tasks of `stage` before this one (waiting outside the pool, as
    /// the images stage's requests wait for a place) would make it end past `deadline`.
    pub(crate) fn would_miss(&self, stage: &'static str, ahead: usize, deadline: Instant) -> bool {
        self.queue
            .as_ref()
            .is_some_and(|queue| queue.would_miss(queue.run_times(stage), ahead, deadline))
    }

    /// Whether a task of `stage` asked now would be refused (queue full, or expected to end
    /// past `deadline`), counted as refused; for a stage that has work to do before its task
    /// (the images stage fetches the original), so that an overloaded pool does not have the
    /// event loops fetch originals only to refuse them.
    pub(crate) fn refuses_now(
        &self,
        stage: &'static str,
        deadline: Instant,
    ) -> Option<PoolRefusal> {
        let queue = self.queue.as_ref()?;
        let refusal = if queue.tasks.lock().len() >= queue.capacity {
            PoolRefusal::Full
        } else if queue.would_miss(queue.run_times(stage), 0, deadline) {
            PoolRefusal::WouldMissDeadline
        } else {
            return None;
        };
        Some(counted(stage, refusal))
    }

    /// Runs `job` on a worker and waits (without blocking the event loop) for its result,
    /// until `deadline` at the latest.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        stage: &'static str,
        deadline: Instant,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, PoolRefusal> {
        let Some(queue) = self.queue.as_ref() else {
            return run_inline(stage, deadline, job);
        };
        let times = queue.run_times(stage);
        if queue.would_miss(times, 0, deadline) {
            return Err(counted(stage, PoolRefusal::WouldMissDeadline));
        }
        let (done, result) = oneshot::channel();
        // The job's CPU, on the worker's thread, goes to the app the request is charged to.
        let app = crate::traffic::cost::current_app();
        let task = Task {
            stage,
            queued_at: Instant::now(),
            deadline,
            estimate_ns: times.wall_ns as u64,
            run: Box::new(move |order| match order {
                Order::Run => {
                    let value = crate::traffic::cost::charged_job(app.as_ref(), job);
                    Box::new(move || {
                        let _ = done.send(Ok(value));
                    })
                }
                Order::Shed => Box::new(move || {
                    let _ = done.send(Err(PoolRefusal::Shed));
                }),
            }),
        };
        {
            let mut tasks = queue.tasks.lock();
            if tasks.len() >= queue.capacity {
                drop(tasks);
                return Err(counted(stage, PoolRefusal::Full));
            }
            queue.in_pool.fetch_add(1, Ordering::Relaxed);
            queue
                .backlog_ns
                .fetch_add(task.estimate_ns, Ordering::Relaxed);
            tasks.push_back(task);
            metrics::POOL_QUEUE_DEPTH.set(tasks.len() as i64);
        }
        queue.ready.notify_one();
        match tokio::time::timeout_at(deadline.into(), result).await {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(refusal))) => {
                metrics::POOL_SHED.with_label_values(&[stage]).inc();
                Err(refusal)
            }
            // Dropped unrun by a worker because its deadline had passed, or cut short here.
            Ok(Err(_)) | Err(_) => {
                metrics::POOL_TIMEOUTS.with_label_values(&[stage]).inc();
                Err(PoolRefusal::TimedOut)
            }
        }
    }
}

/// `refusal`, counted in `switchyard_pool_rejected_total` under its reason.
fn counted(stage: &'static str, refusal: PoolRefusal) -> PoolRefusal {
    let reason = match refusal {
        PoolRefusal::Full => "queue_full",
        PoolRefusal::WouldMissDeadline => "would_miss_deadline",
        // Not refusals before queueing: counted in switchyard_pool_shed_total and
        // switchyard_pool_timeouts_total.
        PoolRefusal::Shed | PoolRefusal::TimedOut => return refusal,
    };
    metrics::POOL_REJECTED
        .with_label_values(&[stage, reason])
        .inc();
    refusal
}

/// What a router without a pool does: the job runs here, on the event loop, and a result
/// that comes after the deadline is a timeout like the pool's.
fn run_inline<T>(
    stage: &'static str,
    deadline: Instant,
    job: impl FnOnce() -> T,
) -> Result<T, PoolRefusal> {
    let started = Instant::now();
    metrics::POOL_WAIT.with_label_values(&[stage]).observe(0.0);
    let value = job();
    metrics::POOL_RUN
        .with_label_values(&[stage])
        .observe(started.elapsed().as_secs_f64());
    if Instant::now() > deadline {
        metrics::POOL_TIMEOUTS.with_label_values(&[stage]).inc();
        return Err(PoolRefusal::TimedOut);
    }
    Ok(value)
}

/// Applies `scheduling` to the calling worker thread; a failure is logged, the worker runs
/// at normal priority.
fn schedule_this_worker(scheduling: PoolScheduling) {
    let niced = || {
        ThreadPriorityValue::try_from(WORKER_PRIORITY)
            .map_err(|e| e.to_string())
            .and_then(|value| {
                set_current_thread_priority(ThreadPriority::Crossplatform(value))
                    .map_err(|e| format!("{e:?}"))
            })
    };
    let outcome = match scheduling {
        PoolScheduling::Idle | PoolScheduling::IdleKernel => set_thread_priority_and_policy(
            thread_native_id(),
            // SCHED_IDLE has one priority, 0: the crate's `Min` for it.
            ThreadPriority::Min,
            ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle),
        )
        .map_err(|e| format!("SCHED_IDLE: {e:?}")),
        PoolScheduling::Nice => niced(),
        PoolScheduling::Pinned => niced().and_then(|()| pin_to_last_core()),
    };
    if let Err(e) = outcome {
        log::warn!("worker thread keeps the normal priority: {e}");
    }
}

fn pin_to_last_core() -> Result<(), String> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut set = nix::sched::CpuSet::new();
    set.set(cores - 1).map_err(|e| e.to_string())?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .map_err(|e| format!("pinning: {e}"))
}

/// CPU time the calling thread has used.
fn thread_cpu_time() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(Duration::ZERO, Duration::from)
}

/// How long a task starting at `started` may pause for light traffic: the time left before
/// its deadline, less [`CPU_KEPT_BEFORE_DEADLINE`] times what its stage's tasks cost.
fn pause_budget(deadline: Instant, started: Instant, times: RunTimes) -> Duration {
    let kept = Duration::from_nanos((times.cpu_ns * CPU_KEPT_BEFORE_DEADLINE) as u64);
    deadline
        .saturating_duration_since(started)
        .saturating_sub(kept)
}

fn work(queue: &Queue, give_way: Option<&GiveWay>) {
    loop {
        let (task, shed) = {
            let mut tasks = queue.tasks.lock();
            loop {
                let shed = queue.shed_unreachable(&mut tasks, Instant::now());
                let task = tasks.pop_front();
                if task.is_some() || !shed.is_empty() {
                    metrics::POOL_QUEUE_DEPTH.set(tasks.len() as i64);
                    break (task, shed);
                }
                queue.ready.wait(&mut tasks);
            }
        };
        for task in shed {
            queue.leave(task.estimate_ns);
            (task.run)(Order::Shed)();
        }
        let Some(task) = task else {
            continue;
        };
        let started = Instant::now();
        metrics::POOL_WAIT
            .with_label_values(&[task.stage])
            .observe(started.duration_since(task.queued_at).as_secs_f64());
        let cpu_before = thread_cpu_time();
        let run = || (task.run)(Order::Run);
        let deliver = match give_way {
            Some(give_way) => {
                let budget = pause_budget(task.deadline, started, queue.run_times(task.stage));
                let (deliver, paused) = give_way.run_pausing_at_most(budget, run);
                if paused.times > 0 {
                    metrics::POOL_GAVE_WAY.inc_by(paused.times);
                    metrics::POOL_GAVE_WAY_SECONDS.inc_by(paused.slept.as_secs_f64());
                }
                deliver
            }
            None => run(),
        };
        let took = started.elapsed();
        queue.record_run(
            task.stage,
            thread_cpu_time().saturating_sub(cpu_before),
            took,
        );
        queue.leave(task.estimate_ns);
        metrics::POOL_RUN
            .with_label_values(&[task.stage])
            .observe(took.as_secs_f64());
        deliver();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Field 19 of `/proc/thread-self/stat`: this thread's nice value.
    fn own_niceness() -> Option<i32> {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
        let after_name = &stat[stat.rfind(')')? + 1..];
        after_name.split_whitespace().nth(16)?.parse().ok()
    }

    /// Work that uses the CPU for `ms` (the pool times tasks by CPU, not by the clock).
    fn busy(ms: u64) {
        let end = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < end {
            std::hint::spin_loop();
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
    }

    /// A task of `stage` busy for `ms`, once a worker has started it.
    async fn running_on_a_worker(
        pool: &Arc<WorkerPool>,
        stage: &'static str,
        ms: u64,
    ) -> tokio::task::JoinHandle<Result<(), PoolRefusal>> {
        let (started, running) = std::sync::mpsc::channel();
        let pool = pool.clone();
        let task = tokio::spawn(async move {
            let job = move || {
                let _ = started.send(());
                busy(ms)
            };
            pool.run(stage, Instant::now() + Duration::from_secs(5), job)
                .await
        });
        while running.try_recv().is_err() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        task
    }

    #[test]
    fn results_come_back_and_overflow_and_deadlines_are_refusals() {
        let pool = Arc::new(WorkerPool::new(1, 2, PoolScheduling::Nice).expect("pool"));
        runtime().block_on(async {
            let soon = || Instant::now() + Duration::from_secs(5);
            assert_eq!(pool.run("test", soon(), || 6 * 7).await, Ok(42));
            let nice = pool.run("test", soon(), own_niceness).await;
            assert_eq!(nice, Ok(Some(10)), "workers yield to the event loops");

            // One worker busy, two queued: the fourth is refused at once.
            let block = || busy(300);
            let first = running_on_a_worker(&pool, "test", 300).await;
            let mut busy: Vec<_> = (0..2)
                .map(|_| {
                    let pool = pool.clone();
                    tokio::spawn(async move { pool.run("test", soon(), block).await })
                })
                .collect();
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(
                pool.run("test", soon(), || ()).await,
                Err(PoolRefusal::Full)
            );
            busy.push(first);
            for task in busy {
                assert_eq!(task.await.expect("joined"), Ok(()));
            }

            // A deadline shorter than the work of a stage the pool has not timed yet: the
            // caller stops waiting at the deadline.
            let started = Instant::now();
            let late = pool
                .run("untimed", Instant::now() + Duration::from_millis(50), block)
                .await;
            assert_eq!(late, Err(PoolRefusal::TimedOut));
            assert!(started.elapsed() < Duration::from_millis(250));
            // Once it knows the stage takes 300 ms, the same deadline is refused at once.
            let started = Instant::now();
            let refused = pool
                .run("test", Instant::now() + Duration::from_millis(50), block)
                .await;
            assert_eq!(refused, Err(PoolRefusal::WouldMissDeadline));
            assert!(started.elapsed() < Duration::from_millis(5));
        });
    }

    #[test]
    fn a_stage_never_timed_is_taken_only_by_a_free_worker() {
        let pool = Arc::new(WorkerPool::new(1, 64, PoolScheduling::Nice).expect("pool"));
        runtime().block_on(async {
            let soon = || Instant::now() + Duration::from_secs(5);
            let holding = running_on_a_worker(&pool, "held", 200).await;
            // Its wait cannot be judged, and a burst of them would all be let in.
            let asked = Instant::now();
            let refused = pool.run("cold", soon(), || ()).await;
            assert_eq!(refused, Err(PoolRefusal::WouldMissDeadline));
            assert!(asked.elapsed() < Duration::from_millis(5));
            assert_eq!(holding.await.expect("joined"), Ok(()));
            assert_eq!(pool.run("cold", soon(), || 7).await, Ok(7));
        });
    }

    /// Field 41 of `/proc/thread-self/stat`: this thread's scheduling policy (5: SCHED_IDLE).
    fn own_policy() -> Option<u32> {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
        let after_name = &stat[stat.rfind(')')? + 1..];
        after_name.split_whitespace().nth(38)?.parse().ok()
    }

    type Queued = Vec<tokio::task::JoinHandle<Result<(), PoolRefusal>>>;

    /// Teaches a one-thread pool how long `job` holds its worker (three runs), queues five
    /// more (about five runs of work ahead), and checks that a sixth allowed about two and
    /// a half runs is refused before it is queued, in far less than its deadline.
    async fn five_queued_refuse_a_sixth_at_once(
        pool: &Arc<WorkerPool>,
        stage: &'static str,
        job: fn(),
    ) -> Queued {
        let soon = || Instant::now() + Duration::from_secs(5);
        for _ in 0..3 {
            assert_eq!(pool.run(stage, soon(), job).await, Ok(()));
        }
        let queued = (0..5)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move { pool.run(stage, soon(), job).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let asked = Instant::now();
        let refused = pool
            .run(stage, Instant::now() + Duration::from_millis(100), job)
            .await;
        assert_eq!(refused, Err(PoolRefusal::WouldMissDeadline));
        assert!(asked.elapsed() < Duration::from_millis(5));
        queued
    }

    /// Waits for every queued task to be served (the pool counts a task out before its
    /// result is handed over).
    async fn all_served(queued: Queued) {
        for task in queued {
            assert_eq!(task.await.expect("joined"), Ok(()));
        }
    }

    #[test]
    fn idle_workers_are_sched_idle_and_work_that_would_miss_its_deadline_is_refused_at_once() {
        let pool = Arc::new(WorkerPool::new(1, 64, PoolScheduling::Idle).expect("pool"));
        runtime().block_on(async {
            let soon = || Instant::now() + Duration::from_secs(5);
            assert_eq!(pool.run("test", soon(), own_policy).await, Ok(Some(5)));
            // A task of this stage takes 40 ms of CPU.
            let slow = || busy(40);
            let queued = five_queued_refuse_a_sixth_at_once(&pool, "slow", slow).await;
            assert!(pool.would_miss("slow", 1, Instant::now() + Duration::from_millis(100)));
            assert!(!pool.would_miss("slow", 1, Instant::now() + Duration::from_secs(5)));
            all_served(queued).await;
            // The backlog drained, the same deadline is met again.
            let met = pool
                .run("slow", Instant::now() + Duration::from_millis(100), slow)
                .await;
            assert_eq!(met, Ok(()));
        });
    }

    #[test]
    fn the_wait_ahead_counts_the_time_tasks_hold_a_worker_not_only_their_cpu_time() {
        let pool = Arc::new(WorkerPool::new(1, 64, PoolScheduling::Nice).expect("pool"));
        runtime().block_on(async {
            // Holds the worker 40 ms on almost no CPU, as a task paused for the event
            // loops does: about 200 ms of wall time ahead, refused at once though its CPU
            // time is microseconds.
            let paused = || std::thread::sleep(Duration::from_millis(40));
            let queued = five_queued_refuse_a_sixth_at_once(&pool, "paused", paused).await;
            all_served(queued).await;
            // A free worker takes a task whose CPU time fits, even if the stage's recent
            // runs held workers longer than its deadline allows: that is how the pool
            // learns that runs are fast again.
            let fast_again = pool
                .run("paused", Instant::now() + Duration::from_millis(30), || ())
                .await;
            assert_eq!(fast_again, Ok(()));
        });
    }

    #[test]
    fn a_queued_task_whose_deadline_the_work_ahead_came_to_pass_is_shed_before_it() {
        let pool = Arc::new(WorkerPool::new(1, 64, PoolScheduling::Nice).expect("pool"));
        runtime().block_on(async {
            let soon = || Instant::now() + Duration::from_secs(5);
            let short = || busy(20);
            for _ in 0..3 {
                assert_eq!(pool.run("test", soon(), short).await, Ok(()));
            }
            // One run holds the worker 400 ms where 20 were expected (a worker that gave
            // way for long), with four runs queued behind it.
            let holding = running_on_a_worker(&pool, "test", 400).await;
            let ahead: Queued = (0..4)
                .map(|_| {
                    let pool = pool.clone();
                    tokio::spawn(async move { pool.run("test", soon(), short).await })
                })
                .collect();
            tokio::time::sleep(Duration::from_millis(5)).await;
            // Admitted: about 120 ms expected ahead of 450. When the long run ends, the
            // four ahead leave it some 60 ms for 100 ms of work: shed, not run late.
            let deadline = Instant::now() + Duration::from_millis(450);
            let shed = pool.run("test", deadline, short).await;
            assert_eq!(shed, Err(PoolRefusal::Shed));
            assert!(Instant::now() < deadline, "refused before its deadline");
            assert_eq!(holding.await.expect("joined"), Ok(()));
            all_served(ahead).await;
        });
    }

    #[test]
    fn the_task_a_free_worker_takes_next_is_judged_by_its_cpu_time_not_shed() {
        let pool = Arc::new(WorkerPool::new(1, 64, PoolScheduling::Nice).expect("pool"));
        runtime().block_on(async {
            let soon = || Instant::now() + Duration::from_secs(5);
            // Runs of this stage held the worker 50 ms on almost no CPU.
            let paused = || std::thread::sleep(Duration::from_millis(50));
            for _ in 0..3 {
                assert_eq!(pool.run("paused", soon(), paused).await, Ok(()));
            }
            let holding = running_on_a_worker(&pool, "other", 370).await;
            // Queued with 400 ms to go; taken with about 30 left, less than the stage's
            // recent runs held a worker but far more than its CPU time: it runs, and that
            // is how the pool learns that runs are fast again.
            let taken_late = pool
                .run("paused", Instant::now() + Duration::from_millis(400), || ())
                .await;
            assert_eq!(taken_late, Ok(()));
            assert_eq!(holding.await.expect("joined"), Ok(()));
        });
    }

    #[test]
    fn a_task_may_pause_until_only_twice_its_cpu_time_is_left() {
        let started = Instant::now();
        let times = RunTimes {
            cpu_ns: 30e6,
            wall_ns: 500e6,
        };
        let budget =
            |left_ms| pause_budget(started + Duration::from_millis(left_ms), started, times);
        assert_eq!(budget(100), Duration::from_millis(40));
        assert_eq!(budget(60), Duration::ZERO);
        assert_eq!(budget(10), Duration::ZERO);
        // Never timed: nothing to keep in hand.
        let untimed = pause_budget(
            started + Duration::from_millis(100),
            started,
            RunTimes::default(),
        );
        assert_eq!(untimed, Duration::from_millis(100));
    }

    #[test]
    fn an_inline_pool_runs_on_the_calling_thread_and_still_reports_late_results() {
        let pool = WorkerPool::inline(2);
        runtime().block_on(async {
            let caller = std::thread::current().id();
            let soon = Instant::now() + Duration::from_secs(5);
            let ran_on = pool.run("test", soon, || std::thread::current().id()).await;
            assert_eq!(ran_on, Ok(caller));

            let deadline = Instant::now() + Duration::from_millis(20);
            let slow = || std::thread::sleep(Duration::from_millis(60));
            assert_eq!(
                pool.run("test", deadline, slow).await,
                Err(PoolRefusal::TimedOut)
            );
        });
    }
}

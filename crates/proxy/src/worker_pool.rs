//! A fixed set of threads for CPU-bound work (WAF inspection), so the event loops never run
//! it and never block waiting for it: a WAF or an image resize on the event loop makes every
//! other request on that loop wait.
//!
//! The queue is bounded: a task that finds it full is refused at once. So is a task that
//! would miss its deadline: the pool keeps each stage's recent run time and the work queued
//! ahead, and a task whose expected end is past its deadline is refused before it is queued
//! (the caller answers 503 with Retry-After in microseconds, rather than after the deadline).
//! Every task carries a deadline: a task still queued at its deadline is dropped unrun, and
//! the waiting request stops waiting at the deadline whatever the task is doing. What a
//! refusal or a missed deadline means is the calling stage's decision.
//!
//! Workers are scheduled `SCHED_IDLE` by default and give way (crates/give-way): they run
//! only on CPU no other thread wants, so a saturated pool cannot delay a light request
//! (seed 001). `SCHED_IDLE` alone (`--pool-sched idle-kernel`) lets a worker run on to the next tick
//! while a preempted loop waits; nice 10 (the setting before it) still gives the workers a
//! share and lets a waking worker preempt a loop; `--pool-sched idle-kernel|nice|pinned`
//! keep them and pinning for comparison (bench/bench_waf.py, bench/bench_images.py).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
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
/// Weight of the newest run in a stage's running average of CPU times.
const RUN_TIME_SMOOTHING: f64 = 0.2;

/// How worker threads share the CPU with the event loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolScheduling {
    /// `SCHED_IDLE`, and a worker running a task pauses while other threads wait for a CPU
    /// (no privilege needed).
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
    /// The deadline passed, queued or running.
    TimedOut,
}

struct Task {
    stage: &'static str,
    queued_at: Instant,
    deadline: Instant,
    /// Its expected run time, counted in [`Queue::backlog_ns`] until it ends.
    estimate_ns: u64,
    run: Box<dyn FnOnce() + Send>,
}

struct Queue {
    tasks: Mutex<VecDeque<Task>>,
    ready: Condvar,
    capacity: usize,
    threads: usize,
    /// Expected run time of every task queued or running.
    backlog_ns: AtomicU64,
    /// Each stage's running average run time.
    run_times: Mutex<HashMap<&'static str, f64>>,
}

impl Queue {
    fn estimate_ns(&self, stage: &'static str) -> u64 {
        self.run_times.lock().get(stage).copied().unwrap_or(0.0) as u64
    }

    fn record_run(&self, stage: &'static str, took: Duration) {
        let took = took.as_nanos() as f64;
        let mut run_times = self.run_times.lock();
        let average = run_times.entry(stage).or_insert(took);
        *average += RUN_TIME_SMOOTHING * (took - *average);
    }

    /// When a task of `estimate_ns` queued now is expected to end: the backlog spread over
    /// the threads, then its own run.
    fn expected_end(&self, estimate_ns: u64) -> Instant {
        let backlog = self.backlog_ns.load(Ordering::Relaxed) / self.threads.max(1) as u64;
        Instant::now() + Duration::from_nanos(backlog.saturating_add(estimate_ns))
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
            "CPU-heavy stages run inline on the event loops (--pool-mode inline): for \
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

    /// Whether `ahead` more tasks of `stage` before this one (waiting outside the pool, as
    /// the images stage's requests wait for a place) would make it end past `deadline`.
    pub(crate) fn would_miss(&self, stage: &'static str, ahead: usize, deadline: Instant) -> bool {
        let Some(queue) = self.queue.as_ref() else {
            return false;
        };
        let estimate = queue.estimate_ns(stage);
        let waiting = estimate.saturating_mul(ahead as u64) / queue.threads.max(1) as u64;
        estimate > 0 && queue.expected_end(estimate.saturating_add(waiting)) > deadline
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
        let estimate_ns = queue.estimate_ns(stage);
        if estimate_ns > 0 && queue.expected_end(estimate_ns) > deadline {
            metrics::POOL_REJECTED
                .with_label_values(&[stage, "would_miss_deadline"])
                .inc();
            return Err(PoolRefusal::WouldMissDeadline);
        }
        let (done, result) = oneshot::channel();
        let task = Task {
            stage,
            queued_at: Instant::now(),
            deadline,
            estimate_ns,
            run: Box::new(move || {
                let _ = done.send(job());
            }),
        };
        {
            let mut tasks = queue.tasks.lock();
            if tasks.len() >= queue.capacity {
                drop(tasks);
                metrics::POOL_REJECTED
                    .with_label_values(&[stage, "queue_full"])
                    .inc();
                return Err(PoolRefusal::Full);
            }
            tasks.push_back(task);
            queue.backlog_ns.fetch_add(estimate_ns, Ordering::Relaxed);
            metrics::POOL_QUEUE_DEPTH.set(tasks.len() as i64);
        }
        queue.ready.notify_one();
        match tokio::time::timeout_at(deadline.into(), result).await {
            Ok(Ok(value)) => Ok(value),
            // Dropped unrun by a worker because its deadline had passed, or cut short here.
            Ok(Err(_)) | Err(_) => {
                metrics::POOL_TIMEOUTS.with_label_values(&[stage]).inc();
                Err(PoolRefusal::TimedOut)
            }
        }
    }
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

fn work(queue: &Queue, give_way: Option<&GiveWay>) {
    loop {
        let task = {
            let mut tasks = queue.tasks.lock();
            loop {
                if let Some(task) = tasks.pop_front() {
                    metrics::POOL_QUEUE_DEPTH.set(tasks.len() as i64);
                    break task;
                }
                queue.ready.wait(&mut tasks);
            }
        };
        let started = Instant::now();
        metrics::POOL_WAIT
            .with_label_values(&[task.stage])
            .observe(started.duration_since(task.queued_at).as_secs_f64());
        if started >= task.deadline {
            // Nobody waits for it any more: dropping it tells the caller.
            queue
                .backlog_ns
                .fetch_sub(task.estimate_ns, Ordering::Relaxed);
            continue;
        }
        let cpu_before = thread_cpu_time();
        match give_way {
            Some(give_way) => {
                let paused = give_way.run(task.run);
                if paused.times > 0 {
                    metrics::POOL_GAVE_WAY.inc_by(paused.times);
                    metrics::POOL_GAVE_WAY_SECONDS.inc_by(paused.slept.as_secs_f64());
                }
            }
            None => (task.run)(),
        }
        let took = started.elapsed();
        // The estimate is CPU time, not wall time: a worker that waits for CPU (SCHED_IDLE
        // under a busy event loop) must not make its stage look slower, or refusals would
        // feed on themselves — refused clients asking again keep the loops busy, which
        // starves the workers, which raises the estimate.
        queue.record_run(task.stage, thread_cpu_time().saturating_sub(cpu_before));
        queue
            .backlog_ns
            .fetch_sub(task.estimate_ns, Ordering::Relaxed);
        metrics::POOL_RUN
            .with_label_values(&[task.stage])
            .observe(took.as_secs_f64());
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
            let (started, running) = std::sync::mpsc::channel();
            let first = {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let job = move || {
                        let _ = started.send(());
                        block()
                    };
                    pool.run("test", soon(), job).await
                })
            };
            while running.try_recv().is_err() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
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

    /// Field 41 of `/proc/thread-self/stat`: this thread's scheduling policy (5: SCHED_IDLE).
    fn own_policy() -> Option<u32> {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
        let after_name = &stat[stat.rfind(')')? + 1..];
        after_name.split_whitespace().nth(38)?.parse().ok()
    }

    #[test]
    fn idle_workers_are_sched_idle_and_work_that_would_miss_its_deadline_is_refused_at_once() {
        let pool = Arc::new(WorkerPool::new(1, 64, PoolScheduling::Idle).expect("pool"));
        runtime().block_on(async {
            let soon = || Instant::now() + Duration::from_secs(5);
            assert_eq!(pool.run("test", soon(), own_policy).await, Ok(Some(5)));
            // Teach the pool that a task of this stage takes 40 ms.
            let slow = || busy(40);
            for _ in 0..3 {
                assert_eq!(pool.run("slow", soon(), slow).await, Ok(()));
            }
            // Five queued ahead: about 200 ms of work. A task allowed 100 ms is refused
            // before it is queued, in far less than its deadline.
            let queued: Vec<_> = (0..5)
                .map(|_| {
                    let pool = pool.clone();
                    tokio::spawn(async move { pool.run("slow", soon(), slow).await })
                })
                .collect();
            tokio::time::sleep(Duration::from_millis(5)).await;
            let asked = Instant::now();
            let refused = pool
                .run("slow", Instant::now() + Duration::from_millis(100), slow)
                .await;
            assert_eq!(refused, Err(PoolRefusal::WouldMissDeadline));
            assert!(asked.elapsed() < Duration::from_millis(5));
            assert!(pool.would_miss("slow", 1, Instant::now() + Duration::from_millis(100)));
            assert!(!pool.would_miss("slow", 1, Instant::now() + Duration::from_secs(5)));
            for task in queued {
                assert_eq!(task.await.expect("joined"), Ok(()));
            }
            // The backlog drained, the same deadline is met again.
            let met = pool
                .run("slow", Instant::now() + Duration::from_millis(100), slow)
                .await;
            assert_eq!(met, Ok(()));
        });
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

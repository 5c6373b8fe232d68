//! A fixed set of threads for CPU-bound work (WAF inspection), so the event loops never run
//! it and never block waiting for it: a WAF or an image resize on the event loop makes every
//! other request on that loop wait.
//!
//! The queue is bounded: a task that finds it full is refused at once. Every task carries a
//! deadline: a task still queued at its deadline is dropped unrun, and the waiting request
//! stops waiting at the deadline whatever the task is doing. What a refusal or a missed
//! deadline means is the calling stage's decision.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use thread_priority::{set_current_thread_priority, ThreadPriority, ThreadPriorityValue};
use tokio::sync::oneshot;

use crate::metrics;

/// Niceness of worker threads (on the `thread-priority` crate's 0–99 scale, 22 is nice 10):
/// when every core is busy the scheduler gives the event loops about ten times the CPU of a
/// worker, so light requests stay fast while heavy ones use what is left.
const WORKER_PRIORITY: u8 = 22;

/// Why a task produced no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PoolRefusal {
    /// The queue was full: the task was never queued.
    Full,
    /// The deadline passed, queued or running.
    TimedOut,
}

struct Task {
    stage: &'static str,
    queued_at: Instant,
    deadline: Instant,
    run: Box<dyn FnOnce() + Send>,
}

struct Queue {
    tasks: Mutex<VecDeque<Task>>,
    ready: Condvar,
    capacity: usize,
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
    pub fn new(threads: usize, capacity: usize) -> std::io::Result<Self> {
        metrics::register_all();
        let queue = Arc::new(Queue {
            tasks: Mutex::new(VecDeque::with_capacity(capacity)),
            ready: Condvar::new(),
            capacity: capacity.max(1),
        });
        let threads = threads.max(1);
        for n in 0..threads {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("switchyard-worker-{n}"))
                .spawn(move || work(&queue))?;
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
        let (done, result) = oneshot::channel();
        let task = Task {
            stage,
            queued_at: Instant::now(),
            deadline,
            run: Box::new(move || {
                let _ = done.send(job());
            }),
        };
        {
            let mut tasks = queue.tasks.lock();
            if tasks.len() >= queue.capacity {
                drop(tasks);
                metrics::POOL_REJECTED.with_label_values(&[stage]).inc();
                return Err(PoolRefusal::Full);
            }
            tasks.push_back(task);
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

fn work(queue: &Queue) {
    let lowered = ThreadPriorityValue::try_from(WORKER_PRIORITY)
        .map_err(|e| e.to_string())
        .and_then(|value| {
            set_current_thread_priority(ThreadPriority::Crossplatform(value))
                .map_err(|e| format!("{e:?}"))
        });
    if let Err(e) = lowered {
        log::warn!("worker thread keeps the normal priority: {e}");
    }
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
            continue;
        }
        (task.run)();
        metrics::POOL_RUN
            .with_label_values(&[task.stage])
            .observe(started.elapsed().as_secs_f64());
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

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
    }

    #[test]
    fn results_come_back_and_overflow_and_deadlines_are_refusals() {
        let pool = Arc::new(WorkerPool::new(1, 2).expect("pool"));
        runtime().block_on(async {
            let soon = || Instant::now() + Duration::from_secs(5);
            assert_eq!(pool.run("test", soon(), || 6 * 7).await, Ok(42));
            let nice = pool.run("test", soon(), own_niceness).await;
            assert_eq!(nice, Ok(Some(10)), "workers yield to the event loops");

            // One worker busy, two queued: the fourth is refused at once.
            let block = || std::thread::sleep(Duration::from_millis(300));
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

            // A deadline shorter than the work: the caller stops waiting at the deadline.
            let started = Instant::now();
            let late = pool
                .run("test", Instant::now() + Duration::from_millis(50), block)
                .await;
            assert_eq!(late, Err(PoolRefusal::TimedOut));
            assert!(started.elapsed() < Duration::from_millis(250));
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

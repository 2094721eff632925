//! The team: kiln's own threads for the parallel steps of a run.
//!
//! A plan runs on the caller's thread, and most of its steps are too small to split. The few
//! that are split (a kernel over many positions, a product in bands) come one after another
//! with a few microseconds of serial work between them. Handing each one to rayon's pool from
//! a thread outside it costs a wake-up of a sleeping worker and of the caller: 15 to 75 µs
//! per step measured on a 2-core virtual machine, longer than most of those steps take.
//!
//! The team instead keeps `threads - 1` helper threads spinning for [`SPIN`] after their last
//! task (as an OpenMP runtime does), and the caller works on its own job's tasks beside
//! them, so a split step starts in well under a microsecond while steps keep coming. An idle
//! helper parks; the next job wakes it and goes on without waiting for it.
//!
//! One job runs at a time. A job started while another is running (another thread's
//! realization, or a task that splits again) runs on rayon's pool instead, as before.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, LazyLock, Mutex, PoisonError, TryLockError};
use std::time::{Duration, Instant};

/// How long a helper spins for the next job after its last one before it parks.
pub(crate) const SPIN: Duration = Duration::from_millis(1);

/// Threads that work on a split step, the caller included: rayon's thread count, so
/// `RAYON_NUM_THREADS` and a global pool the program configured are respected.
pub(crate) fn threads() -> usize {
    TEAM.helpers + 1
}

/// Runs `task(0)`, ..., `task(tasks - 1)` on the team (each exactly once, in any order, on
/// any of its threads) and returns when all have finished. A panic in a task is raised
/// again here after every task has finished or been given up.
pub(crate) fn for_each(tasks: usize, task: &(dyn Fn(usize) + Sync)) {
    if tasks <= 1 || TEAM.helpers == 0 {
        (0..tasks).for_each(task);
        return;
    }
    let _launch = match TEAM.launch.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => {
            use rayon::prelude::*;
            return (0..tasks).into_par_iter().for_each(task);
        }
    };
    let job = Job {
        task: erase(task),
        tasks,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panic: Mutex::new(None),
    };
    let shared = &TEAM.shared;
    shared.job.store(std::ptr::from_ref(&job).cast_mut(), SeqCst);
    shared.epoch.fetch_add(1, SeqCst);
    if shared.sleepers.load(SeqCst) > 0 {
        let _guard = shared.park.lock().unwrap_or_else(PoisonError::into_inner);
        shared.wake.notify_all();
    }
    job.work();
    while job.done.load(SeqCst) < tasks {
        std::hint::spin_loop();
    }
    // No helper touches `job` once it is unpublished and no helper is inside it.
    shared.job.store(std::ptr::null_mut(), SeqCst);
    while shared.active.load(SeqCst) > 0 {
        std::hint::spin_loop();
    }
    if let Some(payload) = job.panic.into_inner().unwrap_or_else(PoisonError::into_inner) {
        resume_unwind(payload);
    }
}

/// `task(0)`, ..., `task(tasks - 1)` run as [`for_each`] runs them, their results in order.
pub(crate) fn map<T: Send>(tasks: usize, task: &(dyn Fn(usize) -> T + Sync)) -> Vec<T> {
    let results: Vec<Mutex<Option<T>>> = (0..tasks).map(|_| Mutex::new(None)).collect();
    for_each(tasks, &|i| {
        let value = task(i);
        *results[i].lock().unwrap_or_else(PoisonError::into_inner) = Some(value);
    });
    let take = |r: Mutex<Option<T>>| r.into_inner().unwrap_or_else(PoisonError::into_inner);
    results.into_iter().map(|r| take(r).expect("every task ran")).collect()
}

/// `task(i, part)` for each of the disjoint `parts` (chunks of one output), as [`for_each`]
/// runs tasks.
pub(crate) fn for_each_part<T: Send>(
    parts: Vec<&mut [T]>,
    task: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    let parts: Vec<Mutex<&mut [T]>> = parts.into_iter().map(Mutex::new).collect();
    for_each(parts.len(), &|i| {
        task(i, &mut parts[i].lock().unwrap_or_else(PoisonError::into_inner));
    });
}

/// A job's task function with its borrow's lifetime erased: [`for_each`] does not return
/// before every thread has stopped using it.
type Task = *const (dyn Fn(usize) + Sync + 'static);

fn erase(task: &(dyn Fn(usize) + Sync)) -> Task {
    let task: *const (dyn Fn(usize) + Sync + '_) = task;
    // SAFETY: only the trait object's lifetime bound changes (the same fat pointer); see `Task`.
    unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), Task>(task) }
}

/// One [`for_each`] call, on the caller's stack while it runs.
struct Job {
    task: Task,
    tasks: usize,
    /// The next task to hand out.
    next: AtomicUsize,
    /// Tasks finished (or skipped after a panic).
    done: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Job {
    /// Takes tasks until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, SeqCst);
            if i >= self.tasks {
                return;
            }
            // SAFETY: the job is published, so `for_each` has not returned and the task's
            // borrow is alive.
            let task = unsafe { &*self.task };
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| task(i))) {
                self.panic.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(payload);
            }
            self.done.fetch_add(1, SeqCst);
        }
    }
}

struct Team {
    helpers: usize,
    /// Held by the thread whose job is running.
    launch: Mutex<()>,
    shared: &'static Shared,
}

/// What the caller and the helpers share.
struct Shared {
    /// The running job, or null.
    job: AtomicPtr<Job>,
    /// Bumped for every job, so a helper takes each job once.
    epoch: AtomicU64,
    /// Helpers inside a job: the caller waits for none before its job leaves its stack.
    active: AtomicUsize,
    /// Parked helpers, and what they park on.
    sleepers: AtomicUsize,
    park: Mutex<()>,
    wake: Condvar,
}

static TEAM: LazyLock<Team> = LazyLock::new(|| {
    let shared: &'static Shared = Box::leak(Box::new(Shared {
        job: AtomicPtr::new(std::ptr::null_mut()),
        epoch: AtomicU64::new(0),
        active: AtomicUsize::new(0),
        sleepers: AtomicUsize::new(0),
        park: Mutex::new(()),
        wake: Condvar::new(),
    }));
    let wanted = rayon::current_num_threads().saturating_sub(1);
    let helpers = (0..wanted)
        .filter(|i| {
            std::thread::Builder::new()
                .name(format!("kiln-team-{}", i + 1))
                .spawn(move || helper(shared))
                .is_ok()
        })
        .count();
    Team { helpers, launch: Mutex::new(()), shared }
});

fn helper(shared: &'static Shared) {
    let mut seen = shared.epoch.load(SeqCst);
    let mut idle_since = Instant::now();
    let mut spins = 0u32;
    loop {
        let epoch = shared.epoch.load(SeqCst);
        if epoch != seen {
            seen = epoch;
            shared.active.fetch_add(1, SeqCst);
            let job = shared.job.load(SeqCst);
            if !job.is_null() {
                // SAFETY: the job is published and `active` counts this thread, so the
                // caller keeps it alive until this thread leaves it.
                unsafe { &*job }.work();
            }
            shared.active.fetch_sub(1, SeqCst);
            idle_since = Instant::now();
            continue;
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(256) {
            std::hint::spin_loop();
            continue;
        }
        if idle_since.elapsed() < SPIN {
            // Let another runnable thread on this core (rayon's workers) have it.
            std::thread::yield_now();
            continue;
        }
        shared.sleepers.fetch_add(1, SeqCst);
        let mut guard = shared.park.lock().unwrap_or_else(PoisonError::into_inner);
        while shared.epoch.load(SeqCst) == seen {
            guard = shared.wake.wait(guard).unwrap_or_else(PoisonError::into_inner);
        }
        drop(guard);
        shared.sleepers.fetch_sub(1, SeqCst);
        idle_since = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// The tests take turns: a job started while another test's runs goes to rayon instead.
    static TURN: Mutex<()> = Mutex::new(());

    #[test]
    fn every_task_runs_once_across_many_jobs_and_threads() {
        let _turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
        let callers: Vec<_> = (0..3)
            .map(|c| {
                std::thread::spawn(move || {
                    for job in 0..200 {
                        let n = 1 + (job * 7 + c) % 37;
                        let counts: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                        for_each(n, &|i| {
                            counts[i].fetch_add(1, SeqCst);
                        });
                        assert!(counts.iter().all(|c| c.load(SeqCst) == 1), "job {job} of {c}");
                        if job % 50 == 0 {
                            std::thread::sleep(SPIN * 2);
                        }
                    }
                })
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
    }

    #[test]
    fn a_panicking_task_panics_the_caller_after_the_others_finish() {
        let _turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
        let finished = AtomicU32::new(0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            for_each(16, &|i| {
                assert!(i != 5, "task five fails");
                finished.fetch_add(1, SeqCst);
            });
        }));
        let message = result.unwrap_err();
        assert_eq!(message.downcast_ref::<&str>(), Some(&"task five fails"));
        assert_eq!(finished.load(SeqCst), 15);
        // The team still works.
        let sum = AtomicUsize::new(0);
        for_each(10, &|i| {
            sum.fetch_add(i, SeqCst);
        });
        assert_eq!(sum.load(SeqCst), 45);
    }

    #[test]
    fn a_task_that_splits_again_runs_its_inner_tasks() {
        let _turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
        let sum = AtomicUsize::new(0);
        for_each(4, &|i| {
            for_each(3, &|j| {
                sum.fetch_add(i * 3 + j, SeqCst);
            });
        });
        assert_eq!(sum.load(SeqCst), (0..12).sum::<usize>());
    }
}

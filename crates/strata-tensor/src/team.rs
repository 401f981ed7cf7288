//! A forward pass's threads, kept spinning between its ops.
//!
//! A decode step of a small model is a few hundred short parallel ops (SmolLM2-135M: 30
//! layers × 7 matmuls, each a few tens of microseconds). Handed to rayon one by one, every
//! op pays for waking the other workers, which sleep or sit in `sched_yield` between ops,
//! and the late ones find most of the work already taken: two threads decoded only 1.45×
//! faster than one. [`CpuBackend::on_workers`](super::CpuBackend) instead runs the pass as
//! a *team*: the pool's first thread runs the pass, the others wait for work in a spin
//! loop, and each op's tasks go to all of them at once ([`for_each`]). Between passes the
//! threads are back in rayon's hands (and asleep when idle).
//!
//! While they wait, team threads also take any rayon job the pass left for the pool, so a
//! parallel iterator inside a pass still runs on every thread.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use rayon::ThreadPool;
use rayon::prelude::*;

/// One op's work: called once for each task index.
type Job<'a> = &'a (dyn Fn(usize) + Sync);

/// An atomic on its own cache line, so that threads polling one do not slow the others.
#[repr(align(128))]
#[derive(Default)]
struct Line<T>(T);

#[derive(Default)]
struct Team {
    /// Bumped once for every op handed out.
    epoch: Line<AtomicUsize>,
    /// The current op's claims: its epoch's low 32 bits above the next task index to take
    /// ([`CLOSED`] while the leader sets up an op, or after its task panicked). A task is
    /// taken by moving this word on from its index under the op's epoch, so a thread
    /// still looking at an op that is over can take nothing of the next.
    claim: Line<AtomicU64>,
    /// Tasks of the current op that have run (or panicked).
    done: Line<AtomicUsize>,
    /// The current op: a pointer to a [`Job`] on the leader's stack, and its task count.
    job: AtomicPtr<()>,
    tasks: AtomicUsize,
    /// The pass is over (or its leader panicked): helpers return.
    stop: AtomicBool,
    /// A helper's task panicked; the leader panics once the op is over.
    panicked: AtomicBool,
    /// Helpers parked until the next op (or the end of the pass), and every helper's
    /// thread, to unpark them.
    sleepers: AtomicUsize,
    threads: Mutex<Vec<std::thread::Thread>>,
}

thread_local! {
    /// The team this thread leads, while it runs a pass and no op of it.
    static LEADING: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
}

/// How long a helper spins without work before it parks until the next op: the gaps
/// between a pass's ops are microseconds, but a pass that waits on storage for its next
/// layer must leave the cores to the threads reading it. (Counted in time, not polls:
/// a `pause` takes 10 to 150 cycles, depending on the CPU.)
const SPIN_FOR: std::time::Duration = std::time::Duration::from_micros(500);

/// The task index of [`Team::claim`] while no task may be taken.
const CLOSED: u64 = u32::MAX as u64;

/// The claim word of epoch `epoch` at task index `i`.
fn tagged(epoch: usize, i: u64) -> u64 {
    ((epoch as u64) << 32) | i
}

impl Team {
    /// Hands `f`'s `tasks` tasks to every thread of the team, takes its share and returns
    /// once every task has run. It waits for the tasks, not for the helpers: a helper the
    /// OS has not given a core (another process on it) takes no task and holds up nothing.
    fn run(&self, tasks: usize, f: Job<'_>) {
        assert!((tasks as u64) < CLOSED, "{tasks} tasks in one op");
        // Only the leader writes the epoch.
        let epoch = self.epoch.0.load(Ordering::Relaxed).wrapping_add(1);
        // Closed under the new epoch before the job and count change: a helper that reads
        // either new value then sees the claims closed (the stores below release this one)
        // and cannot take a task of the last op with them.
        self.claim.0.store(tagged(epoch, CLOSED), Ordering::SeqCst);
        self.job.store((&raw const f).cast_mut().cast(), Ordering::Release);
        self.tasks.store(tasks, Ordering::Release);
        self.done.0.store(0, Ordering::Relaxed);
        // Opens the claims, publishing the stores above to a helper that takes a task.
        self.claim.0.store(tagged(epoch, 0), Ordering::Release);
        // SeqCst against `nap`'s, so that a parking helper either sees it or is woken.
        self.epoch.0.store(epoch, Ordering::SeqCst);
        self.wake();
        // Caught, so that `f` outlives the helpers still running it.
        let mine = catch_unwind(AssertUnwindSafe(|| while self.take_one(epoch, tasks, f) {}));
        let wait_for = match mine {
            Ok(()) => tasks,
            // Closes the claims: the tasks taken so far are the ones to wait for.
            Err(_) => (self.claim.0.swap(tagged(epoch, CLOSED), Ordering::AcqRel) as u32 as usize).min(tasks),
        };
        while self.done.0.load(Ordering::Acquire) < wait_for {
            std::hint::spin_loop();
        }
        if let Err(e) = mine {
            std::panic::resume_unwind(e);
        }
        if self.panicked.load(Ordering::Relaxed) {
            panic!("a task of a parallel op panicked on another thread");
        }
    }

    /// Takes and runs one task of the op of `epoch` (`tasks` tasks of `f`), if one is
    /// left: whether it did. A task that panics still counts as done, after the panic has
    /// been recorded; the leader's own panic goes on up to [`Team::run`].
    fn take_one(&self, epoch: usize, tasks: usize, f: Job<'_>) -> bool {
        let Some(i) = self.claim_one(epoch, tasks) else { return false };
        let ran = catch_unwind(AssertUnwindSafe(|| f(i)));
        self.done.0.fetch_add(1, Ordering::Release);
        if let Err(e) = ran {
            std::panic::resume_unwind(e);
        }
        true
    }

    /// Claims the next task of the op of `epoch`, of `tasks` tasks, while that op is
    /// still handing them out.
    fn claim_one(&self, epoch: usize, tasks: usize) -> Option<usize> {
        let mut c = self.claim.0.load(Ordering::Acquire);
        loop {
            let i = c & CLOSED;
            if c != tagged(epoch, i) || i >= tasks as u64 {
                return None;
            }
            match self.claim.0.compare_exchange_weak(c, c + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(i as usize),
                Err(now) => c = now,
            }
        }
    }

    /// A helper's share of the op of `epoch`: its tasks until none is left. The task
    /// count is read before each claim (under the op's epoch, a claim that succeeds was
    /// made before the next op's count was written), and the job only once a task is
    /// claimed, when the leader must still be waiting for it.
    fn help_with(&self, epoch: usize) {
        loop {
            let tasks = self.tasks.load(Ordering::Acquire);
            let Some(i) = self.claim_one(epoch, tasks) else { return };
            // SAFETY: task `i` of this epoch is claimed and not done, so the leader is
            // still in `run` for it, keeping the `Job` this points at alive.
            let f = unsafe { *self.job.load(Ordering::Acquire).cast::<Job<'_>>() };
            if catch_unwind(AssertUnwindSafe(|| f(i))).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
            self.done.0.fetch_add(1, Ordering::Release);
        }
    }

    /// Unparks the helpers that sleep.
    fn wake(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.threads.lock().unwrap_or_else(|e| e.into_inner()).iter().for_each(|t| t.unpark());
        }
    }

    /// Parks this helper until the leader hands out an op after epoch `seen`, or ends
    /// the pass (or a spurious wake-up).
    fn nap(&self, seen: usize) {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        if self.epoch.0.load(Ordering::SeqCst) == seen && !self.stop.load(Ordering::SeqCst) {
            std::thread::park();
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// A helper's life: waits for ops and takes their tasks until the pass is over.
    fn help(&self) {
        self.threads.lock().unwrap_or_else(|e| e.into_inner()).push(std::thread::current());
        // From the team's first epoch: the leader may have handed out ops before this
        // helper started.
        let mut seen = 0;
        let mut idle = 0u32;
        let mut since = std::time::Instant::now();
        loop {
            let epoch = self.epoch.0.load(Ordering::Acquire);
            if epoch != seen {
                seen = epoch;
                self.help_with(epoch);
                idle = 0;
                since = std::time::Instant::now();
                continue;
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            idle = idle.wrapping_add(1);
            if !idle.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            // Now and then (looking costs more than a poll): rayon jobs the pass left for
            // the pool (a parallel iterator not routed through `for_each`), and the clock.
            if rayon::yield_now() == Some(rayon::Yield::Executed) {
                since = std::time::Instant::now();
            } else if since.elapsed() > SPIN_FOR {
                self.nap(seen);
                since = std::time::Instant::now();
            }
        }
    }
}

/// Runs `pass` on `pool`'s first thread with the others as its team (see the module
/// docs); on a one-thread pool, or inside a pass already, simply on the pool.
pub fn lead<R: Send>(pool: &ThreadPool, pass: impl FnOnce() -> R + Send) -> R {
    let helpers = pool.current_num_threads() - 1;
    if helpers == 0 || !LEADING.get().is_null() {
        return pool.install(pass);
    }
    let team = Team::default();
    let pass = Mutex::new(Some(pass));
    let out = Mutex::new(None);
    /// Ends the pass for the helpers even when it panics.
    struct Over<'a>(&'a Team);
    impl Drop for Over<'_> {
        fn drop(&mut self) {
            LEADING.set(std::ptr::null());
            self.0.stop.store(true, Ordering::SeqCst);
            self.0.wake();
        }
    }
    pool.broadcast(|ctx| {
        if ctx.index() != 0 {
            return team.help();
        }
        let _over = Over(&team);
        LEADING.set(&raw const team);
        let pass = pass.lock().unwrap_or_else(|e| e.into_inner()).take().expect("one leader");
        *out.lock().unwrap_or_else(|e| e.into_inner()) = Some(pass());
    });
    out.into_inner().unwrap_or_else(|e| e.into_inner()).expect("the leader ran the pass")
}

/// Runs `f(i)` for every `i < tasks`, in parallel: on the team this thread leads, or
/// else on `pool`. Tasks may run in any order and on any thread.
pub fn for_each(pool: &ThreadPool, tasks: usize, f: impl Fn(usize) + Sync) {
    for_each_on(Some(pool), tasks, f)
}

/// [`for_each`] on `pool`, or with `None` on the rayon pool this thread is in (the
/// global one outside any), where no team is led.
fn for_each_on(pool: Option<&ThreadPool>, tasks: usize, f: impl Fn(usize) + Sync) {
    if tasks <= 1 {
        return (0..tasks).for_each(f);
    }
    let team = LEADING.get();
    if team.is_null() {
        let all = || (0..tasks).into_par_iter().for_each(&f);
        return match pool {
            Some(pool) => pool.install(all),
            None => all(),
        };
    }
    // Tasks that start parallel work of their own run it in place: the team is busy.
    LEADING.set(std::ptr::null());
    // SAFETY: `lead` set the pointer to a team that outlives its pass, which is running
    // on this thread now.
    unsafe { &*team }.run(tasks, &f);
    LEADING.set(team);
}

/// Runs `f(i, chunk)` for each `chunk`-long piece `i` of `data` (a shorter last one
/// included), in parallel as [`for_each`] does.
pub fn for_each_chunk_mut<T: Send>(
    pool: &ThreadPool,
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    chunks_on(Some(pool), data, chunk, f)
}

/// [`for_each_chunk_mut`] for code that holds no pool (the streamer's repack of a layer
/// it read): on the team this thread leads, or else on the rayon pool it is in.
pub fn for_each_chunk_mut_here<T: Send>(data: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    chunks_on(None, data, chunk, f)
}

fn chunks_on<T: Send>(pool: Option<&ThreadPool>, data: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    /// The start of `data`, shared by tasks that take disjoint pieces of it.
    struct Start<T>(*mut T);
    // SAFETY: each task takes its own piece (below), so sharing the pointer shares no
    // more than disjoint `&mut [T]`, which may go to other threads since `T: Send`.
    unsafe impl<T: Send> Sync for Start<T> {}
    impl<T> Start<T> {
        fn at(&self, i: usize) -> *mut T {
            self.0.wrapping_add(i)
        }
    }
    let (len, chunk) = (data.len(), chunk.max(1));
    let start = Start(data.as_mut_ptr());
    for_each_on(pool, len.div_ceil(chunk), |i| {
        let at = i * chunk;
        // SAFETY: piece `i` is `data[at..at + n]`, inside `data`, which stays borrowed
        // mutably for this call; `for_each` runs each index once, so pieces never overlap.
        let piece = unsafe { std::slice::from_raw_parts_mut(start.at(at), chunk.min(len - at)) };
        f(i, piece);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap()
    }

    #[test]
    fn every_task_runs_once_on_a_team_and_off_it() {
        for threads in [1, 2, 3] {
            let pool = pool(threads);
            let count = |tasks: usize| {
                let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                for_each(&pool, tasks, |i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1)
            };
            let led = lead(&pool, || (0..200).all(|n| count(n % 37)));
            assert!(led && count(5) && count(0), "{threads} threads");
        }
    }

    #[test]
    fn a_pass_uses_every_thread_and_nested_work_runs_in_place() {
        let pool = pool(2);
        let threads = lead(&pool, || {
            let ids = Mutex::new(std::collections::HashSet::new());
            for _ in 0..100 {
                for_each(&pool, 64, |_| {
                    std::thread::sleep(std::time::Duration::from_micros(20));
                    ids.lock().unwrap().insert(std::thread::current().id());
                    // Nested: must not wait on the team it is part of.
                    let inner = AtomicUsize::new(0);
                    for_each(&pool, 3, |_| {
                        inner.fetch_add(1, Ordering::Relaxed);
                    });
                    assert_eq!(inner.load(Ordering::Relaxed), 3);
                });
            }
            let n = ids.lock().unwrap().len();
            // A rayon iterator inside a pass still finishes (helpers take its jobs).
            let sum: usize = pool.install(|| (0..1000usize).into_par_iter().sum());
            assert_eq!(sum, 499_500);
            n
        });
        assert_eq!(threads, 2);
    }

    /// A helper parks through a gap longer than it spins (a pass waiting on storage) and
    /// wakes for the next op.
    #[test]
    fn helpers_parked_through_a_long_gap_take_the_next_op() {
        let pool = pool(2);
        lead(&pool, || {
            for _ in 0..4 {
                std::thread::sleep(SPIN_FOR * 4);
                let ids = Mutex::new(std::collections::HashSet::new());
                // Long enough for a woken thread to be scheduled on a busy machine.
                for_each(&pool, 64, |_| {
                    std::thread::sleep(std::time::Duration::from_micros(300));
                    ids.lock().unwrap().insert(std::thread::current().id());
                });
                assert_eq!(ids.lock().unwrap().len(), 2);
            }
        });
    }

    /// An op waits for its tasks, not for the helpers: a helper held elsewhere (here by a
    /// long rayon job it took while idle; in life, by the OS giving its core to another
    /// process) does not hold up the ops the leader can run alone.
    #[test]
    fn ops_do_not_wait_for_a_helper_held_elsewhere() {
        let pool = pool(2);
        lead(&pool, || {
            let taken = AtomicBool::new(false);
            rayon::scope(|s| {
                s.spawn(|_| {
                    taken.store(true, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(1500));
                });
                // Until the helper has the job (it takes rayon work between ops).
                let t = std::time::Instant::now();
                while !taken.load(Ordering::SeqCst) && t.elapsed() < std::time::Duration::from_secs(5) {
                    std::hint::spin_loop();
                }
                let t = std::time::Instant::now();
                let sum = AtomicUsize::new(0);
                for _ in 0..100 {
                    for_each(&pool, 8, |i| {
                        sum.fetch_add(i, Ordering::Relaxed);
                    });
                }
                assert_eq!(sum.load(Ordering::Relaxed), 100 * 28);
                let took = t.elapsed();
                assert!(took < std::time::Duration::from_millis(750), "100 ops took {took:?}");
            });
        });
    }

    #[test]
    fn a_panicking_task_panics_the_pass_and_the_pool_lives_on() {
        let pool = pool(2);
        for _ in 0..4 {
            let r = catch_unwind(AssertUnwindSafe(|| {
                lead(&pool, || {
                    for_each(&pool, 64, |i| {
                        std::thread::sleep(std::time::Duration::from_micros(50));
                        assert_ne!(i, 40, "task 40 fails");
                    })
                })
            }));
            assert!(r.is_err());
        }
        assert_eq!(lead(&pool, || 7), 7);
    }
}

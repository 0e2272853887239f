//! A helper thread that stays awake for a short while after each job, for ops split in two.
//!
//! Waking a sleeping rayon worker costs 20–50 µs on the 2-core CI-sized machine, so a 64K-
//! element activation (15–30 µs on one thread) cannot gain from a second thread through the
//! pool. OpenMP's workers (PyTorch's) spin after a parallel region, so back-to-back ops split
//! cheaply; this helper does the same: after a job it polls for the next one for
//! [`SPIN`], yielding the core to any other runnable thread meanwhile, then parks; it parks
//! at once when work goes to the thread pool ([`stand_down`]), whose threads need the cores.
//!
//! The caller never waits for a wake: it offers the second half, runs the first, and if the
//! helper has not taken the second half by then (asleep, busy, or another caller's), takes it
//! back and runs it too. So a split through the helper costs at worst a few atomic
//! operations and a wake-up call over running the whole op on the calling thread.
//!
//! The helper must run on another core than the caller. A woken thread is often placed on
//! its waker's core, and there the helper waited behind a caller that never blocks: in a
//! third of the processes on the 2-core EPYC, 1M-element adds ran at one thread's rate for
//! the whole process (session 38). So the caller notes its CPU with each job, and the helper,
//! finding itself on that CPU, moves itself off it ([`leave_caller_cpu`]); a caller whose
//! helper did not take a long half moves the helper off its CPU itself ([`push_off_cpu`]),
//! since a helper queued behind the caller cannot run to move.
//!
//! Invariant: `slot` holds 0 or the address of a [`Job`] on the stack of a caller blocked in
//! [`run_split`] until that job is done or taken back; the helper takes it out of `slot`
//! (compare-exchange to 0) before running it, so each job runs exactly once.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long the helper polls for a next job before it parks.
const SPIN: Duration = Duration::from_micros(100);

/// A first half at least this long that the (awake or woken) helper did not take its half
/// during means the helper is not running: it is moved off the caller's CPU.
const STARVED: Duration = Duration::from_micros(20);

/// Set when pool work starts (a GEMM, a parallel reduction): the helper parks at once
/// rather than take a core from the pool's threads; the next split clears it.
static STAND_DOWN: AtomicBool = AtomicBool::new(false);

/// Makes the helper park now (called before work is handed to the thread pool).
#[inline]
pub(crate) fn stand_down() {
    if !STAND_DOWN.load(Ordering::Relaxed) {
        STAND_DOWN.store(true, Ordering::Relaxed);
    }
}

/// The CPU of the last caller that offered a job (`usize::MAX`: unknown).
static CALLER_CPU: AtomicUsize = AtomicUsize::new(usize::MAX);

/// The CPU this thread runs on, where the OS says so.
fn current_cpu() -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `sched_getcpu` takes no arguments and only reads the thread's CPU.
        let cpu = unsafe { libc::sched_getcpu() };
        usize::try_from(cpu).ok()
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// Moves the helper off the last caller's CPU when it is on it ([`push_off_cpu`]).
/// Processes whose 1M-element adds ran at one thread's rate (`cpu_micro binary 1048576`,
/// alternated with the build before in three batches): 12 → 11 of 30, 4 → 0 of 20, 17 → 2
/// of 50.
fn leave_caller_cpu() {
    let caller = CALLER_CPU.load(Ordering::Relaxed);
    if caller != usize::MAX && current_cpu() == Some(caller) {
        push_off_cpu(0, caller);
    }
}

/// Moves thread `tid` (0: the calling thread) off `cpu`: its affinity without that CPU (the
/// kernel migrates it at once, running or queued), then the affinity it had (which moves
/// nothing). A caller uses it on the helper too, which may not run to move itself: a woken
/// helper queued on its waker's CPU behind a caller that never blocks did not run for the
/// whole of a process in 6 of 30 processes of 1M-element adds (`perf record -e sched:*`: no
/// switch on that CPU for the rest of the run, the other CPU idle; session 40).
fn push_off_cpu(tid: i32, cpu: usize) {
    #[cfg(target_os = "linux")]
    // SAFETY: `cpu_set_t` is plain data, zeroed is a valid (empty) set; the calls read and
    // write only these sets and the affinity of thread `tid` (this thread, or the helper,
    // which never exits: it loops in `serve`), and `cpu` is a CPU number the kernel
    // reported, below `CPU_SETSIZE`.
    unsafe {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(tid, size, &mut allowed) != 0 {
            return;
        }
        let mut others = allowed;
        libc::CPU_CLR(cpu, &mut others);
        if libc::CPU_COUNT(&others) > 0 && libc::sched_setaffinity(tid, size, &others) == 0 {
            libc::sched_setaffinity(tid, size, &allowed);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (tid, cpu);
}

struct Helper {
    /// The helper's thread id (0 until it has started), for [`push_off_cpu`].
    tid: AtomicI32,
    slot: AtomicUsize,
    sleeping: AtomicBool,
    thread: OnceLock<Thread>,
}

static HELPER: Helper = Helper {
    tid: AtomicI32::new(0),
    slot: AtomicUsize::new(0),
    sleeping: AtomicBool::new(false),
    thread: OnceLock::new(),
};

/// A job offered to the helper: its closure and whether it has finished (0 running, 1 done,
/// 2 panicked).
struct Job<'a> {
    f: &'a (dyn Fn() + Sync),
    state: AtomicU8,
}

/// The helper, started on first use; `None` when no thread could be started.
fn helper() -> Option<&'static Helper> {
    static STARTED: OnceLock<bool> = OnceLock::new();
    let started = *STARTED.get_or_init(|| {
        match std::thread::Builder::new()
            .name("kiln-hot-helper".into())
            .spawn(serve)
        {
            Ok(handle) => HELPER.thread.set(handle.thread().clone()).is_ok(),
            Err(_) => false,
        }
    });
    started.then_some(&HELPER)
}

/// The helper's loop: take jobs; poll (yielding) for `SPIN` after each; then park.
fn serve() {
    let me = &HELPER;
    #[cfg(target_os = "linux")]
    // SAFETY: `gettid` takes no arguments and only returns this thread's id.
    me.tid.store(unsafe { libc::gettid() }, Ordering::Relaxed);
    loop {
        let mut idle_since = Instant::now();
        let mut polls = 0u32;
        loop {
            let p = me.slot.load(Ordering::Acquire);
            if p != 0
                && me
                    .slot
                    .compare_exchange(p, 0, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                // SAFETY: a non-zero slot is the address of a live `Job` whose owner waits in
                // `run_split` until `state` leaves 0 (see the module invariant), and this
                // thread took it out of the slot, so nobody else runs it.
                let job = unsafe { &*(p as *const Job) };
                let r = catch_unwind(AssertUnwindSafe(|| (job.f)()));
                job.state
                    .store(if r.is_ok() { 1 } else { 2 }, Ordering::Release);
                idle_since = Instant::now();
                continue;
            }
            polls += 1;
            if polls.is_multiple_of(64) {
                if idle_since.elapsed() > SPIN || STAND_DOWN.load(Ordering::Relaxed) {
                    break;
                }
                leave_caller_cpu();
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        me.sleeping.store(true, Ordering::SeqCst);
        if me.slot.load(Ordering::SeqCst) == 0 {
            std::thread::park();
        }
        me.sleeping.store(false, Ordering::SeqCst);
        leave_caller_cpu();
    }
}

/// When the last split ended, in nanoseconds since the first split.
static LAST_SPLIT_NS: AtomicU64 = AtomicU64::new(0);

fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// A parked helper is woken only when splits come back to back (the previous one ended
/// less than [`SPIN`] ago): waking it after every matrix product of a training step costs
/// more than it gains.
fn worth_waking() -> bool {
    now_ns().saturating_sub(LAST_SPLIT_NS.load(Ordering::Relaxed)) < SPIN.as_nanos() as u64
}

/// [`run_split`] of two computations with results: `(first(), second())`.
pub(crate) fn join<A, B: Send>(first: impl FnOnce() -> A, second: impl Fn() -> B + Sync) -> (A, B) {
    join_with(first, second, false)
}

/// [`join`] for halves long enough to pay for waking a parked helper (matrix products of
/// a fraction of a millisecond and more): the helper is woken whenever it sleeps.
pub(crate) fn join_waking<A, B: Send>(
    first: impl FnOnce() -> A,
    second: impl Fn() -> B + Sync,
) -> (A, B) {
    join_with(first, second, true)
}

fn join_with<A, B: Send>(
    first: impl FnOnce() -> A,
    second: impl Fn() -> B + Sync,
    always_wake: bool,
) -> (A, B) {
    let tail = std::sync::Mutex::new(None);
    let mut head = None;
    split(
        |_| head = Some(first()),
        &|| *tail.lock().unwrap_or_else(|e| e.into_inner()) = Some(second()),
        always_wake,
    );
    let tail = tail.into_inner().unwrap_or_else(|e| e.into_inner());
    (head.expect("first ran"), tail.expect("second ran"))
}

/// Runs `first()` on this thread and `second()` on the helper when it takes it in time,
/// else on this thread too; returns when both have run. A panic in either is resumed here.
/// A parked helper is woken only as [`worth_waking`] says.
pub(crate) fn run_split(first: impl FnOnce(), second: &(dyn Fn() + Sync)) {
    split(|_| first(), second, false)
}

/// Runs `f(i)` for every `i < n_chunks`, each exactly once, on this thread and on the helper:
/// this thread takes chunks from the front and the helper from the back until they meet, so
/// when both run from the start each does one contiguous half (as [`run_split`]), and a
/// helper that starts late (a wake-up of 20–50 µs, or queued behind this thread until it is
/// moved) still takes a share of what remains. While this thread works and the helper has
/// not started, the helper is moved off this CPU once [`STARVED`] has passed, rather than
/// after this thread's half as in [`run_split`]. A parked helper is woken when `wake` is set,
/// else as [`worth_waking`] says. Returns when every chunk has run; a panic in `f` is resumed
/// here.
///
/// Why: through the pool (the caller sleeping while two workers are woken), a 4096×1024
/// softmax on the 2-core EPYC ran near one thread's rate (1.05–1.48 ms; one thread 1.27)
/// in most processes, and in 2 of 8 at 0.64–0.66 ms; shared this way, processes alternated
/// with the pool's gave medians of 0.83 ms against 1.04 (log-softmax 1.00 against 1.40;
/// session 54, `bench/tools/serve_ab.py`).
pub(crate) fn share(n_chunks: usize, f: &(dyn Fn(usize) + Sync), wake: bool) {
    // Chunks not yet taken: [front, back), packed as front | back << 32.
    let left = AtomicU64::new((n_chunks as u64) << 32);
    let take = |from_front: bool| -> Option<usize> {
        let mut cur = left.load(Ordering::Relaxed);
        loop {
            let (front, back) = (cur & 0xffff_ffff, cur >> 32);
            if front >= back {
                return None;
            }
            let (next, i) = if from_front {
                (cur + 1, front)
            } else {
                (front | (back - 1) << 32, back - 1)
            };
            match left.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(i as usize),
                Err(now) => cur = now,
            }
        }
    };
    assert!((n_chunks as u64) < 1 << 32, "share: {n_chunks} chunks");
    split(
        |nudge| {
            while let Some(i) = take(true) {
                f(i);
                nudge.check();
            }
        },
        &|| {
            while let Some(i) = take(false) {
                f(i);
                // The scheduler may have queued this thread on the caller's CPU since it
                // took the job: then the two take turns on one core.
                leave_caller_cpu();
            }
        },
        wake,
    )
}

/// What the caller's own share of a split may call between pieces of its work: moves a
/// helper that has not taken its share after [`STARVED`] off the caller's CPU, once.
struct Nudge<'a> {
    /// `(helper, job address, caller's CPU, when the job was offered)`; `None` when nothing
    /// was offered (no helper, or this thread runs both shares).
    offered: Option<(&'a Helper, usize, usize, Instant)>,
    done: std::cell::Cell<bool>,
}

impl Nudge<'_> {
    fn check(&self) {
        let Some((h, addr, cpu, since)) = self.offered else {
            return;
        };
        if let Some(now) = current_cpu() {
            CALLER_CPU.store(now, Ordering::Relaxed);
        }
        if self.done.get() || h.slot.load(Ordering::Acquire) != addr {
            return;
        }
        let tid = h.tid.load(Ordering::Relaxed);
        if tid != 0 && since.elapsed() > STARVED {
            push_off_cpu(tid, cpu);
            self.done.set(true);
        }
    }
}

/// [`run_split`], waking a parked helper always (`always_wake`) or as [`worth_waking`] says.
/// `first` gets a [`Nudge`] it may check between pieces of its work.
fn split(first: impl FnOnce(&Nudge), second: &(dyn Fn() + Sync), always_wake: bool) {
    let alone = Nudge {
        offered: None,
        done: std::cell::Cell::new(false),
    };
    struct Stamp;
    impl Drop for Stamp {
        fn drop(&mut self) {
            LAST_SPLIT_NS.store(now_ns(), Ordering::Relaxed);
        }
    }
    let _stamp = Stamp;
    let h = match helper() {
        Some(h) => h,
        None => {
            first(&alone);
            second();
            return;
        }
    };
    if h.sleeping.load(Ordering::SeqCst) && !always_wake && !worth_waking() {
        first(&alone);
        second();
        return;
    }
    if STAND_DOWN.load(Ordering::Relaxed) {
        STAND_DOWN.store(false, Ordering::Relaxed);
    }
    let caller_cpu = current_cpu();
    if let Some(cpu) = caller_cpu {
        CALLER_CPU.store(cpu, Ordering::Relaxed);
    }
    let job = Job {
        f: second,
        state: AtomicU8::new(0),
    };
    let addr = &job as *const Job as usize;
    if h.slot
        .compare_exchange(0, addr, Ordering::SeqCst, Ordering::Relaxed)
        .is_err()
    {
        // Another caller's job is waiting: no helper for this one.
        first(&alone);
        second();
        return;
    }
    if h.sleeping.load(Ordering::SeqCst) {
        if let Some(t) = h.thread.get() {
            t.unpark();
        }
        // The woken helper is often queued on this CPU, where it would wait until `first`
        // is done and then find its half taken back (a product at one thread's rate). A
        // yield lets it run now, and on waking it moves itself off this CPU; where it woke
        // elsewhere, the yields return at once.
        for _ in 0..2 {
            if h.slot.load(Ordering::Acquire) != addr {
                break;
            }
            std::thread::yield_now();
        }
    }
    // The job is on this stack: whatever `first` does, it must be out of the slot or done
    // before this frame ends.
    let started = Instant::now();
    let nudge = Nudge {
        offered: caller_cpu.map(|cpu| (h, addr, cpu, started)),
        done: std::cell::Cell::new(false),
    };
    let mine = catch_unwind(AssertUnwindSafe(|| first(&nudge)));
    if h.slot
        .compare_exchange(addr, 0, Ordering::SeqCst, Ordering::Relaxed)
        .is_ok()
    {
        // Not taken in time: run it here. The helper was awake or has just been woken; if
        // it did not take a half that long, it is likely queued on this CPU behind this
        // thread (a short half may just have been quicker than its poll).
        let tid = h.tid.load(Ordering::Relaxed);
        if let (Some(cpu), true) = (
            caller_cpu,
            tid != 0 && started.elapsed() > STARVED && !nudge.done.get(),
        ) {
            push_off_cpu(tid, cpu);
        }
        second();
    } else {
        let mut polls = 0u32;
        while job.state.load(Ordering::Acquire) == 0 {
            polls += 1;
            if polls.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        if job.state.load(Ordering::Acquire) == 2 {
            resume_unwind(Box::new("a kernel panicked on kiln's helper thread"));
        }
    }
    if let Err(p) = mine {
        resume_unwind(p);
    }
}

#[cfg(test)]
mod tests {
    use super::run_split;

    /// A spinning thread pushed off the CPU it runs on is on another CPU's queue when the
    /// push returns (the kernel migrates it before `sched_setaffinity` returns; read from
    /// `/proc`, since once its affinity is back the scheduler may move it again), and keeps
    /// the affinity it had.
    #[cfg(target_os = "linux")]
    #[test]
    fn push_off_cpu_moves_a_thread_and_restores_its_affinity() {
        use std::sync::atomic::{AtomicBool, AtomicI32};
        let allowed = std::thread::available_parallelism().map_or(1, |n| n.get());
        if allowed < 2 {
            eprintln!("one CPU: nothing to move to");
            return;
        }
        let (tid, stop) = (AtomicI32::new(0), AtomicBool::new(false));
        let affinity = |t: i32| {
            // SAFETY: a zeroed cpu_set_t is valid; the call writes only into it.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                assert_eq!(
                    libc::sched_getaffinity(t, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
                    0
                );
                (0..libc::CPU_SETSIZE as usize)
                    .filter(|&c| libc::CPU_ISSET(c, &set))
                    .collect::<Vec<_>>()
            }
        };
        // The CPU a thread last ran on or is queued on: field 39 of its stat line.
        let cpu_of = |t: i32| -> usize {
            let stat = std::fs::read_to_string(format!("/proc/self/task/{t}/stat")).unwrap();
            let after_name = &stat[stat.rfind(')').unwrap() + 1..];
            after_name
                .split_whitespace()
                .nth(36)
                .unwrap()
                .parse()
                .unwrap()
        };
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: `gettid` only returns this thread's id.
                tid.store(unsafe { libc::gettid() }, Ordering::SeqCst);
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
            while tid.load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            let t = tid.load(Ordering::SeqCst);
            let before = affinity(t);
            let mut moved = 0;
            for _ in 0..20 {
                let from = cpu_of(t);
                super::push_off_cpu(t, from);
                moved += usize::from(cpu_of(t) != from);
            }
            stop.store(true, Ordering::Relaxed);
            assert!(moved >= 18, "moved off its CPU in {moved} of 20 pushes");
            assert_eq!(affinity(t), before, "affinity not restored");
        });
    }

    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn both_halves_run_exactly_once_from_many_callers() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for i in 0..2000 {
                        let a = AtomicUsize::new(0);
                        run_split(
                            || {
                                a.fetch_add(1, Ordering::Relaxed);
                            },
                            &|| {
                                a.fetch_add(10, Ordering::Relaxed);
                            },
                        );
                        assert_eq!(a.load(Ordering::Relaxed), 11, "call {i}");
                        total.fetch_add(1, Ordering::Relaxed);
                        if i % 500 == 0 {
                            // Long enough for the helper to park: the next call wakes it.
                            std::thread::sleep(std::time::Duration::from_millis(2));
                        }
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 8000);
    }

    /// With a first half long enough for the helper to wake, the second half runs on the
    /// helper (another thread) and its panic is resumed on the caller; the helper survives.
    #[test]
    fn the_helper_takes_second_halves_and_reports_their_panics() {
        let slow_first = || std::thread::sleep(std::time::Duration::from_millis(5));
        let me = std::thread::current().id();
        let elsewhere = std::sync::Mutex::new(0);
        for _ in 0..20 {
            run_split(slow_first, &|| {
                if std::thread::current().id() != me {
                    *elsewhere.lock().unwrap() += 1;
                }
            });
        }
        assert!(
            *elsewhere.lock().unwrap() > 0,
            "the helper never took a second half"
        );
        let mut reached = false;
        for _ in 0..20 {
            let r = std::panic::catch_unwind(|| {
                run_split(slow_first, &|| {
                    if std::thread::current().id() != me {
                        panic!("second half on the helper");
                    }
                });
            });
            if r.is_err() {
                reached = true;
                break;
            }
        }
        assert!(reached, "no panic of the helper reached the caller");
        let a = AtomicUsize::new(0);
        run_split(slow_first, &|| {
            a.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(a.load(Ordering::Relaxed), 1);
    }

    /// Every chunk of a shared split runs exactly once, from several callers at once (the
    /// helper serves one of them at a time, the others run alone), with the helper asleep
    /// or awake; and a helper that is awake takes chunks from the back.
    #[test]
    fn shared_chunks_run_exactly_once_and_the_helper_takes_some() {
        use super::share;
        let helper_took = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for caller in 0..3 {
                let helper_took = &helper_took;
                s.spawn(move || {
                    let me = std::thread::current().id();
                    for call in 0..300 {
                        let n = 1 + (call * 7 + caller) % 40;
                        let runs: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                        share(
                            n,
                            &|i| {
                                runs[i].fetch_add(1, Ordering::Relaxed);
                                if std::thread::current().id() != me {
                                    helper_took.fetch_add(1, Ordering::Relaxed);
                                }
                                // Chunks long enough for a woken helper to arrive.
                                let t = std::time::Instant::now();
                                while t.elapsed() < std::time::Duration::from_micros(20) {}
                            },
                            call % 2 == 0,
                        );
                        for (i, r) in runs.iter().enumerate() {
                            assert_eq!(
                                r.load(Ordering::Relaxed),
                                1,
                                "call {call}: chunk {i} of {n}"
                            );
                        }
                        if call % 100 == 0 {
                            std::thread::sleep(std::time::Duration::from_millis(2));
                        }
                    }
                });
            }
        });
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cores >= 2 {
            assert!(
                helper_took.load(Ordering::Relaxed) > 0,
                "the helper never took a chunk"
            );
        }
    }

    /// A panic in a chunk reaches the caller, whichever thread ran it; the helper survives
    /// it.
    #[test]
    fn a_panic_in_a_shared_chunk_reaches_the_caller() {
        use super::share;
        for bad in [0, 5, 9] {
            let runs: Vec<AtomicUsize> = (0..10).map(|_| AtomicUsize::new(0)).collect();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                share(
                    10,
                    &|i| {
                        runs[i].fetch_add(1, Ordering::Relaxed);
                        assert!(i != bad, "chunk {i}");
                    },
                    true,
                )
            }));
            assert!(r.is_err(), "chunk {bad}'s panic was lost");
            assert_eq!(runs[bad].load(Ordering::Relaxed), 1);
            // Chunks after a panic may be left undone (the op is lost anyway), never run twice.
            for (i, r) in runs.iter().enumerate() {
                assert!(r.load(Ordering::Relaxed) <= 1, "chunk {i} ran twice");
            }
        }
        let a = AtomicUsize::new(0);
        share(
            4,
            &|_| {
                a.fetch_add(1, Ordering::Relaxed);
            },
            true,
        );
        assert_eq!(a.load(Ordering::Relaxed), 4);
    }
}

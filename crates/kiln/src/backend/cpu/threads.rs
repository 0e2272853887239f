//! The CPU backend's thread pool: rayon, with a settable thread count.

use std::sync::{Arc, OnceLock, RwLock};

/// Work below this many elements runs on the calling thread: spawning costs more.
pub(crate) const PARALLEL_THRESHOLD: usize = 1 << 15;

/// Whether `n` elements of work go to the pool: at least [`PARALLEL_THRESHOLD`], and a pool of
/// more than one thread (with `set_num_threads(1)`, handing the work over would only move it
/// to the pool's thread, a wake-up of 20-50 us on the 2-core CI-sized machine).
pub(crate) fn goes_parallel(n: usize) -> bool {
    n >= PARALLEL_THRESHOLD && num_threads() > 1
}

/// Work (elements times relative cost, 1 = a copy, about 0.25 ns) that pays for handing a
/// share to another thread. Measured on the 2-core CI-sized machine (`docs/benchmarks.md`,
/// "Threading grain"): waking a rayon worker there costs 20-50 us, so an op goes parallel
/// only when one thread would take over ~100 us (a 512K-element add, a 128K-element exp, a
/// 52K-element GELU).
pub(crate) const GRAIN_WORK: usize = 1 << 19;

/// The grain in use: [`GRAIN_WORK`], or `KILN_CPU_GRAIN` (copy-equivalent elements, read
/// once) on machines where waking a thread costs less or more than on the one measured.
fn grain_work() -> usize {
    static GRAIN: OnceLock<usize> = OnceLock::new();
    *GRAIN.get_or_init(|| match std::env::var("KILN_CPU_GRAIN") {
        Ok(s) => s
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&g| g > 0)
            .unwrap_or_else(|| {
                eprintln!(
                    "kiln: KILN_CPU_GRAIN={s:?} is not a positive integer; using {GRAIN_WORK}"
                );
                GRAIN_WORK
            }),
        Err(_) => GRAIN_WORK,
    })
}

/// How many tasks to split `n` elements of an op of relative cost `cost` into: 1 below the
/// grain, at most one per thread above it.
pub(crate) fn parallel_split(n: usize, cost: usize) -> usize {
    let work = n.saturating_mul(cost.max(1));
    let grain = grain_work();
    if work < grain {
        return 1;
    }
    (work / grain).clamp(1, num_threads())
}

/// Work (as in [`GRAIN_WORK`]) from which an op is split in two through the hot helper
/// (`hot_helper.rs`), which costs about a microsecond when the helper is awake and nothing
/// but a wake-up call when it is not (the caller then runs both halves).
pub(crate) const HOT_GRAIN_WORK: usize = 1 << 15;

/// Whether an op of `n` elements of relative cost `cost` is split in two through the hot
/// helper: at least [`HOT_GRAIN_WORK`] and at least two threads allowed.
/// `KILN_CPU_HOT_HELPER=0` turns the helper off.
pub(crate) fn splits_in_two(n: usize, cost: usize) -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("KILN_CPU_HOT_HELPER").map_or(true, |v| v != "0"));
    on && n.saturating_mul(cost.max(1)) >= HOT_GRAIN_WORK && num_threads() >= 2
}

/// Whether a split of `n` elements of relative cost `cost` is long enough to wake a parked
/// hot helper for (four times the grain: about 400 µs on one thread of the 2-core EPYC,
/// against a wake-up of 20–50 µs); shorter ones wake it only when splits come back to back.
pub(crate) fn wakes_helper(n: usize, cost: usize) -> bool {
    n.saturating_mul(cost.max(1)) >= grain_work().saturating_mul(4)
}

/// Whether an op the pool would run as two tasks (`parallel_split(n, cost) == 2`) is shared
/// between the calling thread and the hot helper instead (`hot_helper::share`): with the
/// helper on, and not from a pool thread (whose work is already spread over the cores).
/// Through the pool the caller sleeps while two workers are woken, and on the 2-core EPYC
/// most processes ran such ops near one thread's rate throughout (a 4096×1024 softmax:
/// 1.05–1.48 ms in 6 of 8 processes, 0.64–0.66 in the others; session 54).
pub(crate) fn shares_with_helper(n: usize, cost: usize) -> bool {
    splits_in_two(n, cost) && rayon::current_thread_index().is_none()
}

fn pool_slot() -> &'static RwLock<Option<Arc<rayon::ThreadPool>>> {
    static POOL: OnceLock<RwLock<Option<Arc<rayon::ThreadPool>>>> = OnceLock::new();
    POOL.get_or_init(|| RwLock::new(None))
}

/// Sets the number of threads the CPU backend uses for large ops (GEMM included).
/// `0` restores the default (rayon's global pool: one thread per core, or `RAYON_NUM_THREADS`).
///
/// ```
/// kiln::set_num_threads(1).unwrap();
/// assert_eq!(kiln::num_threads(), 1);
/// kiln::set_num_threads(0).unwrap();
/// ```
pub fn set_num_threads(n: usize) -> crate::Result<()> {
    let pool = if n == 0 {
        None
    } else {
        let p = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .map_err(|e| crate::Error::Msg(format!("set_num_threads({n}): {e}")))?;
        Some(Arc::new(p))
    };
    *pool_slot().write().unwrap_or_else(|e| e.into_inner()) = pool;
    Ok(())
}

/// The number of threads large CPU ops use.
pub fn num_threads() -> usize {
    match &*pool_slot().read().unwrap_or_else(|e| e.into_inner()) {
        Some(p) => p.current_num_threads(),
        None => rayon::current_num_threads(),
    }
}

/// Runs `f` inside the configured pool.
pub(crate) fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    super::hot_helper::stand_down();
    let pool = pool_slot()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    match pool {
        Some(p) => p.install(f),
        None => f(),
    }
}

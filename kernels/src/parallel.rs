//! How kernels split work for rayon.
//!
//! Work is cut into pieces of [`PIECE`] elements; inputs under
//! [`MIN_PARALLEL`] elements run on the calling thread, because below that
//! the cost of waking the pool exceeds the work.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rayon::prelude::*;

/// Elements per unit of parallel work (64 KiB of f32 per buffer).
pub(crate) const PIECE: usize = 1 << 14;

/// Inputs shorter than this run on the calling thread. At 2^15 a ViT
/// step's element-wise kernels (576×64 activations) woke the pool for a
/// few microseconds of work each; at 2^17 the step is 15 % shorter
/// (`docs/benchmarks.md`, vit_digits).
pub(crate) const MIN_PARALLEL: usize = 1 << 17;

/// How long the pool's workers stay awake after a threaded GEMM unless
/// `CISTERN_GEMM_WARM_US` says otherwise (0: not at all).
const WARM_WINDOW_US: u64 = 200;

/// The window [`keep_warm`] runs after a threaded GEMM: `WARM_WINDOW_US`,
/// or `CISTERN_GEMM_WARM_US` microseconds (read once; 0 turns it off).
pub(crate) fn warm_window() -> Option<Duration> {
    static WINDOW: OnceLock<Option<Duration>> = OnceLock::new();
    *WINDOW.get_or_init(|| window_from(std::env::var("CISTERN_GEMM_WARM_US").ok().as_deref()))
}

/// The window a `CISTERN_GEMM_WARM_US` value asks for: the default where
/// it is absent or not a whole number, none at 0.
fn window_from(value: Option<&str>) -> Option<Duration> {
    let micros = value
        .and_then(|value| value.trim().parse::<u64>().ok())
        .unwrap_or(WARM_WINDOW_US);
    (micros > 0).then(|| Duration::from_micros(micros))
}

/// The waiters [`keep_warm`] has alive on rayon's pools: at most one per
/// worker of the pool that spawns them, so a waiter that runs a later
/// waiter inside itself (it runs whatever reaches the pool) cannot nest
/// them without end over a long run of kernels.
static WAITERS: AtomicUsize = AtomicUsize::new(0);

/// The waiters alive on the helper pool ([`helper_pool`]), as `WAITERS`.
static HELPER_WAITERS: AtomicUsize = AtomicUsize::new(0);

/// Keeps every worker of the current rayon pool awake for `window`
/// ([`warm`]).
pub(crate) fn keep_warm(window: Duration) {
    warm(window, rayon::current_num_threads(), &WAITERS, |job| {
        rayon::spawn(job)
    });
}

/// Keeps the pool that [`fork_each`] ran its items on awake for the GEMM's
/// window ([`warm_window`]): the helper pool where the caller took an
/// item, else the current one.
pub(crate) fn keep_warm_after_fork(caller_took_one: bool) {
    let Some(window) = warm_window() else {
        return;
    };
    match caller_took_one.then(helper_pool).flatten() {
        Some(pool) => warm(window, pool.current_num_threads(), &HELPER_WAITERS, |job| {
            pool.spawn(job)
        }),
        None => keep_warm(window),
    }
}

/// Keeps up to `workers` workers of a pool awake for `window`, running
/// whatever work reaches the pool meanwhile (and `window` again after
/// each), then lets them sleep; where `waiters` are already alive, they
/// carry on instead. `spawn` puts a job on the pool. A worker woken from
/// sleep starts 50–130 µs late on a VM, a few percent of a 2 ms product;
/// OpenMP's teams spin between regions for the same reason. An idle
/// worker yields its core to any other thread that wants it.
fn warm(
    window: Duration,
    workers: usize,
    waiters: &'static AtomicUsize,
    spawn: impl Fn(Box<dyn FnOnce() + Send>),
) {
    let claim = || {
        waiters
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |live| {
                (live < workers).then_some(live + 1)
            })
            .is_ok()
    };
    while claim() {
        spawn(Box::new(move || {
            let mut until = Instant::now() + window;
            loop {
                match rayon::yield_now() {
                    Some(rayon::Yield::Executed) => until = Instant::now() + window,
                    _ => std::thread::yield_now(),
                }
                if Instant::now() >= until {
                    break;
                }
            }
            waiters.fetch_sub(1, Ordering::AcqRel);
        }));
    }
}

/// The pool [`fork_each`] spawns onto from a caller outside rayon's pools:
/// one thread fewer than the global pool (the caller is the other), at
/// least one; built on first use (none where its threads cannot start).
/// Sized so, a product split over the cores runs on exactly as many
/// threads: a third woken beside the caller and one worker (as the
/// global pool's sleeping ones are when work reaches it) took a core from
/// them for milliseconds at a time on a 2-vCPU VM.
fn helper_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(rayon::current_num_threads().saturating_sub(1).max(1))
            .thread_name(|index| format!("cistern-gemm-{index}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// Runs `f` on each piece of `dst` with the index of its first element,
/// compiled for AVX2 and FMA where the CPU has them (`with_wide_vectors`).
pub(crate) fn for_each_indexed(dst: &mut [f32], f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if dst.len() < MIN_PARALLEL {
        with_wide_vectors(
            #[inline(always)]
            || f(0, dst),
        );
    } else {
        dst.par_chunks_mut(PIECE)
            .enumerate()
            .for_each(|(piece, dst)| {
                with_wide_vectors(
                    #[inline(always)]
                    || f(piece * PIECE, dst),
                )
            });
    }
}

/// Runs `f` on matching pieces of `dst` and `src` (equal lengths).
pub(crate) fn zip_mut(dst: &mut [f32], src: &[f32], f: impl Fn(&mut [f32], &[f32]) + Sync + Send) {
    debug_assert_eq!(dst.len(), src.len());
    if dst.len() < MIN_PARALLEL {
        f(dst, src);
    } else {
        dst.par_chunks_mut(PIECE)
            .zip(src.par_chunks(PIECE))
            .for_each(|(d, s)| f(d, s));
    }
}

/// Runs `f` on matching pieces of `dst`, `a` and `b` (equal lengths).
pub(crate) fn zip2_mut(
    dst: &mut [f32],
    a: &[f32],
    b: &[f32],
    f: impl Fn(&mut [f32], &[f32], &[f32]) + Sync + Send,
) {
    debug_assert!(dst.len() == a.len() && a.len() == b.len());
    if dst.len() < MIN_PARALLEL {
        f(dst, a, b);
    } else {
        dst.par_chunks_mut(PIECE)
            .zip(a.par_chunks(PIECE))
            .zip(b.par_chunks(PIECE))
            .for_each(|((d, a), b)| f(d, a, b));
    }
}

/// Spins before a thread in [`spin_until`] starts yielding its core.
const SPINS: u32 = 1024;

/// Waits for `done` without sleeping: spins a while, then yields the core
/// between looks. For waits of microseconds on work another running
/// thread is finishing, where a sleep's wake-up (50–130 µs on a VM) would
/// cost more than the wait.
pub(crate) fn spin_until(mut done: impl FnMut() -> bool) {
    let mut spins = 0;
    while !done() {
        if spins < SPINS {
            spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Runs `f` on every item in parallel. A caller outside rayon's pools
/// takes the first item itself, the rest spawned onto the helper pool
/// ([`helper_pool`]), then spins until they end rather than sleeping:
/// waking a sleeping thread costs 50–130 µs on a VM, which OpenMP's master
/// thread avoids by working in its team. Inside a pool (or without the
/// helper pool) rayon's own fork-join runs them on it. Returns whether the
/// caller took an item.
pub(crate) fn fork_each<T: Send>(work: Vec<T>, f: impl Fn(T) + Sync + Send) -> bool {
    let outside = rayon::current_thread_index().is_none() && work.len() > 1;
    let Some(pool) = outside.then(helper_pool).flatten() else {
        work.into_par_iter().for_each(f);
        return false;
    };
    let mut work = work.into_iter();
    let first = work.next();
    let pending = AtomicUsize::new(work.len());
    pool.in_place_scope(|scope| {
        for item in work {
            let (f, pending) = (&f, &pending);
            scope.spawn(move |_| {
                // Counted even if `f` panics (the scope re-raises it), so
                // that the caller's wait ends.
                let _counted = Counted(pending);
                f(item);
            });
        }
        if let Some(first) = first {
            f(first);
        }
        spin_until(|| pending.load(Ordering::Acquire) == 0);
    });
    true
}

/// Counts one of [`fork_each`]'s spawned items done when dropped.
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// Runs `f` on every item, in parallel when `parallel`.
pub(crate) fn run<T: Send>(work: Vec<T>, parallel: bool, f: impl Fn(T) + Sync + Send) {
    if parallel {
        work.into_par_iter().for_each(f);
    } else {
        work.into_iter().for_each(f);
    }
}

/// Maps every item to a result, in order, in parallel when `parallel`.
pub(crate) fn map<T: Send, R: Send>(
    work: Vec<T>,
    parallel: bool,
    f: impl Fn(T) -> R + Sync + Send,
) -> Vec<R> {
    if parallel {
        work.into_par_iter().map(f).collect()
    } else {
        work.into_iter().map(f).collect()
    }
}

/// `Σ x²` in f64, with independent accumulators so the loop vectorizes.
#[inline(always)]
pub(crate) fn sum_squares(x: &[f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            let v = f64::from(v);
            *a += v * v;
        }
    }
    let tail_sum: f64 = tail.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    acc.iter().sum::<f64>() + tail_sum
}

/// `Σ x` in f64, with independent accumulators so the loop vectorizes.
pub(crate) fn sum(x: &[f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a += f64::from(v);
        }
    }
    acc.iter().sum::<f64>() + tail.iter().map(|&v| f64::from(v)).sum::<f64>()
}

/// Calls `f` from code compiled for AVX2 and FMA when the CPU has them,
/// else as is.
///
/// Division and square root dominate the optimizer loops under the SSE2
/// baseline; AVX2 doubles their width. IEEE `+ − × ÷ √` round the same at
/// every width and Rust forms no FMA unasked, so results are bit-identical
/// either way; an explicit `mul_add` is one instruction here and a
/// (correctly rounded, slower) call elsewhere. `f` must be inlined into
/// the clone to benefit: callers pass closures marked `#[inline(always)]`.
#[inline(always)]
pub(crate) fn with_wide_vectors<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports AVX2 and FMA, checked just above.
        return unsafe { avx2_fma(f) };
    }
    f()
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_fma<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use rayon::prelude::*;

    use super::{WAITERS, WARM_WINDOW_US, fork_each, keep_warm, window_from};

    fn two_threads() -> rayon::ThreadPool {
        match rayon::ThreadPoolBuilder::new().num_threads(2).build() {
            Ok(pool) => pool,
            Err(error) => panic!("a pool of 2 threads: {error}"),
        }
    }

    #[test]
    fn the_warm_window_is_the_default_unless_a_whole_number_says_otherwise() {
        let default = Some(Duration::from_micros(WARM_WINDOW_US));
        assert_eq!(window_from(None), default);
        assert_eq!(window_from(Some("lots")), default);
        assert_eq!(window_from(Some(" 500 ")), Some(Duration::from_micros(500)));
        assert_eq!(window_from(Some("0")), None);
    }

    #[test]
    fn work_sent_to_a_pool_kept_warm_runs_on_it() {
        let pool = two_threads();
        pool.install(|| keep_warm(Duration::from_millis(20)));
        let sum: u64 = pool.install(|| (0..100_000u64).into_par_iter().sum());
        assert_eq!(sum, 100_000 * 99_999 / 2);
    }

    #[test]
    fn a_pool_kept_warm_again_and_again_keeps_at_most_one_waiter_per_worker() {
        let pool = two_threads();
        for _ in 0..1000 {
            pool.install(|| keep_warm(Duration::from_millis(20)));
        }
        // Other tests' products keep the global pool warm meanwhile.
        let most = rayon::current_num_threads().max(2);
        let live = WAITERS.load(Ordering::Acquire);
        assert!(
            live <= most,
            "{live} waiters alive, at most {most} expected"
        );
    }

    #[test]
    fn fork_each_runs_every_item_once_the_first_on_a_caller_outside_the_pool() {
        let caller = std::thread::current().id();
        let runs: Vec<AtomicUsize> = (0..5).map(|_| AtomicUsize::new(0)).collect();
        let first_ran_here = AtomicUsize::new(0);
        let took_one = fork_each((0..5).collect(), |item: usize| {
            runs[item].fetch_add(1, Ordering::Relaxed);
            if item == 0 && std::thread::current().id() == caller {
                first_ran_here.fetch_add(1, Ordering::Relaxed);
            }
        });
        assert!(took_one);
        assert_eq!(first_ran_here.load(Ordering::Relaxed), 1);
        assert!(runs.iter().all(|runs| runs.load(Ordering::Relaxed) == 1));
        // Inside the pool, rayon's fork-join runs them all.
        let sum = AtomicUsize::new(0);
        let took_one = two_threads().install(|| {
            fork_each((1..=10).collect(), |item: usize| {
                sum.fetch_add(item, Ordering::Relaxed);
            })
        });
        assert!(!took_one);
        assert_eq!(sum.load(Ordering::Relaxed), 55);
    }

    #[test]
    fn a_panicking_item_of_fork_each_reaches_its_caller_instead_of_hanging_it() {
        let outcome = std::panic::catch_unwind(|| {
            fork_each(vec![0, 1, 2], |item: usize| {
                assert_ne!(item, 2, "item 2 fails");
            })
        });
        assert!(outcome.is_err());
    }
}

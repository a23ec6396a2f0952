//! The machine's single-precision FMA peak, measured: independent fused
//! multiply-adds on every core, no memory traffic, at the widest vector the
//! CPU has (AVX-512 where present, else AVX2 + FMA). `bench gemm` prints it
//! so its GFLOP/s read against what the cores can do at all in the same run.

use std::time::Instant;

/// Vector FMAs per chain per thread in one measurement; a hundredth in a
/// debug build (the tests), whose unoptimized loop measures no peak anyway.
const ITERATIONS: u64 = if cfg!(debug_assertions) {
    200_000
} else {
    20_000_000
};
/// Measurements taken; the fastest is the peak, since a vCPU shared with
/// other guests only ever runs slower than its cores can.
const MEASUREMENTS: usize = 5;
/// Independent accumulators: enough to cover the FMA latency (4 cycles) on
/// two FMA pipes with room to spare.
const CHAINS: usize = 12;

/// A measured FMA peak.
#[derive(Debug, Clone, Copy)]
pub struct FmaPeak {
    /// Single-precision GFLOP/s over all the threads (an FMA is 2 flops).
    pub gflops: f64,
    /// The width of the FMAs measured: 512 or 256.
    pub vector_bits: u32,
}

/// The FMA peak on `threads` threads at the widest width the CPU supports,
/// or `None` on a CPU without AVX2 + FMA.
pub fn fma_peak(threads: usize) -> Option<FmaPeak> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F is present, checked just above.
            return measure(threads, 512, || unsafe { chains_512(ITERATIONS) });
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: AVX2 and FMA are present, checked just above.
            return measure(threads, 256, || unsafe { chains_256(ITERATIONS) });
        }
    }
    let _ = threads;
    None
}

/// The fastest of [`MEASUREMENTS`] runs of `chains` on `threads` threads.
#[cfg(target_arch = "x86_64")]
fn measure(threads: usize, vector_bits: u32, chains: fn() -> f32) -> Option<FmaPeak> {
    (0..MEASUREMENTS)
        .map(|_| measure_once(threads, vector_bits, chains))
        .try_fold(None::<FmaPeak>, |best, peak| {
            let peak = peak?;
            Some(Some(match best {
                Some(best) if best.gflops >= peak.gflops => best,
                _ => peak,
            }))
        })
        .flatten()
}

/// Runs `chains` on `threads` threads at once; the sums are checked so the
/// work cannot be optimized away.
#[cfg(target_arch = "x86_64")]
fn measure_once(threads: usize, vector_bits: u32, chains: fn() -> f32) -> Option<FmaPeak> {
    let start = Instant::now();
    let sums: Vec<f32> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads).map(|_| scope.spawn(chains)).collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    if sums.len() != threads || sums.iter().any(|s| !s.is_finite()) {
        return None;
    }
    let lanes = f64::from(vector_bits / 32);
    let flops = ITERATIONS as f64 * CHAINS as f64 * lanes * 2.0 * threads as f64;
    Some(FmaPeak {
        gflops: flops / seconds / 1e9,
        vector_bits,
    })
}

/// # Safety
/// The CPU must support AVX-512F.
// AVX-512 intrinsics are stable from 1.89, which this package needs anyway
// through cistern-kernels (gemm-f32's x86-v4 kernels).
#[clippy::msrv = "1.89"]
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn chains_512(iterations: u64) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_set1_ps(0.0); CHAINS];
    let a = _mm512_set1_ps(0.999_999);
    let b = _mm512_set1_ps(1e-7);
    for _ in 0..iterations {
        for x in acc.iter_mut() {
            *x = _mm512_fmadd_ps(*x, a, b);
        }
    }
    acc.iter().map(|&x| _mm512_reduce_add_ps(x)).sum()
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chains_256(iterations: u64) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_set1_ps(0.0); CHAINS];
    let a = _mm256_set1_ps(0.999_999);
    let b = _mm256_set1_ps(1e-7);
    for _ in 0..iterations {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    let mut lanes = [0.0f32; 8];
    let mut sum = 0.0;
    for x in acc {
        // SAFETY: `lanes` holds 8 f32, the width of the store.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), x) };
        sum += lanes.iter().sum::<f32>();
    }
    sum
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_peak_is_positive_where_it_can_be_measured() {
        if let Some(peak) = super::fma_peak(1) {
            assert!(peak.gflops > 0.0 && peak.gflops.is_finite());
            assert!(peak.vector_bits == 512 || peak.vector_bits == 256);
        }
    }
}

//! The machine's single-precision FMA peak, measured: independent fused
//! multiply-adds on every core, no memory traffic. `bench gemm` prints it so
//! its GFLOP/s read against what the cores can do at all in the same run.

use std::time::Instant;

/// Vector FMAs per thread per measurement (each is 8 lanes × 2 flops).
const ITERATIONS: u64 = 100_000_000;
/// Independent accumulators: enough to cover the FMA latency on two pipes.
const CHAINS: usize = 12;

/// GFLOP/s of 256-bit FMAs on `threads` threads, or `None` without AVX2/FMA.
pub fn fma_peak_gflops(threads: usize) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        let start = Instant::now();
        let sums: Vec<f32> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    // SAFETY: AVX2 and FMA are present, checked just above.
                    scope.spawn(|| unsafe { fma_chains(ITERATIONS) })
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        let seconds = start.elapsed().as_secs_f64();
        if sums.len() != threads || sums.iter().any(|s| !s.is_finite()) {
            return None;
        }
        let flops = ITERATIONS as f64 * CHAINS as f64 * 8.0 * 2.0 * threads as f64;
        return Some(flops / seconds / 1e9);
    }
    let _ = threads;
    None
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_chains(iterations: u64) -> f32 {
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
        if let Some(gflops) = super::fma_peak_gflops(1) {
            assert!(gflops > 0.0 && gflops.is_finite());
        }
    }
}

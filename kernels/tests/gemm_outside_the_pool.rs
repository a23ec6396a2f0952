//! The GEMM called from a thread outside rayon's pool, as the server's
//! stream executors call it: the caller computes one block of C itself
//! and waits for the pool's, with C split by columns (op(A) packed once,
//! block by block, by whichever task reaches a block first) and by rows
//! (op(B) packed once before the blocks start). This binary's global
//! pool has three threads, so that three tasks meet on every shape.

#[path = "common/gemm_reference.rs"]
mod gemm_reference;

use cistern_kernels::{Activation, GemmKernel, GemmSpec, erfc, gemm_with};
use cistern_memory::SplitMix64;
use gemm_reference::reference;

const THREADS: usize = 3;

/// Sizes global pool of this test binary (every test calls it first; the
/// first call builds it).
fn pool_of_three() {
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(THREADS)
        .build_global();
    assert_eq!(rayon::current_num_threads(), THREADS);
    assert!(
        rayon::current_thread_index().is_none(),
        "not outside the pool"
    );
}

fn check(kernel: GemmKernel, spec: &GemmSpec, rng: &mut SplitMix64) {
    let a = rng.symmetric_f32s(spec.m * spec.k);
    let b = rng.symmetric_f32s(spec.k * spec.n);
    let bias = rng.symmetric_f32s(spec.n);
    let mut c = vec![f32::NAN; spec.m * spec.n];
    if let Err(error) = gemm_with(kernel, spec, &a, &b, Some(&bias), &mut c) {
        panic!("{kernel:?} {spec:?}: {error}");
    }
    for (index, (&got, &(want, magnitude))) in c
        .iter()
        .zip(&reference(spec, &a, &b, Some(&bias)))
        .enumerate()
    {
        assert!(
            (f64::from(got) - want).abs() <= 1e-5 * (magnitude + 1.0),
            "{kernel:?} {spec:?} at ({}, {}): {got} vs {want}",
            index / spec.n,
            index % spec.n
        );
    }
}

#[test]
fn a_product_called_from_outside_the_pool_matches_the_reference_split_either_way() {
    pool_of_three();
    let mut rng = SplitMix64::new(47);
    // By columns with two row blocks of A and two k blocks; by rows; by
    // columns with more than one column block per task (A's blocks read
    // again, packed, by the second). Every size off the tile boundaries.
    let shapes = [(200, 389, 300), (389, 131, 300), (37, 3203, 41)];
    for (m, n, k) in shapes {
        for (transpose_a, transpose_b) in
            [(false, false), (true, false), (false, true), (true, true)]
        {
            let spec = GemmSpec {
                m,
                n,
                k,
                transpose_a,
                transpose_b,
                activation: Activation::Relu,
            };
            check(GemmKernel::Packed, &spec, &mut rng);
        }
    }
}

#[test]
fn every_kernel_called_from_outside_the_pool_matches_the_reference() {
    pool_of_three();
    let mut rng = SplitMix64::new(48);
    for kernel in GemmKernel::ALL {
        for (m, n, k) in [(200, 389, 300), (389, 131, 300)] {
            let spec = GemmSpec {
                m,
                n,
                k,
                transpose_a: false,
                transpose_b: false,
                activation: Activation::Relu,
            };
            check(kernel, &spec, &mut rng);
        }
    }
}

//! Elementwise kernels and reductions against plain loops.

mod common;

use cistern_kernels::{
    KernelError, Segment, add, axpy, column_sum, copy, fill, mse_loss, mse_loss_backward, mul,
    scale, segment_sum, segment_sum_squares,
};
use cistern_memory::SplitMix64;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn axpy_add_mul_and_scale_match_plain_loops(len in 0usize..300, s in -4.0f32..4.0, seed in 0u64..1000) {
        let mut rng = SplitMix64::new(seed);
        let (a, c) = (rng.symmetric_f32s(len), rng.symmetric_f32s(len));
        let mut out = a.clone();
        axpy(&mut out, s, &c).unwrap();
        for i in 0..len {
            prop_assert_eq!(out[i], a[i] + s * c[i]);
        }
        let mut sum = vec![0.0; len];
        add(&a, &c, &mut sum).unwrap();
        let mut product = vec![0.0; len];
        mul(&a, &c, &mut product).unwrap();
        let mut scaled = a.clone();
        scale(&mut scaled, s);
        for i in 0..len {
            prop_assert_eq!(sum[i], a[i] + c[i]);
            prop_assert_eq!(product[i], a[i] * c[i]);
            prop_assert_eq!(scaled[i], a[i] * s);
        }
    }

    #[test]
    fn segment_sums_match_plain_sums(lens in proptest::collection::vec(0usize..50, 0..20), seed in 0u64..1000) {
        let (segments, n) = common::segments(&lens, 1);
        let x = SplitMix64::new(seed).symmetric_f32s(n);
        let mut sums = vec![0.0; segments.len()];
        let mut squares = vec![0.0; segments.len()];
        segment_sum(&x, &segments, &mut sums).unwrap();
        segment_sum_squares(&x, &segments, &mut squares).unwrap();
        for (s, segment) in segments.iter().enumerate() {
            let part = &x[segment.offset..segment.offset + segment.len];
            let want: f64 = part.iter().map(|&v| f64::from(v)).sum();
            let want_sq: f64 = part.iter().map(|&v| f64::from(v).powi(2)).sum();
            prop_assert!((f64::from(sums[s]) - want).abs() <= 1e-6 * (1.0 + want.abs()));
            prop_assert!((f64::from(squares[s]) - want_sq).abs() <= 1e-6 * (1.0 + want_sq));
        }
    }
}

#[test]
fn large_buffers_run_in_parallel_and_match_plain_loops() {
    let mut rng = SplitMix64::new(8);
    let n = 200_001;
    let (a, c) = (rng.symmetric_f32s(n), rng.symmetric_f32s(n));
    let mut out = a.clone();
    axpy(&mut out, 0.25, &c).unwrap();
    assert!((0..n).all(|i| out[i] == a[i] + 0.25 * c[i]));
    let mut copied = vec![0.0; n];
    copy(&a, &mut copied).unwrap();
    assert_eq!(copied, a);
    fill(&mut copied, 3.0);
    assert!(copied.iter().all(|&v| v == 3.0));
    let segments = [Segment::new(0, 150_000), Segment::new(150_000, 50_001)];
    let mut squares = [0.0f32; 2];
    segment_sum_squares(&a, &segments, &mut squares).unwrap();
    let want: f64 = a[..150_000].iter().map(|&v| f64::from(v).powi(2)).sum();
    assert!((f64::from(squares[0]) - want).abs() <= 1e-6 * want);
}

#[test]
fn column_sum_is_the_bias_gradient() {
    for (rows, cols) in [(1, 1), (7, 3), (1000, 70), (3, 0), (0, 4)] {
        let x = SplitMix64::new(rows as u64).symmetric_f32s(rows * cols);
        let mut out = vec![f32::NAN; cols];
        column_sum(&x, rows, cols, &mut out).unwrap();
        for j in 0..cols {
            let want: f64 = (0..rows).map(|i| f64::from(x[i * cols + j])).sum();
            assert!(
                (f64::from(out[j]) - want).abs() <= 1e-5,
                "{rows}x{cols} col {j}"
            );
        }
    }
}

#[test]
fn mse_loss_and_its_gradient_match_pytorch_mean_reduction() {
    let pred = [1.0f32, 2.0, 3.0, 4.0];
    let target = [0.0f32, 2.0, 5.0, 4.5];
    // (1 + 0 + 4 + 0.25) / 4
    assert_eq!(mse_loss(&pred, &target).unwrap(), 1.3125);
    let mut grad = [0.0f32; 4];
    mse_loss_backward(&pred, &target, 1.0, &mut grad).unwrap();
    assert_eq!(grad, [0.5, 0.0, -1.0, -0.25]);
    assert!(matches!(
        mse_loss(&[], &[]),
        Err(KernelError::InvalidArgument { .. })
    ));
}

#[test]
fn elementwise_kernels_and_reductions_refuse_bad_lengths() {
    let mut three = [0.0f32; 3];
    let four = [0.0f32; 4];
    let mismatch =
        |r: Result<(), KernelError>| matches!(r, Err(KernelError::LengthMismatch { .. }));
    assert!(mismatch(copy(&four, &mut three)));
    assert!(mismatch(axpy(&mut three, 1.0, &four)));
    assert!(mismatch(add(&four, &four, &mut three)));
    assert!(mismatch(mul(&four, &three.clone(), &mut [0.0; 4])));
    assert!(mismatch(column_sum(&four, 2, 3, &mut three)));
    assert!(mismatch(mse_loss_backward(&four, &four, 1.0, &mut three)));
    assert!(mse_loss(&four, &three).is_err());
    assert!(mismatch(segment_sum(
        &four,
        &[Segment::new(0, 4)],
        &mut three
    )));
    assert!(matches!(
        segment_sum(&four, &[Segment::new(2, 3)], &mut [0.0]),
        Err(KernelError::InvalidArgument { .. })
    ));
}

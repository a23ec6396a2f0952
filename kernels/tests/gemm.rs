//! GEMM with fused bias + activation against a naive f64 reference.

mod common;

use cistern_kernels::{Activation, GemmSpec, KernelError, gemm};
use cistern_memory::SplitMix64;

fn activate(activation: Activation, x: f64) -> f64 {
    match activation {
        Activation::Identity => x,
        Activation::Relu => x.max(0.0),
        Activation::LeakyRelu { negative_slope } => {
            if x > 0.0 {
                x
            } else {
                x * f64::from(negative_slope)
            }
        }
        Activation::Gelu => {
            let erfc = f64::from(cistern_kernels::erfc(
                (-x / std::f64::consts::SQRT_2) as f32,
            ));
            0.5 * x * erfc
        }
        Activation::GeluTanh => {
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            0.5 * x * (1.0 + inner.tanh())
        }
        Activation::Tanh => x.tanh(),
        Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
    }
}

/// Checks `gemm` against a naive triple loop; returns nothing, panics with
/// the offending case.
fn check(spec: GemmSpec, with_bias: bool, rng: &mut SplitMix64) {
    let GemmSpec { m, n, k, .. } = spec;
    let a = rng.symmetric_f32s(m * k);
    let b = rng.symmetric_f32s(k * n);
    let bias = rng.symmetric_f32s(n);
    let mut c = vec![f32::NAN; m * n];
    gemm(&spec, &a, &b, with_bias.then_some(&bias[..]), &mut c).unwrap();
    let a_at = |i: usize, p: usize| {
        if spec.transpose_a {
            a[p * m + i]
        } else {
            a[i * k + p]
        }
    };
    let b_at = |p: usize, j: usize| {
        if spec.transpose_b {
            b[j * k + p]
        } else {
            b[p * n + j]
        }
    };
    for i in 0..m {
        for j in 0..n {
            let mut sum = if with_bias { f64::from(bias[j]) } else { 0.0 };
            let mut magnitude = sum.abs();
            for p in 0..k {
                let term = f64::from(a_at(i, p)) * f64::from(b_at(p, j));
                sum += term;
                magnitude += term.abs();
            }
            let want = activate(spec.activation, sum);
            let got = f64::from(c[i * n + j]);
            // f32 accumulation error grows with the sum of |terms|.
            let bound = 1e-5 * (magnitude + 1.0);
            assert!(
                (got - want).abs() <= bound,
                "{spec:?} bias={with_bias} at ({i},{j}): {got} vs {want}"
            );
        }
    }
}

const ACTIVATIONS: [Activation; 7] = [
    Activation::Identity,
    Activation::Relu,
    Activation::LeakyRelu {
        negative_slope: 0.1,
    },
    Activation::Gelu,
    Activation::GeluTanh,
    Activation::Tanh,
    Activation::Sigmoid,
];

#[test]
fn gemm_matches_a_naive_product_for_every_transpose_activation_and_bias() {
    let mut rng = SplitMix64::new(21);
    let shapes = [
        (1, 1, 1),
        (3, 5, 7),
        (17, 33, 9),
        (65, 31, 130),
        (2, 129, 3),
    ];
    for (m, n, k) in shapes {
        for transpose_a in [false, true] {
            for transpose_b in [false, true] {
                for activation in ACTIVATIONS {
                    for with_bias in [false, true] {
                        let spec = GemmSpec {
                            m,
                            n,
                            k,
                            transpose_a,
                            transpose_b,
                            activation,
                        };
                        check(spec, with_bias, &mut rng);
                    }
                }
            }
        }
    }
}

#[test]
fn gemm_large_enough_for_a_parallel_epilogue_matches_the_reference() {
    let mut rng = SplitMix64::new(22);
    for transpose_a in [false, true] {
        let spec = GemmSpec {
            m: 301,
            n: 131,
            k: 19,
            transpose_a,
            transpose_b: !transpose_a,
            activation: Activation::Gelu,
        };
        check(spec, true, &mut rng);
    }
}

#[test]
fn gemm_with_an_empty_dimension_is_bias_and_activation_or_nothing() {
    let spec = GemmSpec {
        m: 2,
        n: 3,
        k: 0,
        activation: Activation::Relu,
        ..Default::default()
    };
    let mut c = vec![f32::NAN; 6];
    gemm(&spec, &[], &[], Some(&[1.0, -2.0, 3.0]), &mut c).unwrap();
    assert_eq!(c, vec![1.0, 0.0, 3.0, 1.0, 0.0, 3.0]);
    let empty = GemmSpec {
        m: 0,
        n: 3,
        k: 4,
        ..Default::default()
    };
    gemm(&empty, &[], &[0.0; 12], None, &mut []).unwrap();
}

#[test]
fn gemm_refuses_buffers_of_the_wrong_length() {
    let spec = GemmSpec {
        m: 2,
        n: 3,
        k: 4,
        ..Default::default()
    };
    let (a, b, mut c) = (vec![0.0; 8], vec![0.0; 12], vec![0.0; 6]);
    let error = |result: Result<(), KernelError>| match result {
        Err(KernelError::LengthMismatch { argument, .. }) => argument,
        other => panic!("{other:?}"),
    };
    assert_eq!(error(gemm(&spec, &a[..7], &b, None, &mut c)), "a");
    assert_eq!(error(gemm(&spec, &a, &b[..11], None, &mut c)), "b");
    assert_eq!(error(gemm(&spec, &a, &b, None, &mut c[..5])), "c");
    assert_eq!(error(gemm(&spec, &a, &b, Some(&[0.0; 2]), &mut c)), "bias");
    let huge = GemmSpec {
        m: usize::MAX,
        n: 2,
        k: 2,
        ..Default::default()
    };
    assert!(matches!(
        gemm(&huge, &a, &b, None, &mut c),
        Err(KernelError::InvalidArgument { .. })
    ));
}

//! GEMM with fused bias + activation against a naive f64 reference.

mod common;
#[path = "common/gemm_reference.rs"]
mod gemm_reference;

use cistern_kernels::{Activation, GemmKernel, GemmSpec, KernelError, erfc, gemm, gemm_with};
use cistern_memory::SplitMix64;
use gemm_reference::reference;

/// Runs `kernel` on random data (C starts as NaN, so a kernel that reads
/// it fails) and compares every element with the f64 reference.
fn check(kernel: GemmKernel, spec: GemmSpec, with_bias: bool, rng: &mut SplitMix64) {
    let GemmSpec { m, n, k, .. } = spec;
    let a = rng.symmetric_f32s(m * k);
    let b = rng.symmetric_f32s(k * n);
    let bias = rng.symmetric_f32s(n);
    let bias = with_bias.then_some(&bias[..]);
    let mut c = vec![f32::NAN; m * n];
    gemm_with(kernel, &spec, &a, &b, bias, &mut c).unwrap();
    for (index, (&got, &(want, magnitude))) in
        c.iter().zip(&reference(&spec, &a, &b, bias)).enumerate()
    {
        // f32 accumulation error grows with the sum of |terms|.
        let bound = 1e-5 * (magnitude + 1.0);
        assert!(
            (f64::from(got) - want).abs() <= bound,
            "{kernel:?} {spec:?} bias={with_bias} at ({},{}): {got} vs {want}",
            index / n,
            index % n
        );
    }
}

fn spec(m: usize, n: usize, k: usize, transpose_a: bool, transpose_b: bool) -> GemmSpec {
    GemmSpec {
        m,
        n,
        k,
        transpose_a,
        transpose_b,
        activation: Activation::Identity,
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

const TRANSPOSES: [(bool, bool); 4] = [(false, false), (true, false), (false, true), (true, true)];

#[test]
fn every_kernel_matches_the_reference_for_every_transpose_activation_and_bias() {
    let mut rng = SplitMix64::new(21);
    let shapes = [
        (1, 1, 1),
        (3, 5, 7),
        (17, 33, 9),
        (65, 31, 130),
        (2, 129, 3),
    ];
    for kernel in GemmKernel::ALL {
        for (m, n, k) in shapes {
            for (transpose_a, transpose_b) in TRANSPOSES {
                for activation in ACTIVATIONS {
                    for with_bias in [false, true] {
                        let spec = GemmSpec {
                            activation,
                            ..spec(m, n, k, transpose_a, transpose_b)
                        };
                        check(kernel, spec, with_bias, &mut rng);
                    }
                }
            }
        }
    }
}

#[test]
fn every_kernel_matches_the_reference_at_primes_and_sizes_off_tile_boundaries() {
    let mut rng = SplitMix64::new(23);
    // Around the crates' micro-tiles (8, 16, 48 rows; 4, 8, 16 columns),
    // primes, vector shapes, and a k past one cache block.
    let shapes = [
        (1, 1, 37),
        (1, 97, 13),
        (97, 1, 13),
        (7, 11, 13),
        (15, 17, 16),
        (16, 16, 16),
        (47, 49, 5),
        (48, 48, 48),
        (49, 15, 63),
        (31, 37, 41),
        (101, 67, 103),
        (33, 9, 601),
    ];
    for kernel in GemmKernel::ALL {
        for (m, n, k) in shapes {
            for (transpose_a, transpose_b) in TRANSPOSES {
                check(
                    kernel,
                    spec(m, n, k, transpose_a, transpose_b),
                    true,
                    &mut rng,
                );
            }
        }
    }
}

#[test]
fn every_kernel_matches_the_reference_around_the_packed_kernels_blocks() {
    let mut rng = SplitMix64::new(26);
    // The packed kernel's tiles are 14×32 (6×16 with AVX2 + FMA, whose
    // own boundaries `packed::tests` covers), its packing transposes 16×16,
    // and its blocks are 112 rows, 256 steps of k and 1024 columns: one
    // under, on and over each, and a k that ends a block one step in.
    let shapes = [
        (14, 32, 16),
        (13, 31, 15),
        (15, 33, 17),
        (28, 64, 32),
        (29, 63, 31),
        (111, 17, 256),
        (113, 7, 257),
        (112, 96, 255),
        (3, 1025, 19),
        (5, 1023, 513),
    ];
    for kernel in GemmKernel::ALL {
        for (m, n, k) in shapes {
            for (transpose_a, transpose_b) in TRANSPOSES {
                let spec = GemmSpec {
                    activation: Activation::Tanh,
                    ..spec(m, n, k, transpose_a, transpose_b)
                };
                check(kernel, spec, true, &mut rng);
            }
        }
    }
}

#[test]
fn every_kernel_matches_the_reference_on_shapes_large_enough_to_thread() {
    let mut rng = SplitMix64::new(22);
    // Split by rows (m > n) and by columns (n ≥ m), with ragged last blocks.
    for (m, n, k) in [(301, 131, 67), (67, 301, 131)] {
        for kernel in GemmKernel::ALL {
            for (transpose_a, transpose_b) in TRANSPOSES {
                let spec = GemmSpec {
                    activation: Activation::Gelu,
                    ..spec(m, n, k, transpose_a, transpose_b)
                };
                check(kernel, spec, true, &mut rng);
            }
        }
    }
}

#[test]
fn nan_and_infinity_in_the_inputs_reach_the_elements_they_touch() {
    let mut rng = SplitMix64::new(24);
    let (m, n, k) = (37, 29, 53);
    for kernel in GemmKernel::ALL {
        for (transpose_a, transpose_b) in TRANSPOSES {
            let spec = spec(m, n, k, transpose_a, transpose_b);
            let mut a = rng.symmetric_f32s(m * k);
            let mut b = rng.symmetric_f32s(k * n);
            // A NaN poisons a row of C; an infinity a column (or a NaN where
            // it meets a zero or another infinity of the other sign).
            a[5 * k + 3] = f32::NAN;
            b[17] = f32::INFINITY;
            b[7 * n + 2] = f32::NEG_INFINITY;
            a[11] = 0.0;
            let bias = rng.symmetric_f32s(n);
            let mut c = vec![0.0; m * n];
            gemm_with(kernel, &spec, &a, &b, Some(&bias), &mut c).unwrap();
            let want = reference(&spec, &a, &b, Some(&bias));
            assert!(want.iter().any(|w| w.0.is_nan()) && want.iter().any(|w| w.0.is_infinite()));
            for (index, (&got, &(want, magnitude))) in c.iter().zip(&want).enumerate() {
                let at = (index / n, index % n);
                if want.is_nan() || want.is_infinite() {
                    assert!(
                        got.is_nan() == want.is_nan() && (got.is_nan() || f64::from(got) == want),
                        "{kernel:?} {spec:?} at {at:?}: {got} vs {want}"
                    );
                } else {
                    let bound = 1e-5 * (magnitude + 1.0);
                    assert!(
                        (f64::from(got) - want).abs() <= bound,
                        "{kernel:?} at {at:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_chosen_kernel_follows_the_cpus_widest_vector_unit() {
    let bits = GemmKernel::cpu_vector_bits();
    assert!([32, 128, 256, 512].contains(&bits), "{bits}");
    assert_eq!(GemmKernel::chosen(), GemmKernel::for_vector_bits(bits));
    let square = spec(512, 512, 512, false, false);
    assert_eq!(
        GemmKernel::chosen_for(&square),
        GemmKernel::for_shape(bits, &square)
    );
    // At 512 bits the packed kernel measured ahead wherever an operand is
    // transposed (a weight or an input gradient), the crate elsewhere and
    // for a narrow C.
    for transposes in [(true, false), (false, true), (true, true)] {
        let transposed = spec(256, 1024, 1024, transposes.0, transposes.1);
        assert_eq!(GemmKernel::for_shape(512, &transposed), GemmKernel::Packed);
    }
    assert_eq!(GemmKernel::for_shape(512, &square), GemmKernel::Gemm);
    // With few columns for its rows the crate, which reads A in place,
    // measured ahead of packing it (a small layer's weight gradient, the
    // input gradient of a tall batch); the packed kernel where C is wide
    // or, with B transposed, short.
    for few_columns in [
        spec(784, 64, 256, true, false),
        spec(1024, 128, 1024, true, false),
        spec(4096, 64, 256, false, true),
        spec(1024, 128, 256, false, true),
    ] {
        assert_eq!(GemmKernel::for_shape(512, &few_columns), GemmKernel::Gemm);
    }
    for packed in [
        spec(1024, 192, 256, true, false),
        spec(64, 64, 4096, true, false),
        spec(256, 64, 1024, false, true),
        spec(1024, 64, 1024, true, true),
    ] {
        assert_eq!(GemmKernel::for_shape(512, &packed), GemmKernel::Packed);
    }
    let narrow_weight_gradient = spec(1024, 10, 256, true, false);
    assert_eq!(
        GemmKernel::for_shape(512, &narrow_weight_gradient),
        GemmKernel::Gemm
    );
    // At 256 bits the packed kernel's AVX2 + FMA micro-kernel measured
    // ahead of the crates or level at every shape of `bench gemm`.
    for transposes in TRANSPOSES {
        let product = spec(256, 1024, 784, transposes.0, transposes.1);
        assert_eq!(GemmKernel::for_shape(256, &product), GemmKernel::Packed);
    }
    assert_eq!(GemmKernel::for_shape(256, &square), GemmKernel::Packed);
    // An MLP's last layer (10 outputs): forward and weight gradient have a
    // narrow C, the input gradient a short k; the crate measured ahead.
    for narrow in [
        spec(256, 10, 1024, false, false),
        spec(1024, 10, 256, true, false),
    ] {
        assert_eq!(GemmKernel::for_shape(256, &narrow), GemmKernel::Gemm);
    }
    let short = spec(256, 1024, 10, false, true);
    assert_eq!(GemmKernel::for_shape(256, &short), GemmKernel::Gemm);
    assert_eq!(GemmKernel::for_shape(512, &short), GemmKernel::Packed);
    for bits in [32, 128] {
        assert_eq!(
            GemmKernel::for_shape(bits, &square),
            GemmKernel::for_vector_bits(bits)
        );
    }
    assert_eq!(GemmKernel::for_vector_bits(512), GemmKernel::Gemm);
    assert_eq!(GemmKernel::for_vector_bits(256), GemmKernel::Gemm);
    assert_eq!(GemmKernel::for_vector_bits(128), GemmKernel::MatrixMultiply);
    assert_eq!(GemmKernel::for_vector_bits(32), GemmKernel::MatrixMultiply);
}

#[test]
fn gemm_runs_the_chosen_kernel() {
    let mut rng = SplitMix64::new(25);
    let spec = spec(19, 23, 29, true, false);
    let (a, b) = (rng.symmetric_f32s(19 * 29), rng.symmetric_f32s(29 * 23));
    let (mut chosen, mut plain) = (vec![0.0; 19 * 23], vec![0.0; 19 * 23]);
    gemm_with(
        GemmKernel::chosen_for(&spec),
        &spec,
        &a,
        &b,
        None,
        &mut chosen,
    )
    .unwrap();
    gemm(&spec, &a, &b, None, &mut plain).unwrap();
    assert_eq!(chosen, plain);
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

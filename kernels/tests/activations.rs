//! Activations forward and backward, and erf, against values from f64 math.

mod common;

use cistern_kernels::{
    Activation, KernelError, activation_backward, activation_forward, erf, erfc,
};

/// (z, erf z, erfc z) from CPython's `math.erf` / `math.erfc`.
const ERF_TABLE: [(f64, f64, f64); 17] = [
    (-5.0, -0.9999999999984626, 1.9999999999984626),
    (-3.0, -0.9999779095030014, 1.9999779095030015),
    (-2.5, -0.999593047982555, 1.999593047982555),
    (-2.0, -0.9953222650189527, 1.9953222650189528),
    (-1.0, -0.8427007929497149, 1.842700792949715),
    (-0.3, -0.3286267594591274, 1.3286267594591274),
    (-0.001, -0.0011283787909692365, 1.0011283787909693),
    (0.0, 0.0, 1.0),
    (0.0001, 0.00011283791633342487, 0.9998871620836666),
    (0.2, 0.22270258921047847, 0.7772974107895215),
    (0.9, 0.7969082124228322, 0.20309178757716786),
    (1.5, 0.9661051464753108, 0.033894853524689274),
    (1.99, 0.995111413199617, 0.004888586800383003),
    (2.01, 0.9955248493552482, 0.004475150644751763),
    (3.0, 0.9999779095030014, 2.2090496998585438e-05),
    (4.5, 0.9999999998033839, 1.9661604415428873e-10),
    (9.0, 1.0, 4.13703174651381e-37),
];

/// (x, gelu x, gelu' x) for exact GELU, from CPython's `math.erfc`.
const GELU_TABLE: [(f64, f64, f64); 17] = [
    (-6.0, -5.919525870226207e-09, -3.5468709453902015e-08),
    (-4.0, -0.00012668496733247986, -0.0005036496612264215),
    (-3.0, -0.004049694094890287, -0.011945647204183927),
    (-2.0, -0.04550026389635844, -0.0852318010781969),
    (-1.5, -0.10021080190328713, -0.12746919222997954),
    (-1.0, -0.15865525393145707, -0.08331547058768629),
    (-0.5, -0.15426876936299344, 0.13250487534383712),
    (-0.1, -0.0460172162722971, 0.4204769079752698),
    (0.0, 0.0, 0.5),
    (0.1, 0.053982783727702904, 0.5795230920247302),
    (0.5, 0.34573123063700656, 0.8674951246561629),
    (1.0, 0.8413447460685429, 1.0833154705876864),
    (1.5, 1.399789198096713, 1.1274691922299795),
    (2.0, 1.9544997361036416, 1.085231801078197),
    (3.0, 2.99595030590511, 1.011945647204184),
    (4.0, 3.9998733150326675, 1.0005036496612265),
    (6.0, 5.999999994080474, 1.0000000354687093),
];

fn relative(got: f32, want: f64) -> f64 {
    if f64::from(got) == want {
        0.0
    } else {
        (f64::from(got) - want).abs() / want.abs()
    }
}

#[test]
fn erf_and_erfc_are_accurate_to_f32_including_the_tail() {
    for (z, want_erf, want_erfc) in ERF_TABLE {
        // The inputs are exact in f32 only approximately; compare at the f32 input.
        let z32 = z as f32;
        let shift = (f64::from(z32) - z) * 2.0 / std::f64::consts::PI.sqrt() * (-z * z).exp();
        assert!(relative(erf(z32), want_erf + shift) < 3e-7, "erf({z})");
        assert!(relative(erfc(z32), want_erfc - shift) < 3e-7, "erfc({z})");
    }
}

fn forward(activation: Activation, x: &[f32]) -> Vec<f32> {
    let mut y = vec![0.0; x.len()];
    activation_forward(activation, x, &mut y).unwrap();
    y
}

fn backward(activation: Activation, x: &[f32], grad_out: &[f32]) -> Vec<f32> {
    let mut g = vec![0.0; x.len()];
    activation_backward(activation, x, grad_out, &mut g).unwrap();
    g
}

#[test]
fn exact_gelu_forward_and_backward_match_erf_values() {
    let x: Vec<f32> = GELU_TABLE.iter().map(|t| t.0 as f32).collect();
    let y = forward(Activation::Gelu, &x);
    let d = backward(Activation::Gelu, &x, &vec![1.0; x.len()]);
    for (i, (_, want_y, want_d)) in GELU_TABLE.iter().enumerate() {
        assert!(
            relative(y[i], *want_y) < 1e-6,
            "gelu({})={} vs {want_y}",
            x[i],
            y[i]
        );
        assert!(
            relative(d[i], *want_d) < 1e-6,
            "gelu'({})={} vs {want_d}",
            x[i],
            d[i]
        );
    }
}

/// f64 definitions of the other activations and their derivatives.
fn reference(activation: Activation, x: f64) -> (f64, f64) {
    match activation {
        Activation::Relu => (x.max(0.0), if x > 0.0 { 1.0 } else { 0.0 }),
        Activation::LeakyRelu { negative_slope } => {
            let s = f64::from(negative_slope);
            if x > 0.0 { (x, 1.0) } else { (s * x, s) }
        }
        Activation::GeluTanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let t = (c * (x + 0.044715 * x.powi(3))).tanh();
            let y = 0.5 * x * (1.0 + t);
            let d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
            (y, d)
        }
        Activation::Tanh => (x.tanh(), 1.0 - x.tanh().powi(2)),
        Activation::Sigmoid => {
            let s = 1.0 / (1.0 + (-x).exp());
            (s, s * (1.0 - s))
        }
        Activation::Identity => (x, 1.0),
        Activation::Gelu => unreachable!("tested against the erf table"),
    }
}

#[test]
fn relu_leaky_relu_gelu_tanh_tanh_and_sigmoid_match_f64_definitions() {
    let x: Vec<f32> = (-400..=400).map(|i| i as f32 / 100.0).collect();
    let grad_out: Vec<f32> = x.iter().map(|v| 0.5 + v.abs()).collect();
    for activation in [
        Activation::Identity,
        Activation::Relu,
        Activation::LeakyRelu {
            negative_slope: 0.01,
        },
        Activation::GeluTanh,
        Activation::Tanh,
        Activation::Sigmoid,
    ] {
        let y = forward(activation, &x);
        let d = backward(activation, &x, &grad_out);
        for i in 0..x.len() {
            let (want_y, want_d) = reference(activation, f64::from(x[i]));
            let want_d = want_d * f64::from(grad_out[i]);
            // An absolute floor: tanh-GELU's 1 + tanh(·) and its two
            // derivative terms cancel for x ≪ 0 in f32, as in PyTorch's formula.
            let floor = if activation == Activation::GeluTanh {
                1e-1
            } else {
                1e-3
            };
            let err_y = (f64::from(y[i]) - want_y).abs() / want_y.abs().max(floor);
            let err_d = (f64::from(d[i]) - want_d).abs() / want_d.abs().max(floor);
            assert!(
                err_y < 1e-4 && err_d < 1e-4,
                "{activation:?} at {}: {err_y:e} {err_d:e}",
                x[i]
            );
        }
    }
}

#[test]
fn relu_propagates_nan_and_zeroes_the_gradient_at_zero() {
    let y = forward(Activation::Relu, &[f32::NAN, -1.0, 0.0, 2.0]);
    assert!(y[0].is_nan());
    assert_eq!(&y[1..], &[0.0, 0.0, 2.0]);
    let d = backward(Activation::Relu, &[-1.0, 0.0, 2.0], &[5.0, 5.0, 5.0]);
    assert_eq!(d, vec![0.0, 0.0, 5.0]);
}

#[test]
fn large_activation_buffers_run_in_parallel_with_the_same_results() {
    let x: Vec<f32> = (0..100_000).map(|i| (i as f32 / 10_000.0) - 5.0).collect();
    let y = forward(Activation::Sigmoid, &x);
    for (i, &v) in x.iter().enumerate().step_by(997) {
        assert_eq!(y[i], forward(Activation::Sigmoid, &[v])[0]);
    }
}

#[test]
fn activations_refuse_buffers_of_different_lengths() {
    let mut y = vec![0.0; 3];
    assert!(matches!(
        activation_forward(Activation::Tanh, &[0.0; 4], &mut y),
        Err(KernelError::LengthMismatch { .. })
    ));
    assert!(matches!(
        activation_backward(Activation::Tanh, &[0.0; 3], &[0.0; 4], &mut y),
        Err(KernelError::LengthMismatch { .. })
    ));
}

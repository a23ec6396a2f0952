//! The f64 GEMM reference, shared by `tests/gemm.rs` and the packed
//! kernel's unit tests (`src/gemm/packed/tests.rs` includes this file by
//! path). The including module brings `Activation`, `GemmSpec` and `erfc`
//! into scope.

use super::{Activation, GemmSpec, erfc};

/// `activation` applied in f64.
pub fn activate(activation: Activation, x: f64) -> f64 {
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
            let erfc = f64::from(erfc((-x / std::f64::consts::SQRT_2) as f32));
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

/// `op(A)[i][p]` and `op(B)[p][j]` of a spec over row-major storage.
fn at(spec: &GemmSpec, a: &[f32], b: &[f32], i: usize, p: usize, j: usize) -> (f64, f64) {
    let GemmSpec { m, n, k, .. } = *spec;
    let a_ip = if spec.transpose_a {
        a[p * m + i]
    } else {
        a[i * k + p]
    };
    let b_pj = if spec.transpose_b {
        b[j * k + p]
    } else {
        b[p * n + j]
    };
    (f64::from(a_ip), f64::from(b_pj))
}

/// The f64 reference of every element of C, and the sum of the magnitudes
/// of its terms (the scale of f32 rounding error).
pub fn reference(spec: &GemmSpec, a: &[f32], b: &[f32], bias: Option<&[f32]>) -> Vec<(f64, f64)> {
    let GemmSpec { m, n, k, .. } = *spec;
    let mut out = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let mut sum = bias.map_or(0.0, |bias| f64::from(bias[j]));
            let mut magnitude = sum.abs();
            for p in 0..k {
                let (a_ip, b_pj) = at(spec, a, b, i, p, j);
                sum += a_ip * b_pj;
                magnitude += (a_ip * b_pj).abs();
            }
            out.push((activate(spec.activation, sum), magnitude));
        }
    }
    out
}

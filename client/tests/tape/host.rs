//! Plain host implementations in f64 of what the tape computes: the
//! references of the finite-difference and MLP tests.

use cistern_runtime::Activation;

/// `erf` by its Taylor series: exact to ~1e-13 for |x| ≤ 3, which the tests stay within.
pub fn erf(x: f64) -> f64 {
    let (mut term, mut sum) = (x, x);
    for n in 1..80 {
        term *= -x * x / n as f64;
        sum += term / (2 * n + 1) as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

/// PyTorch's definition of `activation` at `x`.
pub fn activate(activation: Activation, x: f64) -> f64 {
    match activation {
        Activation::Identity => x,
        Activation::Relu => x.max(0.0),
        Activation::LeakyRelu { negative_slope } => {
            if x > 0.0 {
                x
            } else {
                f64::from(negative_slope) * x
            }
        }
        Activation::Gelu => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
        Activation::GeluTanh => {
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            0.5 * x * (1.0 + inner.tanh())
        }
        Activation::Tanh => x.tanh(),
        Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
    }
}

/// `a·b` for a row-major `m×k` and `k×n`.
pub fn matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

/// `act(x·wᵀ + bias)` for `x` `m×k`, `w` `n×k`.
pub fn linear(
    x: &[f64],
    w: &[f64],
    bias: Option<&[f64]>,
    activation: Activation,
    (m, k, n): (usize, usize, usize),
) -> Vec<f64> {
    let mut y = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let z: f64 = (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum::<f64>()
                + bias.map_or(0.0, |b| b[j]);
            y[i * n + j] = activate(activation, z);
        }
    }
    y
}

/// `Σ a ⊙ b`.
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// `Σ (p − t)² / n`.
pub fn mse(pred: &[f64], target: &[f64]) -> f64 {
    let total: f64 = pred
        .iter()
        .zip(target)
        .map(|(p, t)| (p - t) * (p - t))
        .sum();
    total / pred.len() as f64
}

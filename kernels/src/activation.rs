//! Activations, forward and backward, with PyTorch's definitions.

use serde::{Deserialize, Serialize};

use crate::KernelError;
use crate::erf::erfc_f64;
use crate::parallel::{zip_mut, zip2_mut};

/// An elementwise activation. Backward passes take the activation's *input*.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub enum Activation {
    /// `x` (no activation).
    #[default]
    Identity,
    /// `max(x, 0)`; NaN propagates as in PyTorch.
    Relu,
    /// `x` for `x > 0`, else `negative_slope·x` (PyTorch default slope 0.01).
    LeakyRelu {
        /// Slope on the negative side.
        negative_slope: f32,
    },
    /// Exact GELU `x·Φ(x)` via erf: PyTorch's default `approximate='none'`.
    Gelu,
    /// GELU with PyTorch's `approximate='tanh'`.
    GeluTanh,
    /// `tanh(x)`.
    Tanh,
    /// `1 / (1 + e^{−x})`.
    Sigmoid,
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_KAPPA: f32 = 0.044715;

#[inline(always)]
fn relu(x: f32) -> f32 {
    if x < 0.0 { 0.0 } else { x }
}

#[inline(always)]
fn relu_grad(x: f32, g: f32) -> f32 {
    if x > 0.0 { g } else { 0.0 }
}

#[inline(always)]
fn gelu(x: f32) -> f32 {
    let x64 = f64::from(x);
    (x64 * 0.5 * erfc_f64(-x64 * std::f64::consts::FRAC_1_SQRT_2)) as f32
}

#[inline(always)]
fn gelu_grad(x: f32, g: f32) -> f32 {
    let x = f64::from(x);
    let cdf = 0.5 * erfc_f64(-x * std::f64::consts::FRAC_1_SQRT_2);
    let pdf = (-0.5 * x * x).exp()
        * (0.5 * std::f64::consts::FRAC_2_SQRT_PI)
        * std::f64::consts::FRAC_1_SQRT_2;
    (f64::from(g) * (cdf + x * pdf)) as f32
}

#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    let inner = SQRT_2_OVER_PI * (x + GELU_KAPPA * x * x * x);
    0.5 * x * (1.0 + inner.tanh())
}

#[inline(always)]
fn gelu_tanh_grad(x: f32, g: f32) -> f32 {
    let x_sq = x * x;
    let inner = SQRT_2_OVER_PI * (x + GELU_KAPPA * x_sq * x);
    let tanh_inner = inner.tanh();
    let left_derivative = 0.5 * (1.0 + tanh_inner);
    let right_derivative = 0.5
        * x
        * (1.0 - tanh_inner * tanh_inner)
        * SQRT_2_OVER_PI
        * (1.0 + 3.0 * GELU_KAPPA * x_sq);
    g * (left_derivative + right_derivative)
}

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl Activation {
    /// Applies the activation to every element of `y` in place.
    pub(crate) fn apply_in_place(self, y: &mut [f32]) {
        match self {
            Self::Identity => {}
            Self::Relu => map_in_place(y, relu),
            Self::LeakyRelu { negative_slope } => {
                map_in_place(y, |x| if x > 0.0 { x } else { x * negative_slope })
            }
            Self::Gelu => map_in_place(y, gelu),
            Self::GeluTanh => map_in_place(y, gelu_tanh),
            Self::Tanh => map_in_place(y, f32::tanh),
            Self::Sigmoid => map_in_place(y, sigmoid),
        }
    }

    /// Applies `y ← act(y + bias)` to one row of a matrix.
    pub(crate) fn apply_with_bias(self, row: &mut [f32], bias: &[f32]) {
        match self {
            Self::Identity => map_bias(row, bias, |x| x),
            Self::Relu => map_bias(row, bias, relu),
            Self::LeakyRelu { negative_slope } => {
                map_bias(row, bias, |x| if x > 0.0 { x } else { x * negative_slope })
            }
            Self::Gelu => map_bias(row, bias, gelu),
            Self::GeluTanh => map_bias(row, bias, gelu_tanh),
            Self::Tanh => map_bias(row, bias, f32::tanh),
            Self::Sigmoid => map_bias(row, bias, sigmoid),
        }
    }

    fn gradient(self, grad_in: &mut [f32], x: &[f32], grad_out: &[f32]) {
        match self {
            Self::Identity => grad_in.copy_from_slice(grad_out),
            Self::Relu => map_grad(grad_in, x, grad_out, relu_grad),
            Self::LeakyRelu { negative_slope } => map_grad(grad_in, x, grad_out, |x, g| {
                if x > 0.0 { g } else { g * negative_slope }
            }),
            Self::Gelu => map_grad(grad_in, x, grad_out, gelu_grad),
            Self::GeluTanh => map_grad(grad_in, x, grad_out, gelu_tanh_grad),
            Self::Tanh => map_grad(grad_in, x, grad_out, |x, g| {
                let t = x.tanh();
                g * (1.0 - t * t)
            }),
            Self::Sigmoid => map_grad(grad_in, x, grad_out, |x, g| {
                let s = sigmoid(x);
                g * s * (1.0 - s)
            }),
        }
    }
}

#[inline(always)]
fn map_in_place(y: &mut [f32], f: impl Fn(f32) -> f32) {
    for v in y {
        *v = f(*v);
    }
}

#[inline(always)]
fn map_bias(row: &mut [f32], bias: &[f32], f: impl Fn(f32) -> f32) {
    for (v, &b) in row.iter_mut().zip(bias) {
        *v = f(*v + b);
    }
}

#[inline(always)]
fn map_grad(grad_in: &mut [f32], x: &[f32], grad_out: &[f32], f: impl Fn(f32, f32) -> f32) {
    for ((d, &x), &g) in grad_in.iter_mut().zip(x).zip(grad_out) {
        *d = f(x, g);
    }
}

/// `y ← act(x)`.
pub fn activation_forward(
    activation: Activation,
    x: &[f32],
    y: &mut [f32],
) -> Result<(), KernelError> {
    KernelError::check_len("y", x.len(), y.len())?;
    zip_mut(y, x, |y, x| {
        y.copy_from_slice(x);
        activation.apply_in_place(y);
    });
    Ok(())
}

/// `grad_in ← grad_out · act'(x)`, where `x` is the activation's input.
pub fn activation_backward(
    activation: Activation,
    x: &[f32],
    grad_out: &[f32],
    grad_in: &mut [f32],
) -> Result<(), KernelError> {
    KernelError::check_len("grad_out", x.len(), grad_out.len())?;
    KernelError::check_len("grad_in", x.len(), grad_in.len())?;
    zip2_mut(grad_in, x, grad_out, |d, x, g| activation.gradient(d, x, g));
    Ok(())
}

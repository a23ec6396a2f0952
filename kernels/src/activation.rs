//! Activations, forward and backward, with PyTorch's definitions.

use serde::{Deserialize, Serialize};

use crate::KernelError;
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
/// `1/√(2π)`.
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

#[inline(always)]
fn relu(x: f32) -> f32 {
    if x < 0.0 { 0.0 } else { x }
}

#[inline(always)]
fn relu_grad(x: f32, g: f32) -> f32 {
    if x > 0.0 { g } else { 0.0 }
}

/// Past this `|x|` the normal's tail `Φ(−|x|)` is below f32's normal
/// range: it and the density are taken as 0.
const NORMAL_TAIL_LIMIT: f32 = 13.0;

/// `(Φ(−a), φ(a))` for `a ≥ 0`: the standard normal's lower tail and
/// density, in f32 without a call (so that loops over it vectorise).
/// `Φ(−a) = ½·erfc(z)` at `z = a/√2` by Numerical Recipes' `erfcc`
/// (`t·exp(−z² + P(t))`, `t = 1/(1 + z/2)`, relative error under 1.2e-7
/// for every `z ≥ 0`, the WGSL body's formula), `P` by fused multiply-adds.
/// Its `−z² = −a²/2` is taken as `−h²/2`, exact for `h` = `a` with its low
/// 12 bits cleared, plus the small `−(a − h)(a + h)/2`, both given to one
/// [`exp_split`]: an exponent rounded as one f32 would lose `a²·2⁻²⁴`
/// relatively in the tail.
#[inline(always)]
fn normal_tail(a: f32) -> (f32, f32) {
    let t = 1.0 / (1.0 + a * (0.5 * std::f32::consts::FRAC_1_SQRT_2));
    let coefficients: [f32; 10] = [
        0.170_872_77,
        -0.822_152_2,
        1.488_515_9,
        -1.135_204,
        0.278_868_07,
        -0.186_288_06,
        0.096_784_18,
        0.374_091_96,
        1.000_023_7,
        -1.265_512_2,
    ];
    let p = coefficients[1..]
        .iter()
        .fold(coefficients[0], |p, &c| p.mul_add(t, c));
    let h = f32::from_bits(a.to_bits() & 0xffff_f000);
    let big = -0.5 * h * h;
    let small = -0.5 * (a - h) * (a + h);
    let tail = 0.5 * t * exp_split(big, small + p);
    let density = exp_split(big, small) * FRAC_1_SQRT_2PI;
    if a < NORMAL_TAIL_LIMIT {
        (tail, density)
    } else {
        (0.0, 0.0)
    }
}

/// `e^(big + small)` for an exact `big` in `[−85, 0]` and `|small| < 2`,
/// with no rounding of the sum: `big` is reduced by `k·ln 2` exactly
/// (Cody–Waite: `k·C1` has 16 significant bits, and the difference fits
/// f32), then `small` joins the reduced argument. The polynomial is
/// `exp`'s (`classify/rows.rs`), by fused multiply-adds.
#[inline(always)]
fn exp_split(big: f32, small: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0; // 1.5·2²³: adding it rounds to an integer
    let shifted = (big + small) * std::f32::consts::LOG2_E + SHIFT;
    let k = shifted - SHIFT;
    let r = (big - k * 0.693_359_4 + small) - k * -2.121_944_4e-4;
    let p = [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ]
    .iter()
    .fold(1.987_569_1e-4f32, |p, &c| p.mul_add(r, c));
    let y = p.mul_add(r * r, r) + 1.0;
    // Below the tail limit k is in [−125, 0]: a normal power of two (past
    // it the caller discards the value).
    let power = f32::from_bits(((shifted.to_bits() as i32 - 0x4B40_0000 + 127) as u32) << 23);
    y * power
}

/// `Φ(x)` and `φ(x)`.
#[inline(always)]
fn normal_cdf(x: f32) -> (f32, f32) {
    let (tail, density) = normal_tail(x.abs());
    let cdf = if x < 0.0 { tail } else { 1.0 - tail };
    (cdf, density)
}

#[inline(always)]
fn gelu(x: f32) -> f32 {
    x * normal_cdf(x).0
}

#[inline(always)]
fn gelu_grad(x: f32, g: f32) -> f32 {
    let (cdf, density) = normal_cdf(x);
    g * (cdf + x * density)
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
            Self::Gelu => (gelu_kernels().forward)(y),
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
            Self::Gelu => {
                // The wide loops over the row, as `gelu(x + b)` element by element.
                map_bias(row, bias, |x| x);
                (gelu_kernels().forward)(row)
            }
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
            Self::Gelu => (gelu_kernels().backward)(grad_in, x, grad_out),
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

/// Exact GELU's loops, compiled for the widest vector unit present: the
/// same source (`gelu_*_body`, inlined into each), so the same rounding
/// (Rust never contracts; its explicit `mul_add`s are fused multiply-adds
/// everywhere, a correctly rounded library call where the CPU has none),
/// only more lanes at a time.
struct GeluKernels {
    forward: fn(&mut [f32]),
    backward: fn(&mut [f32], &[f32], &[f32]),
}

fn gelu_kernels() -> &'static GeluKernels {
    static KERNELS: std::sync::OnceLock<GeluKernels> = std::sync::OnceLock::new();
    KERNELS.get_or_init(|| {
        crate::wide::widest!(
            with "fma",
            avx512: GeluKernels {
                forward: wide::gelu_forward_avx512,
                backward: wide::gelu_backward_avx512,
            },
            avx2: GeluKernels {
                forward: wide::gelu_forward_avx2,
                backward: wide::gelu_backward_avx2,
            },
            plain: GeluKernels {
                forward: gelu_forward_body,
                backward: gelu_backward_body,
            },
        )
    })
}

// Plain loops over `#[inline(always)]` functions: a function passed as a
// value (`map_in_place(y, gelu)`) stays a call per element.
#[inline(always)]
fn gelu_forward_body(y: &mut [f32]) {
    for v in y {
        *v = gelu(*v);
    }
}

#[inline(always)]
fn gelu_backward_body(grad_in: &mut [f32], x: &[f32], grad_out: &[f32]) {
    for ((d, &x), &g) in grad_in.iter_mut().zip(x).zip(grad_out) {
        *d = gelu_grad(x, g);
    }
}

/// The AVX2 and AVX-512 instances of GELU's loops (with FMA).
#[cfg(target_arch = "x86_64")]
mod wide {
    use super::{gelu_backward_body, gelu_forward_body};

    crate::wide::x86_instances!(
        gelu_forward_body(y: &mut [f32]);
        "avx2,fma" => gelu_forward_avx2,
        "avx512f,fma" => gelu_forward_avx512,
    );
    crate::wide::x86_instances!(
        gelu_backward_body(grad_in: &mut [f32], x: &[f32], grad_out: &[f32]);
        "avx2,fma" => gelu_backward_avx2,
        "avx512f,fma" => gelu_backward_avx512,
    );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::erf::erfc_f64;

    /// `(gelu x, gelu' x, |Φ(x)| + |x·φ(x)|)` in f64 (the last scales the
    /// derivative's error: its two terms cancel near x = −0.75).
    fn reference(x: f32) -> (f64, f64, f64) {
        let x = f64::from(x);
        let cdf = 0.5 * erfc_f64(-x * std::f64::consts::FRAC_1_SQRT_2);
        let density = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
        (x * cdf, cdf + x * density, cdf.abs() + (x * density).abs())
    }

    #[test]
    fn exact_gelu_in_f32_is_within_a_few_ulp_of_the_f64_reference() {
        // Every 1/4096 over [−13, 13], where Φ stays in f32's normal range.
        let (mut worst_y, mut worst_d) = (0.0f64, 0.0f64);
        for i in 1 - 13 * 4096..13 * 4096 {
            let x = i as f32 / 4096.0;
            let (want_y, want_d, scale) = reference(x);
            if want_y != 0.0 {
                let err = (f64::from(gelu(x)) - want_y).abs() / want_y.abs();
                worst_y = worst_y.max(err);
            }
            let err = (f64::from(gelu_grad(x, 1.0)) - want_d).abs() / scale;
            worst_d = worst_d.max(err);
        }
        // Measured: 4.6e-7 and 3.7e-7 (f32's ulp is 6e-8 to 1.2e-7 relative).
        assert!(worst_y < 6e-7, "gelu: worst relative error {worst_y:e}");
        assert!(worst_d < 6e-7, "gelu': worst relative error {worst_d:e}");
    }

    #[test]
    fn the_vector_instances_of_gelu_round_as_the_scalar_body() {
        let x: Vec<f32> = (-20_000..20_000).map(|i| i as f32 / 1000.0).collect();
        let g: Vec<f32> = x.iter().map(|v| 0.5 + v.abs()).collect();
        let mut plain = x.clone();
        plain.iter_mut().for_each(|v| *v = gelu(*v));
        let mut wide = x.clone();
        (gelu_kernels().forward)(&mut wide);
        assert!(
            plain
                .iter()
                .zip(&wide)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
        let plain: Vec<f32> = x.iter().zip(&g).map(|(&x, &g)| gelu_grad(x, g)).collect();
        let mut wide = vec![0.0; x.len()];
        (gelu_kernels().backward)(&mut wide, &x, &g);
        assert!(
            plain
                .iter()
                .zip(&wide)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
    }

    #[test]
    fn exact_gelu_keeps_its_limits_and_propagates_nan() {
        assert_eq!(gelu(0.0), 0.0);
        assert_eq!(gelu(f32::INFINITY), f32::INFINITY);
        assert_eq!(gelu(-20.0), 0.0);
        assert_eq!(gelu_grad(-20.0, 1.0), 0.0);
        assert_eq!(gelu_grad(20.0, 1.0), 1.0);
        assert!(gelu(f32::NAN).is_nan() && gelu_grad(f32::NAN, 1.0).is_nan());
    }
}

// Activations, forward and backward, as `cistern-kernels`' CPU versions
// (their entry points are in elementwise.wgsl and elementwise_vec4.wgsl).
// code: 0 identity, 1 relu, 2 leaky relu (slope f[0]), 3 exact gelu,
// 4 tanh gelu, 5 tanh, 6 sigmoid.

const SQRT_2_OVER_PI: f32 = 0.7978846;
const GELU_KAPPA: f32 = 0.044715;
const FRAC_1_SQRT_2: f32 = 0.70710678;
const FRAC_1_SQRT_2PI: f32 = 0.39894228;

// (Φ(−a), φ(a)) for a >= 0, as the CPU's `normal_tail` (activation.rs):
// ½·erfc(a/√2) by Numerical Recipes' erfcc (relative error < 1.2e-7), its
// −a²/2 as −h²/2 (exact: h is a with its low 12 bits cleared) plus the small
// −(a − h)(a + h)/2, each through its own exp, so that the tail stays
// relatively accurate; both 0 from a = 13 (Φ below f32's normal range).
fn normal_tail(a: f32) -> vec2<f32> {
    if (a >= 13.0) { return vec2<f32>(0.0, 0.0); }
    let t = 1.0 / (1.0 + a * (0.5 * FRAC_1_SQRT_2));
    let poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587
        + t * (-0.82215223 + t * 0.17087277))))))));
    let h = bitcast<f32>(bitcast<u32>(a) & 0xfffff000u);
    let big = exp(-0.5 * h * h);
    let small = -0.5 * (a - h) * (a + h);
    return vec2<f32>(0.5 * t * big * exp(small + poly), big * exp(small) * FRAC_1_SQRT_2PI);
}

// (Φ(x), φ(x)).
fn normal_cdf(x: f32) -> vec2<f32> {
    let n = normal_tail(abs(x));
    return vec2<f32>(select(1.0 - n.x, n.x, x < 0.0), n.y);
}

// tanh to about an ulp: drivers may compute the builtin as
// (e^2x − 1)/(e^2x + 1), which loses digits near 0 and overflows to NaN.
// Its Taylor series below 0.5, 1 − 2/(e^2|x| + 1) above.
fn tanh_safe(x: f32) -> f32 {
    let a = abs(x);
    if (a < 0.5) {
        let s = x * x;
        let poly = 1.0 + s * (-0.33333333 + s * (0.13333333 + s * (-0.053968254
            + s * (0.021869488 + s * (-0.0088632355 + s * (0.0035921280
            + s * -0.0014558344))))));
        return x * poly;
    }
    let t = 1.0 - 2.0 / (exp(2.0 * min(a, 15.0)) + 1.0);
    return select(t, -t, x < 0.0);
}

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

fn activate(code: u32, slope: f32, x: f32) -> f32 {
    switch code {
        case 0u: { return x; }
        case 1u: { return select(x, 0.0, x < 0.0); }
        case 2u: { return select(x * slope, x, x > 0.0); }
        case 3u: { return x * normal_cdf(x).x; }
        case 4u: {
            let inner = SQRT_2_OVER_PI * (x + GELU_KAPPA * x * x * x);
            return 0.5 * x * (1.0 + tanh_safe(inner));
        }
        case 5u: { return tanh_safe(x); }
        default: { return sigmoid(x); }
    }
}

fn gradient(code: u32, slope: f32, x: f32, g: f32) -> f32 {
    switch code {
        case 0u: { return g; }
        case 1u: { return select(0.0, g, x > 0.0); }
        case 2u: { return select(g * slope, g, x > 0.0); }
        case 3u: {
            let n = normal_cdf(x);
            return g * (n.x + x * n.y);
        }
        case 4u: {
            let x_sq = x * x;
            let inner = SQRT_2_OVER_PI * (x + GELU_KAPPA * x_sq * x);
            let t = tanh_safe(inner);
            let left = 0.5 * (1.0 + t);
            let right = 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_KAPPA * x_sq);
            return g * (left + right);
        }
        case 5u: {
            let t = tanh_safe(x);
            return g * (1.0 - t * t);
        }
        default: {
            let s = sigmoid(x);
            return g * s * (1.0 - s);
        }
    }
}

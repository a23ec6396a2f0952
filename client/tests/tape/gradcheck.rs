//! Every operation's gradient against central finite differences of a
//! plain f64 host implementation of the same function.
//!
//! Tolerance: `|tape − fd| ≤ 1e-4 + 1e-4·|fd|`. The tape computes in f32:
//! each kernel rounds to within a few ulps (2^-23 ≈ 1.2e-7 relative), and a
//! gradient here passes through at most five kernels each summing at most
//! five terms of magnitude at most ~5, so its accumulated error stays below
//! ~25·5·1.2e-7 ≈ 1.5e-5. The finite difference is taken in f64 with
//! h = 1e-6: truncation error ~h²·|f'''| ≈ 1e-11, cancellation ~1e-16/h ≈
//! 1e-10. So the bound has ~6× margin over f32 rounding, while a wrong
//! gradient (a missed term, a transpose, a factor) misses it by orders of
//! magnitude. Inputs stay at least 0.05 from 0 (ReLU's kink).

use cistern_client::{AutodiffError, Tape, Tensor, Var, WeightLayout};
use cistern_memory::SplitMix64;
use cistern_runtime::Activation;

use super::common::{ok, open, random, wide};
use super::host;

const STEP: f64 = 1e-6;
const ABSOLUTE: f64 = 1e-4;
const RELATIVE: f64 = 1e-4;

const ACTIVATIONS: [Activation; 8] = [
    Activation::Identity,
    Activation::Relu,
    Activation::LeakyRelu {
        negative_slope: 0.01,
    },
    Activation::LeakyRelu {
        negative_slope: -0.3,
    },
    Activation::Gelu,
    Activation::GeluTanh,
    Activation::Tanh,
    Activation::Sigmoid,
];

/// Checks the loss `build` records over tracked inputs of `shapes` (random
/// from `seed`) and every input's gradient against `host`'s finite differences.
fn check<F, H>(name: &str, seed: u64, shapes: &[&[usize]], build: F, host: H)
where
    F: for<'t> Fn(&'t Tape, &[Var<'t>]) -> Result<Var<'t>, AutodiffError>,
    H: Fn(&[Vec<f64>]) -> f64,
{
    let client = open();
    let mut rng = SplitMix64::new(seed);
    let inputs: Vec<Tensor<f32>> = shapes.iter().map(|shape| random(&mut rng, shape)).collect();
    let tape = Tape::new(&client);
    let vars: Vec<Var<'_>> = inputs.iter().map(|t| ok(tape.var(t), "var")).collect();
    let loss = ok(build(&tape, &vars), name);
    let gradients = ok(tape.backward(&loss), "backward");
    let x: Vec<Vec<f64>> = inputs.iter().map(wide).collect();
    let value = f64::from(ok(loss.item(), "the loss"));
    let expected = host(&x);
    assert!(
        (value - expected).abs() <= ABSOLUTE + RELATIVE * expected.abs(),
        "{name}: loss {value}, host {expected}"
    );
    for (input, var) in vars.iter().enumerate() {
        let Some(gradient) = ok(gradients.to_host(var), "gradient") else {
            panic!("{name}: the loss reaches input {input}");
        };
        for element in 0..x[input].len() {
            let at = |delta: f64| {
                let mut moved = x.clone();
                moved[input][element] += delta;
                host(&moved)
            };
            let fd = (at(STEP) - at(-STEP)) / (2.0 * STEP);
            let got = f64::from(gradient.data()[element]);
            assert!(
                (got - fd).abs() <= ABSOLUTE + RELATIVE * fd.abs(),
                "{name}: ∂/∂input{input}[{element}] is {got}, finite differences {fd}"
            );
        }
    }
}

/// `Σ y ⊙ w` for a fixed untracked `w`: a loss whose upstream gradient is not all ones.
fn weighted<'t>(tape: &'t Tape, y: &Var<'t>, w: &Tensor<f32>) -> Result<Var<'t>, AutodiffError> {
    let w = tape.upload(w)?;
    tape.sum(&tape.mul(y, &w)?)
}

fn weights(seed: u64, shape: &[usize]) -> (Tensor<f32>, Vec<f64>) {
    let w = random(&mut SplitMix64::new(seed ^ 0xA5A5), shape);
    let wide = wide(&w);
    (w, wide)
}

#[test]
fn the_gradients_of_matmul_match_finite_differences() {
    let (w, ww) = weights(1, &[3, 2]);
    check(
        "matmul",
        1,
        &[&[3, 4], &[4, 2]],
        |tape, v| weighted(tape, &tape.matmul(&v[0], &v[1])?, &w),
        |x| host::dot(&host::matmul(&x[0], &x[1], 3, 4, 2), &ww),
    );
}

#[test]
fn the_gradients_of_linear_with_bias_and_every_activation_match_finite_differences() {
    let (w, ww) = weights(2, &[4, 5]);
    for (seed, activation) in (10..).zip(ACTIVATIONS) {
        check(
            &format!("linear {activation:?}"),
            seed,
            &[&[4, 3], &[5, 3], &[5]],
            |tape, v| {
                weighted(
                    tape,
                    &tape.linear(&v[0], &v[1], Some(&v[2]), activation)?,
                    &w,
                )
            },
            |x| {
                host::dot(
                    &host::linear(&x[0], &x[1], Some(&x[2]), activation, (4, 3, 5)),
                    &ww,
                )
            },
        );
    }
}

#[test]
fn the_gradients_of_linear_without_bias_match_finite_differences() {
    let (w, ww) = weights(3, &[4, 5]);
    for activation in [Activation::Relu, Activation::Gelu] {
        check(
            &format!("linear without bias {activation:?}"),
            3,
            &[&[4, 3], &[5, 3]],
            |tape, v| weighted(tape, &tape.linear(&v[0], &v[1], None, activation)?, &w),
            |x| {
                host::dot(
                    &host::linear(&x[0], &x[1], None, activation, (4, 3, 5)),
                    &ww,
                )
            },
        );
    }
}

#[test]
fn the_gradients_of_an_in_out_linear_match_finite_differences() {
    let (w, ww) = weights(5, &[4, 5]);
    for (seed, activation) in (40..).zip([Activation::Identity, Activation::Tanh]) {
        check(
            &format!("in-out linear {activation:?}"),
            seed,
            &[&[4, 3], &[3, 5], &[5]],
            |tape, v| {
                let layout = WeightLayout::InOut;
                let y = tape.linear_with_layout(&v[0], &v[1], Some(&v[2]), activation, layout)?;
                weighted(tape, &y, &w)
            },
            |x| {
                // The `[in, out]` weight is the transpose of `[out, in]`'s.
                let out_in: Vec<f64> = (0..5)
                    .flat_map(|o| (0..3).map(move |i| (o, i)))
                    .map(|(o, i)| x[1][i * 5 + o])
                    .collect();
                let y = host::linear(&x[0], &out_in, Some(&x[2]), activation, (4, 3, 5));
                host::dot(&y, &ww)
            },
        );
    }
}

#[test]
fn the_gradient_of_every_activation_alone_matches_finite_differences() {
    let (w, ww) = weights(4, &[2, 3]);
    for (seed, activation) in (20..).zip(ACTIVATIONS) {
        check(
            &format!("{activation:?}"),
            seed,
            &[&[2, 3]],
            |tape, v| weighted(tape, &tape.activation(&v[0], activation)?, &w),
            |x| {
                let y: Vec<f64> = x[0]
                    .iter()
                    .map(|&x| host::activate(activation, x))
                    .collect();
                host::dot(&y, &ww)
            },
        );
    }
}

#[test]
fn the_gradients_of_add_mul_and_scale_match_finite_differences() {
    let (w, ww) = weights(5, &[2, 3]);
    let shapes: &[&[usize]] = &[&[2, 3], &[2, 3]];
    check(
        "add",
        5,
        shapes,
        |tape, v| weighted(tape, &tape.add(&v[0], &v[1])?, &w),
        |x| {
            let y: Vec<f64> = x[0].iter().zip(&x[1]).map(|(a, b)| a + b).collect();
            host::dot(&y, &ww)
        },
    );
    check(
        "mul",
        6,
        shapes,
        |tape, v| weighted(tape, &tape.mul(&v[0], &v[1])?, &w),
        |x| {
            let y: Vec<f64> = x[0].iter().zip(&x[1]).map(|(a, b)| a * b).collect();
            host::dot(&y, &ww)
        },
    );
    check(
        "scale",
        7,
        &[&[2, 3]],
        |tape, v| weighted(tape, &tape.scale(&v[0], -1.5)?, &w),
        |x| {
            let y: Vec<f64> = x[0].iter().map(|a| -1.5 * a).collect();
            host::dot(&y, &ww)
        },
    );
}

#[test]
fn the_gradients_of_sum_mean_and_mse_loss_match_finite_differences() {
    check(
        "sum",
        8,
        &[&[2, 3]],
        |tape, v| tape.sum(&v[0]),
        |x| x[0].iter().sum(),
    );
    check(
        "mean",
        9,
        &[&[2, 3]],
        |tape, v| tape.mean(&v[0]),
        |x| x[0].iter().sum::<f64>() / 6.0,
    );
    check(
        "mse_loss",
        10,
        &[&[2, 3], &[2, 3]],
        |tape, v| tape.mse_loss(&v[0], &v[1]),
        |x| host::mse(&x[0], &x[1]),
    );
}

#[test]
fn scalar_gradients_held_on_the_device_broadcast_correctly() {
    // A product of scalars makes their upstream gradients device values.
    check(
        "sum times mean",
        11,
        &[&[2, 3], &[3]],
        |tape, v| tape.mul(&tape.sum(&v[0])?, &tape.mean(&v[1])?),
        |x| x[0].iter().sum::<f64>() * x[1].iter().sum::<f64>() / 3.0,
    );
    check(
        "mse times sum",
        12,
        &[&[2, 3], &[2, 3], &[3]],
        |tape, v| tape.mul(&tape.mse_loss(&v[0], &v[1])?, &tape.sum(&v[2])?),
        |x| host::mse(&x[0], &x[1]) * x[2].iter().sum::<f64>(),
    );
}

#[test]
fn scalar_gradients_known_on_the_host_pass_through_add_and_scale() {
    let (w, ww) = weights(13, &[2, 3]);
    check(
        "scaled mean plus sum",
        13,
        &[&[2, 3], &[4]],
        |tape, v| {
            let left = tape.scale(&tape.mean(&tape.mul(&v[0], &tape.upload(&w)?)?)?, -2.0)?;
            tape.add(&left, &tape.sum(&v[1])?)
        },
        |x| -2.0 * host::dot(&x[0], &ww) / 6.0 + x[1].iter().sum::<f64>(),
    );
}

//! A two-layer MLP's gradients against a plain host implementation of its
//! backward pass, and what an untracked input saves.

use cistern_client::{AutodiffError, Tape, Tensor};
use cistern_memory::SplitMix64;
use cistern_runtime::{Activation, Kernel};

use super::common::{ok, open, random, wide};
use super::host;

const BATCH: usize = 8;
const IN: usize = 5;
const HIDDEN: usize = 7;
const OUT: usize = 3;

/// The MLP's parameters and data.
struct Problem {
    x: Tensor<f32>,
    w1: Tensor<f32>,
    b1: Tensor<f32>,
    w2: Tensor<f32>,
    b2: Tensor<f32>,
    y: Tensor<f32>,
}

fn problem() -> Problem {
    let mut rng = SplitMix64::new(0x4D4C50);
    Problem {
        x: random(&mut rng, &[BATCH, IN]),
        w1: random(&mut rng, &[HIDDEN, IN]),
        b1: random(&mut rng, &[HIDDEN]),
        w2: random(&mut rng, &[OUT, HIDDEN]),
        b2: random(&mut rng, &[OUT]),
        y: random(&mut rng, &[BATCH, OUT]),
    }
}

/// `Σ_rows a[i][j]·b[i][l]` over row-major `rows×ca` and `rows×cb`: `aᵀ·b`.
fn transposed_product(a: &[f64], b: &[f64], rows: usize, ca: usize, cb: usize) -> Vec<f64> {
    let mut out = vec![0.0; ca * cb];
    for i in 0..rows {
        for j in 0..ca {
            for l in 0..cb {
                out[j * cb + l] += a[i * ca + j] * b[i * cb + l];
            }
        }
    }
    out
}

fn column_sums(a: &[f64], cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; cols];
    for row in a.chunks(cols) {
        out.iter_mut().zip(row).for_each(|(o, v)| *o += v);
    }
    out
}

/// The host reference: (loss, [∂w1, ∂b1, ∂w2, ∂b2]).
fn reference(p: &Problem) -> (f64, [Vec<f64>; 4]) {
    let (x, w1, b1, w2, b2, y) = (
        wide(&p.x),
        wide(&p.w1),
        wide(&p.b1),
        wide(&p.w2),
        wide(&p.b2),
        wide(&p.y),
    );
    let z1 = host::linear(
        &x,
        &w1,
        Some(&b1),
        Activation::Identity,
        (BATCH, IN, HIDDEN),
    );
    let h: Vec<f64> = z1.iter().map(|z| z.max(0.0)).collect();
    let pred = host::linear(
        &h,
        &w2,
        Some(&b2),
        Activation::Identity,
        (BATCH, HIDDEN, OUT),
    );
    let n = (BATCH * OUT) as f64;
    let g_pred: Vec<f64> = pred
        .iter()
        .zip(&y)
        .map(|(p, t)| 2.0 * (p - t) / n)
        .collect();
    let g_w2 = transposed_product(&g_pred, &h, BATCH, OUT, HIDDEN);
    let g_b2 = column_sums(&g_pred, OUT);
    let g_h = host::matmul(&g_pred, &w2, BATCH, OUT, HIDDEN);
    let g_z1: Vec<f64> = g_h
        .iter()
        .zip(&z1)
        .map(|(g, z)| if *z > 0.0 { *g } else { 0.0 })
        .collect();
    let g_w1 = transposed_product(&g_z1, &x, BATCH, HIDDEN, IN);
    let g_b1 = column_sums(&g_z1, HIDDEN);
    (host::mse(&pred, &y), [g_w1, g_b1, g_w2, g_b2])
}

fn assert_close(name: &str, got: &[f32], expected: &[f64]) {
    assert_eq!(got.len(), expected.len(), "{name}");
    for (index, (&got, &expected)) in got.iter().zip(expected).enumerate() {
        let got = f64::from(got);
        assert!(
            (got - expected).abs() <= 1e-5 + 1e-4 * expected.abs(),
            "{name}[{index}] is {got}, the host reference {expected}"
        );
    }
}

#[test]
fn an_mlps_gradients_equal_the_host_references() {
    let client = open();
    let p = problem();
    let tape = Tape::new(&client);
    let x = ok(tape.upload(&p.x), "x");
    let params = [&p.w1, &p.b1, &p.w2, &p.b2].map(|t| ok(tape.var(t), "param"));
    let y = ok(tape.upload(&p.y), "y");
    let [w1, b1, w2, b2] = &params;
    let record = || -> Result<_, AutodiffError> {
        let h = tape.linear(&x, w1, Some(b1), Activation::Relu)?;
        let pred = tape.linear(&h, w2, Some(b2), Activation::Identity)?;
        tape.mse_loss(&pred, &y)
    };
    let loss = ok(record(), "forward");
    let gradients = ok(tape.backward(&loss), "backward");
    let (expected_loss, expected) = reference(&p);
    assert_close("loss", &[ok(loss.item(), "loss")], &[expected_loss]);
    for (name, (var, expected)) in ["w1", "b1", "w2", "b2"]
        .iter()
        .zip(params.iter().zip(&expected))
    {
        let Some(gradient) = ok(gradients.to_host(var), name) else {
            panic!("{name} has a gradient");
        };
        assert_eq!(gradient.shape(), var.shape().as_slice());
        assert_close(name, gradient.data(), expected);
    }
    assert_eq!(
        gradients.get(&x).err(),
        Some(AutodiffError::GradientTrackingDisabled)
    );
}

#[test]
fn a_linear_whose_input_is_untracked_skips_the_input_gradient_gemm() {
    let client = open();
    let p = problem();
    let tape = Tape::new(&client);
    let x = ok(tape.upload(&p.x), "x");
    let (w1, b1) = (ok(tape.var(&p.w1), "w1"), ok(tape.var(&p.b1), "b1"));
    let (w2, b2) = (ok(tape.var(&p.w2), "w2"), ok(tape.var(&p.b2), "b2"));
    let y = ok(tape.upload(&p.y), "y");
    let h = ok(tape.linear(&x, &w1, Some(&b1), Activation::Relu), "layer 1");
    let pred = ok(
        tape.linear(&h, &w2, Some(&b2), Activation::Identity),
        "layer 2",
    );
    let loss = ok(tape.mse_loss(&pred, &y), "loss");
    let forward = tape.launches().len();
    ok(tape.backward(&loss), "backward");
    let gemms = |launches: &[cistern_runtime::KernelLaunch]| {
        launches
            .iter()
            .filter(|launch| matches!(launch.kernel, Kernel::Gemm { .. }))
            .count()
    };
    let launches = tape.launches();
    // Layer 2: ∂w2 and ∂h; layer 1: ∂w1 only (x is untracked).
    assert_eq!(gemms(&launches[forward..]), 3);
    assert_eq!(gemms(&launches[..forward]), 2);
}

//! Broadcasting, reductions over dimensions and views on every device: the
//! kernels (`broadcast_binary`, `strided_sum`) against an f64 reference,
//! and the tape's operations (add, sub, mul, div with broadcasting,
//! sum_dim, mean_dim, reshape, permute, transpose) forward against the
//! reference and backward against its central finite differences.

use cistern::client::{AutodiffError, ComputeClient, Tape, Tensor, Var};
use cistern::kernels::{BinaryOp, BroadcastSpec, SumSpec};
use cistern::memory::SplitMix64;
use cistern::runtime::{Device, ErrorCode, KernelLaunch};

use super::common::{ok, open};
use super::optim_reference::download;

/// f32 arithmetic of a few terms against f64.
const TOLERANCE: f64 = 1e-5;
/// Gradients against finite differences (step 1e-6 in f64): `|got − fd| ≤
/// FD_TOLERANCE·(1 + |fd|)`. A wrong gradient misses by orders of magnitude.
const FD_TOLERANCE: f64 = 1e-4;
const STEP: f64 = 1e-6;

pub fn values(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(-1.0, 1.0) as f32).collect()
}

fn run(client: &ComputeClient, launch: KernelLaunch) {
    let what = launch.kernel.name();
    let token = ok(client.launch_tracked(client.default_stream(), launch), what);
    ok(token.wait(), what);
}

pub fn close(got: f64, want: f64, tolerance: f64) -> bool {
    (got - want).abs() <= tolerance * (1.0 + want.abs())
}

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut out = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        out[d] = out[d + 1] * shape[d + 1];
    }
    out
}

/// The index of each dimension of element `i` of `shape`.
fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        index[d] = i % shape[d];
        i /= shape[d];
    }
    index
}

/// The element of `x` (of `shape`) that broadcasts to `index` of `out`.
fn broadcast_at(x: &[f64], shape: &[usize], index: &[usize]) -> f64 {
    let lead = index.len() - shape.len();
    let own = strides(shape);
    let at: usize = (0..shape.len())
        .map(|d| {
            if shape[d] == 1 {
                0
            } else {
                index[lead + d] * own[d]
            }
        })
        .sum();
    x[at]
}

fn apply(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
    }
}

/// `a op b` broadcast to `out`, in f64.
fn broadcast_reference(
    op: BinaryOp,
    (a, a_shape): (&[f64], &[usize]),
    (b, b_shape): (&[f64], &[usize]),
    out: &[usize],
) -> Vec<f64> {
    (0..out.iter().product())
        .map(|i| {
            let index = unravel(i, out);
            let x = broadcast_at(a, a_shape, &index);
            apply(op, x, broadcast_at(b, b_shape, &index))
        })
        .collect()
}

/// The sum of `x` (of `shape`) over `dims`, kept as 1s, times `scale`.
fn sum_reference(x: &[f64], shape: &[usize], dims: &[usize], scale: f64) -> Vec<f64> {
    let kept: Vec<usize> = (0..shape.len())
        .map(|d| if dims.contains(&d) { 1 } else { shape[d] })
        .collect();
    let mut out = vec![0.0; kept.iter().product()];
    let kept_strides = strides(&kept);
    for (i, v) in x.iter().enumerate() {
        let index = unravel(i, shape);
        let at: usize = (0..shape.len())
            .map(|d| {
                if dims.contains(&d) {
                    0
                } else {
                    index[d] * kept_strides[d]
                }
            })
            .sum();
        out[at] += v;
    }
    out.iter().map(|v| v * scale).collect()
}

/// `x` (of `shape`) with dimension `i` of the result its `order[i]`.
fn permute_reference(x: &[f64], shape: &[usize], order: &[usize]) -> Vec<f64> {
    let out: Vec<usize> = order.iter().map(|&d| shape[d]).collect();
    let own = strides(shape);
    (0..x.len())
        .map(|i| {
            let index = unravel(i, &out);
            x[(0..order.len())
                .map(|k| index[k] * own[order[k]])
                .sum::<usize>()]
        })
        .collect()
}

pub fn widen(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&v| f64::from(v)).collect()
}

fn u64s(values: &[usize]) -> Vec<u64> {
    values.iter().map(|&v| v as u64).collect()
}

/// The kernels over broadcasts of every kind (leading, trailing, inner,
/// both sides, a scalar) and sums over every pattern of dimensions,
/// gathers included, each against the f64 reference.
pub fn broadcast_and_strided_sum_kernels_match_the_f64_reference(device: Device) {
    let client = open(device);
    let mut rng = SplitMix64::new(44);
    let pairs: &[(&[usize], &[usize])] = &[
        (&[2, 3, 4], &[4]),
        (&[2, 3, 4], &[3, 1]),
        (&[3, 1, 5], &[1, 4, 1]),
        (&[1], &[2, 2, 2]),
        (&[70, 33, 31], &[33, 1]),
        (&[2, 1, 3, 1, 2, 2], &[1, 2, 1, 4, 1, 2]),
    ];
    for &(a_shape, b_shape) in pairs {
        let rank = a_shape.len().max(b_shape.len());
        let dim = |s: &[usize], d: usize| (d + s.len()).checked_sub(rank).map_or(1, |i| s[i]);
        let out: Vec<usize> = (0..rank)
            .map(|d| dim(a_shape, d).max(dim(b_shape, d)))
            .collect();
        let a = values(&mut rng, a_shape.iter().product());
        let b: Vec<f32> = values(&mut rng, b_shape.iter().product())
            .into_iter()
            .map(|v| 1.5 + v.abs())
            .collect();
        let (da, db) = (
            ok(client.upload_f32(&a), "upload"),
            ok(client.upload_f32(&b), "upload"),
        );
        for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
            let pad = |s: &[usize]| -> Vec<u64> {
                let own = strides(s);
                (0..rank)
                    .map(|d| match (d + s.len()).checked_sub(rank) {
                        Some(i) if s[i] != 1 => own[i] as u64,
                        _ => 0,
                    })
                    .collect()
            };
            let spec = BroadcastSpec {
                op,
                shape: u64s(&out),
                a_strides: pad(a_shape),
                b_strides: pad(b_shape),
            };
            let dout = ok(
                client.upload_f32(&vec![0.0; out.iter().product()]),
                "upload",
            );
            run(
                &client,
                KernelLaunch::broadcast_binary(spec, da.whole(), db.whole(), dout.whole()),
            );
            let got = download(&client, &dout);
            let want = broadcast_reference(op, (&widen(&a), a_shape), (&widen(&b), b_shape), &out);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    close(f64::from(*g), *w, TOLERANCE),
                    "{device}: {op:?} of {a_shape:?} and {b_shape:?}: element {i} is {g}, want {w}"
                );
            }
        }
    }
    let sums: &[(&[usize], &[usize])] = &[
        (&[4, 5, 6], &[0]),
        (&[4, 5, 6], &[2]),
        (&[4, 5, 6], &[0, 2]),
        (&[4, 5, 6], &[1]),
        (&[4, 5, 6], &[0, 1, 2]),
        (&[300, 257], &[0]),
        (&[2, 3, 2, 3, 2, 3], &[1, 3, 5]),
    ];
    for &(shape, dims) in sums {
        let x = values(&mut rng, shape.iter().product());
        let kept_strides = strides(shape);
        let spec = SumSpec {
            shape: (0..shape.len())
                .filter(|d| !dims.contains(d))
                .map(|d| shape[d] as u64)
                .collect(),
            strides: (0..shape.len())
                .filter(|d| !dims.contains(d))
                .map(|d| kept_strides[d] as u64)
                .collect(),
            summed: dims.iter().map(|&d| shape[d] as u64).collect(),
            summed_strides: dims.iter().map(|&d| kept_strides[d] as u64).collect(),
            scale: 0.5,
        };
        let want = sum_reference(&widen(&x), shape, dims, 0.5);
        let (dx, dout) = (
            ok(client.upload_f32(&x), "upload"),
            ok(client.upload_f32(&vec![0.0; want.len()]), "upload"),
        );
        run(
            &client,
            KernelLaunch::strided_sum(spec, dx.whole(), dout.whole()),
        );
        let got = download(&client, &dout);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                close(f64::from(*g), *w, 1e-5 * (1 + x.len() / 100) as f64),
                "{device}: sum of {shape:?} over {dims:?}: element {i} is {g}, want {w}"
            );
        }
    }
    // A gather: the transpose of a 3×4 matrix.
    let x = values(&mut rng, 12);
    let spec = SumSpec {
        shape: vec![4, 3],
        strides: vec![1, 4],
        summed: vec![],
        summed_strides: vec![],
        scale: 1.0,
    };
    let (dx, dout) = (
        ok(client.upload_f32(&x), "upload"),
        ok(client.upload_f32(&[0.0; 12]), "upload"),
    );
    run(
        &client,
        KernelLaunch::strided_sum(spec, dx.whole(), dout.whole()),
    );
    let want = permute_reference(&widen(&x), &[3, 4], &[1, 0]);
    assert_eq!(
        widen(&download(&client, &dout)),
        want,
        "{device}: transpose"
    );
}

/// A walk reaching past its input is `InvalidProgram`, a rank past six
/// `InvalidArgument`, both before anything runs; the stream stays usable.
pub fn a_strided_walk_past_its_input_is_refused_before_it_runs(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let (a, out) = (
        ok(client.upload_f32(&[1.0; 6]), "upload"),
        ok(client.upload_f32(&[7.0; 6]), "upload"),
    );
    let spec = BroadcastSpec {
        op: BinaryOp::Add,
        shape: vec![2, 3],
        a_strides: vec![3, 1],
        b_strides: vec![4, 1],
    };
    let past = KernelLaunch::broadcast_binary(spec, a.whole(), a.whole(), out.whole());
    let spec = SumSpec {
        shape: vec![1; 7],
        strides: vec![0; 7],
        summed: vec![],
        summed_strides: vec![],
        scale: 1.0,
    };
    let too_deep = KernelLaunch::strided_sum(spec, a.whole(), out.range(0, 4));
    let refusals = [
        (past, ErrorCode::InvalidProgram),
        (too_deep, ErrorCode::InvalidArgument),
    ];
    for (launch, code) in refusals {
        let token = ok(client.launch_tracked(stream, launch), "launch");
        assert_eq!(token.wait().map_err(|e| e.code()), Err(code), "{device}");
        assert_eq!(
            client.sync(stream).map_err(|e| e.code()),
            Err(code),
            "{device}"
        );
    }
    assert_eq!(download(&client, &out), [7.0; 6], "{device}: nothing ran");
}

/// The value `build` records over tracked inputs of `shapes` (random from
/// `seed`; inputs listed in `positive` are kept in [1.5, 2.5], away from
/// a division's pole), checked forward against `host` and backward
/// against its finite differences, through the loss Σ y ⊙ w for random w.
pub fn check_tape<F, H>(
    device: Device,
    name: &str,
    shapes: &[&[usize]],
    positive: &[usize],
    build: F,
    host: H,
) where
    F: for<'t> Fn(&'t Tape, &[Var<'t>]) -> Result<Var<'t>, AutodiffError>,
    H: Fn(&[Vec<f64>]) -> Vec<f64>,
{
    let client = open(device);
    let mut rng = SplitMix64::new(4400 + name.len() as u64);
    let inputs: Vec<Vec<f32>> = (shapes.iter().enumerate())
        .map(|(i, shape)| {
            let raw = values(&mut rng, shape.iter().product());
            match positive.contains(&i) {
                true => raw.into_iter().map(|v| 2.0 + v / 2.0).collect(),
                false => raw,
            }
        })
        .collect();
    let tape = Tape::new(&client);
    let vars: Vec<Var<'_>> = (inputs.iter().zip(shapes))
        .map(|(data, shape)| {
            ok(
                tape.var(&ok(Tensor::new(shape.to_vec(), data.clone()), "tensor")),
                "var",
            )
        })
        .collect();
    let y = ok(build(&tape, &vars), name);
    let x: Vec<Vec<f64>> = inputs.iter().map(|v| widen(v)).collect();
    let want = host(&x);
    let got = ok(y.to_host(), "read y");
    assert_eq!(got.len(), want.len(), "{device} {name}: length");
    for (i, (g, w)) in got.data().iter().zip(&want).enumerate() {
        assert!(
            close(f64::from(*g), *w, TOLERANCE),
            "{device} {name}: element {i} is {g}, want {w}"
        );
    }
    let weights = values(&mut rng, want.len());
    let w = ok(
        tape.var_no_grad(&ok(Tensor::new(y.shape(), weights.clone()), "w")),
        "w",
    );
    let loss = ok(tape.sum(&ok(tape.mul(&y, &w), "y⊙w")), "loss");
    let gradients = ok(tape.backward(&loss), "backward");
    let loss_at = |x: &[Vec<f64>]| -> f64 {
        host(x)
            .iter()
            .zip(&weights)
            .map(|(y, w)| y * f64::from(*w))
            .sum()
    };
    for (input, var) in vars.iter().enumerate() {
        let Some(gradient) = ok(gradients.to_host(var), "gradient") else {
            panic!("{device} {name}: the loss reaches input {input}");
        };
        assert_eq!(
            gradient.shape(),
            shapes[input],
            "{device} {name}: gradient shape"
        );
        for element in 0..x[input].len() {
            let at = |delta: f64| {
                let mut moved = x.to_vec();
                moved[input][element] += delta;
                loss_at(&moved)
            };
            let fd = (at(STEP) - at(-STEP)) / (2.0 * STEP);
            let got = f64::from(gradient.data()[element]);
            assert!(
                close(got, fd, FD_TOLERANCE),
                "{device} {name}: ∂/∂input{input}[{element}] is {got}, finite differences {fd}"
            );
        }
    }
}

/// Add, sub, mul and div over equal shapes and every kind of broadcast,
/// forward and backward (the broadcast operand's gradient summed over the
/// dimensions it was broadcast along).
pub fn broadcasting_arithmetic_on_the_tape_matches_finite_differences(device: Device) {
    let pairs: &[(&[usize], &[usize])] = &[
        (&[2, 3], &[2, 3]),
        (&[2, 3, 4], &[4]),
        (&[2, 3, 4], &[3, 1]),
        (&[3, 1], &[1, 4]),
        (&[2, 1, 3], &[2, 2, 1]),
        (&[], &[2, 3]),
        (&[4], &[2, 3, 4]),
    ];
    let ops = [
        (BinaryOp::Add, "add"),
        (BinaryOp::Sub, "sub"),
        (BinaryOp::Mul, "mul"),
        (BinaryOp::Div, "div"),
    ];
    for &(a_shape, b_shape) in pairs {
        for (op, name) in ops {
            let rank = a_shape.len().max(b_shape.len());
            let dim = |s: &[usize], d: usize| (d + s.len()).checked_sub(rank).map_or(1, |i| s[i]);
            let out: Vec<usize> = (0..rank)
                .map(|d| dim(a_shape, d).max(dim(b_shape, d)))
                .collect();
            let label = format!("{name} {a_shape:?} {b_shape:?}");
            check_tape(
                device,
                &label,
                &[a_shape, b_shape],
                &[1],
                |tape, v| match op {
                    BinaryOp::Add => tape.add(&v[0], &v[1]),
                    BinaryOp::Sub => tape.sub(&v[0], &v[1]),
                    BinaryOp::Mul => tape.mul(&v[0], &v[1]),
                    BinaryOp::Div => tape.div(&v[0], &v[1]),
                },
                |x| broadcast_reference(op, (&x[0], a_shape), (&x[1], b_shape), &out),
            );
        }
    }
    // One operand used on both sides.
    check_tape(
        device,
        "x / x",
        &[&[2, 3]],
        &[0],
        |tape, v| tape.div(&v[0], &v[0]),
        |x| vec![1.0; x[0].len()],
    );
}

/// Sums and means over dimensions (kept or removed), reshape, permute and
/// transpose, alone and composed with a broadcast.
pub fn reductions_and_views_on_the_tape_match_finite_differences(device: Device) {
    for (dims, keepdim) in [
        (&[0isize][..], true),
        (&[-1], false),
        (&[0, 2], false),
        (&[1], true),
    ] {
        let shape: &[usize] = &[3, 4, 5];
        let resolved: Vec<usize> = dims.iter().map(|&d| d.rem_euclid(3) as usize).collect();
        let count: usize = resolved.iter().map(|&d| shape[d]).product();
        let label = format!("sum_dim {dims:?} keepdim {keepdim}");
        let summed = resolved.clone();
        check_tape(
            device,
            &label,
            &[shape],
            &[],
            |tape, v| tape.sum_dim(&v[0], dims, keepdim),
            |x| sum_reference(&x[0], shape, &summed, 1.0),
        );
        let label = format!("mean_dim {dims:?} keepdim {keepdim}");
        check_tape(
            device,
            &label,
            &[shape],
            &[],
            |tape, v| tape.mean_dim(&v[0], dims, keepdim),
            |x| sum_reference(&x[0], shape, &resolved, 1.0 / count as f64),
        );
    }
    check_tape(
        device,
        "reshape",
        &[&[2, 3, 4]],
        &[],
        |tape, v| {
            let r = tape.reshape(&v[0], &[4, -1])?;
            tape.mul(&r, &r)
        },
        |x| x[0].iter().map(|v| v * v).collect(),
    );
    check_tape(
        device,
        "permute",
        &[&[2, 3, 4]],
        &[],
        |tape, v| tape.permute(&v[0], &[2, 0, 1]),
        |x| permute_reference(&x[0], &[2, 3, 4], &[2, 0, 1]),
    );
    check_tape(
        device,
        "transpose then a broadcast",
        &[&[2, 3, 4], &[3]],
        &[],
        |tape, v| {
            let t = tape.transpose(&v[0], -1, -2)?;
            tape.mul(&t, &v[1])
        },
        |x| {
            let t = permute_reference(&x[0], &[2, 3, 4], &[0, 2, 1]);
            broadcast_reference(BinaryOp::Mul, (&t, &[2, 4, 3]), (&x[1], &[3]), &[2, 4, 3])
        },
    );
}

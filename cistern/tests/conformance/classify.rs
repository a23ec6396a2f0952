//! The classification kernels (softmax, log-softmax, cross-entropy, NLL,
//! binary cross-entropy with logits) on every device, against an f64
//! reference written here from PyTorch's definitions; gradients against
//! central finite differences of that reference.

use cistern::client::{Buffer, ComputeClient};
use cistern::kernels::{ClassInput, ClassLossSpec, MapOp, Reduction};
use cistern::memory::SplitMix64;
use cistern::optim::parity::max_relative_error;
use cistern::runtime::{Device, KernelLaunch};

use super::common::{ok, open};
use super::optim_reference::download;

/// Device results against the f64 reference: f32 arithmetic, a
/// transcendental per element and sums of up to a few hundred terms.
const TOLERANCE: f64 = 2e-5;
/// Gradients against finite differences (step 1e-5 in f64).
const FD_TOLERANCE: f64 = 1e-4;

fn run(client: &ComputeClient, launch: KernelLaunch) {
    let what = launch.kernel.name();
    let token = ok(client.launch_tracked(client.default_stream(), launch), what);
    ok(token.wait(), what);
}

fn upload(client: &ComputeClient, values: &[f32]) -> Buffer {
    ok(client.upload_f32(values), "upload_f32")
}

fn upload_targets(client: &ComputeClient, targets: &[i32]) -> Buffer {
    let bytes: Vec<u8> = targets.iter().flat_map(|t| t.to_ne_bytes()).collect();
    ok(client.upload(&bytes), "upload targets")
}

fn zeros(client: &ComputeClient, n: usize) -> Buffer {
    upload(client, &vec![0.0; n])
}

fn assert_near(got: &[f32], want: &[f64], tolerance: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.is_finite(), "{what}: element {i} is {g}, want {w}");
    }
    let error = max_relative_error(got, want, 1e-3);
    assert!(
        error <= tolerance,
        "{what}: max relative error {error:e}\n got {got:?}\nwant {want:?}"
    );
}

/// Central differences of `f` at `x`, step `h`.
fn finite_differences(x: &[f64], h: f64, f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let mut point = x.to_vec();
    (0..x.len())
        .map(|i| {
            let v = point[i];
            point[i] = v + h;
            let up = f(&point);
            point[i] = v - h;
            let down = f(&point);
            point[i] = v;
            (up - down) / (2.0 * h)
        })
        .collect()
}

fn widen(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&v| f64::from(v)).collect()
}

/// Row-wise log-softmax in f64.
fn log_softmax(x: &[f64], cols: usize) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
            row.iter().map(move |v| v - lse)
        })
        .collect()
}

/// PyTorch's `cross_entropy` / `nll_loss` in f64: the loss's elements.
fn class_loss(
    spec: &ClassLossSpec,
    x: &[f64],
    targets: &[i32],
    weight: Option<&[f64]>,
) -> Vec<f64> {
    let c = spec.classes;
    let logp = match spec.input {
        ClassInput::Logits => log_softmax(x, c),
        ClassInput::LogProbabilities => x.to_vec(),
    };
    let w = |class: usize| weight.map_or(1.0, |w| w[class]);
    let eps = f64::from(spec.label_smoothing);
    let (mut losses, mut denominator) = (Vec::new(), 0.0);
    for (row, &t) in logp.chunks(c).zip(targets) {
        if t == spec.ignore_index {
            losses.push(0.0);
            continue;
        }
        let t = t as usize;
        denominator += w(t);
        let smooth: f64 = (0..c).map(|k| -w(k) * row[k]).sum();
        losses.push((1.0 - eps) * -w(t) * row[t] + eps / c as f64 * smooth);
    }
    match spec.reduction {
        Reduction::None => losses,
        Reduction::Sum => vec![losses.iter().sum()],
        Reduction::Mean => vec![losses.iter().sum::<f64>() / denominator],
    }
}

/// Runs the class loss and its backward on the device; returns the loss
/// and the input's gradient for `grad_output`.
fn device_class_loss(
    client: &ComputeClient,
    spec: &ClassLossSpec,
    x: &[f32],
    targets: &[i32],
    weight: Option<&[f32]>,
    grad_output: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let (dx, dt) = (upload(client, x), upload_targets(client, targets));
    let dw = weight.map(|w| upload(client, w));
    let (out, grad) = (zeros(client, spec.outputs()), zeros(client, x.len()));
    let g = upload(client, grad_output);
    let weight_binding = dw.as_ref().map(Buffer::whole);
    run(
        client,
        KernelLaunch::class_loss(*spec, dx.whole(), dt.whole(), weight_binding, out.whole()),
    );
    let launch = KernelLaunch::class_loss_backward(
        *spec,
        dx.whole(),
        dt.whole(),
        weight_binding,
        g.whole(),
        grad.whole(),
    );
    run(client, launch);
    (download(client, &out), download(client, &grad))
}

pub fn softmax_and_log_softmax_match_the_f64_reference_and_finite_differences(device: Device) {
    let client = open(device);
    let (rows, cols) = (6, 7);
    let mut rng = SplitMix64::new(11);
    let x: Vec<f32> = rng
        .symmetric_f32s(rows * cols)
        .iter()
        .map(|v| 4.0 * v)
        .collect();
    let g = rng.symmetric_f32s(rows * cols);
    let (x64, g64) = (widen(&x), widen(&g));
    for log in [false, true] {
        let what = if log { "log_softmax" } else { "softmax" };
        let reference = |x: &[f64]| {
            let y = log_softmax(x, cols);
            if log {
                y
            } else {
                y.iter().map(|v| v.exp()).collect()
            }
        };
        let (dx, y, dg, grad) = (
            upload(&client, &x),
            zeros(&client, x.len()),
            upload(&client, &g),
            zeros(&client, x.len()),
        );
        let (r, c) = (rows as u64, cols as u64);
        run(
            &client,
            KernelLaunch::softmax(dx.whole(), r, c, log, y.whole()),
        );
        let y_got = download(&client, &y);
        assert_near(&y_got, &reference(&x64), TOLERANCE, what);
        let backward =
            KernelLaunch::softmax_backward(y.whole(), dg.whole(), r, c, log, grad.whole());
        run(&client, backward);
        let want = finite_differences(&x64, 1e-5, |x| {
            reference(x).iter().zip(&g64).map(|(y, g)| y * g).sum()
        });
        assert_near(
            &download(&client, &grad),
            &want,
            FD_TOLERANCE,
            &format!("{what} backward"),
        );
    }
}

pub fn every_cross_entropy_option_matches_the_f64_reference_and_finite_differences(device: Device) {
    let client = open(device);
    let (rows, classes) = (9, 5);
    let mut rng = SplitMix64::new(5);
    let x: Vec<f32> = rng
        .symmetric_f32s(rows * classes)
        .iter()
        .map(|v| 3.0 * v)
        .collect();
    let weight: Vec<f32> = rng
        .symmetric_f32s(classes)
        .iter()
        .map(|v| 1.0 + 0.9 * v)
        .collect();
    // Row 3 is ignored with PyTorch's default; the rest cover every class.
    let targets = [0, 1, 2, -100, 4, 0, 3, 2, 1];
    let x64 = widen(&x);
    let weight64 = widen(&weight);
    for input in [ClassInput::Logits, ClassInput::LogProbabilities] {
        // NLL reads log-probabilities: give it real ones.
        let (x, x64) = match input {
            ClassInput::Logits => (x.clone(), x64.clone()),
            ClassInput::LogProbabilities => {
                let lp = log_softmax(&x64, classes);
                (lp.iter().map(|&v| v as f32).collect::<Vec<_>>(), lp)
            }
        };
        let smoothings: &[f32] = match input {
            ClassInput::Logits => &[0.0, 0.2],
            ClassInput::LogProbabilities => &[0.0],
        };
        for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
            for &label_smoothing in smoothings {
                for weighted in [false, true] {
                    let spec = ClassLossSpec {
                        rows,
                        classes,
                        input,
                        reduction,
                        ignore_index: -100,
                        label_smoothing,
                        weighted,
                    };
                    let what = format!("{spec:?}");
                    let w64 = weighted.then_some(&weight64[..]);
                    let grad_output: Vec<f32> =
                        (0..spec.outputs()).map(|i| 0.5 + i as f32 * 0.25).collect();
                    let (loss, grad) = device_class_loss(
                        &client,
                        &spec,
                        &x,
                        &targets,
                        weighted.then_some(&weight[..]),
                        &grad_output,
                    );
                    let want = class_loss(&spec, &x64, &targets, w64);
                    assert_near(&loss, &want, TOLERANCE, &what);
                    let go = widen(&grad_output);
                    let fd = finite_differences(&x64, 1e-5, |x| {
                        let loss = class_loss(&spec, x, &targets, w64);
                        loss.iter().zip(&go).map(|(l, g)| l * g).sum()
                    });
                    assert_near(&grad, &fd, FD_TOLERANCE, &format!("{what} backward"));
                    let ignored = &grad[3 * classes..4 * classes];
                    assert!(
                        ignored.iter().all(|&g| g == 0.0),
                        "{what}: ignored row {ignored:?}"
                    );
                }
            }
        }
    }
}

pub fn extreme_and_equal_logits_give_finite_correct_cross_entropy(device: Device) {
    let client = open(device);
    // Rows: one maximum of 1e30; equal logits; two maxima of 1e30 (ln 2,
    // which an unshifted log-sum-exp of 1e30 + ln 2 would round away).
    let x = [
        1e30, -1e30, 0.0, 2.0, 2.0, 2.0, -1e30, 1e30, -1e30, 1e30, 1e30, -1e30,
    ];
    let targets = [0, 2, 1, 1];
    let spec = ClassLossSpec {
        reduction: Reduction::None,
        ..ClassLossSpec::cross_entropy(4, 3)
    };
    let (loss, grad) = device_class_loss(&client, &spec, &x, &targets, None, &[1.0; 4]);
    let third = 1.0 / 3.0;
    let ln2 = 2f64.ln();
    assert_near(&loss, &[0.0, 3f64.ln(), 0.0, ln2], TOLERANCE, "losses");
    let want = [
        0.0,
        0.0,
        0.0,
        third,
        third,
        third - 1.0,
        0.0,
        0.0,
        0.0,
        0.5,
        -0.5,
        0.0,
    ];
    assert_near(&grad, &want, TOLERANCE, "gradient");
    for log in [true, false] {
        let y = zeros(&client, 12);
        run(
            &client,
            KernelLaunch::softmax(upload(&client, &x).whole(), 4, 3, log, y.whole()),
        );
        let got = download(&client, &y);
        let probabilities = [
            1.0, 0.0, 0.0, third, third, third, 0.0, 1.0, 0.0, 0.5, 0.5, 0.0,
        ];
        if log {
            let finite: Vec<f64> = probabilities
                .iter()
                .map(|p: &f64| p.ln().max(-3e30))
                .collect();
            let near: Vec<usize> = (0..12).filter(|&i| probabilities[i] > 0.0).collect();
            for i in near {
                assert!(
                    (f64::from(got[i]) - finite[i]).abs() < 1e-6,
                    "log_softmax {i}: {}",
                    got[i]
                );
            }
            assert!(got.iter().all(|v| v.is_finite()), "{got:?}");
        } else {
            assert_near(&got, &probabilities, TOLERANCE, "softmax");
        }
    }
}

pub fn a_large_batch_matches_the_f64_reference(device: Device) {
    let client = open(device);
    // Past the CPU kernels' parallel threshold, several workgroups of rows.
    let (rows, classes) = (1_100, 130);
    let mut rng = SplitMix64::new(9);
    let x: Vec<f32> = rng
        .symmetric_f32s(rows * classes)
        .iter()
        .map(|v| 5.0 * v)
        .collect();
    let targets: Vec<i32> = (0..rows).map(|r| ((r * 37) % classes) as i32).collect();
    let spec = ClassLossSpec::cross_entropy(rows, classes);
    let (loss, grad) = device_class_loss(&client, &spec, &x, &targets, None, &[2.0]);
    let x64 = widen(&x);
    assert_near(
        &loss,
        &class_loss(&spec, &x64, &targets, None),
        TOLERANCE,
        "loss",
    );
    let p: Vec<f64> = log_softmax(&x64, classes).iter().map(|v| v.exp()).collect();
    let want: Vec<f64> = (p.iter().enumerate())
        .map(|(i, &p)| {
            let onehot = if targets[i / classes] as usize == i % classes {
                1.0
            } else {
                0.0
            };
            2.0 * (p - onehot) / rows as f64
        })
        .collect();
    assert_near(&grad, &want, TOLERANCE, "gradient");
}

pub fn an_out_of_range_target_is_never_read_through_on_the_device(device: Device) {
    let client = open(device);
    let x = [0.5, -0.5, 1.0, 2.0];
    let spec = ClassLossSpec {
        reduction: Reduction::None,
        ..ClassLossSpec::cross_entropy(2, 2)
    };
    // 7 and -3 are outside 0..2: their rows are NaN, nothing else is touched.
    let (loss, grad) = device_class_loss(&client, &spec, &x, &[7, 1], None, &[1.0, 1.0]);
    assert!(loss[0].is_nan() && loss[1].is_finite(), "{loss:?}");
    assert!(grad[..2].iter().all(|g| g.is_nan()) && grad[2..].iter().all(|g| g.is_finite()));
    let (loss, _) = device_class_loss(
        &client,
        &ClassLossSpec::cross_entropy(2, 2),
        &x,
        &[0, -3],
        None,
        &[1.0],
    );
    assert!(loss[0].is_nan(), "{loss:?}");
}

/// PyTorch's `binary_cross_entropy_with_logits` per element, in f64.
fn bce(x: f64, y: f64, pos_weight: f64, weight: f64) -> f64 {
    let log_sigmoid = |v: f64| -((-v).max(0.0) + (1.0 + (-v.abs()).exp()).ln());
    -weight * (pos_weight * y * log_sigmoid(x) + (1.0 - y) * log_sigmoid(-x))
}

pub fn binary_cross_entropy_with_logits_matches_the_f64_reference_and_finite_differences(
    device: Device,
) {
    let client = open(device);
    let n = 23;
    let mut rng = SplitMix64::new(3);
    let mut x: Vec<f32> = rng.symmetric_f32s(n).iter().map(|v| 6.0 * v).collect();
    x[0] = 1e30;
    x[1] = -1e30;
    let y: Vec<f32> = (0..n).map(|i| [0.0, 1.0, 0.3][i % 3]).collect();
    let pos_weight: Vec<f32> = (0..n).map(|i| 0.5 + (i % 4) as f32).collect();
    let weight: Vec<f32> = rng
        .symmetric_f32s(n)
        .iter()
        .map(|v| 1.0 + 0.5 * v)
        .collect();
    let bound = [&x, &y, &pos_weight, &weight].map(|v| upload(&client, v));
    let bindings = || bound.iter().map(Buffer::whole).collect::<Vec<_>>();
    let out = zeros(&client, n);
    let mut forward = bindings();
    forward.push(out.whole());
    run(
        &client,
        KernelLaunch::map(MapOp::BceWithLogits, &[1.0, 0.5], forward),
    );
    let want: Vec<f64> = (0..n)
        .map(|i| {
            bce(
                x[i].into(),
                y[i].into(),
                pos_weight[i].into(),
                weight[i].into(),
            )
        })
        .collect();
    assert_near(
        &download(&client, &out),
        &want,
        TOLERANCE,
        "bce_with_logits",
    );
    let grad = zeros(&client, n);
    let mut backward = bindings();
    backward.push(grad.whole());
    run(
        &client,
        KernelLaunch::map(MapOp::BceWithLogitsBackward, &[0.5, 1.0], backward),
    );
    let got = download(&client, &grad);
    // The extremes exactly: σ saturates to 0 and 1.
    assert_eq!(got[0], 0.5 * weight[0] * (1.0 - y[0]));
    assert_eq!(
        got[1],
        0.5 * weight[1] * (1.0 - y[1] - pos_weight[1] * y[1])
    );
    let x64 = widen(&x[2..]);
    let fd = finite_differences(&x64, 1e-5, |x| {
        x.iter()
            .enumerate()
            .map(|(i, &v)| {
                let k = i + 2;
                0.5 * bce(v, y[k].into(), pos_weight[k].into(), weight[k].into())
            })
            .sum()
    });
    assert_near(&got[2..], &fd, FD_TOLERANCE, "bce_with_logits backward");
}

pub fn a_class_loss_with_bad_arguments_is_refused_before_it_runs(device: Device) {
    let client = open(device);
    let (x, t, out) = (
        upload(&client, &[0.0; 6]),
        upload_targets(&client, &[0, 1]),
        zeros(&client, 1),
    );
    let refused = |spec: ClassLossSpec, out: &Buffer| {
        client
            .launch_tracked(
                client.default_stream(),
                KernelLaunch::class_loss(spec, x.whole(), t.whole(), None, out.whole()),
            )
            .and_then(|token| token.wait())
            .is_err()
    };
    let smoothing = ClassLossSpec {
        label_smoothing: 1.5,
        ..ClassLossSpec::cross_entropy(2, 3)
    };
    assert!(refused(smoothing, &out), "a smoothing outside [0, 1]");
    let nll = ClassLossSpec {
        label_smoothing: 0.1,
        ..ClassLossSpec::nll(2, 3)
    };
    assert!(refused(nll, &out), "NLL with smoothing");
    assert!(
        refused(ClassLossSpec::cross_entropy(3, 3), &out),
        "a shape that does not match"
    );
    let none = ClassLossSpec {
        reduction: Reduction::None,
        ..ClassLossSpec::cross_entropy(2, 3)
    };
    assert!(refused(none, &out), "one output for two rows");
    assert_eq!(download(&client, &out), [0.0], "nothing ran");
    assert!(!refused(ClassLossSpec::cross_entropy(2, 3), &out));
}

/// Five cross-entropy SGD steps through the store's device chain (the
/// later ones replayed) on `device` give the CPU's losses and parameters.
pub fn the_device_chains_cross_entropy_step_matches_the_cpus(device: Device) {
    use cistern::client::{ChainLoss, CrossEntropyOptions, DeviceParamStore, Tape, Tensor};
    use cistern::optim::SgdConfig;
    use cistern::runtime::Activation;

    let mut rng = SplitMix64::new(0xC1A5);
    let mut tensor = |shape: &[usize]| {
        let data: Vec<f32> = rng.symmetric_f32s(shape.iter().product());
        ok(Tensor::new(shape.to_vec(), data), "a tensor")
    };
    let x = tensor(&[12, 5]);
    let params = [tensor(&[5, 7]), tensor(&[7]), tensor(&[7, 4]), tensor(&[4])];
    let labels: Vec<i64> = (0..12).map(|r| [0, 3, 1, 2, -100][r % 5]).collect();
    let options = CrossEntropyOptions {
        weight: Some(vec![1.0, 0.5, 2.0, 1.5]),
        label_smoothing: 0.05,
        ..Default::default()
    };
    let config = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        ..Default::default()
    };
    let train = |device: Device| {
        let client = open(device);
        let refs: Vec<&Tensor<f32>> = params.iter().collect();
        let mut store = ok(DeviceParamStore::new(&Tape::new(&client), &refs), "store");
        let mut losses = Vec::new();
        for _ in 0..5 {
            let tape = Tape::new(&client);
            let leaves = ok(store.snapshot_resident_params(&tape), "snapshot");
            let chain = vec![
                (leaves[0].clone(), Some(leaves[1].clone()), Activation::Tanh),
                (
                    leaves[2].clone(),
                    Some(leaves[3].clone()),
                    Activation::Identity,
                ),
            ];
            let loss = ChainLoss::CrossEntropy {
                targets: &labels,
                options: &options,
            };
            let sent = store.train_step_device_chain_with_loss(&chain, &x, loss, &config);
            losses.push(ok(store.read_train_step_loss(&ok(sent, "step")), "loss"));
        }
        let trained: Vec<f32> = ok(store.sync_to_host(), "params")
            .iter()
            .flat_map(|t| t.data().to_vec())
            .collect();
        (losses, trained)
    };
    let (losses, trained) = train(device);
    let (want_losses, want) = train(Device::Cpu(0));
    assert_near(
        &losses,
        &widen(&want_losses),
        1e-4,
        &format!("{device} losses"),
    );
    assert_near(
        &trained,
        &widen(&want),
        1e-4,
        &format!("{device} parameters"),
    );
    assert!(losses[4] < losses[0], "{losses:?}");
}

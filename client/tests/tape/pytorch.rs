//! The classification operations through the tape against PyTorch's own
//! values and autograd gradients (`benches/classify_reference.py` writes
//! the fixture; it is committed, so this runs without PyTorch).
//!
//! Every device present runs it (the CPU, and a wgpu adapter or CUDA
//! device where there is one). Tolerance: `|got − torch| ≤ r·|torch| +
//! 1e-6·max|torch|` per buffer, `r` 2e-5 on the CPU and 1e-4 on a GPU: both
//! sides compute in f32 with a transcendental per element and short sums,
//! in different orders (a GPU's `exp` is within a few ulp, not one).

use cistern_client::{
    BceWithLogitsOptions, CrossEntropyOptions, NllLossOptions, Reduction, Tape, Tensor, Var,
};
use serde_json::Value;

use cistern_client::ComputeClient;
use cistern_runtime::{Device, DeviceOptions, list_devices};

use super::common::ok;

const FIXTURE: &str = include_str!("../fixtures/classify_pytorch.json");

fn floats(value: &Value, key: &str) -> Vec<f32> {
    let Some(list) = value[key].as_array() else {
        panic!("the fixture has no list `{key}`");
    };
    list.iter()
        .map(|v| v.as_f64().unwrap_or(f64::NAN) as f32)
        .collect()
}

fn reduction(value: &Value) -> Reduction {
    match value["reduction"].as_str() {
        Some("mean") => Reduction::Mean,
        Some("sum") => Reduction::Sum,
        Some("none") => Reduction::None,
        other => panic!("a reduction the fixture should not have: {other:?}"),
    }
}

/// A client on every device present, with its relative tolerance.
pub(super) fn clients() -> Vec<(ComputeClient, f32)> {
    list_devices()
        .into_iter()
        .map(|info| {
            let options = DeviceOptions::with_memory_limit(64 << 20);
            let client = ok(ComputeClient::open(info.device, options), "open");
            let relative = if matches!(info.device, Device::Cpu(_)) {
                2e-5
            } else {
                1e-4
            };
            (client, relative)
        })
        .collect()
}

pub(super) fn assert_matches(got: &[f32], want: &[f32], relative: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0.0f32, |m, w| m.max(w.abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let bound = relative * w.abs() + 1e-6 * scale;
        assert!(
            g.is_finite() && (g - w).abs() <= bound,
            "{what}: element {i} is {g}, PyTorch {w}"
        );
    }
}

/// `loss` weighted by the case's upstream gradient, as a scalar: the
/// gradient that reaches the loss is then `upstream`.
fn weighted<'t>(tape: &'t Tape, loss: &Var<'t>, upstream: &[f32]) -> Var<'t> {
    if loss.len() == 1 && loss.shape().is_empty() {
        return ok(tape.scale(loss, upstream[0]), "scale");
    }
    let u = ok(Tensor::new([upstream.len()], upstream.to_vec()), "upstream");
    let u = ok(tape.upload(&u), "upload");
    ok(tape.sum(&ok(tape.mul(loss, &u), "mul")), "sum")
}

#[test]
fn cross_entropy_and_nll_loss_match_pytorch_values_and_gradients() {
    let fixture: Value = ok(serde_json::from_str(FIXTURE), "the fixture parses");
    let rows = fixture["rows"].as_u64().unwrap_or(0) as usize;
    let classes = fixture["classes"].as_u64().unwrap_or(0) as usize;
    let logits = ok(
        Tensor::new([rows, classes], floats(&fixture, "logits")),
        "logits",
    );
    let weight = floats(&fixture, "weight");
    for (client, relative) in clients() {
        let Some(cases) = fixture["cases"].as_array() else {
            panic!("the fixture has no cases");
        };
        assert!(cases.len() >= 19, "{} cases", cases.len());
        for case in cases {
            let what = format!(
                "{} {} weighted={} smoothing={} ignore={}",
                case["op"],
                case["reduction"],
                case["weighted"],
                case["label_smoothing"],
                case["ignore_index"]
            );
            let tape = Tape::new(&client);
            let x = ok(tape.var(&logits), "var");
            let labels: Vec<i64> = match case["ignore_index"].as_i64() {
                Some(3) => vec![0, 4, 2, 3, 1, 0, 3, 2],
                _ => fixture["targets"]
                    .as_array()
                    .map(|t| t.iter().filter_map(Value::as_i64).collect())
                    .unwrap_or_default(),
            };
            let targets = ok(tape.class_targets(&labels), "targets");
            let class_weight = case["weighted"]
                .as_bool()
                .unwrap_or(false)
                .then(|| weight.clone());
            let ignore_index = case["ignore_index"].as_i64().unwrap_or(-100);
            let loss = if case["op"] == "cross_entropy" {
                let options = CrossEntropyOptions {
                    weight: class_weight,
                    ignore_index,
                    reduction: reduction(case),
                    label_smoothing: case["label_smoothing"].as_f64().unwrap_or(0.0) as f32,
                };
                ok(tape.cross_entropy(&x, &targets, &options), &what)
            } else {
                let options = NllLossOptions {
                    weight: class_weight,
                    ignore_index,
                    reduction: reduction(case),
                };
                let log_probs = ok(tape.log_softmax(&x), "log_softmax");
                ok(tape.nll_loss(&log_probs, &targets, &options), &what)
            };
            let total = weighted(&tape, &loss, &floats(case, "upstream"));
            let gradients = ok(tape.backward(&total), "backward");
            let loss = ok(loss.to_host(), "loss");
            assert_matches(loss.data(), &floats(case, "loss"), relative, &what);
            let Some(grad) = ok(gradients.to_host(&x), "grad") else {
                panic!("{what}: the loss reaches the logits");
            };
            assert_matches(
                grad.data(),
                &floats(case, "grad"),
                relative,
                &format!("{what} gradient"),
            );
        }
    }
}

#[test]
fn softmax_and_log_softmax_match_pytorch() {
    let fixture: Value = ok(serde_json::from_str(FIXTURE), "the fixture parses");
    let rows = fixture["rows"].as_u64().unwrap_or(0) as usize;
    let classes = fixture["classes"].as_u64().unwrap_or(0) as usize;
    let logits = ok(
        Tensor::new([rows, classes], floats(&fixture, "logits")),
        "logits",
    );
    for (client, relative) in clients() {
        let tape = Tape::new(&client);
        let x = ok(tape.upload(&logits), "upload");
        let softmax = ok(ok(tape.softmax(&x), "softmax").to_host(), "read");
        assert_matches(
            softmax.data(),
            &floats(&fixture, "softmax"),
            relative,
            "softmax",
        );
        let log_softmax = ok(ok(tape.log_softmax(&x), "log_softmax").to_host(), "read");
        assert_matches(
            log_softmax.data(),
            &floats(&fixture, "log_softmax"),
            relative,
            "log_softmax",
        );
    }
}

#[test]
fn binary_cross_entropy_with_logits_matches_pytorch_values_and_gradients() {
    let fixture: Value = ok(serde_json::from_str(FIXTURE), "the fixture parses");
    let shape: Vec<usize> = fixture["bce_shape"]
        .as_array()
        .map(|s| {
            s.iter()
                .filter_map(Value::as_u64)
                .map(|d| d as usize)
                .collect()
        })
        .unwrap_or_default();
    let logits = ok(
        Tensor::new(shape.clone(), floats(&fixture, "bce_logits")),
        "logits",
    );
    let target = ok(
        Tensor::new(shape.clone(), floats(&fixture, "bce_target")),
        "target",
    );
    for (client, relative) in clients() {
        let Some(cases) = fixture["bce"].as_array() else {
            panic!("the fixture has no bce cases");
        };
        for case in cases {
            let what = format!(
                "bce {} pos_weighted={} weighted={}",
                case["reduction"], case["pos_weighted"], case["weighted"]
            );
            let tape = Tape::new(&client);
            let x = ok(tape.var(&logits), "var");
            let y = ok(tape.upload(&target), "target");
            let options = BceWithLogitsOptions {
                pos_weight: (case["pos_weighted"].as_bool() == Some(true))
                    .then(|| floats(&fixture, "bce_pos_weight")),
                weight: (case["weighted"].as_bool() == Some(true))
                    .then(|| floats(&fixture, "bce_weight")),
                reduction: reduction(case),
            };
            let loss = ok(
                tape.binary_cross_entropy_with_logits(&x, &y, &options),
                &what,
            );
            let upstream = floats(case, "upstream");
            let total = if upstream.len() == 1 {
                ok(tape.scale(&loss, upstream[0]), "scale")
            } else {
                let u = ok(
                    tape.upload(&ok(Tensor::new(shape.clone(), upstream), "upstream")),
                    "upload",
                );
                ok(tape.sum(&ok(tape.mul(&loss, &u), "mul")), "sum")
            };
            let gradients = ok(tape.backward(&total), "backward");
            assert_matches(
                ok(loss.to_host(), "loss").data(),
                &floats(case, "loss"),
                relative,
                &what,
            );
            let Some(grad) = ok(gradients.to_host(&x), "grad") else {
                panic!("{what}: the loss reaches the logits");
            };
            assert_matches(
                grad.data(),
                &floats(case, "grad"),
                relative,
                &format!("{what} gradient"),
            );
        }
    }
}

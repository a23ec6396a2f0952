//! The tape's classification operations: gradients through a small
//! classifier against finite differences of an f64 host version, and the
//! refusals that must come before anything is queued.

use cistern_client::{
    AutodiffError, BceWithLogitsOptions, CrossEntropyOptions, NllLossOptions, Reduction, Tape,
    Tensor,
};
use cistern_memory::SplitMix64;
use cistern_runtime::Activation;

use super::common::{ok, open, random, wide};

/// f64 cross-entropy (mean, label smoothing `eps`, class weights `w`) of
/// `logits` (`rows×classes`) against `targets`.
fn host_cross_entropy(logits: &[f64], classes: usize, targets: &[i64], w: &[f64], eps: f64) -> f64 {
    let (mut total, mut denominator) = (0.0, 0.0);
    for (row, &t) in logits.chunks(classes).zip(targets) {
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
        let t = t as usize;
        let smooth: f64 = (0..classes).map(|c| w[c] * (lse - row[c])).sum();
        total += (1.0 - eps) * w[t] * (lse - row[t]) + eps / classes as f64 * smooth;
        denominator += w[t];
    }
    total / denominator
}

#[test]
fn a_classifiers_gradients_through_cross_entropy_match_finite_differences() {
    let client = open();
    let mut rng = SplitMix64::new(43);
    let (x, weight, bias) = (
        random(&mut rng, &[6, 4]),
        random(&mut rng, &[3, 4]),
        random(&mut rng, &[3]),
    );
    let targets = [0, 2, 1, 1, 0, 2];
    let class_weight = vec![0.5, 1.5, 1.0];
    let options = CrossEntropyOptions {
        weight: Some(class_weight.clone()),
        label_smoothing: 0.1,
        ..Default::default()
    };
    let tape = Tape::new(&client);
    let (xv, wv, bv) = (
        ok(tape.upload(&x), "x"),
        ok(tape.var(&weight), "weight"),
        ok(tape.var(&bias), "bias"),
    );
    let logits = ok(
        tape.linear(&xv, &wv, Some(&bv), Activation::Identity),
        "linear",
    );
    let labels = ok(tape.class_targets(&targets), "targets");
    let loss = ok(
        tape.cross_entropy(&logits, &labels, &options),
        "cross_entropy",
    );
    let gradients = ok(tape.backward(&loss), "backward");
    let cw: Vec<f64> = class_weight.iter().map(|&v| f64::from(v)).collect();
    let host = |w: &[f64], b: &[f64]| {
        let xs = wide(&x);
        let logits: Vec<f64> = (0..6)
            .flat_map(|r| (0..3).map(move |c| (r, c)))
            .map(|(r, c)| b[c] + (0..4).map(|k| xs[r * 4 + k] * w[c * 4 + k]).sum::<f64>())
            .collect();
        host_cross_entropy(&logits, 3, &targets, &cw, 0.1)
    };
    let (w0, b0) = (wide(&weight), wide(&bias));
    let value = f64::from(ok(loss.item(), "loss"));
    assert!((value - host(&w0, &b0)).abs() < 1e-5, "loss {value}");
    let h = 1e-6;
    for (var, base, is_weight) in [(&wv, &w0, true), (&bv, &b0, false)] {
        let Some(grad) = ok(gradients.to_host(var), "gradient") else {
            panic!("the loss reaches every parameter");
        };
        for i in 0..base.len() {
            let at = |delta: f64| {
                let mut moved = base.clone();
                moved[i] += delta;
                if is_weight {
                    host(&moved, &b0)
                } else {
                    host(&w0, &moved)
                }
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            let got = f64::from(grad.data()[i]);
            assert!(
                (got - fd).abs() <= 1e-4 + 1e-4 * fd.abs(),
                "∂[{i}] {got} vs {fd}"
            );
        }
    }
}

#[test]
fn softmax_then_log_and_nll_loss_equal_log_softmax_and_cross_entropy() {
    let client = open();
    let mut rng = SplitMix64::new(7);
    let x = random(&mut rng, &[5, 4]);
    let targets = [3, 0, 1, 2, 3];
    let tape = Tape::new(&client);
    let xv = ok(tape.var(&x), "x");
    let labels = ok(tape.class_targets(&targets), "targets");
    let ce = ok(
        tape.cross_entropy(&xv, &labels, &Default::default()),
        "cross_entropy",
    );
    let log_probs = ok(tape.log_softmax(&xv), "log_softmax");
    let nll = ok(
        tape.nll_loss(&log_probs, &labels, &NllLossOptions::default()),
        "nll",
    );
    let (a, b) = (ok(ce.item(), "ce"), ok(nll.item(), "nll"));
    assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    let gradients = ok(tape.backward(&nll), "backward");
    let Some(through_nll) = ok(gradients.to_host(&xv), "grad") else {
        panic!("nll reaches x");
    };
    let tape2 = Tape::new(&client);
    let xv2 = ok(tape2.var(&x), "x");
    let labels2 = ok(tape2.class_targets(&targets), "targets");
    let ce2 = ok(
        tape2.cross_entropy(&xv2, &labels2, &Default::default()),
        "ce",
    );
    let fused = ok(ok(tape2.backward(&ce2), "backward").to_host(&xv2), "grad");
    let Some(fused) = fused else {
        panic!("ce reaches x");
    };
    for (a, b) in through_nll.data().iter().zip(fused.data()) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }
    let sm = ok(ok(tape.softmax(&xv), "softmax").to_host(), "read");
    for row in sm.data().chunks(4) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6, "{row:?}");
    }
}

#[test]
fn a_target_out_of_range_is_refused_naming_its_row_before_anything_is_queued() {
    let client = open();
    let tape = Tape::new(&client);
    let x = ok(
        tape.var(&ok(Tensor::new(vec![3, 4], vec![0.5; 12]), "x")),
        "x",
    );
    let labels = ok(tape.class_targets(&[1, 4, 0]), "targets");
    let queued = tape.launches().len();
    let refused = tape.cross_entropy(&x, &labels, &CrossEntropyOptions::default());
    let Err(AutodiffError::InvalidArgument(message)) = refused else {
        panic!("class 4 of 4 is refused: {refused:?}");
    };
    assert!(message.contains("row 1 has class 4"), "{message}");
    assert_eq!(tape.launches().len(), queued, "nothing was queued");
    // The same label is fine where it is the ignore_index.
    let ignoring = CrossEntropyOptions {
        ignore_index: 4,
        ..Default::default()
    };
    assert!(tape.cross_entropy(&x, &labels, &ignoring).is_ok());
    let too_wide = tape.class_targets(&[0, 1 << 40]);
    assert!(matches!(too_wide, Err(AutodiffError::InvalidArgument(m)) if m.contains("row 1")));
}

#[test]
fn bad_shapes_weights_and_smoothing_are_refused() {
    let client = open();
    let tape = Tape::new(&client);
    let x = ok(
        tape.var(&ok(Tensor::new(vec![2, 3], vec![0.5; 6]), "x")),
        "x",
    );
    let labels = ok(tape.class_targets(&[0, 1, 2]), "three targets");
    assert!(matches!(
        tape.cross_entropy(&x, &labels, &Default::default()),
        Err(AutodiffError::ShapeMismatch(_))
    ));
    let labels = ok(tape.class_targets(&[0, 1]), "targets");
    let weight = CrossEntropyOptions {
        weight: Some(vec![1.0; 2]),
        ..Default::default()
    };
    assert!(matches!(
        tape.cross_entropy(&x, &labels, &weight),
        Err(AutodiffError::InvalidArgument(_))
    ));
    let smoothing = CrossEntropyOptions {
        label_smoothing: -0.1,
        ..Default::default()
    };
    assert!(matches!(
        tape.cross_entropy(&x, &labels, &smoothing),
        Err(AutodiffError::InvalidArgument(_))
    ));
    let other = Tape::new(&client);
    let foreign = ok(other.class_targets(&[0, 1]), "targets");
    assert!(matches!(
        tape.cross_entropy(&x, &foreign, &Default::default()),
        Err(AutodiffError::TapeMismatch)
    ));
    let y = ok(
        tape.var(&ok(Tensor::new(vec![2, 3], vec![1.0; 6]), "y")),
        "tracked target",
    );
    assert!(matches!(
        tape.binary_cross_entropy_with_logits(&x, &y, &BceWithLogitsOptions::default()),
        Err(AutodiffError::InvalidArgument(_))
    ));
    let pos_weight = BceWithLogitsOptions {
        pos_weight: Some(vec![1.0; 2]),
        reduction: Reduction::Sum,
        ..Default::default()
    };
    let y = ok(
        tape.upload(&ok(Tensor::new(vec![2, 3], vec![1.0; 6]), "y")),
        "y",
    );
    assert!(matches!(
        tape.binary_cross_entropy_with_logits(&x, &y, &pos_weight),
        Err(AutodiffError::InvalidArgument(_))
    ));
}

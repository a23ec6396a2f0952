//! The device chain as a classifier: its cross-entropy train step against
//! the tape's `cross_entropy` and the store's `step`, refusals that change
//! nothing, and predictions as logits, probabilities and classes.

use cistern_client::{
    BackendError, ChainLoss, CrossEntropyOptions, DeviceParamStore, Reduction, Tape, argmax_rows,
};
use cistern_optim::SgdConfig;
use cistern_runtime::Activation;

use super::chain::chain;
use super::common::{flat32, model, ok, open, store};

fn sgd() -> SgdConfig {
    SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        ..Default::default()
    }
}

/// Three classes for the model's eight rows (its outputs are 3 wide).
const LABELS: [i64; 8] = [0, 2, 1, 1, 0, 2, 2, 0];

fn options() -> CrossEntropyOptions {
    CrossEntropyOptions {
        weight: Some(vec![1.0, 2.0, 0.5]),
        label_smoothing: 0.1,
        ..Default::default()
    }
}

/// One step through the tape: forward, `cross_entropy`, the store's
/// backward and SGD step.
fn tape_step(
    client: &cistern_client::ComputeClient,
    store: &mut DeviceParamStore,
    x: &cistern_client::Tensor<f32>,
) {
    let tape = Tape::new(client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    let input = ok(tape.upload(x), "x");
    let h = ok(
        store.linear_forward_with_activation(
            &tape,
            &input,
            &leaves[0],
            Some(&leaves[1]),
            Activation::Tanh,
        ),
        "h",
    );
    let logits = ok(
        store.linear_forward(&tape, &h, &leaves[2], Some(&leaves[3])),
        "logits",
    );
    let targets = ok(tape.class_targets(&LABELS), "targets");
    let loss = ok(tape.cross_entropy(&logits, &targets, &options()), "loss");
    let gradients = ok(store.backward(&tape, &loss), "backward");
    ok(store.step(&gradients, &sgd()), "step");
}

#[test]
fn a_cross_entropy_chain_step_equals_the_tapes_cross_entropy_and_step() {
    let client = open();
    let model = model(0xCE);
    let mut chained = store(&client, &model);
    let mut taped = store(&client, &model);
    let options = options();
    let mut losses = Vec::new();
    for _ in 0..10 {
        let tape = Tape::new(&client);
        let leaves = ok(chained.snapshot_resident_params(&tape), "snapshot");
        let loss = ChainLoss::CrossEntropy {
            targets: &LABELS,
            options: &options,
        };
        let sent =
            chained.train_step_device_chain_with_loss(&chain(&leaves), &model.x, loss, &sgd());
        let loss = ok(sent, "chain step");
        losses.push(ok(chained.read_train_step_loss(&loss), "loss"));
        tape_step(&client, &mut taped, &model.x);
    }
    let got = flat32(&ok(chained.sync_to_host(), "chain params"));
    let want = flat32(&ok(taped.sync_to_host(), "tape params"));
    for (got, want) in got.iter().zip(&want) {
        assert!(
            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
            "{got} vs {want}"
        );
    }
    assert!(losses[9] < losses[0], "the loss falls: {losses:?}");
    assert_eq!(chained.steps(), 10);
}

#[test]
fn a_class_out_of_range_is_refused_naming_its_row_and_nothing_changes() {
    let client = open();
    let model = model(0xCF);
    let mut store = store(&client, &model);
    let before = flat32(&ok(store.sync_to_host(), "params"));
    let tape = Tape::new(&client);
    let leaves = ok(store.snapshot_resident_params(&tape), "snapshot");
    let mut labels = LABELS;
    labels[5] = 3;
    let options = CrossEntropyOptions::default();
    let loss = ChainLoss::CrossEntropy {
        targets: &labels,
        options: &options,
    };
    let refused = store.train_step_device_chain_with_loss(&chain(&leaves), &model.x, loss, &sgd());
    let Err(BackendError::InvalidArgument(message)) = refused else {
        panic!("class 3 of 3 is refused: {refused:?}");
    };
    assert!(message.contains("row 5 has class 3"), "{message}");
    let none = CrossEntropyOptions {
        reduction: Reduction::None,
        ..Default::default()
    };
    let loss = ChainLoss::CrossEntropy {
        targets: &LABELS,
        options: &none,
    };
    assert!(matches!(
        store.validate_train_step_device_chain_with_loss(&chain(&leaves), &model.x, loss, &sgd()),
        Err(BackendError::InvalidArgument(_))
    ));
    let short = ChainLoss::CrossEntropy {
        targets: &LABELS[..7],
        options: &options,
    };
    assert!(
        store
            .validate_train_step_device_chain_with_loss(&chain(&leaves), &model.x, short, &sgd())
            .is_err()
    );
    assert_eq!(store.steps(), 0);
    assert_eq!(flat32(&ok(store.sync_to_host(), "params")), before);
}

#[test]
fn predictions_give_logits_probabilities_and_the_classes_of_the_largest_logits() {
    let client = open();
    let model = model(0xD0);
    let mut store = store(&client, &model);
    let options = CrossEntropyOptions::default();
    for _ in 0..60 {
        let tape = Tape::new(&client);
        let leaves = ok(store.snapshot_resident_params(&tape), "snapshot");
        let loss = ChainLoss::CrossEntropy {
            targets: &LABELS,
            options: &options,
        };
        ok(
            store.train_step_device_chain_with_loss(&chain(&leaves), &model.x, loss, &sgd()),
            "step",
        );
    }
    let tape = Tape::new(&client);
    let leaves = ok(store.snapshot_resident_params(&tape), "snapshot");
    let logits = ok(
        store.predict_device_chain(&chain(&leaves), &model.x),
        "logits",
    );
    let probabilities = ok(
        store.predict_device_chain_probabilities(&chain(&leaves), &model.x),
        "probabilities",
    );
    assert_eq!(probabilities.shape(), logits.shape());
    for (p, z) in probabilities.data().chunks(3).zip(logits.data().chunks(3)) {
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-5, "{p:?}");
        let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let total: f32 = z.iter().map(|v| (v - max).exp()).sum();
        for (p, z) in p.iter().zip(z) {
            assert!((p - (z - max).exp() / total).abs() < 1e-5);
        }
    }
    let classes = ok(
        store.predict_device_chain_classes(&chain(&leaves), &model.x),
        "classes",
    );
    assert_eq!(classes, argmax_rows(&logits));
    let labels: Vec<usize> = LABELS.iter().map(|&l| l as usize).collect();
    assert_eq!(
        classes, labels,
        "eight rows, 60 steps: the training set is learned"
    );
}

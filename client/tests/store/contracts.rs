//! Contracts of the store's original API that no other file names: the
//! store's own backward refusals, every family's frozen hyper-parameters,
//! the Adam and AdamW guard, registration moving no bytes, and the strict
//! `[out]` bias.

use cistern_client::{AutodiffError, BackendError, Tape};
use cistern_optim::{
    AdagradConfig, AdamConfig, AdamWConfig, LambConfig, OptimizerConfig, RmsPropConfig, SgdConfig,
};

use super::common::{loss, model, ok, open, step_with, store, with_gradients};

#[test]
fn the_stores_backward_without_a_registered_forward_is_an_invalid_argument() {
    let client = open();
    let model = model(61);
    let mut store = store(&client, &model);
    let tape = Tape::new(&client);
    let x = ok(tape.var(&model.x), "var");
    let unrelated = ok(tape.sum(&x), "sum");
    match store.backward(&tape, &unrelated) {
        Err(AutodiffError::InvalidArgument(message)) => {
            assert!(message.contains("registered forward"), "{message}")
        }
        other => panic!("a backward with no forward, got {:?}", other.map(|_| ())),
    }
    assert_eq!(store.steps(), 0);
    assert!(!store.is_poisoned());
}

#[test]
fn the_stores_backward_on_another_tape_is_tape_mismatch_and_keeps_the_forward() {
    let client = open();
    let model = model(62);
    let mut store = store(&client, &model);
    let tape = Tape::new(&client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    let value = ok(loss(&store, &tape, &leaves, &model), "forward");
    let other = Tape::new(&client);
    let y = ok(other.var(&model.y), "var");
    let elsewhere = ok(other.sum(&y), "sum");
    match store.backward(&other, &elsewhere) {
        Err(AutodiffError::Backend(BackendError::TapeMismatch)) => {}
        other => panic!("a backward on another tape, got {:?}", other.map(|_| ())),
    }
    let gradients = ok(store.backward(&tape, &value), "the forward's own backward");
    ok(store.step(&gradients, &SgdConfig::default()), "step");
    assert_eq!(store.steps(), 1);
}

/// A first step of `first`, then a step of `changed` (same family, one
/// field other than `lr` changed) must be refused naming `field`, and a
/// step of `first` with another `lr` must pass.
fn frozen_after_the_first_step(
    first: OptimizerConfig,
    changed: OptimizerConfig,
    faster: OptimizerConfig,
    field: &str,
) {
    let client = open();
    let model = model(63);
    let mut store = store(&client, &model);
    with_gradients(&client, &mut store, &model, |store, gradients| {
        ok(step_with(store, gradients, &first), "the first step")
    });
    with_gradients(&client, &mut store, &model, |store, gradients| {
        match step_with(store, gradients, &changed) {
            Err(BackendError::InvalidArgument(message)) => {
                assert!(message.contains(field), "{field}: {message}")
            }
            other => panic!("a changed `{field}` is refused, got {other:?}"),
        }
        ok(step_with(store, gradients, &faster), "a new lr is allowed");
    });
    assert_eq!(store.steps(), 2);
}

#[test]
fn every_familys_hyper_parameters_but_lr_are_fixed_by_the_first_step() {
    use OptimizerConfig::*;
    let sgd = SgdConfig {
        momentum: 0.9,
        ..SgdConfig::default()
    };
    frozen_after_the_first_step(
        Sgd(sgd.clone()),
        Sgd(SgdConfig {
            momentum: 0.5,
            ..sgd.clone()
        }),
        Sgd(SgdConfig { lr: 0.5, ..sgd }),
        "`momentum`",
    );
    let rmsprop = RmsPropConfig::default();
    frozen_after_the_first_step(
        RmsProp(rmsprop.clone()),
        RmsProp(RmsPropConfig {
            alpha: 0.9,
            ..rmsprop.clone()
        }),
        RmsProp(RmsPropConfig {
            lr: 1e-3,
            ..rmsprop
        }),
        "`alpha`",
    );
    let adagrad = AdagradConfig::default();
    frozen_after_the_first_step(
        Adagrad(adagrad.clone()),
        Adagrad(AdagradConfig {
            eps: 1e-6,
            ..adagrad.clone()
        }),
        Adagrad(AdagradConfig {
            lr: 1e-3,
            ..adagrad
        }),
        "`eps`",
    );
    let lamb = LambConfig::default();
    frozen_after_the_first_step(
        Lamb(lamb.clone()),
        Lamb(LambConfig {
            weight_decay: 0.5,
            ..lamb.clone()
        }),
        Lamb(LambConfig { lr: 1e-4, ..lamb }),
        "`weight_decay`",
    );
}

#[test]
fn adam_after_adamw_and_adamw_after_adam_are_invalid_arguments() {
    for (first, then) in [
        (
            OptimizerConfig::Adam(AdamConfig::default()),
            OptimizerConfig::AdamW(AdamWConfig::default()),
        ),
        (
            OptimizerConfig::AdamW(AdamWConfig::default()),
            OptimizerConfig::Adam(AdamConfig::default()),
        ),
    ] {
        let client = open();
        let model = model(64);
        let mut store = store(&client, &model);
        with_gradients(&client, &mut store, &model, |store, gradients| {
            ok(step_with(store, gradients, &first), "the first step")
        });
        let before = ok(store.sync_to_host(), "params");
        with_gradients(&client, &mut store, &model, |store, gradients| {
            let refused = step_with(store, gradients, &then);
            assert!(
                matches!(refused, Err(BackendError::InvalidArgument(_))),
                "{first:?} then {then:?}: {refused:?}"
            );
        });
        assert_eq!(
            ok(store.sync_to_host(), "params"),
            before,
            "nothing changed"
        );
        assert_eq!(store.steps(), 1);
    }
}

#[test]
fn registering_the_resident_parameters_moves_no_bytes() {
    let client = open();
    let model = model(65);
    let mut store = store(&client, &model);
    let tape = Tape::new(&client);
    let before = ok(client.server_stats(), "stats");
    let leaves = ok(store.register_resident_params(&tape), "register");
    let after = ok(client.server_stats(), "stats");
    assert_eq!(leaves.len(), model.params.len());
    assert_eq!((after.reads, after.writes), (before.reads, before.writes));
    assert_eq!(after.launches, before.launches, "no copy either");
}

#[test]
fn a_bias_through_the_store_is_strictly_out_long_a_row_of_it_is_a_shape_mismatch() {
    let client = open();
    let model = model(66);
    let tape = Tape::new(&client);
    // W (3×4), and b as a [1, 3] row instead of [3].
    let row = ok(
        cistern_client::Tensor::new([1, 3], model.params[3].data().to_vec()),
        "a row bias",
    );
    let params = [&model.params[2], &row];
    let mut store = ok(
        cistern_client::DeviceParamStore::new(&tape, &params),
        "store",
    );
    let leaves = ok(store.register_resident_params(&tape), "register");
    let input = ok(cistern_client::Tensor::full([2, 4], 0.5), "input");
    let x = ok(tape.upload(&input), "x");
    match store.linear_forward(&tape, &x, &leaves[0], Some(&leaves[1])) {
        Err(BackendError::ShapeMismatch(_)) => {}
        other => panic!("a [1, out] bias, got {:?}", other.map(|_| ())),
    }
    assert!(!store.is_poisoned());
}

//! SGD through the store against the f64 reference, every option, 20 steps.

use cistern_optim::{OptimizerConfig, SgdConfig};

use super::common::{self, model, ok, open, store, with_gradients};

fn matches_the_reference_over_20_steps(config: SgdConfig) {
    common::matches_the_reference_over_20_steps(OptimizerConfig::Sgd(config));
}

fn sgd(lr: f64) -> SgdConfig {
    SgdConfig {
        lr,
        ..SgdConfig::default()
    }
}

#[test]
fn plain_sgd_through_the_store_matches_the_reference() {
    matches_the_reference_over_20_steps(sgd(0.01));
}

#[test]
fn sgd_with_momentum_through_the_store_matches_the_reference() {
    matches_the_reference_over_20_steps(SgdConfig {
        momentum: 0.9,
        ..sgd(0.002)
    });
}

#[test]
fn sgd_with_dampening_through_the_store_matches_the_reference() {
    matches_the_reference_over_20_steps(SgdConfig {
        momentum: 0.8,
        dampening: 0.3,
        ..sgd(0.002)
    });
}

#[test]
fn nesterov_sgd_through_the_store_matches_the_reference() {
    matches_the_reference_over_20_steps(SgdConfig {
        momentum: 0.9,
        nesterov: true,
        ..sgd(0.002)
    });
}

#[test]
fn sgd_with_weight_decay_through_the_store_matches_the_reference() {
    matches_the_reference_over_20_steps(SgdConfig {
        weight_decay: 0.01,
        momentum: 0.5,
        ..sgd(0.002)
    });
}

#[test]
fn maximizing_sgd_through_the_store_matches_the_reference() {
    matches_the_reference_over_20_steps(SgdConfig {
        maximize: true,
        weight_decay: 0.01,
        ..sgd(0.002)
    });
}

#[test]
fn the_learning_rate_may_change_between_steps() {
    let client = open();
    let model = model(0x1A);
    let mut store = store(&client, &model);
    for lr in [0.1, 0.05] {
        with_gradients(&client, &mut store, &model, |store, gradients| {
            ok(store.step(gradients, &sgd(lr)), "step")
        });
    }
    assert_eq!(store.steps(), 2);
}

//! SGD through the store against the f64 reference, every option, 20 steps.

use cistern_client::Tensor;
use cistern_optim::parity::{PARAM_FLOOR, TOLERANCE, max_relative_error};
use cistern_optim::reference::{self, ReferenceState};
use cistern_optim::{OptimizerConfig, Segment, SgdConfig};

use super::common::{flat, flat32, model, ok, open, store, with_gradients};

fn segments(params: &[Tensor<f32>]) -> Vec<Segment> {
    let mut offset = 0;
    params
        .iter()
        .map(|tensor| {
            let segment = Segment::new(offset, tensor.len());
            offset += tensor.len();
            segment
        })
        .collect()
}

/// 20 steps of `config` through the store, each checked against the
/// reference fed the same gradients (read back from the staging buffer).
/// Learning rates are small enough that no parameter crosses 0, where the
/// parity floor would measure f32 rounding instead of the update.
fn matches_the_reference_over_20_steps(config: SgdConfig) {
    let client = open();
    let model = model(0x5_6D);
    let mut store = store(&client, &model);
    let segments = segments(&model.params);
    let wrapped = OptimizerConfig::Sgd(config.clone());
    let mut want = ReferenceState::new(&wrapped, flat(&model.params));
    for step in 1..=20 {
        let grads = with_gradients(&client, &mut store, &model, |store, gradients| {
            let staged = ok(store.resident_grads_to_host(), "resident grads");
            let grads: Vec<Tensor<f32>> = staged.into_iter().flatten().collect();
            assert_eq!(grads.len(), 4, "every slot is staged");
            ok(store.step(gradients, &config), "step");
            flat(&grads)
        });
        ok(
            reference::step(&wrapped, step, &segments, &grads, &mut want),
            "reference",
        );
        let got = flat32(&ok(store.sync_to_host(), "sync_to_host"));
        let error = max_relative_error(&got, &want.params, PARAM_FLOOR);
        assert!(error <= TOLERANCE, "step {step} of {config:?}: {error}");
    }
    assert_eq!(store.steps(), 20);
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

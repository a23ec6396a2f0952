//! The store's checkpoint: out after some steps, restored into a new store
//! (on another CPU ordinal too), whose steps then equal the original's bit
//! for bit; a checkpoint that does not fit is refused naming what.

use cistern_client::{BackendError, DeviceParamStore, StoreCheckpoint, Tape};
use cistern_optim::{OptimizerConfig, SgdConfig};
use cistern_runtime::{Device, DeviceOptions};

use super::common::{flat32, model, ok, open, step_with, store, with_gradients};

fn every_family() -> Vec<OptimizerConfig> {
    use cistern_optim::*;
    vec![
        OptimizerConfig::Sgd(SgdConfig {
            lr: 0.01,
            momentum: 0.9,
            ..Default::default()
        }),
        OptimizerConfig::Adam(AdamConfig {
            amsgrad: true,
            ..Default::default()
        }),
        OptimizerConfig::AdamW(AdamWConfig::default()),
        OptimizerConfig::RmsProp(RmsPropConfig {
            momentum: 0.5,
            centered: true,
            ..Default::default()
        }),
        OptimizerConfig::Adagrad(AdagradConfig::default()),
        OptimizerConfig::Lamb(LambConfig::default()),
    ]
}

#[test]
fn a_restored_store_steps_exactly_as_the_one_it_was_checkpointed_from() {
    let elsewhere = ok(
        cistern_client::ComputeClient::open(Device::Cpu(5), DeviceOptions::default()),
        "cpu:5",
    );
    for config in every_family() {
        let client = open();
        let model = model(31);
        let mut original = store(&client, &model);
        for _ in 0..5 {
            with_gradients(&client, &mut original, &model, |store, gradients| {
                ok(step_with(store, gradients, &config), "step")
            });
        }
        let checkpoint = ok(original.checkpoint(), "checkpoint");
        let saved = checkpoint
            .optimizer
            .as_ref()
            .map(|o| (o.steps, o.state.len()));
        assert_eq!(
            saved,
            Some((5, config.state_layout().buffers.len())),
            "{config:?}"
        );
        let mut restored = ok(
            DeviceParamStore::restore(&Tape::new(&elsewhere), &checkpoint),
            "restore",
        );
        assert_eq!(restored.steps(), 5);
        for _ in 0..5 {
            with_gradients(&client, &mut original, &model, |store, gradients| {
                ok(step_with(store, gradients, &config), "original step")
            });
            with_gradients(&elsewhere, &mut restored, &model, |store, gradients| {
                ok(step_with(store, gradients, &config), "restored step")
            });
        }
        assert_eq!(
            ok(restored.checkpoint(), "again"),
            ok(original.checkpoint(), "original again"),
            "{config:?}"
        );
    }
}

#[test]
fn a_store_that_never_stepped_checkpoints_its_parameters_alone() {
    let client = open();
    let model = model(32);
    let checkpoint = ok(store(&client, &model).checkpoint(), "checkpoint");
    assert_eq!(checkpoint.optimizer, None);
    assert_eq!(checkpoint.params, flat32(&model.params));
    assert_eq!(
        checkpoint.shapes,
        vec![vec![4, 6], vec![6], vec![6, 3], vec![3]]
    );
    let restored = ok(
        DeviceParamStore::restore(&Tape::new(&client), &checkpoint),
        "restore",
    );
    assert_eq!(
        flat32(&ok(restored.sync_to_host(), "params")),
        checkpoint.params
    );
}

fn refused(checkpoint: &StoreCheckpoint, needle: &str) {
    let client = open();
    match DeviceParamStore::restore(&Tape::new(&client), checkpoint) {
        Err(BackendError::InvalidArgument(why)) => assert!(why.contains(needle), "{why}"),
        other => panic!("restored: {other:?}"),
    }
    assert_eq!(
        ok(client.memory_stats(), "stats").live_allocations,
        0,
        "nothing kept"
    );
}

#[test]
fn a_checkpoint_that_does_not_fit_is_refused_naming_what() {
    let client = open();
    let model = model(33);
    let mut stepped = store(&client, &model);
    let config = every_family().remove(1);
    with_gradients(&client, &mut stepped, &model, |store, gradients| {
        ok(step_with(store, gradients, &config), "step")
    });
    let good = ok(stepped.checkpoint(), "checkpoint");
    let mut short = good.clone();
    short.params.truncate(40);
    refused(&short, "slot 2");
    let mut long = good.clone();
    long.params.push(1.0);
    refused(&long, "52 floats");
    let mut missing = good.clone();
    if let Some(optimizer) = &mut missing.optimizer {
        optimizer.state.pop();
    }
    refused(&missing, "buffers");
    let mut wrong = good.clone();
    if let Some(optimizer) = &mut wrong.optimizer {
        optimizer.state[0].pop();
    }
    refused(&wrong, "`exp_avg`");
    let mut invalid = good;
    if let Some(optimizer) = &mut invalid.optimizer {
        optimizer.config = OptimizerConfig::Sgd(SgdConfig {
            lr: -1.0,
            ..Default::default()
        });
    }
    refused(&invalid, "config");
}

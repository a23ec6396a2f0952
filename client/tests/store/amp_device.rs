//! AMP with no synchronisation: the scale, growth tracker, skips and step
//! count on the device give the synchronising form's parameters, skips and
//! final scale bit for bit, with infinities and NaN at chosen steps.

use cistern_client::{BackendError, DeviceParamStore, Gradients, Tape, Tensor};
use cistern_optim::{
    AdamConfig, AdamWConfig, GradScaler, GradScalerConfig, OptimizerConfig, SgdConfig,
};

use super::common::{flat32, loss, model, ok, open, store};

/// What is at the first gradient element of a step.
fn poisoned_value(step: u64) -> Option<f32> {
    match step {
        2 => Some(f32::INFINITY),
        6 | 7 => Some(f32::NAN),
        11 => Some(f32::NEG_INFINITY),
        _ => None,
    }
}

fn scaler() -> GradScaler {
    let config = GradScalerConfig {
        init_scale: 1024.0,
        growth_interval: 3,
        ..GradScalerConfig::default()
    };
    ok(GradScaler::new(config), "a scaler")
}

/// One store's gradients of the loss scaled by `scale`, with `bad` (if
/// any) at the first element.
fn step_on<'t>(
    store: &mut DeviceParamStore,
    tape: &'t Tape,
    scale: f32,
    bad: Option<f32>,
    step: impl FnOnce(&mut DeviceParamStore, &Gradients<'t>),
) {
    let model = model(0xA3);
    let leaves = ok(store.register_resident_params(tape), "register");
    let value = ok(loss(store, tape, &leaves, &model), "forward");
    let scaled = ok(tape.scale(&value, scale), "scaled loss");
    let gradients = ok(store.backward(tape, &scaled), "backward");
    let Some(bad) = bad else {
        return step(store, &gradients);
    };
    let mut staged: Vec<Tensor<f32>> = ok(store.resident_grads_to_host(), "staged")
        .into_iter()
        .flatten()
        .collect();
    let mut first = staged[0].clone().into_data();
    first[0] = bad;
    staged[0] = ok(Tensor::new(staged[0].shape(), first), "bad gradient");
    let pairs = leaves.iter().map(|leaf| leaf.var()).zip(staged);
    let host = ok(Gradients::from_host(tape, pairs), "from_host");
    step(store, &host);
}

fn synchronised(
    store: &mut DeviceParamStore,
    gradients: &Gradients<'_>,
    config: &OptimizerConfig,
    scaler: &mut GradScaler,
) -> bool {
    let skipped = match config {
        OptimizerConfig::Sgd(config) => store.step_amp(gradients, config, scaler),
        OptimizerConfig::Adam(config) => store.step_adam_amp(gradients, config, scaler),
        OptimizerConfig::AdamW(config) => store.step_adamw_amp(gradients, config, scaler),
        other => panic!("no AMP step for {other:?}"),
    };
    ok(skipped, "synchronising AMP step")
}

fn on_device(
    store: &mut DeviceParamStore,
    gradients: &Gradients<'_>,
    config: &OptimizerConfig,
    scaler: &GradScaler,
) -> Result<(), BackendError> {
    match config {
        OptimizerConfig::Sgd(config) => store.step_amp_on_device(gradients, config, scaler),
        OptimizerConfig::Adam(config) => store.step_adam_amp_on_device(gradients, config, scaler),
        OptimizerConfig::AdamW(config) => store.step_adamw_amp_on_device(gradients, config, scaler),
        other => panic!("no AMP step for {other:?}"),
    }
}

/// 14 AMP steps of `config` in both forms (the device form from step
/// `switch` on, the synchronising form before it); the parameters, skips,
/// scale, tracker and step count agree bit for bit.
fn both_forms_agree(config: OptimizerConfig, switch: u64) {
    let client = open();
    let model = model(0xA3);
    let mut synced = store(&client, &model);
    let mut device = store(&client, &model);
    let mut scaler_synced = scaler();
    let mut scaler_device = scaler();
    let mut skips = 0u32;
    for step in 1..=14 {
        let scale = scaler_synced.scale();
        let bad = poisoned_value(step);
        let tape = Tape::new(&client);
        step_on(&mut synced, &tape, scale, bad, |store, gradients| {
            let skipped = synchronised(store, gradients, &config, &mut scaler_synced);
            skips += u32::from(skipped);
        });
        let tape = Tape::new(&client);
        let device_scale = if step < switch {
            scaler_device.scale()
        } else {
            // The one read a training loop would make for its loss scale.
            ok(device.device_amp_state(), "device state").map_or(scaler_device.scale(), |s| s.scale)
        };
        assert_eq!(device_scale, scale, "step {step}");
        step_on(&mut device, &tape, scale, bad, |store, gradients| {
            if step < switch {
                synchronised(store, gradients, &config, &mut scaler_device);
            } else {
                ok(
                    on_device(store, gradients, &config, &scaler_device),
                    "device step",
                );
            }
        });
    }
    let state = ok(device.device_amp_state(), "device state");
    let state = state.unwrap_or_else(|| panic!("no device state"));
    assert_eq!(
        flat32(&ok(device.sync_to_host(), "device params")),
        flat32(&ok(synced.sync_to_host(), "synced params")),
    );
    assert_eq!(state.scale, scaler_synced.scale());
    assert_eq!(state.growth_tracker, scaler_synced.growth_tracker());
    assert_eq!(u64::from(state.steps), synced.steps());
    let device_form_skips = (switch..=14)
        .filter(|&s| poisoned_value(s).is_some())
        .count();
    assert_eq!(state.skipped as usize, device_form_skips);
    assert_eq!(skips, 4);
}

#[test]
fn amp_sgd_on_the_device_matches_the_synchronising_form_bit_for_bit() {
    let config = SgdConfig {
        lr: 0.002,
        momentum: 0.9,
        ..SgdConfig::default()
    };
    both_forms_agree(OptimizerConfig::Sgd(config), 1);
}

#[test]
fn amp_adam_on_the_device_matches_the_synchronising_form_bit_for_bit() {
    both_forms_agree(OptimizerConfig::Adam(AdamConfig::default()), 1);
}

#[test]
fn amp_adamw_on_the_device_matches_the_synchronising_form_bit_for_bit() {
    let config = AdamWConfig {
        amsgrad: true,
        ..AdamWConfig::default()
    };
    both_forms_agree(OptimizerConfig::AdamW(config), 1);
}

#[test]
fn switching_to_the_device_form_mid_training_carries_the_count_and_scale() {
    both_forms_agree(OptimizerConfig::Adam(AdamConfig::default()), 5);
}

#[test]
fn a_host_counted_step_after_the_device_form_is_an_invalid_argument() {
    let client = open();
    let model = model(0xA3);
    let mut store = store(&client, &model);
    let config = AdamConfig::default();
    let tape = Tape::new(&client);
    step_on(&mut store, &tape, 1024.0, None, |store, gradients| {
        ok(
            store.step_adam_amp_on_device(gradients, &config, &scaler()),
            "device step",
        );
    });
    let tape = Tape::new(&client);
    step_on(&mut store, &tape, 1024.0, None, |store, gradients| {
        let refused = store.step_adam(gradients, &config);
        assert!(
            matches!(refused, Err(BackendError::InvalidArgument(_))),
            "{refused:?}"
        );
        let mut other = scaler();
        let refused = store.step_adam_amp(gradients, &config, &mut other);
        assert!(refused.is_err());
        let changed = ok(
            GradScaler::new(GradScalerConfig {
                growth_interval: 7,
                ..GradScalerConfig::default()
            }),
            "scaler",
        );
        let refused = store.step_adam_amp_on_device(gradients, &config, &changed);
        assert!(
            matches!(refused, Err(BackendError::InvalidArgument(_))),
            "{refused:?}"
        );
        ok(
            store.step_adam_amp_on_device(gradients, &config, &scaler()),
            "the same rule",
        );
    });
    let state = ok(store.device_amp_state(), "state").unwrap_or_else(|| panic!("no state"));
    assert_eq!(state.steps, 2);
    assert_eq!(state.skipped, 0);
    assert_eq!(state.growth_tracker, 2);
}

#[test]
fn a_store_without_a_device_form_step_has_no_device_amp_state() {
    let client = open();
    let store = store(&client, &model(0xA3));
    assert_eq!(ok(store.device_amp_state(), "state"), None);
}

#[test]
fn a_device_amp_store_restored_from_its_checkpoint_file_goes_on_bit_for_bit() {
    let client = open();
    let config = OptimizerConfig::Adam(AdamConfig::default());
    let mut original = store(&client, &model(0xA3));
    let device_step = |store: &mut DeviceParamStore, step: u64| {
        let scale = ok(store.device_amp_state(), "state").map_or(scaler().scale(), |s| s.scale);
        let tape = Tape::new(&client);
        step_on(
            store,
            &tape,
            scale,
            poisoned_value(step),
            |store, gradients| {
                ok(
                    on_device(store, gradients, &config, &scaler()),
                    "device step",
                )
            },
        );
    };
    for step in 1..=7 {
        device_step(&mut original, step);
    }
    let checkpoint = ok(original.checkpoint(), "checkpoint");
    let saved = checkpoint
        .optimizer
        .as_ref()
        .and_then(|o| o.device_amp.clone());
    let saved = saved.unwrap_or_else(|| panic!("the checkpoint lacks the device AMP words"));
    assert_eq!(
        (saved.state.steps, saved.state.skipped),
        (4, 3),
        "3 of 7 skipped"
    );
    let dir = std::env::temp_dir().join(format!("cistern-amp-ckpt-{}", std::process::id()));
    let checkpoints = ok(cistern_client::CheckpointDir::create(&dir, 1), "dir");
    let path = ok(
        checkpoints.save_store(7, &original, &serde_json::json!({})),
        "save",
    );
    let read = ok(
        cistern_client::read_checkpoint(&ok(std::fs::read(&path), "file")),
        "read",
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(read.store, checkpoint);
    let mut restored = ok(
        DeviceParamStore::restore(&Tape::new(&client), &read.store),
        "restore",
    );
    for step in 8..=14 {
        device_step(&mut original, step);
        device_step(&mut restored, step);
    }
    assert_eq!(
        ok(restored.checkpoint(), "restored"),
        ok(original.checkpoint(), "original")
    );
    assert_eq!(
        ok(restored.device_amp_state(), "restored state"),
        ok(original.device_amp_state(), "original state")
    );
}

//! Mixed precision through the store: sequences with infinities and NaN at
//! chosen steps give the parameters, skips and final scale of the reference
//! `GradScaler` semantics, for SGD, Adam and AdamW.

use cistern_client::{Gradients, Tape, Tensor};
use cistern_optim::parity::{PARAM_FLOOR, TOLERANCE, max_relative_error};
use cistern_optim::reference::{self, ReferenceState};
use cistern_optim::{
    AdamConfig, AdamWConfig, GradScaler, GradScalerConfig, OptimizerConfig, SgdConfig,
};

use super::common::{flat, flat32, loss, model, ok, open, segments, store};

/// What is at the first gradient element of a step.
fn poisoned_value(step: u64) -> Option<f32> {
    match step {
        3 => Some(f32::INFINITY),
        7 | 8 => Some(f32::NAN),
        12 => Some(f32::NEG_INFINITY),
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

/// 16 AMP steps of `config`, the loss scaled by the scaler's scale; at
/// the chosen steps a non-finite value replaces the first gradient.
fn matches_the_reference_scaler(config: OptimizerConfig) {
    let client = open();
    let model = model(0xA3);
    let mut store = store(&client, &model);
    let segments = segments(&model.params);
    let (mut device_scaler, mut host_scaler) = (scaler(), scaler());
    let mut want = ReferenceState::new(&config, flat(&model.params));
    let (mut want_steps, mut skips) = (0u64, 0u64);
    for step in 1..=16 {
        let tape = Tape::new(&client);
        let leaves = ok(store.register_resident_params(&tape), "register");
        let value = ok(loss(&store, &tape, &leaves, &model), "forward");
        let scaled = ok(tape.scale(&value, device_scaler.scale()), "scaled loss");
        let gradients = ok(store.backward(&tape, &scaled), "backward");
        let mut staged: Vec<Tensor<f32>> = ok(store.resident_grads_to_host(), "staged")
            .into_iter()
            .flatten()
            .collect();
        let host;
        let used = match poisoned_value(step) {
            None => &gradients,
            Some(bad) => {
                let mut first = staged[0].clone().into_data();
                first[0] = bad;
                staged[0] = ok(Tensor::new(staged[0].shape(), first), "bad gradient");
                let pairs = leaves.iter().map(|leaf| leaf.var()).zip(staged.clone());
                host = ok(Gradients::from_host(&tape, pairs), "from_host");
                &host
            }
        };
        let skipped = ok(
            amp_step(&mut store, used, &config, &mut device_scaler),
            "amp step",
        );
        let grads = flat(&staged);
        let found_inf = grads.iter().any(|g| !g.is_finite());
        assert_eq!(skipped, found_inf, "step {step}");
        if found_inf {
            skips += 1;
        } else {
            let inv_scale = f64::from(host_scaler.inv_scale());
            let unscaled: Vec<f64> = grads.iter().map(|g| g * inv_scale).collect();
            want_steps += 1;
            ok(
                reference::step(&config, want_steps, &segments, &unscaled, &mut want),
                "reference",
            );
        }
        ok(host_scaler.update(found_inf), "host scaler");
        assert_eq!(device_scaler, host_scaler, "step {step}");
        let got = flat32(&ok(store.sync_to_host(), "sync_to_host"));
        let error = max_relative_error(&got, &want.params, PARAM_FLOOR);
        assert!(error <= TOLERANCE, "step {step} of {config:?}: {error}");
    }
    assert_eq!(skips, 4);
    assert_eq!(store.steps(), want_steps);
    assert_eq!(device_scaler.scale(), host_scaler.scale());
}

fn amp_step(
    store: &mut cistern_client::DeviceParamStore,
    gradients: &Gradients<'_>,
    config: &OptimizerConfig,
    scaler: &mut GradScaler,
) -> Result<bool, cistern_client::AutodiffError> {
    match config {
        OptimizerConfig::Sgd(config) => store.step_amp(gradients, config, scaler),
        OptimizerConfig::Adam(config) => store.step_adam_amp(gradients, config, scaler),
        OptimizerConfig::AdamW(config) => store.step_adamw_amp(gradients, config, scaler),
        other => panic!("no AMP step for {other:?}"),
    }
}

#[test]
fn amp_sgd_with_infinities_and_nan_matches_the_reference_scaler() {
    matches_the_reference_scaler(OptimizerConfig::Sgd(SgdConfig {
        lr: 0.002,
        momentum: 0.9,
        ..SgdConfig::default()
    }));
}

#[test]
fn amp_adam_with_infinities_and_nan_matches_the_reference_scaler() {
    matches_the_reference_scaler(OptimizerConfig::Adam(AdamConfig::default()));
}

#[test]
fn amp_adamw_with_infinities_and_nan_matches_the_reference_scaler() {
    matches_the_reference_scaler(OptimizerConfig::AdamW(AdamWConfig {
        amsgrad: true,
        ..AdamWConfig::default()
    }));
}

/// Regression (found by the store simulation): a transfer failure of the
/// flag read after the step was queued answered `TransferFailed` with the
/// store unlatched, its parameters stepped and its count advanced, so the
/// refusal looked operation-local while the step had run.
#[test]
fn a_failed_flag_read_after_a_queued_amp_step_never_looks_like_a_refusal() {
    use cistern_runtime::{DeviceOptions, FaultPlan};
    let config = SgdConfig {
        lr: 0.002,
        momentum: 0.9,
        ..SgdConfig::default()
    };
    let model = model(0xA4);
    let mut stepped = 0;
    for n in 1..=12 {
        let client = super::common::open_with(
            DeviceOptions::with_memory_limit(64 << 20)
                .with_faults(FaultPlan::none().with_failed_transfer(n)),
        );
        let params: Vec<&Tensor<f32>> = model.params.iter().collect();
        let Ok(mut store) = cistern_client::DeviceParamStore::new(&Tape::new(&client), &params)
        else {
            continue;
        };
        let tape = Tape::new(&client);
        let Ok(leaves) = store.register_resident_params(&tape) else {
            continue;
        };
        let Ok(value) = loss(&store, &tape, &leaves, &model) else {
            continue;
        };
        let mut scaler = scaler();
        let Ok(scaled) = tape.scale(&value, scaler.scale()) else {
            continue;
        };
        let Ok(gradients) = store.backward(&tape, &scaled) else {
            continue;
        };
        let Ok(staged) = store.resident_grads_to_host() else {
            continue;
        };
        let grads: Vec<Tensor<f32>> = staged.into_iter().flatten().collect();
        match store.step_amp(&gradients, &config, &mut scaler) {
            Ok(skipped) => {
                assert!(!skipped, "transfer failure {n}");
                let config = OptimizerConfig::Sgd(config.clone());
                let mut want = ReferenceState::new(&config, flat(&model.params));
                let inv_scale = f64::from(self::scaler().inv_scale());
                let unscaled: Vec<f64> = flat(&grads).iter().map(|g| g * inv_scale).collect();
                let segments = segments(&model.params);
                ok(
                    reference::step(&config, 1, &segments, &unscaled, &mut want),
                    "reference",
                );
                // The injected failure may be this read's: one retry.
                let read = store.sync_to_host().or_else(|_| store.sync_to_host());
                let got = flat32(&ok(read, "sync_to_host"));
                let error = max_relative_error(&got, &want.params, PARAM_FLOOR);
                assert!(error <= TOLERANCE, "transfer failure {n}: {error}");
                assert_eq!(store.steps(), 1, "transfer failure {n}");
                stepped += 1;
            }
            Err(error) => {
                // Refused: either nothing changed, or the store is latched.
                match store.sync_to_host() {
                    Ok(values) => {
                        assert!(!store.is_poisoned(), "transfer failure {n}");
                        assert_eq!(values, model.params, "transfer failure {n}: {error:?}");
                        assert_eq!(store.steps(), 0, "transfer failure {n}");
                    }
                    Err(_) => assert!(store.is_poisoned(), "transfer failure {n}"),
                }
            }
        }
    }
    assert!(stepped > 0);
}

/// One AMP SGD step from a fresh forward; any refusal as its text.
fn amp_attempt(
    client: &cistern_client::ComputeClient,
    store: &mut cistern_client::DeviceParamStore,
    model: &super::common::Model,
    config: &SgdConfig,
    scaler: &mut GradScaler,
) -> Result<bool, String> {
    let tape = Tape::new(client);
    let leaves = store
        .register_resident_params(&tape)
        .map_err(|e| format!("register: {e}"))?;
    let value = loss(store, &tape, &leaves, model).map_err(|e| format!("forward: {e}"))?;
    let scaled = tape
        .scale(&value, scaler.scale())
        .map_err(|e| format!("scale: {e}"))?;
    let gradients = store
        .backward(&tape, &scaled)
        .map_err(|e| format!("backward: {e}"))?;
    store
        .step_amp(&gradients, config, scaler)
        .map_err(|e| format!("step: {e}"))
}

/// Regression (found by `cistern stress --store-weight`): a flag read
/// refused by another client's capture latched the store, although the
/// capture ended a millisecond later and the step had run.
#[test]
fn an_amp_step_waits_out_another_clients_capture_at_its_flag_read() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    const STEPS: usize = 200;
    let client = open();
    let model = model(0xA8);
    let config = SgdConfig {
        lr: 0.002,
        momentum: 0.9,
        ..SgdConfig::default()
    };
    let mut contended = store(&client, &model);
    let stop = Arc::new(AtomicBool::new(false));
    let capturer = {
        let (other, stop) = (client.clone(), stop.clone());
        std::thread::spawn(move || {
            let Ok(stream) = other.create_stream() else {
                return 0;
            };
            let mut captures = 0u32;
            while !stop.load(Ordering::Relaxed) {
                if let Ok((_token, guard)) = other.begin_capture(stream) {
                    std::thread::sleep(Duration::from_millis(1));
                    captures += u32::from(other.end_capture(guard).is_ok());
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            captures
        })
    };
    let mut contended_scaler = scaler();
    let (mut stepped, mut refused) = (0, Vec::new());
    for _ in 0..40_000 {
        if stepped == STEPS {
            break;
        }
        match amp_attempt(
            &client,
            &mut contended,
            &model,
            &config,
            &mut contended_scaler,
        ) {
            Ok(_) => stepped += 1,
            Err(error) => {
                refused.push(error);
                let _ = contended.abandon_pending_forward();
                std::thread::sleep(Duration::from_micros(500));
            }
        }
        assert!(
            !contended.is_poisoned(),
            "latched after {stepped} steps: {:?}",
            refused.last()
        );
    }
    stop.store(true, Ordering::Relaxed);
    let captures = ok(capturer.join().map_err(|_| "the capturer panicked"), "join");
    assert!(captures > 0, "no capture ran beside the steps");
    assert_eq!(
        stepped,
        STEPS,
        "{} refusals, the last {:?}",
        refused.len(),
        refused.last()
    );
    // The same steps with no capture beside them end in the same place.
    let mut quiet = store(&client, &model);
    let mut quiet_scaler = scaler();
    for step in 0..STEPS {
        let attempt = amp_attempt(&client, &mut quiet, &model, &config, &mut quiet_scaler);
        ok(attempt, &format!("quiet step {step}"));
    }
    assert_eq!(contended_scaler, quiet_scaler);
    assert_eq!(
        flat32(&ok(contended.sync_to_host(), "contended")),
        flat32(&ok(quiet.sync_to_host(), "quiet"))
    );
}

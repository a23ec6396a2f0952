//! AMP on the device: unscale with the found-inf flag as a launch, steps
//! that read the flag and skip, the flag read back as four bytes, and the
//! form with no host read (scale, growth tracker, skips and step count in
//! device words) against the host `GradScaler` and the f64 reference.

use cistern::client::{Buffer, ComputeClient, OptimizerState};
use cistern::kernels::{ScaleRule, Segment, amp_unscale_by_device_scale};
use cistern::memory::SplitMix64;
use cistern::optim::reference::{self, ReferenceState};
use cistern::optim::{
    AdagradConfig, AdamConfig, AdamWConfig, GradScaler, GradScalerConfig, OptimizerConfig,
};
use cistern::runtime::{Device, KernelLaunch, OptimizerStep};

use super::common::{ok, open};
use super::optim::every_family;
use super::optim_reference::{PARAM_FLOOR, STATE_FLOOR, TOLERANCE, download, max_relative_error};

pub fn an_amp_step_unscales_then_applies_or_skips_on_the_flag(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let config = OptimizerConfig::AdamW(AdamWConfig::default());
    let n = 64;
    let mut rng = SplitMix64::new(9);
    let initial = rng.non_zero_f32s(n, 1.0);
    let params = ok(client.upload_f32(&initial), "upload params");
    let state = ok(client.optimizer_state(&config, n as u64), "optimizer_state");
    let flag = ok(client.upload_f32(&[0.0]), "upload flag");
    let scale = 1024.0f32;
    let unscaled = rng.symmetric_f32s(n);
    let scaled: Vec<f32> = unscaled.iter().map(|g| g * scale).collect();
    let grads = ok(client.upload_f32(&scaled), "upload grads");
    let step = |count: u64| {
        OptimizerStep::new(
            config.clone(),
            count,
            vec![Segment::new(0, n)],
            params.whole(),
            grads.whole(),
            state.bindings(),
        )
        .with_found_inf(flag.whole())
    };

    // Finite gradients: unscaled exactly (a power of two), flag clear, applied.
    let unscale = KernelLaunch::amp_unscale(grads.whole(), 1.0 / scale, flag.whole());
    ok(client.launch(stream, unscale.clone()), "amp_unscale");
    ok(
        ok(client.optimizer_step(stream, step(1)), "step").wait(),
        "step 1",
    );
    assert!(!ok(client.read_found_inf(stream, &flag), "read_found_inf"));
    assert_eq!(download(&client, &grads), unscaled);
    let after_one = download(&client, &params);
    assert_ne!(after_one, initial);
    let state_after_one: Vec<Vec<f32>> = state
        .buffers()
        .iter()
        .map(|b| download(&client, b))
        .collect();

    // An overflowed gradient: the flag is set and the step changes nothing.
    let mut overflowed = scaled.clone();
    overflowed[17] = f32::INFINITY;
    ok(client.write_f32(&grads, 0, &overflowed), "write grads");
    ok(
        client.launch(stream, KernelLaunch::fill(flag.whole(), 0.0)),
        "reset flag",
    );
    ok(client.launch(stream, unscale), "amp_unscale");
    ok(
        ok(client.optimizer_step(stream, step(2)), "step").wait(),
        "step 2",
    );
    assert!(ok(client.read_found_inf(stream, &flag), "read_found_inf"));
    assert_eq!(download(&client, &params), after_one, "skipped step");
    for (buffer, before) in state.buffers().iter().zip(&state_after_one) {
        assert_eq!(&download(&client, buffer), before, "skipped step state");
    }
    ok(client.sync(stream), "sync");
}

pub fn the_flag_accumulates_over_several_unscales_until_reset(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let flag = ok(client.upload_f32(&[0.0]), "upload flag");
    let bad = ok(client.upload_f32(&[1.0, f32::NAN]), "upload");
    let good = ok(client.upload_f32(&[1.0, 2.0]), "upload");
    ok(
        client.launch(
            stream,
            KernelLaunch::amp_unscale(bad.whole(), 0.5, flag.whole()),
        ),
        "unscale",
    );
    ok(
        client.launch(
            stream,
            KernelLaunch::amp_unscale(good.whole(), 0.5, flag.whole()),
        ),
        "unscale",
    );
    assert!(ok(client.read_found_inf(stream, &flag), "read_found_inf"));
    assert_eq!(download(&client, &good), vec![0.5, 1.0]);
    ok(
        client.launch(stream, KernelLaunch::fill(flag.whole(), 0.0)),
        "reset",
    );
    assert!(!ok(client.read_found_inf(stream, &flag), "read_found_inf"));
}

/// One counted step's launches: the flag reset, the unscale by the
/// device's scale, the counted step and `_amp_update_scale_`, over the
/// words (flag, scale, tracker, skipped, count).
fn device_amp_batch(
    config: &OptimizerConfig,
    n: usize,
    params: &Buffer,
    grads: &Buffer,
    state: &OptimizerState,
    words: &Buffer,
    rule: ScaleRule,
) -> Vec<KernelLaunch> {
    let at = |i: u64| words.range(4 * i, 4);
    let counted = OptimizerStep::new(
        config.clone(),
        1,
        vec![Segment::new(0, n)],
        params.whole(),
        grads.whole(),
        state.bindings(),
    )
    .with_found_inf(at(0))
    .into_counted_launch(at(4));
    let mut launches = vec![
        KernelLaunch::fill(at(0), 0.0),
        KernelLaunch::amp_unscale_by_device_scale(grads.whole(), at(0), at(1)),
    ];
    launches.extend(counted);
    launches.push(KernelLaunch::amp_update_scale(
        rule,
        at(0),
        at(1),
        at(2),
        at(3),
    ));
    launches
}

/// The device words as (scale, tracker, skipped, count).
fn read_words(client: &ComputeClient, words: &Buffer) -> (f32, u32, u32, u32) {
    let bytes = ok(client.read(words, 4, 16), "words");
    let word = |i: usize| [bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]];
    (
        f32::from_ne_bytes(word(0)),
        u32::from_ne_bytes(word(4)),
        u32::from_ne_bytes(word(8)),
        u32::from_ne_bytes(word(12)),
    )
}

/// Every family the counted step runs, with the options whose per-step
/// constants it computes on the device (Adagrad's lr decay, Adam's betas).
fn counted_configs() -> Vec<OptimizerConfig> {
    let mut configs = every_family();
    configs.push(OptimizerConfig::Adagrad(AdagradConfig {
        lr_decay: 0.1,
        ..Default::default()
    }));
    configs.push(OptimizerConfig::Adam(AdamConfig {
        betas: (0.5, 0.9),
        lr: 1e-2,
        ..Default::default()
    }));
    configs
}

/// The device form of AMP: unscale by the device's scale, a step counted on
/// the device, then `_amp_update_scale_`, five times with a NaN at the
/// second: the words follow the host `GradScaler` exactly and the
/// parameters and state match the f64 reference of four steps within
/// [`TOLERANCE`], for every optimizer family (on wgpu the per-step
/// constants are computed on the device in f32: see `docs/param-store.md`).
pub fn the_device_scale_update_and_counted_step_follow_the_grad_scaler(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let n = 16;
    let rule = ScaleRule {
        growth_factor: 2.0,
        backoff_factor: 0.5,
        growth_interval: 2,
    };
    for config in counted_configs() {
        let mut rng = SplitMix64::new(5);
        let initial = rng.non_zero_f32s(n, 1.0);
        let params = ok(client.upload_f32(&initial), "params");
        let state = ok(client.optimizer_state(&config, n as u64), "state");
        let words = ok(client.upload_f32(&[0.0, 1024.0, 0.0, 0.0, 0.0]), "words");
        let mut expected =
            ReferenceState::new(&config, initial.iter().map(|&p| f64::from(p)).collect());
        let scaler = GradScaler::new(GradScalerConfig {
            init_scale: 1024.0,
            growth_interval: 2,
            ..GradScalerConfig::default()
        });
        let Ok(mut scaler) = scaler else {
            panic!("a scaler: {scaler:?}");
        };
        let mut applied = 0;
        for step in 0..5 {
            let unscaled = rng.symmetric_f32s(n);
            // A power-of-two scale: the device's unscale gives `unscaled` back.
            let mut grads: Vec<f32> = unscaled.iter().map(|g| g * scaler.scale()).collect();
            if step == 1 {
                grads[3] = f32::NAN;
            }
            let grads = ok(client.upload_f32(&grads), "grads");
            let launches = device_amp_batch(&config, n, &params, &grads, &state, &words, rule);
            let sent = client.launch_batch(stream, launches).and_then(|t| t.wait());
            ok(sent, &format!("device AMP batch of {config:?}"));
            if step != 1 {
                applied += 1;
                let values: Vec<f64> = unscaled.iter().map(|&g| f64::from(g)).collect();
                let segments = [Segment::new(0, n)];
                if let Err(error) =
                    reference::step(&config, applied, &segments, &values, &mut expected)
                {
                    panic!("reference step {applied}: {error}");
                }
            }
            if let Err(error) = scaler.update(step == 1) {
                panic!("host scaler: {error}");
            }
        }
        let (scale, tracker, skipped, count) = read_words(&client, &words);
        assert_eq!(scale, scaler.scale(), "{config:?}");
        assert_eq!(tracker, scaler.growth_tracker(), "{config:?}");
        assert_eq!((skipped, count), (1, 4), "{config:?}");
        let got = download(&client, &params);
        let error = max_relative_error(&got, &expected.params, PARAM_FLOOR);
        assert!(error <= TOLERANCE, "params of {config:?}: {error:e}");
        for (buffer, want) in state.buffers().iter().zip(&expected.buffers) {
            let error = max_relative_error(&download(&client, buffer), want, STATE_FLOOR);
            assert!(error <= TOLERANCE, "state of {config:?}: {error:e}");
        }
    }
}

/// A counted step far into training (the count written as 999 and as
/// 99 999) runs as the next step: its bias corrections and decayed rates
/// match the f64 reference's at that step within [`TOLERANCE`].
pub fn a_counted_step_far_into_training_matches_the_reference_at_its_count(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let n = 64;
    let rule = ScaleRule {
        growth_factor: 2.0,
        backoff_factor: 0.5,
        growth_interval: 1000,
    };
    for seeded in [999u32, 99_999] {
        for config in counted_configs() {
            let mut rng = SplitMix64::new(u64::from(seeded));
            let initial = rng.non_zero_f32s(n, 1.0);
            let params = ok(client.upload_f32(&initial), "params");
            let state = ok(client.optimizer_state(&config, n as u64), "state");
            let count = f32::from_bits(seeded);
            let words = ok(client.upload_f32(&[0.0, 1.0, 0.0, 0.0, count]), "words");
            let mut expected =
                ReferenceState::new(&config, initial.iter().map(|&p| f64::from(p)).collect());
            for step in 1..=3 {
                let unscaled = rng.symmetric_f32s(n);
                let grads = ok(client.upload_f32(&unscaled), "grads");
                let launches = device_amp_batch(&config, n, &params, &grads, &state, &words, rule);
                let sent = client.launch_batch(stream, launches).and_then(|t| t.wait());
                ok(sent, &format!("device AMP batch of {config:?}"));
                let values: Vec<f64> = unscaled.iter().map(|&g| f64::from(g)).collect();
                let at = u64::from(seeded) + step;
                let segments = [Segment::new(0, n)];
                if let Err(error) = reference::step(&config, at, &segments, &values, &mut expected)
                {
                    panic!("reference step {at}: {error}");
                }
            }
            let (_, _, skipped, count) = read_words(&client, &words);
            assert_eq!((skipped, count), (0, seeded + 3), "{config:?}");
            let got = download(&client, &params);
            let error = max_relative_error(&got, &expected.params, PARAM_FLOOR);
            assert!(
                error <= TOLERANCE,
                "params of {config:?} from {seeded}: {error:e}"
            );
        }
    }
}

/// The unscale by the device's scale multiplies by `1 / scale` rounded as
/// the CPU rounds it (f64, then f32), for scales whose reciprocal is not a
/// power of two or is past f32's range (a subnormal scale): the grads match
/// bit for bit. (No product here is subnormal: a device may flush those.)
pub fn unscaling_by_the_device_scale_rounds_the_reciprocal_as_the_cpu(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let grads_in = [1.0f32, -3.0, 0.75, 1.5e-3, 7.0, 2.0e10];
    let mut rng = SplitMix64::new(17);
    let mut scales = vec![
        3.0f32,
        1000.0,
        65536.0,
        0.1,
        1.0e30,
        3.3e29,
        f32::MIN_POSITIVE,
        1.0e-40,
        1.0e-45,
        -7.0,
    ];
    scales.extend(rng.non_zero_f32s(20, 1.0e4));
    for scale in scales {
        let grads = ok(client.upload_f32(&grads_in), "grads");
        let words = ok(client.upload_f32(&[0.0, scale]), "words");
        let launch = KernelLaunch::amp_unscale_by_device_scale(
            grads.whole(),
            words.range(0, 4),
            words.range(4, 4),
        );
        ok(client.launch(stream, launch), "unscale");
        let mut want = grads_in.to_vec();
        let mut flag = [0.0f32];
        if let Err(error) = amp_unscale_by_device_scale(&mut want, &mut flag, &[scale]) {
            panic!("cpu unscale: {error}");
        }
        let got = download(&client, &grads);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "scale {scale:e}");
    }
    ok(client.sync(stream), "sync");
}

/// The bound on one counted step's update against the f64 reference's, for
/// the families whose per-step constants the counted step computes (on wgpu
/// in f32: Adam's, AdamW's bias corrections, Adagrad's decayed rate): 2⁻¹⁹.
pub const COUNTED_UPDATE_TOLERANCE: f64 = 1.0 / 524_288.0;

/// From zero parameters and state, one counted step's parameters are its
/// update alone, so they measure its per-step constants: within
/// [`COUNTED_UPDATE_TOLERANCE`] of the f64 reference at every count tried.
pub fn one_counted_step_from_zero_parameters_measures_its_constants(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let n = 64;
    let rule = ScaleRule {
        growth_factor: 2.0,
        backoff_factor: 0.5,
        growth_interval: 1000,
    };
    let configs = [
        OptimizerConfig::Adam(AdamConfig::default()),
        OptimizerConfig::AdamW(AdamWConfig::default()),
        OptimizerConfig::Adam(AdamConfig {
            betas: (0.5, 0.9),
            ..Default::default()
        }),
        OptimizerConfig::Adagrad(AdagradConfig {
            lr_decay: 0.1,
            ..Default::default()
        }),
    ];
    let mut worst = 0.0f64;
    for seeded in [0u32, 1, 9, 99, 999, 4_999, 99_999, 9_999_999] {
        for config in &configs {
            let params = ok(client.upload_f32(&vec![0.0; n]), "params");
            let state = ok(client.optimizer_state(config, n as u64), "state");
            let words = ok(
                client.upload_f32(&[0.0, 1.0, 0.0, 0.0, f32::from_bits(seeded)]),
                "words",
            );
            let mut rng = SplitMix64::new(u64::from(seeded));
            let values = rng.non_zero_f32s(n, 1.0);
            let grads = ok(client.upload_f32(&values), "grads");
            let launches = device_amp_batch(config, n, &params, &grads, &state, &words, rule);
            let sent = client.launch_batch(stream, launches).and_then(|t| t.wait());
            ok(sent, &format!("device AMP batch of {config:?}"));
            let mut expected = ReferenceState::new(config, vec![0.0; n]);
            let values: Vec<f64> = values.iter().map(|&g| f64::from(g)).collect();
            let at = u64::from(seeded) + 1;
            let segments = [Segment::new(0, n)];
            if let Err(error) = reference::step(config, at, &segments, &values, &mut expected) {
                panic!("reference step {at}: {error}");
            }
            let got = download(&client, &params);
            let error = max_relative_error(&got, &expected.params, PARAM_FLOOR);
            worst = worst.max(error);
            assert!(
                error <= COUNTED_UPDATE_TOLERANCE,
                "{config:?} at step {at}: {error:e}"
            );
        }
    }
    eprintln!("counted step constants on {device:?}: worst relative error {worst:e}");
}

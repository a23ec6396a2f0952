//! AMP on the device: unscale with the found-inf flag as a launch, steps
//! that read the flag and skip, and the flag read back as four bytes.

use cistern::kernels::Segment;
use cistern::optim::{AdamWConfig, OptimizerConfig};
use cistern::runtime::{Device, KernelLaunch, OptimizerStep};

use super::common::{ok, open};
use cistern::memory::SplitMix64;

use super::optim_reference::download;

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

/// The device form of AMP: unscale by the device's scale, a step counted on
/// the device, then `_amp_update_scale_`; wgpu has no WGSL body for these
/// and must answer `UnsupportedOperation`.
pub fn the_device_scale_update_and_counted_step_follow_the_grad_scaler(device: Device) {
    use cistern::kernels::ScaleRule;
    use cistern::optim::{GradScaler, GradScalerConfig};
    use cistern::runtime::ServerError;

    let client = open(device);
    let stream = client.default_stream();
    let config = OptimizerConfig::AdamW(AdamWConfig::default());
    let n = 16;
    let mut rng = SplitMix64::new(5);
    let params = ok(client.upload_f32(&rng.non_zero_f32s(n, 1.0)), "params");
    let state = ok(client.optimizer_state(&config, n as u64), "state");
    // flag, scale, tracker, skipped, count
    let words = ok(client.upload_f32(&[0.0, 1024.0, 0.0, 0.0, 0.0]), "words");
    let at = |i: u64| words.range(4 * i, 4);
    let rule = ScaleRule {
        growth_factor: 2.0,
        backoff_factor: 0.5,
        growth_interval: 2,
    };
    let scaler = GradScaler::new(GradScalerConfig {
        init_scale: 1024.0,
        growth_interval: 2,
        ..GradScalerConfig::default()
    });
    let Ok(mut scaler) = scaler else {
        panic!("a scaler: {scaler:?}");
    };
    for step in 0..5 {
        let mut grads = rng.symmetric_f32s(n);
        if step == 1 {
            grads[3] = f32::NAN;
        }
        let grads = ok(client.upload_f32(&grads), "grads");
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
        let sent = client.launch_batch(stream, launches).and_then(|t| t.wait());
        if matches!(device, Device::Wgpu(_)) {
            assert!(
                matches!(sent, Err(ServerError::UnsupportedOperation { .. })),
                "{sent:?}"
            );
            let _ = client.sync(stream);
            return;
        }
        ok(sent, "device AMP batch");
        if let Err(error) = scaler.update(step == 1) {
            panic!("host scaler: {error}");
        }
    }
    let bytes = ok(client.read(&words, 4, 16), "words");
    let word = |i: usize| [bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]];
    assert_eq!(f32::from_ne_bytes(word(0)), scaler.scale());
    assert_eq!(u32::from_ne_bytes(word(4)), scaler.growth_tracker());
    assert_eq!(u32::from_ne_bytes(word(8)), 1);
    assert_eq!(u32::from_ne_bytes(word(12)), 4);
}

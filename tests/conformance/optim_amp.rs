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

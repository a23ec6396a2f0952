//! Optimizer steps through the client: every family and option against the
//! f64 reference of `cistern-optim` over twenty steps (the tolerance rule of
//! `kernels/tests/`), state living in device buffers, AMP skipping, and the
//! server's checks of configs and segment tables.

use cistern::client::ComputeClient;
use cistern::kernels::Segment;
use cistern::memory::SplitMix64;
use cistern::optim::reference::{self, ReferenceState};
use cistern::optim::{
    AdagradConfig, AdamConfig, AdamWConfig, LambConfig, OptimizerConfig, RmsPropConfig, SgdConfig,
};
use cistern::runtime::{Device, ErrorCode, OptimizerStep, ServerError};

use super::common::{ok, open};
use super::optim_reference::{
    PARAM_FLOOR, STATE_FLOOR, TOLERANCE, download, max_relative_error, segments,
};

const STEPS: u64 = 20;

/// Runs `STEPS` steps through `client` and the reference on the same random
/// data; returns the largest relative error seen in any buffer.
fn compare(
    client: &ComputeClient,
    config: &OptimizerConfig,
    segments: &[Segment],
    n: usize,
    seed: u64,
) -> f64 {
    let mut rng = SplitMix64::new(seed);
    let initial = rng.non_zero_f32s(n, 1.0);
    let params = ok(client.upload_f32(&initial), "upload params");
    let grads = ok(client.reserve(4 * n as u64), "reserve grads");
    let state = ok(client.optimizer_state(config, n as u64), "optimizer_state");
    let stream = client.default_stream();
    let mut expected = ReferenceState::new(config, initial.iter().map(|&p| f64::from(p)).collect());
    let mut worst = 0.0f64;
    for step in 1..=STEPS {
        let values = rng.symmetric_f32s(n);
        ok(client.write_f32(&grads, 0, &values), "write grads");
        let command = OptimizerStep::new(
            config.clone(),
            step,
            segments,
            params.whole(),
            grads.whole(),
            state.bindings(),
        );
        let token = ok(client.optimizer_step(stream, command), "optimizer_step");
        ok(token.wait(), "step");
        let values: Vec<f64> = values.iter().map(|&g| f64::from(g)).collect();
        if let Err(error) = reference::step(config, step, segments, &values, &mut expected) {
            panic!("reference step {step}: {error}");
        }
        let got = download(client, &params);
        worst = worst.max(max_relative_error(&got, &expected.params, PARAM_FLOOR));
        for (buffer, want) in state.buffers().iter().zip(&expected.buffers) {
            let got = download(client, buffer);
            worst = worst.max(max_relative_error(&got, want, STATE_FLOOR));
        }
    }
    worst
}

/// Every family with every option the kernels' parity tests cover.
fn every_option() -> Vec<OptimizerConfig> {
    use OptimizerConfig::*;
    vec![
        Sgd(SgdConfig {
            lr: 1e-2,
            ..Default::default()
        }),
        Sgd(SgdConfig {
            momentum: 0.9,
            dampening: 0.3,
            ..Default::default()
        }),
        Sgd(SgdConfig {
            momentum: 0.8,
            nesterov: true,
            weight_decay: 0.05,
            ..Default::default()
        }),
        Sgd(SgdConfig {
            momentum: 0.5,
            maximize: true,
            weight_decay: 0.01,
            ..Default::default()
        }),
        Adam(AdamConfig::default()),
        Adam(AdamConfig {
            weight_decay: 0.1,
            amsgrad: true,
            lr: 1e-2,
            ..Default::default()
        }),
        Adam(AdamConfig {
            maximize: true,
            betas: (0.5, 0.9),
            eps: 1e-3,
            ..Default::default()
        }),
        AdamW(AdamWConfig::default()),
        AdamW(AdamWConfig {
            amsgrad: true,
            maximize: true,
            weight_decay: 0.3,
            lr: 1e-2,
            ..Default::default()
        }),
        RmsProp(RmsPropConfig {
            lr: 1e-3,
            ..Default::default()
        }),
        RmsProp(RmsPropConfig {
            lr: 1e-3,
            centered: true,
            momentum: 0.9,
            weight_decay: 0.01,
            ..Default::default()
        }),
        RmsProp(RmsPropConfig {
            lr: 1e-3,
            centered: true,
            maximize: true,
            alpha: 0.9,
            ..Default::default()
        }),
        RmsProp(RmsPropConfig {
            lr: 1e-3,
            momentum: 0.5,
            ..Default::default()
        }),
        Adagrad(AdagradConfig::default()),
        Adagrad(AdagradConfig {
            lr_decay: 0.1,
            weight_decay: 0.05,
            initial_accumulator_value: 0.3,
            maximize: true,
            ..Default::default()
        }),
        Lamb(LambConfig::default()),
        Lamb(LambConfig {
            bias_correction: false,
            grad_averaging: false,
            ..Default::default()
        }),
        Lamb(LambConfig {
            adam_w_mode: false,
            max_grad_norm: 0.5,
            weight_decay: 0.1,
            ..Default::default()
        }),
        Lamb(LambConfig {
            max_grad_norm: f64::INFINITY,
            weight_decay: 0.0,
            ..Default::default()
        }),
        Lamb(LambConfig {
            use_nvlamb: true,
            weight_decay: 0.0,
            max_grad_norm: 100.0,
            ..Default::default()
        }),
    ]
}

/// One config per family, each with its state-heaviest options.
pub fn every_family() -> Vec<OptimizerConfig> {
    vec![
        OptimizerConfig::Sgd(SgdConfig {
            momentum: 0.9,
            ..Default::default()
        }),
        OptimizerConfig::Adam(AdamConfig {
            amsgrad: true,
            ..Default::default()
        }),
        OptimizerConfig::AdamW(AdamWConfig::default()),
        OptimizerConfig::RmsProp(RmsPropConfig {
            centered: true,
            momentum: 0.9,
            lr: 1e-4,
            ..Default::default()
        }),
        OptimizerConfig::Adagrad(AdagradConfig::default()),
        OptimizerConfig::Lamb(LambConfig::default()),
    ]
}

pub fn every_optimizer_option_matches_the_reference_through_the_server(device: Device) {
    let client = open(device);
    let (segments, n) = segments(&[1, 7, 300, 33, 1000, 5, 64], 3);
    for config in every_option() {
        let error = compare(&client, &config, &segments, n, 42);
        assert!(
            error <= TOLERANCE,
            "{config:?}: max relative error {error:e}"
        );
    }
}

pub fn every_streaming_step_matches_the_reference_on_and_off_a_16_byte_boundary(device: Device) {
    let client = open(device);
    // One run of 4k + 3 from element 0 (a vec4 bulk and a scalar tail where
    // a device has vec4 steps) and one from element 1 (off a 16-byte
    // boundary: element by element).
    let len = 4 * 300 + 3;
    for first in [0, 1] {
        let segments = [Segment::new(first, len)];
        let streaming = every_option()
            .into_iter()
            .filter(|config| !matches!(config, OptimizerConfig::Lamb(_)));
        for config in streaming {
            let error = compare(&client, &config, &segments, first + len, 9);
            assert!(
                error <= TOLERANCE,
                "{config:?} from {first}: max relative error {error:e}"
            );
        }
    }
}

pub fn buffers_large_enough_to_run_in_parallel_match_the_reference(device: Device) {
    let client = open(device);
    let (segments, n) = segments(&[140_000, 1, 17_001], 5);
    for config in every_family() {
        let error = compare(&client, &config, &segments, n, 5);
        assert!(error <= TOLERANCE, "{config:?}: {error:e}");
    }
}

pub fn many_small_segments_match_the_reference(device: Device) {
    let client = open(device);
    let mut rng = SplitMix64::new(3);
    let lens: Vec<usize> = (0..500).map(|_| 1 + rng.below(5) as usize).collect();
    let (segments, n) = segments(&lens, 1);
    for config in every_family() {
        let error = compare(&client, &config, &segments, n, 11);
        assert!(error <= TOLERANCE, "{config:?}: {error:e}");
    }
}

pub fn optimizer_state_is_allocated_and_initialised_per_its_layout(device: Device) {
    let client = open(device);
    let config = OptimizerConfig::Adagrad(AdagradConfig {
        initial_accumulator_value: 0.25,
        ..Default::default()
    });
    let state = ok(client.optimizer_state(&config, 10), "optimizer_state");
    assert_eq!(state.buffers().len(), config.state_layout().len());
    assert_eq!(state.numel(), 10);
    for buffer in state.buffers() {
        assert_eq!(download(&client, buffer), vec![0.25; 10]);
    }
    let adam = OptimizerConfig::Adam(AdamConfig {
        amsgrad: true,
        ..Default::default()
    });
    let state = ok(client.optimizer_state(&adam, 3), "optimizer_state");
    assert_eq!(state.buffers().len(), 3);
    assert!(state.buffers().iter().all(|b| b.size() == 12));
    let sgd = OptimizerConfig::Sgd(SgdConfig::default());
    assert!(
        ok(client.optimizer_state(&sgd, 3), "optimizer_state")
            .buffers()
            .is_empty()
    );
}

fn adam_step(
    client: &ComputeClient,
    config: AdamConfig,
    segments: Vec<Segment>,
) -> Result<(), ServerError> {
    let params = ok(client.upload_f32(&[1.0; 8]), "upload");
    let grads = ok(client.upload_f32(&[0.5; 8]), "upload");
    let state = ok(
        client.optimizer_state(&OptimizerConfig::Adam(AdamConfig::default()), 8),
        "optimizer_state",
    );
    let step = OptimizerStep::new(
        OptimizerConfig::Adam(config),
        1,
        segments,
        params.whole(),
        grads.whole(),
        state.bindings(),
    );
    let token = ok(client.optimizer_step(client.default_stream(), step), "step");
    let result = token.wait();
    assert_eq!(download(client, &params), vec![1.0; 8], "nothing ran");
    result
}

fn invalid_argument(result: Result<(), ServerError>) -> String {
    match result {
        Err(ServerError::InvalidArgument { message }) => message,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

pub fn an_invalid_config_or_segment_table_is_refused_before_anything_runs(device: Device) {
    let client = open(device);
    let bad_beta = AdamConfig {
        betas: (0.9, 1.0),
        ..Default::default()
    };
    let message = invalid_argument(adam_step(&client, bad_beta, vec![Segment::new(0, 8)]));
    assert!(message.contains("`betas[1]`"), "{message}");
    let stream = client.default_stream();
    let latched = client.sync(stream).map_err(|e| e.code());
    assert_eq!(latched, Err(ErrorCode::InvalidArgument));
    let past_the_end = vec![Segment::new(4, 5)];
    let message = invalid_argument(adam_step(&client, AdamConfig::default(), past_the_end));
    assert!(message.contains("`segments[0]`"), "{message}");
    let overlapping = vec![Segment::new(0, 4), Segment::new(3, 2)];
    let message = invalid_argument(adam_step(&client, AdamConfig::default(), overlapping));
    assert!(message.contains("`segments[1]`"), "{message}");
    let _ = client.sync(stream);
    let lr = OptimizerConfig::Sgd(SgdConfig {
        lr: -1.0,
        ..Default::default()
    });
    let refused = client.optimizer_state(&lr, 4).map(|_| ());
    assert!(invalid_argument(refused).contains("`lr`"));
}

pub fn a_lamb_refusal_at_run_time_is_operation_local_and_does_not_poison(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let config = OptimizerConfig::Lamb(LambConfig::default());
    let initial = SplitMix64::new(2).non_zero_f32s(8, 1.0);
    let params = ok(client.upload_f32(&initial), "upload");
    let mut values = vec![0.1f32; 8];
    values[5] = f32::INFINITY;
    let grads = ok(client.upload_f32(&values), "upload");
    let state = ok(client.optimizer_state(&config, 8), "optimizer_state");
    let step = OptimizerStep::new(
        config.clone(),
        1,
        vec![Segment::new(0, 4), Segment::new(4, 4)],
        params.whole(),
        grads.whole(),
        state.bindings(),
    );
    let token = ok(client.optimizer_step(stream, step.clone()), "step");
    let refused = token.wait();
    assert!(invalid_argument(refused).contains("`grads`"));
    // Latched on the stream once, then clear; the device is healthy.
    let latched = client.sync(stream).map_err(|e| e.code());
    assert_eq!(latched, Err(ErrorCode::InvalidArgument));
    ok(client.sync(stream), "second sync");
    assert_eq!(download(&client, &params), initial, "nothing changed");
    for buffer in state.buffers() {
        assert_eq!(download(&client, buffer), vec![0.0; 8]);
    }
    // The same step with finite gradients runs.
    ok(client.write_f32(&grads, 0, &[0.1; 8]), "write");
    let token = ok(client.optimizer_step(stream, step), "step");
    ok(token.wait(), "finite step");
    assert_ne!(download(&client, &params), initial);
    let stats = ok(client.server_stats(), "server_stats");
    assert!(stats.kernels_run > 0);
}

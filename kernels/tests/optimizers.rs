//! Every optimizer and option against the f64 reference of `cistern-optim`.

mod common;

use cistern_kernels::{KernelError, Segment, StepContext, StepOutcome, optimizer_step};
use cistern_memory::SplitMix64;
use cistern_optim::parity::{PARAM_FLOOR, STATE_FLOOR, TOLERANCE, max_relative_error};
use cistern_optim::reference::{self, ReferenceState};
use cistern_optim::{
    AdagradConfig, AdamConfig, AdamWConfig, LambConfig, OptimizerConfig, RmsPropConfig, SgdConfig,
};
use common::segments;

const STEPS: u64 = 20;

/// Kernel buffers initialised as the config's state layout says.
fn kernel_state(config: &OptimizerConfig, n: usize) -> Vec<Vec<f32>> {
    config
        .state_layout()
        .buffers
        .iter()
        .map(|b| vec![b.initial_value as f32; n])
        .collect()
}

/// Runs `STEPS` steps of the kernel and the reference on the same random
/// data and returns the largest relative error seen in any buffer.
fn compare(config: &OptimizerConfig, segments: &[Segment], n: usize, seed: u64) -> f64 {
    let mut rng = SplitMix64::new(seed);
    let params = rng.non_zero_f32s(n, 1.0);
    let mut kernel_params = params.clone();
    let mut state = kernel_state(config, n);
    let mut expected = ReferenceState::new(config, params.iter().map(|&p| f64::from(p)).collect());
    let mut worst = 0.0f64;
    for step in 1..=STEPS {
        let grads = rng.symmetric_f32s(n);
        let ctx = StepContext {
            step,
            segments,
            found_inf: None,
        };
        let mut views: Vec<&mut [f32]> = state.iter_mut().map(|b| b.as_mut_slice()).collect();
        let outcome = optimizer_step(config, &ctx, &mut kernel_params, &grads, &mut views);
        assert_eq!(outcome, Ok(StepOutcome::Applied));
        let grads64: Vec<f64> = grads.iter().map(|&g| f64::from(g)).collect();
        reference::step(config, step, segments, &grads64, &mut expected).unwrap();
        worst = worst.max(max_relative_error(
            &kernel_params,
            &expected.params,
            PARAM_FLOOR,
        ));
        for (got, want) in state.iter().zip(&expected.buffers) {
            worst = worst.max(max_relative_error(got, want, STATE_FLOOR));
        }
    }
    worst
}

/// Several segments of awkward lengths, with unused gaps between some.
fn mixed_segments() -> (Vec<Segment>, usize) {
    segments(&[1, 7, 300, 33, 1000, 5, 64], 3)
}

fn assert_matches(config: OptimizerConfig) {
    let (segments, n) = mixed_segments();
    let error = compare(&config, &segments, n, 42);
    assert!(
        error <= TOLERANCE,
        "{config:?}: max relative error {error:e}"
    );
}

macro_rules! matches_reference {
    ($($name:ident => $config:expr;)*) => {
        $(
            #[test]
            fn $name() {
                assert_matches($config);
            }
        )*
    };
}

matches_reference! {
    sgd_matches_the_f64_reference_over_twenty_steps =>
        OptimizerConfig::Sgd(SgdConfig { lr: 1e-2, ..Default::default() });
    sgd_with_momentum_and_dampening_matches_the_reference => OptimizerConfig::Sgd(SgdConfig {
        momentum: 0.9, dampening: 0.3, ..Default::default() });
    sgd_with_nesterov_and_weight_decay_matches_the_reference => OptimizerConfig::Sgd(SgdConfig {
        momentum: 0.8, nesterov: true, weight_decay: 0.05, ..Default::default() });
    sgd_maximizing_with_momentum_matches_the_reference => OptimizerConfig::Sgd(SgdConfig {
        momentum: 0.5, maximize: true, weight_decay: 0.01, ..Default::default() });
    adam_matches_the_f64_reference_over_twenty_steps =>
        OptimizerConfig::Adam(AdamConfig::default());
    adam_with_weight_decay_and_amsgrad_matches_the_reference => OptimizerConfig::Adam(AdamConfig {
        weight_decay: 0.1, amsgrad: true, lr: 1e-2, ..Default::default() });
    adam_maximizing_with_odd_betas_matches_the_reference => OptimizerConfig::Adam(AdamConfig {
        maximize: true, betas: (0.5, 0.9), eps: 1e-3, ..Default::default() });
    adamw_matches_the_f64_reference_over_twenty_steps =>
        OptimizerConfig::AdamW(AdamWConfig::default());
    adamw_with_amsgrad_and_maximize_matches_the_reference => OptimizerConfig::AdamW(AdamWConfig {
        amsgrad: true, maximize: true, weight_decay: 0.3, lr: 1e-2, ..Default::default() });
    rmsprop_matches_the_f64_reference_over_twenty_steps =>
        OptimizerConfig::RmsProp(RmsPropConfig { lr: 1e-3, ..Default::default() });
    rmsprop_centered_with_momentum_matches_the_reference => OptimizerConfig::RmsProp(RmsPropConfig {
        lr: 1e-3, centered: true, momentum: 0.9, weight_decay: 0.01, ..Default::default() });
    rmsprop_centered_maximizing_without_momentum_matches_the_reference =>
        OptimizerConfig::RmsProp(RmsPropConfig {
            lr: 1e-3, centered: true, maximize: true, alpha: 0.9, ..Default::default() });
    rmsprop_with_momentum_only_matches_the_reference => OptimizerConfig::RmsProp(RmsPropConfig {
        lr: 1e-3, momentum: 0.5, ..Default::default() });
    adagrad_matches_the_f64_reference_over_twenty_steps =>
        OptimizerConfig::Adagrad(AdagradConfig::default());
    adagrad_with_lr_decay_weight_decay_and_accumulator_matches_the_reference =>
        OptimizerConfig::Adagrad(AdagradConfig {
            lr_decay: 0.1, weight_decay: 0.05, initial_accumulator_value: 0.3, maximize: true,
            ..Default::default() });
    lamb_matches_the_f64_reference_over_twenty_steps =>
        OptimizerConfig::Lamb(LambConfig::default());
    lamb_without_bias_correction_or_grad_averaging_matches_the_reference =>
        OptimizerConfig::Lamb(LambConfig {
            bias_correction: false, grad_averaging: false, ..Default::default() });
    lamb_with_l2_mode_and_tight_clipping_matches_the_reference =>
        OptimizerConfig::Lamb(LambConfig {
            adam_w_mode: false, max_grad_norm: 0.5, weight_decay: 0.1, ..Default::default() });
    lamb_without_clipping_or_weight_decay_matches_the_reference =>
        OptimizerConfig::Lamb(LambConfig {
            max_grad_norm: f64::INFINITY, weight_decay: 0.0, ..Default::default() });
    lamb_with_nvlamb_and_no_weight_decay_matches_the_reference =>
        OptimizerConfig::Lamb(LambConfig {
            use_nvlamb: true, weight_decay: 0.0, max_grad_norm: 100.0, ..Default::default() });
}

fn every_family() -> Vec<OptimizerConfig> {
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
            // Its steps reach ~0.1: a larger lr would drive parameters through 0.
            lr: 1e-4,
            ..Default::default()
        }),
        OptimizerConfig::Adagrad(AdagradConfig::default()),
        OptimizerConfig::Lamb(LambConfig::default()),
    ]
}

#[test]
fn segments_of_length_one_match_the_reference_for_every_family() {
    let (segments, n) = segments(&[1; 50], 1);
    for config in every_family() {
        let error = compare(&config, &segments, n, 7);
        assert!(error <= TOLERANCE, "{config:?}: {error:e}");
    }
}

#[test]
fn thousands_of_small_segments_match_the_reference_for_every_family() {
    let mut rng = SplitMix64::new(3);
    let lens: Vec<usize> = (0..3000).map(|_| 1 + rng.below(5) as usize).collect();
    for gap in [0, 2] {
        let (segments, n) = segments(&lens, gap);
        for config in every_family() {
            let error = compare(&config, &segments, n, 11);
            assert!(error <= TOLERANCE, "gap {gap}, {config:?}: {error:e}");
        }
    }
}

#[test]
fn buffers_large_enough_to_run_in_parallel_match_the_reference() {
    let (segments, n) = segments(&[40_000, 1, 17_001], 5);
    for config in every_family() {
        let error = compare(&config, &segments, n, 5);
        assert!(error <= TOLERANCE, "{config:?}: {error:e}");
    }
}

#[test]
fn elements_outside_every_segment_are_never_touched() {
    let (segments, n) = segments(&[4, 9, 2], 3);
    for config in every_family() {
        let mut params = vec![7.0f32; n];
        let grads = vec![0.5f32; n];
        let mut state = kernel_state(&config, n);
        let initial_state = state.clone();
        let mut views: Vec<&mut [f32]> = state.iter_mut().map(|b| b.as_mut_slice()).collect();
        let ctx = StepContext {
            step: 1,
            segments: &segments,
            found_inf: None,
        };
        optimizer_step(&config, &ctx, &mut params, &grads, &mut views).unwrap();
        for gap in [4..7, 16..19, 21..24] {
            assert!(params[gap.clone()].iter().all(|&p| p == 7.0), "{config:?}");
            for (now, before) in state.iter().zip(&initial_state) {
                assert_eq!(now[gap.clone()], before[gap.clone()], "{config:?}");
            }
        }
    }
}

#[test]
fn zero_gradients_leave_parameters_unchanged_without_weight_decay() {
    let (segments, n) = segments(&[10, 20], 0);
    let configs = vec![
        OptimizerConfig::Sgd(SgdConfig {
            momentum: 0.9,
            nesterov: true,
            ..Default::default()
        }),
        OptimizerConfig::Adam(AdamConfig {
            amsgrad: true,
            ..Default::default()
        }),
        OptimizerConfig::AdamW(AdamWConfig {
            weight_decay: 0.0,
            ..Default::default()
        }),
        OptimizerConfig::RmsProp(RmsPropConfig {
            centered: true,
            momentum: 0.5,
            ..Default::default()
        }),
        OptimizerConfig::Adagrad(AdagradConfig::default()),
        OptimizerConfig::Lamb(LambConfig {
            weight_decay: 0.0,
            ..Default::default()
        }),
    ];
    for config in configs {
        let initial = SplitMix64::new(1).non_zero_f32s(n, 1.0);
        let mut params = initial.clone();
        let mut state = kernel_state(&config, n);
        for step in 1..=3 {
            let mut views: Vec<&mut [f32]> = state.iter_mut().map(|b| b.as_mut_slice()).collect();
            let ctx = StepContext {
                step,
                segments: &segments,
                found_inf: None,
            };
            optimizer_step(&config, &ctx, &mut params, &vec![0.0; n], &mut views).unwrap();
        }
        assert_eq!(params, initial, "{config:?}");
    }
}

#[test]
fn lamb_uses_the_plain_learning_rate_for_zero_parameters() {
    let config = LambConfig::default();
    let (segments, n) = segments(&[8, 8], 0);
    let mut params = vec![0.0f32; n];
    let grads: Vec<f32> = (0..n)
        .map(|i| if i % 2 == 0 { 0.01 } else { -0.02 })
        .collect();
    let mut state = kernel_state(&OptimizerConfig::Lamb(config.clone()), n);
    let mut views: Vec<&mut [f32]> = state.iter_mut().map(|b| b.as_mut_slice()).collect();
    let ctx = StepContext {
        step: 1,
        segments: &segments,
        found_inf: None,
    };
    cistern_kernels::lamb_step(&config, &ctx, &mut params, &grads, &mut views).unwrap();
    // At step 1 with bias correction, u = g/(|g| + eps) ≈ sign(g): p = −lr·u.
    for (p, g) in params.iter().zip(&grads) {
        let expected = -config.lr * f64::from(*g) / (f64::from(g.abs()) + config.eps);
        assert!(
            (f64::from(*p) - expected).abs() <= 1e-5 * expected.abs(),
            "{p} vs {expected}"
        );
    }
}

#[test]
fn lamb_matches_the_reference_across_blocks_and_parallel_pieces() {
    // Long enough to run in parallel, in several rayon pieces, each measured
    // in several blocks with a ragged tail.
    let (segments, n) = segments(&[3 * 1024 + 17, (1 << 15) + 5], 2);
    let config = OptimizerConfig::Lamb(LambConfig::default());
    let error = compare(&config, &segments, n, 7);
    assert!(
        error <= TOLERANCE,
        "{config:?}: max relative error {error:e}"
    );
}

#[test]
fn lamb_without_trust_ratio_still_refuses_a_non_finite_moment() {
    // With no weight decay and no NVLAMB the trust ratio does not use the
    // norms, and the overflowing second moment makes the update 0, not
    // non-finite: only the moment check can refuse this step.
    let config = LambConfig {
        max_grad_norm: f64::INFINITY,
        weight_decay: 0.0,
        ..Default::default()
    };
    let (segments, n) = segments(&[5], 0);
    let initial = vec![1.0f32; n];
    let mut params = initial.clone();
    let grads = vec![1e30f32; n];
    let mut state = vec![vec![0.5f32; n]; 2];
    let before = state.clone();
    let mut views: Vec<&mut [f32]> = state.iter_mut().map(|b| b.as_mut_slice()).collect();
    let ctx = StepContext {
        step: 1,
        segments: &segments,
        found_inf: None,
    };
    let result = cistern_kernels::lamb_step(&config, &ctx, &mut params, &grads, &mut views);
    assert!(
        matches!(result, Err(KernelError::InvalidArgument { ref field, .. }) if field == "segments[0]"),
        "{result:?}"
    );
    assert_eq!(params, initial);
    assert_eq!(state, before);
}

#[test]
fn lamb_refuses_non_finite_gradients_and_changes_nothing() {
    let config = LambConfig::default();
    let (segments, n) = segments(&[4, 4], 0);
    let initial = SplitMix64::new(2).non_zero_f32s(n, 1.0);
    let mut params = initial.clone();
    let mut grads = vec![0.1f32; n];
    grads[5] = f32::INFINITY;
    let mut state = vec![vec![0.25f32; n]; 2];
    let mut views: Vec<&mut [f32]> = state.iter_mut().map(|b| b.as_mut_slice()).collect();
    let ctx = StepContext {
        step: 1,
        segments: &segments,
        found_inf: None,
    };
    let result = cistern_kernels::lamb_step(&config, &ctx, &mut params, &grads, &mut views);
    assert!(
        matches!(result, Err(KernelError::InvalidArgument { ref field, .. }) if field == "grads")
    );
    assert_eq!(params, initial);
    assert!(state.iter().flatten().all(|&s| s == 0.25));
}

#[test]
fn lamb_refuses_a_non_finite_moment_and_changes_nothing() {
    // A gradient of 1e30 has a finite norm in f64, but its square overflows
    // the f32 second moment.
    let config = LambConfig {
        max_grad_norm: f64::INFINITY,
        ..Default::default()
    };
    let (segments, n) = segments(&[3, 3], 0);
    let initial = vec![1.0f32; n];
    let mut params = initial.clone();
    let grads = vec![1e30f32; n];
    let mut state = vec![vec![0.5f32; n]; 2];
    let before = state.clone();
    let mut views: Vec<&mut [f32]> = state.iter_mut().map(|b| b.as_mut_slice()).collect();
    let ctx = StepContext {
        step: 2,
        segments: &segments,
        found_inf: None,
    };
    let result = cistern_kernels::lamb_step(&config, &ctx, &mut params, &grads, &mut views);
    assert!(
        matches!(result, Err(KernelError::InvalidArgument { ref field, .. }) if field == "segments[0]"),
        "{result:?}"
    );
    assert_eq!(params, initial);
    assert_eq!(state, before);
}

#[test]
fn steps_refuse_bad_lengths_and_segment_tables() {
    let config = OptimizerConfig::Adam(AdamConfig::default());
    let segs = [Segment::new(0, 4)];
    let ctx = StepContext {
        step: 1,
        segments: &segs,
        found_inf: None,
    };
    let mut params = vec![1.0f32; 4];
    let mut m = vec![0.0f32; 4];
    let mut v = vec![0.0f32; 4];
    let mut short = vec![0.0f32; 3];

    let mut state: Vec<&mut [f32]> = vec![&mut m, &mut v];
    let result = optimizer_step(&config, &ctx, &mut params, &[0.0; 3], &mut state);
    assert!(
        matches!(result, Err(KernelError::LengthMismatch { ref argument, .. }) if argument == "grads")
    );

    let mut one: Vec<&mut [f32]> = vec![&mut m];
    let result = optimizer_step(&config, &ctx, &mut params, &[0.0; 4], &mut one);
    assert!(
        matches!(result, Err(KernelError::LengthMismatch { ref argument, .. }) if argument == "state")
    );

    let mut state: Vec<&mut [f32]> = vec![&mut m, &mut short];
    let result = optimizer_step(&config, &ctx, &mut params, &[0.0; 4], &mut state);
    assert!(
        matches!(result, Err(KernelError::LengthMismatch { ref argument, .. }) if argument == "state[1]")
    );

    let mut state: Vec<&mut [f32]> = vec![&mut m, &mut v];
    for bad in [
        vec![Segment::new(2, 3)],
        vec![Segment::new(0, 2), Segment::new(1, 2)],
        vec![Segment::new(usize::MAX, 2)],
    ] {
        let ctx = StepContext {
            step: 1,
            segments: &bad,
            found_inf: None,
        };
        let result = optimizer_step(&config, &ctx, &mut params, &[0.0; 4], &mut state);
        assert!(
            matches!(result, Err(KernelError::InvalidArgument { ref field, .. }) if field.starts_with("segments")),
            "{bad:?}: {result:?}"
        );
    }

    let zero_step = StepContext { step: 0, ..ctx };
    let result = optimizer_step(&config, &zero_step, &mut params, &[0.0; 4], &mut state);
    assert!(
        matches!(result, Err(KernelError::InvalidArgument { ref field, .. }) if field == "step")
    );

    let flag = [0.0f32, 0.0];
    let two_flags = StepContext {
        found_inf: Some(&flag),
        ..ctx
    };
    let result = optimizer_step(&config, &two_flags, &mut params, &[0.0; 4], &mut state);
    assert!(
        matches!(result, Err(KernelError::LengthMismatch { ref argument, .. }) if argument == "found_inf")
    );
    assert_eq!(params, vec![1.0; 4]);
}

#[test]
fn an_invalid_config_is_refused_naming_the_field() {
    let config = OptimizerConfig::Adam(AdamConfig {
        betas: (0.9, 1.0),
        ..Default::default()
    });
    let segs = [Segment::new(0, 2)];
    let ctx = StepContext {
        step: 1,
        segments: &segs,
        found_inf: None,
    };
    let mut params = vec![1.0f32; 2];
    let (mut m, mut v) = (vec![0.0f32; 2], vec![0.0f32; 2]);
    let mut state: Vec<&mut [f32]> = vec![&mut m, &mut v];
    let result = optimizer_step(&config, &ctx, &mut params, &[1.0; 2], &mut state);
    assert!(
        matches!(result, Err(KernelError::InvalidArgument { ref field, .. }) if field == "betas[1]")
    );
}

//! AMP: unscaling with a found-inf flag, and steps that skip themselves.

mod common;

use cistern_kernels::{
    KernelError, Segment, StepContext, StepOutcome, amp_unscale, optimizer_step,
};
use cistern_memory::SplitMix64;
use cistern_optim::{
    AdagradConfig, AdamConfig, AdamWConfig, LambConfig, OptimizerConfig, RmsPropConfig, SgdConfig,
};

#[test]
fn unscale_multiplies_by_the_inverse_scale_and_leaves_the_flag_clear_when_finite() {
    let mut grads = vec![65536.0f32, -32768.0, 0.0, 1.5];
    let mut flag = [0.0f32];
    amp_unscale(&mut grads, 1.0 / 65536.0, &mut flag).unwrap();
    assert_eq!(grads, vec![1.0, -0.5, 0.0, 1.5 / 65536.0]);
    assert_eq!(flag, [0.0]);
}

#[test]
fn unscale_sets_the_flag_for_infinity_and_nan_in_large_buffers() {
    for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
        let mut grads = SplitMix64::new(4).symmetric_f32s(100_003);
        grads[77_777] = bad;
        let mut flag = [0.0f32];
        amp_unscale(&mut grads, 0.5, &mut flag).unwrap();
        assert_eq!(flag, [1.0], "{bad}");
    }
}

#[test]
fn unscale_never_clears_a_flag_already_set() {
    let mut grads = vec![1.0f32; 8];
    let mut flag = [1.0f32];
    amp_unscale(&mut grads, 1.0, &mut flag).unwrap();
    assert_eq!(flag, [1.0]);
}

#[test]
fn unscale_refuses_a_flag_that_is_not_one_element() {
    let mut grads = vec![1.0f32; 8];
    let mut flag = [0.0f32; 2];
    assert!(matches!(
        amp_unscale(&mut grads, 1.0, &mut flag),
        Err(KernelError::LengthMismatch { .. })
    ));
}

#[test]
fn every_optimizer_skips_itself_and_changes_nothing_when_the_flag_is_set() {
    let configs = [
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
            momentum: 0.5,
            ..Default::default()
        }),
        OptimizerConfig::Adagrad(AdagradConfig::default()),
        OptimizerConfig::Lamb(LambConfig::default()),
    ];
    let segments = [Segment::new(0, 5), Segment::new(5, 1000)];
    for config in configs {
        let mut rng = SplitMix64::new(9);
        let initial = rng.non_zero_f32s(1005, 1.0);
        let mut grads = rng.symmetric_f32s(1005);
        grads[3] = f32::INFINITY;
        grads[600] = f32::NAN;
        let mut flag = [0.0f32];
        amp_unscale(&mut grads, 1.0 / 1024.0, &mut flag).unwrap();
        assert_eq!(flag, [1.0]);

        let mut params = initial.clone();
        // Non-negative, so second moments are valid.
        let mut state: Vec<Vec<f32>> = (0..config.state_layout().len())
            .map(|_| rng.symmetric_f32s(1005).iter().map(|v| v.abs()).collect())
            .collect();
        let before = state.clone();
        let mut views: Vec<&mut [f32]> = state.iter_mut().map(|b| b.as_mut_slice()).collect();
        let ctx = StepContext {
            step: 3,
            segments: &segments,
            found_inf: Some(&flag),
        };
        let outcome = optimizer_step(&config, &ctx, &mut params, &grads, &mut views);
        assert_eq!(outcome, Ok(StepOutcome::Skipped), "{config:?}");
        assert_eq!(params, initial, "{config:?}");
        assert_eq!(state, before, "{config:?}");

        let clear = [0.0f32];
        let ctx = StepContext {
            found_inf: Some(&clear),
            ..ctx
        };
        let finite_grads = rng.symmetric_f32s(1005);
        let mut views: Vec<&mut [f32]> = state.iter_mut().map(|b| b.as_mut_slice()).collect();
        let outcome = optimizer_step(&config, &ctx, &mut params, &finite_grads, &mut views);
        assert_eq!(outcome, Ok(StepOutcome::Applied), "{config:?}");
        assert_ne!(params, initial, "{config:?}");
    }
}

/// Adam's β powers: the kernel takes them as `β.powf(t)` in f64 from the
/// step count, computed once per call on the host (every backend does the
/// same), which is `1 - beta ** step` of PyTorch in f64. At a late step
/// with f32-inexact betas, one element's update is exactly that of the
/// f64 powers.
#[test]
fn adams_bias_corrections_are_f64_powers_of_the_step_count() {
    use cistern_kernels::{StepContext, adam_step};
    use cistern_optim::{AdamConfig, Segment};

    let config = AdamConfig {
        betas: (0.93, 0.9971),
        ..AdamConfig::default()
    };
    let t = 1237u64;
    let segments = [Segment::new(0, 1)];
    let ctx = StepContext {
        step: t,
        segments: &segments,
        found_inf: None,
    };
    let (g, m0, v0, p0) = (0.25f32, 0.01f32, 0.002f32, 1.5f32);
    let (mut p, mut m, mut v) = ([p0], [m0], [v0]);
    let mut state: Vec<&mut [f32]> = vec![&mut m, &mut v];
    adam_step(&config, &ctx, &mut p, &[g], &mut state).unwrap();
    let expected = |bc1: f64, bc2: f64| {
        let m_i = m0 + (1.0 - config.betas.0) as f32 * (g - m0);
        let v_i = v0 * config.betas.1 as f32 + (1.0 - config.betas.1) as f32 * g * g;
        let denom = v_i.sqrt() * (1.0 / bc2.sqrt()) as f32 + config.eps as f32;
        p0 - (config.lr / bc1) as f32 * (m_i / denom)
    };
    let tf = t as f64;
    let f64_powers = expected(1.0 - config.betas.0.powf(tf), 1.0 - config.betas.1.powf(tf));
    assert_eq!(p[0].to_bits(), f64_powers.to_bits());
}

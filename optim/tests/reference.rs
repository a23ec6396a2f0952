//! Hand-checked values of the f64 reference.

use cistern_optim::reference::{self, ReferenceState};
use cistern_optim::{
    AdagradConfig, AdamConfig, LambConfig, OptimError, OptimizerConfig, Segment, SgdConfig,
};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * (1.0 + b.abs())
}

#[test]
fn sgd_momentum_starts_from_the_undampened_gradient() {
    let config = OptimizerConfig::Sgd(SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.5,
        ..Default::default()
    });
    let segs = [Segment::new(0, 1)];
    let mut state = ReferenceState::new(&config, vec![1.0]);
    reference::step(&config, 1, &segs, &[2.0], &mut state).unwrap();
    assert!(close(state.buffers[0][0], 2.0) && close(state.params[0], 0.8));
    reference::step(&config, 2, &segs, &[2.0], &mut state).unwrap();
    // buf = 0.9·2 + 0.5·2 = 2.8
    assert!(close(state.buffers[0][0], 2.8) && close(state.params[0], 0.52));
}

#[test]
fn adams_first_step_moves_each_parameter_by_about_lr() {
    let config = OptimizerConfig::Adam(AdamConfig::default());
    let segs = [Segment::new(0, 2)];
    let mut state = ReferenceState::new(&config, vec![1.0, 1.0]);
    reference::step(&config, 1, &segs, &[0.5, -3.0], &mut state).unwrap();
    assert!((state.params[0] - (1.0 - 1e-3)).abs() < 1e-10);
    assert!((state.params[1] - (1.0 + 1e-3)).abs() < 1e-10);
}

#[test]
fn adagrad_decays_the_learning_rate_from_the_second_step() {
    let config = OptimizerConfig::Adagrad(AdagradConfig {
        lr: 1.0,
        lr_decay: 1.0,
        eps: 0.0,
        ..Default::default()
    });
    let segs = [Segment::new(0, 1)];
    let mut state = ReferenceState::new(&config, vec![0.0]);
    reference::step(&config, 1, &segs, &[1.0], &mut state).unwrap();
    assert!(close(state.params[0], -1.0));
    // clr = 1/2, sum = 2: p −= 0.5 · 1/√2
    reference::step(&config, 2, &segs, &[1.0], &mut state).unwrap();
    assert!(close(state.params[0], -1.0 - 0.5 / 2f64.sqrt()));
}

#[test]
fn lamb_clips_by_the_global_norm_and_scales_by_the_trust_ratio() {
    let config = LambConfig {
        lr: 0.1,
        bias_correction: false,
        grad_averaging: false,
        weight_decay: 0.0,
        use_nvlamb: true,
        eps: 0.0,
        betas: (0.0, 0.0),
        ..Default::default()
    };
    let opt = OptimizerConfig::Lamb(config);
    let segs = [Segment::new(0, 1), Segment::new(1, 1)];
    let mut state = ReferenceState::new(&opt, vec![3.0, 0.0]);
    // Global norm 5 > 1: g becomes (0.6, 0.8); with betas 0, u = g/|g| = (1, 1).
    reference::step(&opt, 1, &segs, &[3.0, 4.0], &mut state).unwrap();
    assert!(close(state.buffers[0][0], 0.6) && close(state.buffers[0][1], 0.8));
    // Segment 0: ratio = 0.1 · 3/1; segment 1: ‖p‖ = 0, plain lr.
    assert!(close(state.params[0], 3.0 - 0.3));
    assert!(close(state.params[1], -0.1));
}

#[test]
fn the_reference_refuses_bad_steps_and_lengths() {
    let config = OptimizerConfig::Adam(AdamConfig::default());
    let segs = [Segment::new(0, 2)];
    let mut state = ReferenceState::new(&config, vec![1.0, 1.0]);
    let field = |r: Result<(), OptimError>| match r {
        Err(OptimError::InvalidArgument { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        field(reference::step(&config, 0, &segs, &[0.0; 2], &mut state)),
        "step"
    );
    assert_eq!(
        field(reference::step(&config, 1, &segs, &[0.0; 3], &mut state)),
        "grads"
    );
    state.buffers.pop();
    assert_eq!(
        field(reference::step(&config, 1, &segs, &[0.0; 2], &mut state)),
        "state"
    );
}

//! Config defaults, validation and state layouts.

use cistern_optim::{
    AdagradConfig, AdamConfig, AdamWConfig, LambConfig, OptimError, OptimizerConfig, RmsPropConfig,
    Segment, SgdConfig, validate_segments,
};

fn field_of(result: Result<(), OptimError>) -> String {
    match result {
        Err(OptimError::InvalidArgument { field, .. }) => field,
        other => panic!("expected an invalid argument, got {other:?}"),
    }
}

#[test]
fn defaults_are_pytorchs_and_apexs() {
    let sgd = SgdConfig::default();
    assert_eq!(
        (sgd.lr, sgd.momentum, sgd.dampening, sgd.nesterov),
        (1e-3, 0.0, 0.0, false)
    );
    let adam = AdamConfig::default();
    assert_eq!(
        (adam.lr, adam.betas, adam.eps, adam.weight_decay),
        (1e-3, (0.9, 0.999), 1e-8, 0.0)
    );
    assert_eq!(AdamWConfig::default().weight_decay, 1e-2);
    let rms = RmsPropConfig::default();
    assert_eq!((rms.lr, rms.alpha, rms.eps), (1e-2, 0.99, 1e-8));
    let adagrad = AdagradConfig::default();
    assert_eq!(
        (adagrad.lr, adagrad.eps, adagrad.lr_decay),
        (1e-2, 1e-10, 0.0)
    );
    let lamb = LambConfig::default();
    assert_eq!(
        (lamb.lr, lamb.eps, lamb.weight_decay, lamb.max_grad_norm),
        (1e-3, 1e-6, 0.01, 1.0)
    );
    assert!(lamb.bias_correction && lamb.adam_w_mode && lamb.grad_averaging && !lamb.use_nvlamb);
    for config in every_default() {
        assert_eq!(config.validate(), Ok(()));
    }
}

fn every_default() -> Vec<OptimizerConfig> {
    vec![
        OptimizerConfig::Sgd(SgdConfig::default()),
        OptimizerConfig::Adam(AdamConfig::default()),
        OptimizerConfig::AdamW(AdamWConfig::default()),
        OptimizerConfig::RmsProp(RmsPropConfig::default()),
        OptimizerConfig::Adagrad(AdagradConfig::default()),
        OptimizerConfig::Lamb(LambConfig::default()),
    ]
}

#[test]
fn invalid_values_are_refused_naming_the_field() {
    let sgd = SgdConfig::default;
    assert_eq!(field_of(SgdConfig { lr: -1.0, ..sgd() }.validate()), "lr");
    assert_eq!(
        field_of(
            SgdConfig {
                lr: f64::NAN,
                ..sgd()
            }
            .validate()
        ),
        "lr"
    );
    assert_eq!(
        field_of(
            SgdConfig {
                momentum: -0.1,
                ..sgd()
            }
            .validate()
        ),
        "momentum"
    );
    assert_eq!(
        field_of(
            SgdConfig {
                weight_decay: -1.0,
                ..sgd()
            }
            .validate()
        ),
        "weight_decay"
    );
    assert_eq!(
        field_of(
            SgdConfig {
                nesterov: true,
                ..sgd()
            }
            .validate()
        ),
        "nesterov"
    );
    assert_eq!(
        field_of(
            SgdConfig {
                nesterov: true,
                momentum: 0.9,
                dampening: 0.1,
                ..sgd()
            }
            .validate()
        ),
        "nesterov"
    );
    let adam = AdamConfig::default;
    assert_eq!(
        field_of(
            AdamConfig {
                betas: (1.0, 0.9),
                ..adam()
            }
            .validate()
        ),
        "betas[0]"
    );
    assert_eq!(
        field_of(
            AdamConfig {
                betas: (0.9, -0.1),
                ..adam()
            }
            .validate()
        ),
        "betas[1]"
    );
    assert_eq!(
        field_of(
            AdamConfig {
                eps: -1e-8,
                ..adam()
            }
            .validate()
        ),
        "eps"
    );
    assert_eq!(
        field_of(
            AdamWConfig {
                weight_decay: f64::INFINITY,
                ..Default::default()
            }
            .validate()
        ),
        "weight_decay"
    );
    assert_eq!(
        field_of(
            RmsPropConfig {
                alpha: -0.5,
                ..Default::default()
            }
            .validate()
        ),
        "alpha"
    );
    assert_eq!(
        field_of(
            AdagradConfig {
                lr_decay: -1.0,
                ..Default::default()
            }
            .validate()
        ),
        "lr_decay"
    );
    assert_eq!(
        field_of(
            AdagradConfig {
                initial_accumulator_value: -1.0,
                ..Default::default()
            }
            .validate()
        ),
        "initial_accumulator_value"
    );
    assert_eq!(
        field_of(
            LambConfig {
                max_grad_norm: 0.0,
                ..Default::default()
            }
            .validate()
        ),
        "max_grad_norm"
    );
    assert_eq!(
        field_of(
            LambConfig {
                betas: (0.9, 1.5),
                ..Default::default()
            }
            .validate()
        ),
        "betas[1]"
    );
}

#[test]
fn state_layouts_count_the_buffers_each_optimizer_needs() {
    let count = |c: OptimizerConfig| c.state_layout().len();
    assert_eq!(count(OptimizerConfig::Sgd(SgdConfig::default())), 0);
    assert_eq!(
        count(OptimizerConfig::Sgd(SgdConfig {
            momentum: 0.9,
            ..Default::default()
        })),
        1
    );
    assert_eq!(count(OptimizerConfig::Adam(AdamConfig::default())), 2);
    assert_eq!(
        count(OptimizerConfig::Adam(AdamConfig {
            amsgrad: true,
            ..Default::default()
        })),
        3
    );
    assert_eq!(
        count(OptimizerConfig::AdamW(AdamWConfig {
            amsgrad: true,
            ..Default::default()
        })),
        3
    );
    assert_eq!(count(OptimizerConfig::RmsProp(RmsPropConfig::default())), 1);
    assert_eq!(
        count(OptimizerConfig::RmsProp(RmsPropConfig {
            momentum: 0.9,
            centered: true,
            ..Default::default()
        })),
        3
    );
    assert_eq!(count(OptimizerConfig::Lamb(LambConfig::default())), 2);
    let adagrad = AdagradConfig {
        initial_accumulator_value: 0.1,
        ..Default::default()
    };
    let layout = OptimizerConfig::Adagrad(adagrad).state_layout();
    assert_eq!(
        (layout.buffers[0].name, layout.buffers[0].initial_value),
        ("sum", 0.1)
    );
}

#[test]
fn configs_round_trip_through_json_and_fill_missing_fields_with_defaults() {
    for config in every_default() {
        let json = serde_json::to_string(&config).unwrap();
        let back: OptimizerConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, config);
    }
    let partial: AdamWConfig = serde_json::from_str(r#"{"lr": 0.01}"#).unwrap();
    assert_eq!(
        partial,
        AdamWConfig {
            lr: 0.01,
            ..Default::default()
        }
    );
}

#[test]
fn segment_tables_must_be_sorted_disjoint_and_in_bounds() {
    assert_eq!(
        validate_segments(
            &[Segment::new(0, 2), Segment::new(2, 0), Segment::new(3, 1)],
            4
        ),
        Ok(())
    );
    assert_eq!(
        field_of(validate_segments(&[Segment::new(0, 5)], 4)),
        "segments[0]"
    );
    assert_eq!(
        field_of(validate_segments(
            &[Segment::new(0, 2), Segment::new(1, 1)],
            4
        )),
        "segments[1]"
    );
    assert_eq!(
        field_of(validate_segments(&[Segment::new(usize::MAX, 1)], 4)),
        "segments[0]"
    );
}

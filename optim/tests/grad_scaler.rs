//! GradScaler sequences, as `torch.amp.GradScaler`.

use cistern_optim::{GradScaler, GradScalerConfig, OptimError, ScaleUpdate};

fn scaler(interval: u32) -> GradScaler {
    GradScaler::new(GradScalerConfig {
        growth_interval: interval,
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn the_scale_starts_at_two_to_the_sixteen() {
    let scaler = GradScaler::new(GradScalerConfig::default()).unwrap();
    assert_eq!(scaler.scale(), 65536.0);
    assert_eq!(scaler.inv_scale(), 1.0 / 65536.0);
    assert_eq!(scaler.config().growth_interval, 2000);
}

#[test]
fn the_scale_grows_after_an_interval_of_finite_steps() {
    let mut scaler = GradScaler::new(GradScalerConfig::default()).unwrap();
    for _ in 0..1999 {
        assert_eq!(scaler.update(false), Ok(ScaleUpdate::Unchanged));
    }
    assert_eq!(scaler.growth_tracker(), 1999);
    assert_eq!(scaler.update(false), Ok(ScaleUpdate::Grew));
    assert_eq!(scaler.scale(), 131072.0);
    assert_eq!(scaler.growth_tracker(), 0);
}

#[test]
fn an_overflow_backs_off_and_resets_the_growth_tracker() {
    let mut scaler = scaler(3);
    scaler.update(false).unwrap();
    scaler.update(false).unwrap();
    assert_eq!(scaler.update(true), Ok(ScaleUpdate::BackedOff));
    assert_eq!(scaler.scale(), 32768.0);
    assert_eq!(scaler.growth_tracker(), 0);
    // The interval counts again from zero.
    scaler.update(false).unwrap();
    scaler.update(false).unwrap();
    assert_eq!(scaler.scale(), 32768.0);
    assert_eq!(scaler.update(false), Ok(ScaleUpdate::Grew));
    assert_eq!(scaler.scale(), 65536.0);
}

#[test]
fn growth_that_would_overflow_to_infinity_is_refused() {
    let mut scaler = GradScaler::new(GradScalerConfig {
        init_scale: 2f64.powi(127),
        growth_interval: 1,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(scaler.update(false), Ok(ScaleUpdate::GrowthRefused));
    assert_eq!(scaler.scale(), 2f32.powi(127));
    assert_eq!(scaler.growth_tracker(), 0);
}

#[test]
fn backing_off_into_a_subnormal_scale_is_an_error_that_changes_nothing() {
    let mut scaler = GradScaler::new(GradScalerConfig {
        init_scale: f64::from(f32::MIN_POSITIVE),
        ..Default::default()
    })
    .unwrap();
    scaler.update(false).unwrap();
    let before = scaler.clone();
    assert!(matches!(
        scaler.update(true),
        Err(OptimError::ScaleOutOfRange { .. })
    ));
    assert_eq!(scaler, before);
}

#[test]
fn invalid_scaler_configs_are_refused_naming_the_field() {
    let field = |config: GradScalerConfig| match GradScaler::new(config) {
        Err(OptimError::InvalidArgument { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    let d = GradScalerConfig::default;
    assert_eq!(
        field(GradScalerConfig {
            init_scale: 0.0,
            ..d()
        }),
        "init_scale"
    );
    assert_eq!(
        field(GradScalerConfig {
            init_scale: 1e39,
            ..d()
        }),
        "init_scale"
    );
    assert_eq!(
        field(GradScalerConfig {
            growth_factor: 1.0,
            ..d()
        }),
        "growth_factor"
    );
    assert_eq!(
        field(GradScalerConfig {
            backoff_factor: 1.0,
            ..d()
        }),
        "backoff_factor"
    );
    assert_eq!(
        field(GradScalerConfig {
            growth_interval: 0,
            ..d()
        }),
        "growth_interval"
    );
}

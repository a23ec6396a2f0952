//! Every optimizer family against `torch.optim` itself: the same float32
//! parameters and 20 gradients (`fixtures/pytorch_optimizers.txt`, written
//! by `benches/optimizer_parity.py`), PyTorch's defaults and the options
//! that change its arithmetic; the parameters after the last step within
//! `PARITY` of PyTorch's, relative.

use cistern_kernels::{Segment, StepContext, StepOutcome, optimizer_step};
use cistern_optim::parity::{PARAM_FLOOR, max_relative_error};
use cistern_optim::{
    AdagradConfig, AdamConfig, AdamWConfig, OptimizerConfig, RmsPropConfig, SgdConfig,
};

/// The largest relative error against PyTorch after 20 steps.
const PARITY: f64 = 5e-6;

const FIXTURE: &str = include_str!("fixtures/pytorch_optimizers.txt");

struct Fixture {
    params: Vec<f32>,
    grads: Vec<Vec<f32>>,
    cases: Vec<(String, Vec<f32>)>,
}

fn floats(values: &str) -> Vec<f32> {
    values
        .split_whitespace()
        .map(|v| match v.parse() {
            Ok(value) => value,
            Err(error) => panic!("fixture value {v}: {error}"),
        })
        .collect()
}

fn fixture() -> Fixture {
    let mut fixture = Fixture {
        params: Vec::new(),
        grads: Vec::new(),
        cases: Vec::new(),
    };
    let mut case = None;
    for line in FIXTURE.lines().filter(|line| !line.starts_with('#')) {
        let (tag, rest) = line.split_once(' ').unwrap_or((line, ""));
        match tag {
            "params" => fixture.params = floats(rest),
            "grad" => fixture.grads.push(floats(rest)),
            "case" => case = Some(rest.to_string()),
            "want" => match case.take() {
                Some(name) => fixture.cases.push((name, floats(rest))),
                None => panic!("a `want` line before its `case`"),
            },
            other => panic!("unknown fixture line `{other}`"),
        }
    }
    fixture
}

/// The config PyTorch ran case `name` with (`benches/optimizer_parity.py`).
fn config(name: &str) -> OptimizerConfig {
    match name {
        "sgd" => OptimizerConfig::Sgd(SgdConfig {
            lr: 0.01,
            ..Default::default()
        }),
        "sgd_momentum_nesterov_decay" => OptimizerConfig::Sgd(SgdConfig {
            lr: 0.01,
            momentum: 0.9,
            nesterov: true,
            weight_decay: 0.01,
            ..Default::default()
        }),
        "adam" => OptimizerConfig::Adam(AdamConfig::default()),
        "adam_amsgrad_decay" => OptimizerConfig::Adam(AdamConfig {
            amsgrad: true,
            weight_decay: 0.01,
            ..Default::default()
        }),
        "adamw" => OptimizerConfig::AdamW(AdamWConfig::default()),
        "rmsprop" => OptimizerConfig::RmsProp(RmsPropConfig::default()),
        "rmsprop_centered_momentum_decay" => OptimizerConfig::RmsProp(RmsPropConfig {
            centered: true,
            momentum: 0.9,
            weight_decay: 0.01,
            ..Default::default()
        }),
        "adagrad" => OptimizerConfig::Adagrad(AdagradConfig::default()),
        "adagrad_lr_decay_decay" => OptimizerConfig::Adagrad(AdagradConfig {
            lr_decay: 0.01,
            weight_decay: 0.01,
            ..Default::default()
        }),
        other => panic!("no config for fixture case {other}"),
    }
}

/// The parameters after Cistern's kernel ran every step of the fixture.
fn run(config: &OptimizerConfig, fixture: &Fixture) -> Vec<f32> {
    let n = fixture.params.len();
    let segments = [Segment::new(0, n)];
    let mut params = fixture.params.clone();
    let mut state: Vec<Vec<f32>> = (config.state_layout().buffers.iter())
        .map(|buffer| vec![buffer.initial_value as f32; n])
        .collect();
    for (step, grads) in (1..).zip(&fixture.grads) {
        let ctx = StepContext {
            step,
            segments: &segments,
            found_inf: None,
        };
        let mut views: Vec<&mut [f32]> = state.iter_mut().map(Vec::as_mut_slice).collect();
        let outcome = optimizer_step(config, &ctx, &mut params, grads, &mut views);
        assert_eq!(outcome, Ok(StepOutcome::Applied));
    }
    params
}

#[test]
fn every_family_ends_within_five_millionths_of_torch_optim_after_twenty_steps() {
    let fixture = fixture();
    assert_eq!(fixture.grads.len(), 20, "the fixture's steps");
    assert!(fixture.cases.len() >= 9, "the fixture's cases");
    let mut report = Vec::new();
    for (name, want) in &fixture.cases {
        let got = run(&config(name), &fixture);
        let want: Vec<f64> = want.iter().map(|&w| f64::from(w)).collect();
        report.push((name.as_str(), max_relative_error(&got, &want, PARAM_FLOOR)));
    }
    println!("{report:#?}");
    for (name, error) in &report {
        assert!(
            *error <= PARITY,
            "{name}: {error:e} from torch.optim; every case: {report:?}"
        );
    }
}

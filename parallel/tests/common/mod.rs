//! What the group tests share: a small regression model, its shards, and
//! the work a replica runs each step.

#![allow(dead_code)]

use cistern_client::{BackendError, ComputeClient, Tape, Tensor};
use cistern_memory::SplitMix64;
use cistern_optim::{
    AdagradConfig, AdamConfig, AdamWConfig, LambConfig, OptimizerConfig, RmsPropConfig, SgdConfig,
};
use cistern_parallel::{Replica, Shard};
use cistern_runtime::{Activation, Device, DeviceOptions, FaultPlan};

/// Rows of the global batch.
pub const ROWS: usize = 16;

pub fn ok<T, E: std::fmt::Debug>(result: Result<T, E>, what: &str) -> T {
    match result {
        Ok(value) => value,
        Err(error) => panic!("{what}: {error:?}"),
    }
}

/// CPU ordinal `n` with a pool of one thread.
pub fn cpu(n: usize) -> ComputeClient {
    cpu_with(n, FaultPlan::none())
}

/// CPU ordinal `n` with one thread and `faults`.
pub fn cpu_with(n: usize, faults: FaultPlan) -> ComputeClient {
    let options = DeviceOptions::with_memory_limit(64 << 20)
        .with_cpu_threads(1)
        .with_faults(faults);
    ok(ComputeClient::open(Device::Cpu(n), options), "open")
}

fn random(rng: &mut SplitMix64, shape: &[usize]) -> Tensor<f32> {
    let len = shape.iter().product();
    let data = (0..len)
        .map(|_| ((rng.next_u64() >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32)
        .collect();
    ok(Tensor::new(shape.to_vec(), data), "tensor")
}

/// `tanh(x·W1ᵀ + b1)·W2ᵀ + b2` on a regression problem.
pub struct Problem {
    pub x: Vec<f32>,
    pub y: Vec<f32>,
    /// W1 (6×4), b1 (6), W2 (3×6), b2 (3).
    pub params: Vec<Tensor<f32>>,
}

pub fn problem(seed: u64) -> Problem {
    let mut rng = SplitMix64::new(seed);
    Problem {
        x: random(&mut rng, &[ROWS, 4]).into_data(),
        y: random(&mut rng, &[ROWS, 3]).into_data(),
        params: vec![
            random(&mut rng, &[4, 6]),
            random(&mut rng, &[6]),
            random(&mut rng, &[6, 3]),
            random(&mut rng, &[3]),
        ],
    }
}

/// The rows of `replica`'s shard of `rows`.
pub fn shard_rows(rows: usize, index: usize, count: usize) -> std::ops::Range<usize> {
    rows * index / count..rows * (index + 1) / count
}

/// One replica's forward and backward on its shard, scaled by `scale`
/// (1 unless AMP).
pub fn work(problem: &Problem, replica: &mut Replica, scale: f32) -> Result<Shard, BackendError> {
    let rows = shard_rows(ROWS, replica.index(), replica.count());
    let tape = Tape::new(replica.client());
    let x = Tensor::new(
        [rows.len(), 4],
        problem.x[rows.start * 4..rows.end * 4].to_vec(),
    )?;
    let y = Tensor::new(
        [rows.len(), 3],
        problem.y[rows.start * 3..rows.end * 3].to_vec(),
    )?;
    let store = replica.store_mut();
    let leaves = store.register_resident_params(&tape)?;
    let x = tape.upload(&x).map_err(BackendError::from)?;
    let y = tape.upload(&y).map_err(BackendError::from)?;
    let h = store.linear_forward_with_activation(
        &tape,
        &x,
        &leaves[0],
        Some(&leaves[1]),
        Activation::Tanh,
    )?;
    let pred = store.linear_forward(&tape, &h, &leaves[2], Some(&leaves[3]))?;
    let loss = tape.mse_loss(&pred, &y).map_err(BackendError::from)?;
    let value = loss.item().map_err(BackendError::from)?;
    let scaled = match scale {
        1.0 => loss,
        _ => tape.scale(&loss, scale).map_err(BackendError::from)?,
    };
    store.backward(&tape, &scaled).map_err(BackendError::from)?;
    Ok(Shard {
        loss: value,
        examples: rows.len(),
    })
}

/// One config of every family, with learning rates small enough for 200 steps.
pub fn every_family() -> Vec<OptimizerConfig> {
    vec![
        OptimizerConfig::Sgd(SgdConfig {
            lr: 0.05,
            momentum: 0.9,
            nesterov: true,
            ..Default::default()
        }),
        OptimizerConfig::Adam(AdamConfig {
            lr: 0.01,
            ..Default::default()
        }),
        OptimizerConfig::AdamW(AdamWConfig {
            lr: 0.01,
            amsgrad: true,
            ..Default::default()
        }),
        OptimizerConfig::RmsProp(RmsPropConfig {
            lr: 0.001,
            momentum: 0.5,
            ..Default::default()
        }),
        OptimizerConfig::Adagrad(AdagradConfig {
            lr: 0.05,
            ..Default::default()
        }),
        OptimizerConfig::Lamb(LambConfig {
            lr: 0.01,
            ..Default::default()
        }),
    ]
}

/// A group over `engine` and `clients` holding problem `seed`'s parameters,
/// after `steps` Adam steps, each of which must complete (no step lost);
/// and the replicas the steps recovered in place.
pub fn adam_steps(
    engine: Box<dyn cistern_parallel::Collective>,
    clients: Vec<ComputeClient>,
    seed: u64,
    steps: usize,
) -> (cistern_parallel::ReplicaGroup, usize) {
    let problem = problem(seed);
    let mut group = ok(
        cistern_parallel::ReplicaGroup::new(engine, clients, &problem.params),
        "group",
    );
    let config = every_family().remove(1);
    let mut recovered = 0;
    for _ in 0..steps {
        let report = ok(
            group.step(&config, |replica| work(&problem, replica, 1.0)),
            "step",
        );
        recovered += report.recovered;
    }
    assert_eq!(group.steps(), steps as u64, "no step lost");
    (group, recovered)
}

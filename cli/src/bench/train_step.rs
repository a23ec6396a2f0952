//! `cistern bench train-step`: one whole training step of an MLP
//! 784-1024-1024-10 (ReLU, ReLU, identity) at batch 256 with an MSE loss on
//! random data, through the parameter store: `chain-sgd` is
//! `train_step_device_chain` (a replayed graph) with its loss read;
//! `tape-adam` a tape forward, the store's `backward` and `step_adam`,
//! with the loss read. Both time the step up to and including the loss
//! read (its one host synchronisation).
//!
//!
//! The reference, `kernel_ms_per_step`: the launches the server logged for
//! each measured step (its launch log), replayed right after it as one
//! batch on one stream, up to a sync: the step's kernels alone.

use std::time::Instant;

use cistern_client::{ComputeClient, DeviceParamStore, Tape, Tensor};
use cistern_memory::SplitMix64;
use cistern_optim::{AdamConfig, SgdConfig};
use cistern_runtime::{Activation, Device, DeviceOptions};

use super::optim::{median, print_line};
use super::tape::{round, tensor};

pub(super) const BATCH: usize = 256;
pub(super) const LAYERS: [usize; 4] = [784, 1024, 1024, 10];
const WARMUP: usize = 3;
const SAMPLES: usize = 15;

/// Runs both paths, in turns, and prints one JSON line for each.
pub fn run() -> Result<(), String> {
    let (client, params, x, y) = bench_mlp()?;
    let refs: Vec<&Tensor<f32>> = params.iter().collect();
    let tape = Tape::new(&client);
    let failed = |e: cistern_client::BackendError| format!("store: {e}");
    let mut chain = DeviceParamStore::new(&tape, &refs).map_err(failed)?;
    let mut taped = DeviceParamStore::new(&tape, &refs).map_err(failed)?;
    let (mut chain_runs, mut tape_runs) = (Runs::default(), Runs::default());
    for sample in 0..WARMUP + SAMPLES {
        let chained = timed(&client, &mut chain, |store| {
            chain_step(&client, store, &x, &y).map(|loss| (loss, None))
        })?;
        let taped = timed(&client, &mut taped, |store| {
            adam_step(&client, store, &x, &y).map(|(loss, tape)| (loss, Some(tape)))
        })?;
        if sample >= WARMUP {
            chain_runs.push(chained);
            tape_runs.push(taped);
        }
    }
    for (path, runs) in [
        ("chain-sgd", &mut chain_runs),
        ("tape-adam", &mut tape_runs),
    ] {
        print_line(serde_json::json!({
            "bench": "train_step",
            "path": path,
            "ms_per_step": round(median(&mut runs.step) * 1e3, 3),
            "kernel_ms_per_step": round(median(&mut runs.kernels) * 1e3, 3),
            "launches": runs.launches,
            "kernels_replayed": runs.replayed,
        }));
    }
    Ok(())
}

/// One path's samples: step seconds, and its logged launches' seconds.
#[derive(Default)]
struct Runs {
    step: Vec<f64>,
    kernels: Vec<f64>,
    /// Kernels the device ran for the latest step, and for its replay.
    launches: u64,
    replayed: u64,
}

/// One timed step and the replay of its logged launches.
struct Timed {
    step: f64,
    kernels: f64,
    launches: u64,
    replayed: u64,
}

impl Runs {
    fn push(&mut self, timed: Timed) {
        self.step.push(timed.step);
        self.kernels.push(timed.kernels);
        (self.launches, self.replayed) = (timed.launches, timed.replayed);
    }
}

/// Times `step` of `store` with the launch log on, then (once the store's
/// work is done) its logged launches replayed back to back on the default
/// stream, the step's tape, if any, kept alive so its buffers are; each
/// with the kernels the device ran for it.
fn timed(
    client: &ComputeClient,
    store: &mut DeviceParamStore,
    step: impl FnOnce(&mut DeviceParamStore) -> Result<(f32, Option<Tape>), String>,
) -> Result<Timed, String> {
    let failed = |e: cistern_runtime::ServerError| format!("bench: {e}");
    let kernels_run = || client.server_stats().map(|s| s.kernels_run).map_err(failed);
    client.take_launch_log(true).map_err(failed)?;
    let before = kernels_run()?;
    let start = Instant::now();
    let (loss, tape) = step(store)?;
    let seconds = start.elapsed().as_secs_f64();
    store.wait_device().map_err(|e| format!("bench: {e}"))?;
    let log = client.take_launch_log(false).map_err(failed)?;
    if !loss.is_finite() {
        return Err(format!("the loss is {loss}"));
    }
    let between = kernels_run()?;
    let stream = client.default_stream();
    let start = Instant::now();
    client.launch_batch(stream, log).map_err(failed)?;
    client.sync(stream).map_err(failed)?;
    let kernels = start.elapsed().as_secs_f64();
    let after = kernels_run()?;
    drop(tape);
    Ok(Timed {
        step: seconds,
        kernels,
        launches: between - before,
        replayed: after - between,
    })
}

fn chain_step(
    client: &ComputeClient,
    store: &mut DeviceParamStore,
    x: &Tensor<f32>,
    y: &Tensor<f32>,
) -> Result<f32, String> {
    let failed = |e: cistern_client::BackendError| format!("chain: {e}");
    let tape = Tape::new(client);
    let leaves = store.snapshot_resident_params(&tape).map_err(failed)?;
    let chain: Vec<_> = leaves
        .chunks(2)
        .enumerate()
        .map(|(index, pair)| (pair[0].clone(), pair.get(1).cloned(), activation(index)))
        .collect();
    let config = SgdConfig {
        lr: 1e-3,
        momentum: 0.9,
        ..Default::default()
    };
    let loss = store
        .train_step_device_chain(&chain, x, y, &config)
        .map_err(failed)?;
    store.read_train_step_loss(&loss).map_err(failed)
}

/// The step's loss, and its tape (whose buffers its launches bind).
pub(super) fn adam_step(
    client: &ComputeClient,
    store: &mut DeviceParamStore,
    x: &Tensor<f32>,
    y: &Tensor<f32>,
) -> Result<(f32, Tape), String> {
    let failed = |e: cistern_client::BackendError| format!("tape: {e}");
    let autodiff = |e: cistern_client::AutodiffError| format!("tape: {e}");
    let tape = Tape::new(client);
    let leaves = store.register_resident_params(&tape).map_err(failed)?;
    let mut h = tape.upload(x).map_err(autodiff)?;
    let target = tape.upload(y).map_err(autodiff)?;
    for (index, pair) in leaves.chunks(2).enumerate() {
        h = store
            .linear_forward_with_activation(&tape, &h, &pair[0], pair.get(1), activation(index))
            .map_err(failed)?;
    }
    let loss = tape.mse_loss(&h, &target).map_err(autodiff)?;
    let gradients = store.backward(&tape, &loss).map_err(autodiff)?;
    store
        .step_adam(
            &gradients,
            &AdamConfig {
                lr: 1e-3,
                ..Default::default()
            },
        )
        .map_err(failed)?;
    let value = loss.item().map_err(autodiff)?;
    drop((loss, gradients, leaves, h, target));
    Ok((value, tape))
}

/// `cpu:0` (1 GiB), the MLP's parameters and a batch of random data.
pub(super) type BenchMlp = (ComputeClient, Vec<Tensor<f32>>, Tensor<f32>, Tensor<f32>);

/// The bench MLP on `cpu:0`: its client, parameters, inputs and targets.
pub(super) fn bench_mlp() -> Result<BenchMlp, String> {
    let client = ComputeClient::open(Device::Cpu(0), DeviceOptions::with_memory_limit(1 << 30))
        .map_err(|e| format!("cannot open cpu:0: {e}"))?;
    let mut rng = SplitMix64::new(0x7A9F);
    let params = parameters(&mut rng)?;
    let x = tensor(&mut rng, &[BATCH, LAYERS[0]], 1.0)?;
    let y = tensor(&mut rng, &[BATCH, LAYERS[3]], 1.0)?;
    Ok((client, params, x, y))
}

pub(super) fn activation(index: usize) -> Activation {
    if index + 2 < LAYERS.len() {
        Activation::Relu
    } else {
        Activation::Identity
    }
}

/// The MLP's parameters (weight, bias per layer), uniform in ±1/√fan_in.
pub(super) fn parameters(rng: &mut SplitMix64) -> Result<Vec<Tensor<f32>>, String> {
    let mut params = Vec::new();
    for pair in LAYERS.windows(2) {
        let bound = 1.0 / (pair[0] as f32).sqrt();
        params.push(tensor(rng, &[pair[0], pair[1]], bound)?);
        params.push(tensor(rng, &[pair[1]], bound)?);
    }
    Ok(params)
}

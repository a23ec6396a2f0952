//! `cistern bench train-step`: one whole training step of an MLP
//! 784-1024-1024-10 (ReLU, ReLU, identity) at batch 256 with an MSE loss on
//! random data, through the parameter store: `chain-sgd` is
//! `train_step_device_chain` (a replayed graph) with its loss read;
//! `tape-adam` a tape forward, the store's `backward` and `step_adam`,
//! with the loss read. Both time the step up to and including the loss
//! read (its one host synchronisation).
//!
//! Not built: `kernel_ms_per_step` (a same-run replay of the step's
//! launches); the store does not expose the launches of its recorded step,
//! so it is printed as `null`.

use std::time::Instant;

use cistern_client::{ComputeClient, DeviceParamStore, Tape, Tensor};
use cistern_memory::SplitMix64;
use cistern_optim::{AdamConfig, SgdConfig};
use cistern_runtime::{Activation, Device, DeviceOptions};

use super::optim::{median, print_line};
use super::tape::{round, tensor};

const BATCH: usize = 256;
const LAYERS: [usize; 4] = [784, 1024, 1024, 10];
const WARMUP: usize = 3;
const SAMPLES: usize = 15;

/// Runs both paths, in turns, and prints one JSON line for each.
pub fn run() -> Result<(), String> {
    let client = ComputeClient::open(Device::Cpu(0), DeviceOptions::with_memory_limit(1 << 30))
        .map_err(|e| format!("cannot open cpu:0: {e}"))?;
    let mut rng = SplitMix64::new(0x7A9F);
    let params = parameters(&mut rng)?;
    let x = tensor(&mut rng, &[BATCH, LAYERS[0]], 1.0)?;
    let y = tensor(&mut rng, &[BATCH, LAYERS[3]], 1.0)?;
    let refs: Vec<&Tensor<f32>> = params.iter().collect();
    let tape = Tape::new(&client);
    let failed = |e: cistern_client::BackendError| format!("store: {e}");
    let mut chain = DeviceParamStore::new(&tape, &refs).map_err(failed)?;
    let mut taped = DeviceParamStore::new(&tape, &refs).map_err(failed)?;
    let (mut chain_s, mut tape_s) = (Vec::new(), Vec::new());
    let (mut chain_launches, mut tape_launches) = (0, 0);
    for sample in 0..WARMUP + SAMPLES {
        let (seconds, launches) = timed(&client, || chain_step(&client, &mut chain, &x, &y))?;
        let (tape_seconds, taped_launches) =
            timed(&client, || adam_step(&client, &mut taped, &x, &y))?;
        if sample >= WARMUP {
            chain_s.push(seconds);
            tape_s.push(tape_seconds);
            (chain_launches, tape_launches) = (launches, taped_launches);
        }
    }
    for (path, seconds, launches) in [
        ("chain-sgd", &mut chain_s, chain_launches),
        ("tape-adam", &mut tape_s, tape_launches),
    ] {
        print_line(serde_json::json!({
            "bench": "train_step",
            "path": path,
            "ms_per_step": round(median(seconds) * 1e3, 3),
            "kernel_ms_per_step": null,
            "launches": launches,
        }));
    }
    Ok(())
}

/// The seconds `step` takes and the kernels the device ran for it.
fn timed(
    client: &ComputeClient,
    step: impl FnOnce() -> Result<f32, String>,
) -> Result<(f64, u64), String> {
    let stats = || {
        client
            .server_stats()
            .map_err(|e| format!("server_stats: {e}"))
    };
    let before = stats()?.kernels_run;
    let start = Instant::now();
    let loss = step()?;
    let seconds = start.elapsed().as_secs_f64();
    if !loss.is_finite() {
        return Err(format!("the loss is {loss}"));
    }
    Ok((seconds, stats()?.kernels_run - before))
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

fn adam_step(
    client: &ComputeClient,
    store: &mut DeviceParamStore,
    x: &Tensor<f32>,
    y: &Tensor<f32>,
) -> Result<f32, String> {
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
    loss.item().map_err(autodiff)
}

fn activation(index: usize) -> Activation {
    if index + 2 < LAYERS.len() {
        Activation::Relu
    } else {
        Activation::Identity
    }
}

/// The MLP's parameters (weight, bias per layer), uniform in ±1/√fan_in.
fn parameters(rng: &mut SplitMix64) -> Result<Vec<Tensor<f32>>, String> {
    let mut params = Vec::new();
    for pair in LAYERS.windows(2) {
        let bound = 1.0 / (pair[0] as f32).sqrt();
        params.push(tensor(rng, &[pair[1], pair[0]], bound)?);
        params.push(tensor(rng, &[pair[1]], bound)?);
    }
    Ok(params)
}

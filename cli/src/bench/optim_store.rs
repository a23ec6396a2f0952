//! `cistern bench optim --through store`: the same fused step through
//! `DeviceParamStore` (about 64M parameters in 200 slots of varied sizes:
//! 100 linear layers' weights and biases) beside the raw `OptimizerStep`
//! command over buffers of the same size and the same segment table, in
//! the same run, samples alternating.
//!
//! Each store sample is one step of a real training loop: a tape, the
//! parameters registered, a forward through every layer, the store's
//! backward (all untimed, then synced), then the timed part: the store's
//! step and `wait_device`. Each raw sample is one command and a wait on
//! its token.

use std::time::Instant;

use cistern_client::{Buffer, ComputeClient, DeviceParamStore, Gradients, Tape, Tensor, Var};
use cistern_memory::SplitMix64;
use cistern_optim::OptimizerConfig;
use cistern_runtime::{Activation, Device, DeviceOptions, OptimizerStep, Segment};

use super::optim::{config_named, median, print_line};

const WARMUP: usize = 2;
const SAMPLES: usize = 15;
const LAYERS: usize = 100;

/// The layers' `(out, in)` sizes (their weights stored `[in, out]`):
/// inputs cycling through four widths, outputs varied, about `params`
/// parameters in all (weights and biases).
fn layer_shapes(params: u64) -> Vec<(usize, usize)> {
    let widths = [256usize, 512, 1024, 2048];
    let weights = [1usize, 3, 2, 4, 6, 5];
    let per_layer: u64 = params / LAYERS as u64;
    let unit: usize = weights.iter().sum();
    (0..LAYERS)
        .map(|layer| {
            let k = widths[layer % widths.len()];
            let share = per_layer as usize * weights[layer % weights.len()] * weights.len() / unit;
            ((share / (k + 1)).max(1), k)
        })
        .collect()
}

/// Runs the store benchmark and prints its two JSON lines.
pub fn run(optimizer: &str, params: u64) -> Result<(), String> {
    let config = config_named(optimizer)?;
    let shapes = layer_shapes(params);
    let mut rng = SplitMix64::new(0x5_70E);
    let mut tensors = Vec::with_capacity(2 * shapes.len());
    for &(n, k) in &shapes {
        tensors.push(tensor(&[k, n], rng.non_zero_f32s(n * k, 0.05))?);
        tensors.push(tensor(&[n], rng.non_zero_f32s(n, 0.05))?);
    }
    let numel: usize = tensors.iter().map(Tensor::len).sum();
    let bytes = numel as u64 * 4;
    let state = config.state_layout().len() as u64;
    // Store: params, staging, state, the tape's gradients; raw: params,
    // grads, state; with room for the pools' rounding.
    let limit = bytes * (5 + 2 * state) + (512 << 20);
    let client = ComputeClient::open(Device::Cpu(0), DeviceOptions::with_memory_limit(limit))
        .map_err(|e| format!("cannot open cpu:0: {e}"))?;
    let tape = Tape::new(&client);
    let refs: Vec<&Tensor<f32>> = tensors.iter().collect();
    let mut store = DeviceParamStore::new(&tape, &refs).map_err(|e| format!("store: {e}"))?;
    drop(tape);
    let inputs: Vec<Tensor<f32>> = shapes
        .iter()
        .map(|&(_, k)| tensor(&[1, k], rng.non_zero_f32s(k, 1.0)))
        .collect::<Result<_, _>>()?;
    let raw = RawStep::new(&client, &config, &tensors, &mut rng)?;

    let (mut store_samples, mut raw_samples) = (Vec::new(), Vec::new());
    for sample in 0..WARMUP + SAMPLES {
        let tape = Tape::new(&client);
        let gradients = forward_backward(&mut store, &tape, &inputs)?;
        client
            .sync(tape.stream())
            .map_err(|e| format!("backward: {e}"))?;
        store.wait_device().map_err(|e| format!("store: {e}"))?;
        let start = Instant::now();
        step(&mut store, &gradients, &config)?;
        store
            .wait_device()
            .map_err(|e| format!("store step: {e}"))?;
        let store_seconds = start.elapsed().as_secs_f64();
        let raw_seconds = raw.sample(&client, sample as u64 + 1)?;
        if sample >= WARMUP {
            store_samples.push(store_seconds);
            raw_samples.push(raw_seconds);
        }
    }
    let store_ms = median(&mut store_samples) * 1e3;
    let raw_ms = median(&mut raw_samples) * 1e3;
    let line = |through: &str, ms: f64| {
        serde_json::json!({
            "bench": "optim",
            "through": through,
            "optimizer": optimizer,
            "params": numel,
            "slots": tensors.len(),
            "ms_per_step": round(ms),
            "vs_raw": round(ms / raw_ms),
        })
    };
    print_line(line("raw", raw_ms));
    print_line(line("store", store_ms));
    Ok(())
}

/// The raw reference: the optimizer command over its own buffers.
struct RawStep {
    config: OptimizerConfig,
    segments: Vec<Segment>,
    params: Buffer,
    grads: Buffer,
    state: cistern_client::OptimizerState,
}

impl RawStep {
    fn new(
        client: &ComputeClient,
        config: &OptimizerConfig,
        tensors: &[Tensor<f32>],
        rng: &mut SplitMix64,
    ) -> Result<RawStep, String> {
        let mut segments = Vec::with_capacity(tensors.len());
        let mut offset = 0;
        for tensor in tensors {
            segments.push(Segment::new(offset, tensor.len()));
            offset += tensor.len();
        }
        let upload = |values: Vec<f32>| {
            client
                .upload_f32(&values)
                .map_err(|e| format!("upload: {e}"))
        };
        let params = upload(rng.non_zero_f32s(offset, 0.05))?;
        let grads = upload(rng.non_zero_f32s(offset, 0.01))?;
        let state = client
            .optimizer_state(config, offset as u64)
            .map_err(|e| format!("optimizer_state: {e}"))?;
        Ok(RawStep {
            config: config.clone(),
            segments,
            params,
            grads,
            state,
        })
    }

    /// One timed step `step`, waited on through its token.
    fn sample(&self, client: &ComputeClient, step: u64) -> Result<f64, String> {
        let command = OptimizerStep::new(
            self.config.clone(),
            step,
            self.segments.clone(),
            self.params.whole(),
            self.grads.whole(),
            self.state.bindings(),
        );
        let start = Instant::now();
        let token = client
            .optimizer_step(client.default_stream(), command)
            .map_err(|e| format!("optimizer_step: {e}"))?;
        token.wait().map_err(|e| format!("raw step: {e}"))?;
        Ok(start.elapsed().as_secs_f64())
    }
}

/// Registers the store on `tape`, runs every layer on its input, sums the
/// outputs and runs the store's backward.
fn forward_backward<'t>(
    store: &mut DeviceParamStore,
    tape: &'t Tape,
    inputs: &[Tensor<f32>],
) -> Result<Gradients<'t>, String> {
    let leaves = store
        .register_resident_params(tape)
        .map_err(|e| format!("register: {e}"))?;
    let mut total: Option<Var<'t>> = None;
    for (layer, input) in inputs.iter().enumerate() {
        let x = tape.upload(input).map_err(|e| format!("upload: {e}"))?;
        let (weight, bias) = (&leaves[2 * layer], &leaves[2 * layer + 1]);
        let out = store
            .linear_forward_with_activation(tape, &x, weight, Some(bias), Activation::Identity)
            .map_err(|e| format!("forward: {e}"))?;
        let sum = tape.sum(&out).map_err(|e| format!("sum: {e}"))?;
        total = Some(match total {
            None => sum,
            Some(total) => tape.add(&total, &sum).map_err(|e| format!("add: {e}"))?,
        });
    }
    let loss = total.ok_or("no layers")?;
    store
        .backward(tape, &loss)
        .map_err(|e| format!("backward: {e}"))
}

/// The store's step method for `config`'s family.
fn step(
    store: &mut DeviceParamStore,
    gradients: &Gradients<'_>,
    config: &OptimizerConfig,
) -> Result<(), String> {
    let stepped = match config {
        OptimizerConfig::Sgd(config) => store.step(gradients, config),
        OptimizerConfig::Adam(config) => store.step_adam(gradients, config),
        OptimizerConfig::AdamW(config) => store.step_adamw(gradients, config),
        OptimizerConfig::RmsProp(config) => store.step_rmsprop(gradients, config),
        OptimizerConfig::Adagrad(config) => store.step_adagrad(gradients, config),
        OptimizerConfig::Lamb(config) => store.step_lamb(gradients, config),
    };
    stepped.map_err(|e| format!("store step: {e}"))
}

fn tensor(shape: &[usize], data: Vec<f32>) -> Result<Tensor<f32>, String> {
    Tensor::new(shape, data).map_err(|e| format!("tensor: {e}"))
}

fn round(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

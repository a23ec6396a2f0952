//! `cistern bench tape`: one training step's forward + backward through the
//! tape, against the same step's kernels replayed back to back.
//!
//! The step: an MLP 784-1024-1024-10 (ReLU, ReLU, identity) at batch 256
//! with an MSE loss, on random data. Its parameters stay on the device
//! (resident leaves, uploaded once); each step makes a tape, uploads the
//! batch, records forward and backward and reads the loss (its one host
//! synchronisation). The reference replays, in the same run, exactly the
//! launches that step sent (the tape's log, checked against the server's
//! launch count) as one batch on the same stream, while the step's tape
//! still holds their buffers. Step and replay samples alternate so both
//! medians see the same load.

use std::time::Instant;

use cistern_client::{Buffer, ComputeClient, Tape, Tensor};
use cistern_memory::SplitMix64;
use cistern_runtime::{Activation, Device, DeviceOptions};

use super::optim::{median, print_line};

const BATCH: usize = 256;
const LAYERS: [usize; 4] = [784, 1024, 1024, 10];
const WARMUP: usize = 3;
const SAMPLES: usize = 15;
/// The step's target: at most this multiple of its kernels' own time.
const TARGET: f64 = 1.10;

/// A layer's parameters on the device: weight (out×in) and bias.
struct Layer {
    weight: Buffer,
    bias: Buffer,
    inputs: usize,
    outputs: usize,
}

/// What one measured step reports.
struct Step {
    seconds: f64,
    launches: u64,
    waits: u64,
}

/// Runs the benchmark and prints its JSON line.
pub fn run() -> Result<(), String> {
    let client = ComputeClient::open(Device::Cpu(0), DeviceOptions::with_memory_limit(1 << 30))
        .map_err(|e| format!("cannot open cpu:0: {e}"))?;
    let mut rng = SplitMix64::new(0x7A9E);
    let layers = parameters(&client, &mut rng)?;
    let x = tensor(&mut rng, &[BATCH, LAYERS[0]], 1.0)?;
    let y = tensor(&mut rng, &[BATCH, LAYERS[3]], 1.0)?;
    for _ in 0..WARMUP {
        let tape = Tape::new(&client);
        measure_step(&tape, &layers, &x, &y)?;
        replay(&tape)?;
    }
    let (mut steps, mut replays) = (Vec::new(), Vec::new());
    let mut last = None;
    for _ in 0..SAMPLES {
        let tape = Tape::new(&client);
        let step = measure_step(&tape, &layers, &x, &y)?;
        replays.push(replay(&tape)?);
        steps.push(step.seconds);
        last = Some(step);
    }
    let last = last.ok_or("no samples")?;
    let (ms, kernel_ms) = (median(&mut steps) * 1e3, median(&mut replays) * 1e3);
    let ratio = ms / kernel_ms;
    print_line(serde_json::json!({
        "bench": "tape",
        "ms_per_step": round(ms, 3),
        "kernel_ms_per_step": round(kernel_ms, 3),
        "launches": last.launches,
        "syncs": last.waits,
        "ratio": round(ratio, 3),
        "target": TARGET,
    }));
    Ok(())
}

/// One step on `tape`: timed from the tape's first upload to the loss read.
fn measure_step(
    tape: &Tape,
    layers: &[Layer],
    x: &Tensor<f32>,
    y: &Tensor<f32>,
) -> Result<Step, String> {
    let client = tape.client();
    let stats = || {
        client
            .server_stats()
            .map_err(|e| format!("server_stats: {e}"))
    };
    let before = stats()?;
    let waits = client.stream_waits();
    let start = Instant::now();
    let loss = forward_backward(tape, layers, x, y)?;
    let seconds = start.elapsed().as_secs_f64();
    let waits = client.stream_waits() - waits;
    let launches = stats()?.launches - before.launches;
    let logged = tape.launches().len() as u64;
    if launches != logged || !loss.is_finite() {
        return Err(format!(
            "the server ran {launches} launches, the tape logged {logged}; loss {loss}"
        ));
    }
    Ok(Step {
        seconds,
        launches,
        waits,
    })
}

fn forward_backward(
    tape: &Tape,
    layers: &[Layer],
    x: &Tensor<f32>,
    y: &Tensor<f32>,
) -> Result<f32, String> {
    let failed = |e: cistern_client::AutodiffError| format!("tape: {e}");
    let mut h = tape.upload(x).map_err(failed)?;
    let target = tape.upload(y).map_err(failed)?;
    for (index, layer) in layers.iter().enumerate() {
        let weight = tape.var_resident(&layer.weight, &[layer.outputs, layer.inputs]);
        let bias = tape.var_resident(&layer.bias, &[layer.outputs]);
        let (weight, bias) = (weight.map_err(failed)?, bias.map_err(failed)?);
        let activation = if index + 1 < layers.len() {
            Activation::Relu
        } else {
            Activation::Identity
        };
        h = tape
            .linear(&h, &weight, Some(&bias), activation)
            .map_err(failed)?;
    }
    let loss = tape.mse_loss(&h, &target).map_err(failed)?;
    let gradients = tape.backward(&loss).map_err(failed)?;
    let value = loss.item().map_err(failed)?;
    drop(gradients);
    Ok(value)
}

/// The seconds one replay of `tape`'s launches takes, as one batch on its stream.
fn replay(tape: &Tape) -> Result<f64, String> {
    let launches = tape.launches();
    let start = Instant::now();
    let token = tape
        .client()
        .launch_batch(tape.stream(), launches)
        .map_err(|e| format!("replay: {e}"))?;
    token.wait().map_err(|e| format!("replay: {e}"))?;
    Ok(start.elapsed().as_secs_f64())
}

/// The MLP's parameters, uniform in ±1/√fan_in (PyTorch's default range).
fn parameters(client: &ComputeClient, rng: &mut SplitMix64) -> Result<Vec<Layer>, String> {
    LAYERS
        .windows(2)
        .map(|pair| {
            let (inputs, outputs) = (pair[0], pair[1]);
            let bound = 1.0 / (inputs as f32).sqrt();
            let upload = |t: Tensor<f32>| {
                client
                    .upload_f32(t.data())
                    .map_err(|e| format!("upload: {e}"))
            };
            Ok(Layer {
                weight: upload(tensor(rng, &[outputs, inputs], bound)?)?,
                bias: upload(tensor(rng, &[outputs], bound)?)?,
                inputs,
                outputs,
            })
        })
        .collect()
}

pub(super) fn tensor(
    rng: &mut SplitMix64,
    shape: &[usize],
    bound: f32,
) -> Result<Tensor<f32>, String> {
    let count = shape.iter().product();
    let data = (0..count)
        .map(|_| bound * (2.0 * rng.unit_f32() - 1.0))
        .collect();
    Tensor::new(shape, data).map_err(|e| format!("tensor: {e}"))
}

pub(super) fn round(value: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

//! `cistern bench cross-entropy`: the fused cross-entropy forward and
//! backward (PyTorch's `F.cross_entropy` + its backward) of a 256×1000
//! batch on the CPU, as one launch batch waited for, and the same two
//! kernels called directly (the kernels' own time, without the server).
//!
//! The reference is PyTorch's: `benches/cross_entropy_pytorch.py` runs
//! this and `F.cross_entropy(x, t).backward()` in turns (the issue's
//! target: Cistern's median at most 1.0× PyTorch's).

use std::time::Instant;

use cistern_client::ComputeClient;
use cistern_kernels::{ClassLossSpec, class_loss, class_loss_backward};
use cistern_memory::SplitMix64;
use cistern_runtime::{Device, DeviceOptions, KernelLaunch};

use super::optim::{median, print_line};

const ROWS: usize = 256;
const CLASSES: usize = 1000;
const WARMUP: usize = 5;

/// Runs the benchmark with `samples` samples and prints its JSON line.
pub fn run(samples: usize) -> Result<(), String> {
    let samples = samples.max(1);
    let client = ComputeClient::open(Device::Cpu(0), DeviceOptions::with_memory_limit(1 << 28))
        .map_err(|e| format!("cannot open cpu:0: {e}"))?;
    let mut rng = SplitMix64::new(0xCE);
    let logits: Vec<f32> = rng
        .symmetric_f32s(ROWS * CLASSES)
        .iter()
        .map(|v| 4.0 * v)
        .collect();
    let targets: Vec<i32> = (0..ROWS).map(|r| ((r * 7919) % CLASSES) as i32).collect();
    let spec = ClassLossSpec::cross_entropy(ROWS, CLASSES);
    let failed = |e: cistern_runtime::ServerError| format!("cross-entropy: {e}");
    let target_bytes: Vec<u8> = targets.iter().flat_map(|t| t.to_ne_bytes()).collect();
    let x = client.upload_f32(&logits).map_err(failed)?;
    let t = client.upload(&target_bytes).map_err(failed)?;
    let one = client.upload_f32(&[1.0]).map_err(failed)?;
    let (loss, grad) = (
        client.upload_f32(&[0.0]).map_err(failed)?,
        client
            .upload_f32(&vec![0.0; ROWS * CLASSES])
            .map_err(failed)?,
    );
    let launches = vec![
        KernelLaunch::class_loss(spec, x.whole(), t.whole(), None, loss.whole()),
        KernelLaunch::class_loss_backward(
            spec,
            x.whole(),
            t.whole(),
            None,
            one.whole(),
            grad.whole(),
        ),
    ];
    let stream = client.default_stream();
    let mut served = Vec::with_capacity(samples);
    let mut direct = Vec::with_capacity(samples);
    let (mut out, mut g) = ([0.0f32], vec![0.0f32; ROWS * CLASSES]);
    for sample in 0..WARMUP + samples {
        let begun = Instant::now();
        let token = client
            .launch_batch(stream, launches.clone())
            .map_err(failed)?;
        token.wait().map_err(failed)?;
        let through_server = begun.elapsed().as_secs_f64();
        let begun = Instant::now();
        class_loss(&spec, &logits, &targets, None, &mut out).map_err(|e| e.to_string())?;
        class_loss_backward(&spec, &logits, &targets, None, &[1.0], &mut g)
            .map_err(|e| e.to_string())?;
        let kernels = begun.elapsed().as_secs_f64();
        if sample >= WARMUP {
            served.push(through_server);
            direct.push(kernels);
        }
    }
    let value = client.download_f32(&loss).map_err(failed)?;
    if !value.first().is_some_and(|v| v.is_finite()) || !out[0].is_finite() {
        return Err(format!("cross-entropy: a non-finite loss {value:?}"));
    }
    print_line(serde_json::json!({
        "bench": "cross_entropy",
        "rows": ROWS,
        "classes": CLASSES,
        "samples": samples,
        "ms": round(median(&mut served) * 1e3),
        "kernel_ms": round(median(&mut direct) * 1e3),
        "loss": out[0],
    }));
    Ok(())
}

fn round(value: f64) -> f64 {
    (value * 1e4).round() / 1e4
}

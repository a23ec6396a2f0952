//! `cistern bench attention`: the ViT's attention (batch 64, 9 tokens, 4
//! heads of 16), forward and backward on the tape, fused
//! (`multi_head_attention`, heads read in place) against the same
//! attention composed of the tape's operations (heads split and merged
//! by permutes around `scaled_dot_product_attention`) in the same run.
//! The inputs stay on the device (resident leaves, uploaded once); a
//! sample is the tape's forward and backward and one gradient read back
//! (its stream's one synchronisation, after every launch). Samples
//! alternate, so both medians see the same load; each sample counts the
//! kernels the server ran, so neither can skip work.

use std::time::Instant;

use cistern_client::{AutodiffError, Buffer, ComputeClient, Tape, Var};
use cistern_memory::SplitMix64;
use cistern_runtime::{Device, DeviceOptions};

use super::optim::{median, print_line};

const BATCH: usize = 64;
const TOKENS: usize = 9;
const HEADS: usize = 4;
const HEAD_DIM: usize = 16;
const WARMUP: usize = 5;
const SAMPLES: usize = 41;

/// Runs the benchmark and prints its JSON line.
pub fn run() -> Result<(), String> {
    let client = ComputeClient::open(Device::Cpu(0), DeviceOptions::with_memory_limit(1 << 28))
        .map_err(|e| format!("cannot open cpu:0: {e}"))?;
    let mut rng = SplitMix64::new(0xA77E);
    let inputs = (0..4)
        .map(|_| {
            let data: Vec<f32> = (0..BATCH * TOKENS * HEADS * HEAD_DIM)
                .map(|_| rng.uniform(-1.0, 1.0) as f32)
                .collect();
            client.upload_f32(&data).map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (mut fused, mut composed) = (Vec::new(), Vec::new());
    let (mut fused_kernels, mut composed_kernels) = (0, 0);
    for sample in 0..WARMUP + SAMPLES {
        let (seconds, kernels) = measure(&client, &inputs, true)?;
        let (reference, reference_kernels) = measure(&client, &inputs, false)?;
        if sample >= WARMUP {
            fused.push(seconds);
            composed.push(reference);
            (fused_kernels, composed_kernels) = (kernels, reference_kernels);
        }
    }
    let (fused, composed) = (median(&mut fused), median(&mut composed));
    print_line(serde_json::json!({
        "bench": "attention",
        "batch": BATCH,
        "tokens": TOKENS,
        "heads": HEADS,
        "head_dim": HEAD_DIM,
        "fused_us": (fused * 1e7).round() / 10.0,
        "composed_us": (composed * 1e7).round() / 10.0,
        "fused_vs_composed": (fused / composed * 1000.0).round() / 1000.0,
        "fused_kernels": fused_kernels,
        "composed_kernels": composed_kernels,
        "samples": SAMPLES,
    }));
    Ok(())
}

/// One forward and backward, its seconds (to the gradients read back) and
/// the kernels the server ran for it.
fn measure(client: &ComputeClient, inputs: &[Buffer], fused: bool) -> Result<(f64, u64), String> {
    let kernels = || {
        client
            .server_stats()
            .map(|s| s.kernels_run)
            .map_err(|e| e.to_string())
    };
    let before = kernels()?;
    let start = Instant::now();
    let tape = Tape::new(client);
    step(&tape, inputs, fused).map_err(|e| e.to_string())?;
    let seconds = start.elapsed().as_secs_f64();
    Ok((seconds, kernels()? - before))
}

fn step(tape: &Tape, inputs: &[Buffer], fused: bool) -> Result<(), AutodiffError> {
    let shape = [BATCH, TOKENS, HEADS * HEAD_DIM];
    let vars = inputs[..3]
        .iter()
        .map(|x| tape.var_resident(x, &shape))
        .collect::<Result<Vec<_>, _>>()?;
    let y = if fused {
        tape.multi_head_attention(&vars[0], &vars[1], &vars[2], HEADS, false)?
    } else {
        composed(tape, &vars)?
    };
    let w = tape.var_resident(&inputs[3], &shape)?;
    let loss = tape.sum(&tape.mul(&y, &w)?)?;
    let gradients = tape.backward(&loss)?;
    // The read waits for every launch before it, the last gradients' too.
    gradients.to_host(&vars[0])?;
    Ok(())
}

/// The heads split by permutes, attended, and merged back.
fn composed<'t>(tape: &'t Tape, vars: &[Var<'t>]) -> Result<Var<'t>, AutodiffError> {
    let split = |x: &Var<'t>| {
        let x = tape.reshape(x, &[BATCH as isize, TOKENS as isize, HEADS as isize, -1])?;
        tape.permute(&x, &[0, 2, 1, 3])
    };
    let (q, k, v) = (split(&vars[0])?, split(&vars[1])?, split(&vars[2])?);
    let y = tape.scaled_dot_product_attention(&q, &k, &v, None, false)?;
    let y = tape.permute(&y, &[0, 2, 1, 3])?;
    tape.reshape(&y, &[BATCH as isize, TOKENS as isize, -1])
}

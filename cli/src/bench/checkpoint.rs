//! `cistern bench checkpoint`: two lines.
//!
//! `save`: a checkpoint of an Adam store of about 16.5M parameters
//! (`CheckpointDir::save_store`: its download streamed into the file,
//! `fsync`, rename and the directory's `fsync`)
//! against its reference, `std::fs::write` of as many bytes plus an
//! `fsync` of the file, in the same run, samples alternating.
//!
//! `loop`: the bench MLP's Adam step (`bench train-step`'s `tape-adam`)
//! run `ROUND` steps at a time, with a checkpoint every 100 steps and
//! without, rounds alternating: the steps per second it loses.

use std::path::{Path, PathBuf};
use std::time::Instant;

use cistern_client::{CheckpointDir, ComputeClient, DeviceParamStore, Gradients, Tape, Tensor};
use cistern_memory::SplitMix64;
use cistern_optim::AdamConfig;
use cistern_runtime::{Device, DeviceOptions};

use super::optim::{median, print_line};
use super::tape::tensor;
use super::train_step::{BATCH, LAYERS, adam_step, bench_mlp};

const SAVE_SAMPLES: usize = 7;
const ROUNDS: usize = 3;
const ROUND: u64 = 300;
const EVERY: u64 = 100;

/// Runs both measurements in `dir` (a fresh folder under the system's
/// temporary one by default) and prints their JSON lines.
pub fn run(params: usize, dir: Option<&Path>) -> Result<(), String> {
    let dir = match dir {
        Some(dir) => dir.to_path_buf(),
        None => {
            std::env::temp_dir().join(format!("cistern-bench-checkpoint-{}", std::process::id()))
        }
    };
    let result = save(params, &dir).and_then(|()| training_loop(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn failed(what: &'static str) -> impl Fn(cistern_client::BackendError) -> String {
    move |error| format!("{what}: {error}")
}

/// The `save` line.
fn save(params: usize, dir: &Path) -> Result<(), String> {
    let client = ComputeClient::open(Device::Cpu(0), DeviceOptions::default())
        .map_err(|e| format!("cannot open cpu:0: {e}"))?;
    let store = stepped_store(&client, params)?;
    let checkpoints = CheckpointDir::create(dir.join("save"), 1).map_err(|e| e.to_string())?;
    let reference = dir.join("reference.bin");
    let run = serde_json::json!({"bench": "checkpoint"});
    let (mut saves, mut writes, mut bytes) = (Vec::new(), Vec::new(), 0u64);
    for sample in 0..=SAVE_SAMPLES {
        let begun = Instant::now();
        let path = checkpoints
            .save_store(sample as u64, &store, &run)
            .map_err(|e| e.to_string())?;
        let saved = begun.elapsed().as_secs_f64();
        bytes = std::fs::metadata(&path).map_err(|e| e.to_string())?.len();
        let written = write_and_sync(&reference, bytes as usize)?;
        if sample > 0 {
            saves.push(saved * 1e3);
            writes.push(written * 1e3);
        }
    }
    let (save_ms, write_ms) = (median(&mut saves), median(&mut writes));
    print_line(serde_json::json!({
        "bench": "checkpoint",
        "measure": "save",
        "params": params,
        "bytes": bytes,
        "saves": SAVE_SAMPLES,
        "save_ms": round(save_ms),
        "write_fsync_ms": round(write_ms),
        "vs_write": round(save_ms / write_ms),
        "target": 1.5,
    }));
    Ok(())
}

/// An Adam store of about `params` parameters in four layers, one step
/// taken from staged gradients (so its state buffers are filled).
fn stepped_store(client: &ComputeClient, params: usize) -> Result<DeviceParamStore, String> {
    let mut rng = SplitMix64::new(0xC4EC);
    let width = 2048;
    let rows = (params / 4 / (width + 1)).max(1);
    let mut tensors = Vec::new();
    for _ in 0..4 {
        tensors.push(tensor(&mut rng, &[rows, width], 0.05)?);
        tensors.push(tensor(&mut rng, &[rows], 0.05)?);
    }
    let refs: Vec<&Tensor<f32>> = tensors.iter().collect();
    let mut store = DeviceParamStore::new(&Tape::new(client), &refs).map_err(failed("store"))?;
    let tape = Tape::new(client);
    let leaves = store
        .register_resident_params(&tape)
        .map_err(failed("register"))?;
    let gradients = leaves
        .iter()
        .map(|leaf| leaf.var())
        .zip(tensors.iter().cloned());
    let gradients =
        Gradients::from_host(&tape, gradients).map_err(|e| format!("gradients: {e}"))?;
    store
        .step_adam(&gradients, &AdamConfig::default())
        .map_err(failed("step"))?;
    drop((gradients, leaves));
    Ok(store)
}

/// The reference: `bytes` bytes written with `std::fs::write`, then the
/// file's `fsync`. Returns the seconds taken.
fn write_and_sync(path: &PathBuf, bytes: usize) -> Result<f64, String> {
    let data = vec![0x5Au8; bytes];
    let begun = Instant::now();
    std::fs::write(path, &data).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::File::open(path)
        .and_then(|file| file.sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(begun.elapsed().as_secs_f64())
}

/// The `loop` line.
fn training_loop(dir: &Path) -> Result<(), String> {
    let (client, params, x, y) = bench_mlp()?;
    let refs: Vec<&Tensor<f32>> = params.iter().collect();
    let mut store = DeviceParamStore::new(&Tape::new(&client), &refs).map_err(failed("store"))?;
    let checkpoints = CheckpointDir::create(dir.join("loop"), 2).map_err(|e| e.to_string())?;
    let run = serde_json::json!({"bench": "checkpoint"});
    // One warm-up round, then rounds without and with checkpoints in turns.
    let (mut plain, mut checkpointed) = (Vec::new(), Vec::new());
    let (mut steps, mut saved) = (0u64, 0u64);
    for round in 0..=2 * ROUNDS {
        let with = round % 2 == 0;
        let begun = Instant::now();
        for _ in 0..ROUND {
            adam_step(&client, &mut store, &x, &y)?;
            steps += 1;
            if with && steps % EVERY == 0 {
                checkpoints
                    .save_store(steps, &store, &run)
                    .map_err(|e| e.to_string())?;
                saved += 1;
            }
        }
        let rate = ROUND as f64 / begun.elapsed().as_secs_f64();
        match (round, with) {
            (0, _) => {}
            (_, true) => checkpointed.push(rate),
            (_, false) => plain.push(rate),
        }
    }
    let (plain, checkpointed) = (median(&mut plain), median(&mut checkpointed));
    print_line(serde_json::json!({
        "bench": "checkpoint",
        "measure": "loop",
        "model": LAYERS,
        "batch": BATCH,
        "every": EVERY,
        "steps": steps,
        "checkpoints": saved,
        "plain_steps_per_s": round(plain),
        "checkpointed_steps_per_s": round(checkpointed),
        "loss": round(1.0 - checkpointed / plain),
        "target": 0.05,
    }));
    Ok(())
}

fn round(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

//! `cistern bench allreduce` and `cistern bench data-parallel`: the
//! replica group's reduction against its engine called directly, and a
//! group step against one replica's step (weak scaling).
//!
//! `allreduce` sums buffers of 1 KiB to 256 MiB the way the group does
//! (`Collective::all_reduce_sum`) and, on the same buffers, the way the
//! engine does alone: `MPI_Allreduce` under MPI, a bare summation loop in
//! one process. `data-parallel` times the bench MLP (784-1024-1024-10,
//! batch 256 per replica, Adam, one core per replica) for one replica
//! alone, for replicas stepping at once but apart (no reduction: what the
//! machine allows, `machine_efficiency`), then for a group of two, each
//! sample a whole step up to its device's idle.

#[cfg(feature = "mpi")]
use std::time::Duration;
use std::time::Instant;

use cistern_client::{BackendError, ComputeClient, DeviceParamStore, Tape, Tensor};
use cistern_memory::SplitMix64;
use cistern_optim::{AdamConfig, OptimizerConfig};
use cistern_parallel::{Collective, InProcess, Replica, ReplicaGroup, Shard};
use cistern_runtime::{Device, DeviceOptions};

use super::optim::{median, print_line};
use super::tape::{round, tensor};
use super::train_step::{BATCH, LAYERS, activation, parameters};

/// The engines the benchmarks run over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineName {
    /// The devices of one process.
    InProcess,
    /// One process per rank under mpirun (a build with `--features mpi`).
    Mpi,
}

/// Buffer sizes, in bytes: 1 KiB to 256 MiB by fours.
const SIZES: [usize; 10] = [
    1 << 10,
    1 << 12,
    1 << 14,
    1 << 16,
    1 << 18,
    1 << 20,
    1 << 22,
    1 << 24,
    1 << 26,
    1 << 28,
];

/// Seconds each side of a size is sampled for, at least.
const SAMPLE_SECONDS: f64 = 0.25;

/// Runs `bench allreduce` over `engine`, for the sizes up to `max_bytes`.
pub fn allreduce(engine: EngineName, max_bytes: usize) -> Result<(), String> {
    let sizes: Vec<usize> = SIZES.into_iter().filter(|&b| b <= max_bytes).collect();
    if sizes.is_empty() {
        return Err(format!(
            "--max-bytes {max_bytes}: the smallest size is 1024"
        ));
    }
    match engine {
        EngineName::InProcess => allreduce_in_process(&sizes),
        EngineName::Mpi => allreduce_mpi(&sizes),
    }
}

/// Runs `bench data-parallel` over `engine`.
pub fn data_parallel(engine: EngineName) -> Result<(), String> {
    match engine {
        EngineName::InProcess => data_parallel_in_process(),
        EngineName::Mpi => data_parallel_mpi(),
    }
}

/// Two buffers summed by `InProcess` against a bare loop adding one into
/// the other.
fn allreduce_in_process(sizes: &[usize]) -> Result<(), String> {
    let mut engine = InProcess;
    for &bytes in sizes {
        let floats = bytes / 4;
        let mut buffers = vec![vec![1.0f32; floats], vec![2.0f32; floats]];
        let reps = repetitions(floats);
        let (mut group, mut direct) = (Vec::new(), Vec::new());
        let mut reductions = 0u64;
        for _ in 0..samples(floats) {
            let started = Instant::now();
            for _ in 0..reps {
                engine
                    .all_reduce_sum(&mut buffers)
                    .map_err(|e| e.to_string())?;
                reductions += 1;
            }
            group.push(started.elapsed().as_secs_f64() / reps as f64);
            let started = Instant::now();
            for _ in 0..reps {
                let (first, rest) = buffers.split_at_mut(1);
                for (total, value) in first[0].iter_mut().zip(&rest[0]) {
                    *total += value;
                }
            }
            direct.push(started.elapsed().as_secs_f64() / reps as f64);
        }
        print_allreduce("in-process", 1, bytes, &mut group, &mut direct, reductions);
    }
    Ok(())
}

fn print_allreduce(
    engine: &str,
    ranks: usize,
    bytes: usize,
    group: &mut [f64],
    direct: &mut [f64],
    reductions: u64,
) {
    let (group, direct) = (median(group), median(direct));
    print_line(serde_json::json!({
        "bench": "allreduce",
        "engine": engine,
        "ranks": ranks,
        "bytes": bytes,
        "group_us": round(group * 1e6, 2),
        "direct_us": round(direct * 1e6, 2),
        "vs_direct": round(group / direct, 3),
        "gb_per_s": round(bytes as f64 / group / 1e9, 3),
        "reductions": reductions,
    }));
}

/// Reductions per sample: enough that a sample spans about a millisecond.
fn repetitions(floats: usize) -> usize {
    (250_000 / floats.max(1)).clamp(1, 1_000)
}

/// Samples per side: about [`SAMPLE_SECONDS`] of them, at least 5.
fn samples(floats: usize) -> usize {
    // About 1 GB/s for the slowest engine: a generous guess.
    let per_sample = (floats as f64 * 4.0 / 1e9).max(1e-3);
    ((SAMPLE_SECONDS / per_sample) as usize).clamp(5, 200)
}

/// One replica's forward and backward of the bench MLP on its shard.
fn work(x: &Tensor<f32>, y: &Tensor<f32>, replica: &mut Replica) -> Result<Shard, BackendError> {
    let client = replica.client().clone();
    let loss = forward_backward(&client, replica.store_mut(), x, y)?;
    Ok(Shard {
        loss,
        examples: BATCH,
    })
}

fn forward_backward(
    client: &ComputeClient,
    store: &mut DeviceParamStore,
    x: &Tensor<f32>,
    y: &Tensor<f32>,
) -> Result<f32, BackendError> {
    let tape = Tape::new(client);
    let leaves = store.register_resident_params(&tape)?;
    let mut h = tape.upload(x).map_err(BackendError::from)?;
    let target = tape.upload(y).map_err(BackendError::from)?;
    for (index, pair) in leaves.chunks(2).enumerate() {
        h = store.linear_forward_with_activation(
            &tape,
            &h,
            &pair[0],
            pair.get(1),
            activation(index),
        )?;
    }
    let loss = tape.mse_loss(&h, &target).map_err(BackendError::from)?;
    store.backward(&tape, &loss).map_err(BackendError::from)?;
    loss.item().map_err(BackendError::from)
}

fn adam() -> OptimizerConfig {
    OptimizerConfig::Adam(AdamConfig {
        lr: 1e-4,
        ..Default::default()
    })
}

/// A CPU device with a pool of one thread.
fn one_core(ordinal: usize) -> Result<ComputeClient, String> {
    let options = DeviceOptions::with_memory_limit(1 << 30).with_cpu_threads(1);
    ComputeClient::open(Device::Cpu(ordinal), options)
        .map_err(|e| format!("cannot open cpu:{ordinal}: {e}"))
}

/// The bench MLP's data for one replica.
fn batch(seed: u64) -> Result<(Tensor<f32>, Tensor<f32>), String> {
    let mut rng = SplitMix64::new(seed);
    Ok((
        tensor(&mut rng, &[BATCH, LAYERS[0]], 1.0)?,
        tensor(&mut rng, &[BATCH, LAYERS[3]], 1.0)?,
    ))
}

const WARMUP: usize = 3;
const STEPS: usize = 20;

/// A lone store's step on one core: forward, backward, the fused step.
fn lone_step_seconds(client: &ComputeClient, params: &[Tensor<f32>]) -> Result<Vec<f64>, String> {
    let (x, y) = batch(1)?;
    let refs: Vec<&Tensor<f32>> = params.iter().collect();
    let failed = |e: BackendError| format!("one replica: {e}");
    let mut store = DeviceParamStore::new(&Tape::new(client), &refs).map_err(failed)?;
    let mut seconds = Vec::new();
    for step in 0..WARMUP + STEPS {
        let started = Instant::now();
        forward_backward(client, &mut store, &x, &y).map_err(failed)?;
        store.step_staged(&adam()).map_err(failed)?;
        store.wait_device().map_err(failed)?;
        if step >= WARMUP {
            seconds.push(started.elapsed().as_secs_f64());
        }
    }
    Ok(seconds)
}

/// A group's steps, each replica on a batch of its own.
fn group_step_seconds(group: &mut ReplicaGroup) -> Result<(Vec<f64>, u64), String> {
    let (x, y) = batch(1)?;
    let mut seconds = Vec::new();
    for step in 0..WARMUP + STEPS {
        let started = Instant::now();
        group
            .step(&adam(), |replica| work(&x, &y, replica))
            .map_err(|e| format!("group: {e}"))?;
        for replica in group.replicas() {
            replica
                .store()
                .wait_device()
                .map_err(|e| format!("group: {e}"))?;
        }
        if step >= WARMUP {
            seconds.push(started.elapsed().as_secs_f64());
        }
    }
    Ok((seconds, group.steps()))
}

/// One line: the step of one replica alone, of replicas stepping at once
/// apart (what the machine allows), and of the group.
fn print_scaling(engine: &str, ranks: usize, samples: [&mut Vec<f64>; 3], steps: u64) {
    let [one, concurrent, many] = samples.map(|samples| median(samples));
    print_line(serde_json::json!({
        "bench": "data_parallel",
        "engine": engine,
        "replicas": ranks,
        "batch_per_replica": BATCH,
        "one_replica_ms": round(one * 1e3, 3),
        "apart_at_once_ms": round(concurrent * 1e3, 3),
        "group_ms": round(many * 1e3, 3),
        "efficiency": round(one / many, 3),
        "machine_efficiency": round(one / concurrent, 3),
        "vs_apart": round(concurrent / many, 3),
        "group_steps": steps,
    }));
}

fn data_parallel_in_process() -> Result<(), String> {
    let params = parameters(&mut SplitMix64::new(0x7A9F))?;
    let mut one = lone_step_seconds(&one_core(0)?, &params)?;
    // The machine's own limit: two replicas stepping at once, apart.
    let (a, b) = (one_core(3)?, one_core(4)?);
    let concurrent = std::thread::scope(|scope| {
        let params = &params;
        let other = scope.spawn(|| lone_step_seconds(&b, params));
        let mine = lone_step_seconds(&a, params);
        let _ = other.join();
        mine
    });
    let mut concurrent = concurrent?;
    let clients = vec![one_core(1)?, one_core(2)?];
    let mut group = ReplicaGroup::new(Box::new(InProcess), clients, &params)
        .map_err(|e| format!("group: {e}"))?;
    let (mut many, steps) = group_step_seconds(&mut group)?;
    print_scaling(
        "in-process",
        2,
        [&mut one, &mut concurrent, &mut many],
        steps,
    );
    Ok(())
}

#[cfg(feature = "mpi")]
fn mpi_engine() -> Result<cistern_parallel::mpi::Mpi, String> {
    cistern_parallel::mpi::Mpi::with_timeout(Duration::from_secs(120))
        .map_err(|e| format!("--engine mpi: {e}"))
}

#[cfg(feature = "mpi")]
fn allreduce_mpi(sizes: &[usize]) -> Result<(), String> {
    let mut engine = mpi_engine()?;
    let (rank, ranks) = (engine.rank(), engine.size());
    for &bytes in sizes {
        let floats = bytes / 4;
        let mut buffers = vec![vec![1.0f32; floats]];
        let send = vec![1.0f32; floats];
        let mut receive = vec![0.0f32; floats];
        let reps = repetitions(floats);
        let (mut group, mut direct) = (Vec::new(), Vec::new());
        let mut reductions = 0u64;
        for _ in 0..samples(floats) {
            engine.barrier();
            let started = Instant::now();
            for _ in 0..reps {
                buffers[0].fill(1.0);
                engine
                    .all_reduce_sum(&mut buffers)
                    .map_err(|e| e.to_string())?;
                reductions += 1;
            }
            group.push(started.elapsed().as_secs_f64() / reps as f64);
            engine.barrier();
            let started = Instant::now();
            for _ in 0..reps {
                receive.fill(1.0);
                engine.raw_all_reduce_sum(&send, &mut receive);
            }
            direct.push(started.elapsed().as_secs_f64() / reps as f64);
        }
        if buffers[0].first() != Some(&(ranks as f32)) {
            return Err(format!("the group's sum is {:?}", buffers[0].first()));
        }
        if rank == 0 {
            print_allreduce("mpi", ranks, bytes, &mut group, &mut direct, reductions);
        }
    }
    Ok(())
}

#[cfg(feature = "mpi")]
fn data_parallel_mpi() -> Result<(), String> {
    let mut engine = mpi_engine()?;
    let (rank, ranks) = (engine.rank(), engine.size());
    let params = parameters(&mut SplitMix64::new(0x7A9F))?;
    let client = one_core(0)?;
    // One replica alone first, on rank 0, while the others wait.
    let mut one = match rank {
        0 => lone_step_seconds(&client, &params)?,
        _ => Vec::new(),
    };
    // The machine's own limit: every rank stepping at once, apart.
    engine.barrier();
    let mut concurrent = lone_step_seconds(&client, &params)?;
    engine.barrier();
    let mut group = ReplicaGroup::new(Box::new(engine), vec![client], &params)
        .map_err(|e| format!("group: {e}"))?;
    let (mut many, steps) = group_step_seconds(&mut group)?;
    if rank == 0 {
        print_scaling("mpi", ranks, [&mut one, &mut concurrent, &mut many], steps);
    }
    Ok(())
}

#[cfg(not(feature = "mpi"))]
fn allreduce_mpi(_sizes: &[usize]) -> Result<(), String> {
    Err(no_mpi())
}

#[cfg(not(feature = "mpi"))]
fn data_parallel_mpi() -> Result<(), String> {
    Err(no_mpi())
}

#[cfg(not(feature = "mpi"))]
fn no_mpi() -> String {
    "--engine mpi: this cistern was built without MPI; build it with `--features mpi` \
     and start it with `mpirun -np 2`"
        .into()
}

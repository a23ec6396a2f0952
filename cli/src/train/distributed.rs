//! `--devices` and `--distributed`: the engine and devices of the replica
//! group a run trains, and this process's place in it.

use std::time::Duration;

use cistern_client::ComputeClient;
use cistern_parallel::{Collective, InProcess};
use cistern_runtime::{Device, DeviceOptions, FaultPlan};

use super::args::{DistributedEngine, TrainArgs};
use super::failure::Failure;

/// Where a group's replicas of this process train.
#[derive(Debug)]
pub struct Placement {
    /// The engine joining this process to the others.
    pub engine: Box<dyn Collective>,
    /// This process's devices, opened.
    pub clients: Vec<ComputeClient>,
    /// How the run names them (`cpu:0,cpu:1`, `cpu:0 x 2 ranks (mpi)`).
    pub label: String,
}

/// The placement `args` ask for, or `None` for a run on one device. The
/// engine starts first: under MPI every rank gets the same answer.
pub fn placement(args: &TrainArgs, faults: &FaultPlan) -> Result<Option<Placement>, Failure> {
    if let Some(kind) = args.distributed {
        let engine = engine(kind, Duration::from_secs_f64(args.peer_timeout))?;
        let device = crate::devices::choose(&args.device)?;
        let threads = cpu_share(device, ranks_on_this_host());
        // An injected fault strikes the last rank alone: the others recover it.
        let last = engine.rank() + 1 == engine.size();
        let client = open(device, threads, &faults_if(last, faults))?;
        let label = format!("{device} x {} ranks ({})", engine.size(), engine.name());
        return Ok(Some(Placement {
            engine,
            clients: vec![client],
            label,
        }));
    }
    if args.devices.is_empty() {
        return Ok(None);
    }
    let mut devices: Vec<Device> = Vec::new();
    for spec in &args.devices {
        let device = crate::devices::choose(spec).map_err(|e| format!("--devices: {e}"))?;
        if devices.contains(&device) {
            return Err(Failure::Usage(format!(
                "--devices: {device} is named twice; each device holds one replica"
            )));
        }
        devices.push(device);
    }
    let cpus = devices
        .iter()
        .filter(|d| matches!(d, Device::Cpu(_)))
        .count();
    // An injected fault strikes the last device alone: the others recover it.
    let clients = devices
        .iter()
        .enumerate()
        .map(|(n, &device)| {
            let faults = faults_if(n + 1 == devices.len(), faults);
            open(device, cpu_share(device, cpus), &faults)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(Placement {
        engine: Box::new(InProcess),
        clients,
        label: args.devices.join(","),
    }))
}

/// `faults` where `injected`, else none.
fn faults_if(injected: bool, faults: &FaultPlan) -> FaultPlan {
    match injected {
        true => faults.clone(),
        false => FaultPlan::none(),
    }
}

/// A CPU device's share of the cores when `sharing` replicas use them.
fn cpu_share(device: Device, sharing: usize) -> Option<usize> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match device {
        Device::Cpu(_) => Some((cores / sharing.max(1)).max(1)),
        _ => None,
    }
}

fn open(
    device: Device,
    threads: Option<usize>,
    faults: &FaultPlan,
) -> Result<ComputeClient, Failure> {
    let mut options = DeviceOptions::default().with_faults(faults.clone());
    options.cpu_threads = threads;
    Ok(ComputeClient::open(device, options)?)
}

/// How many ranks of the job run on this host (OpenMPI says; else 1).
fn ranks_on_this_host() -> usize {
    std::env::var("OMPI_COMM_WORLD_LOCAL_SIZE")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

#[cfg(feature = "mpi")]
fn engine(kind: DistributedEngine, timeout: Duration) -> Result<Box<dyn Collective>, Failure> {
    match kind {
        DistributedEngine::Mpi => match cistern_parallel::mpi::Mpi::with_timeout(timeout) {
            Ok(mpi) => Ok(Box::new(mpi)),
            Err(error) => Err(Failure::Usage(format!("--distributed mpi: {error}"))),
        },
    }
}

#[cfg(not(feature = "mpi"))]
fn engine(kind: DistributedEngine, _timeout: Duration) -> Result<Box<dyn Collective>, Failure> {
    match kind {
        DistributedEngine::Mpi => Err(Failure::Usage(
            "--distributed mpi: this cistern was built without MPI; build it with \
             `cargo build --release --features mpi` (needs libopenmpi-dev and libclang-dev) \
             and start it with `mpirun -np N target/release/cistern train --distributed mpi`"
                .into(),
        )),
    }
}

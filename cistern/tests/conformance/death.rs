//! The server ending: by a panic, by a shutdown, or never starting.

use std::thread;

use cistern::client::ComputeClient;
use cistern::runtime::{Device, DeviceOptions, ErrorCode, FaultPlan, KernelLaunch, ServerError};

use super::common::{ok, open, open_with};

/// What one worker saw: calls that succeeded, then the first error.
fn hammer(client: ComputeClient) -> (u64, Option<ServerError>) {
    let stream = client.default_stream();
    let mut succeeded = 0;
    for round in 0..10_000u64 {
        let result = (|| {
            let buffer = client.upload_f32(&[round as f32; 64])?;
            client.launch(stream, KernelLaunch::fill(buffer.whole(), 1.0))?;
            client.download_f32(&buffer)?;
            client.sync(stream)
        })();
        match result {
            Ok(()) => succeeded += 1,
            Err(error) => return (succeeded, Some(error)),
        }
    }
    (succeeded, None)
}

pub fn a_server_panic_fails_calls_in_flight_and_every_later_call(device: Device) {
    let options = DeviceOptions::with_memory_limit(64 << 20)
        .with_faults(FaultPlan::none().with_server_panic_at_command(300));
    let client = open_with(device, options);
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let client = client.clone();
            thread::spawn(move || hammer(client))
        })
        .collect();
    for worker in workers {
        let (_, error) = match worker.join() {
            Ok(seen) => seen,
            Err(_) => panic!("a client thread panicked"),
        };
        let error = error.map(|e| e.code());
        assert_eq!(error, Some(ErrorCode::PoisonedLock));
    }
    let later = client.reserve(64).map(|_| ());
    assert!(matches!(later, Err(ServerError::ServerPanicked { .. })));
    let later = client.sync(client.default_stream());
    assert!(matches!(later, Err(ServerError::ServerPanicked { .. })));
    let launch = client.launch_tracked(client.default_stream(), KernelLaunch::empty());
    assert!(matches!(launch, Err(ServerError::ServerPanicked { .. })));
}

pub fn a_shut_down_server_answers_server_gone(device: Device) {
    let client = open(device);
    let buffer = ok(client.upload_f32(&[1.0; 4]), "upload");
    ok(client.shutdown(), "shutdown");
    let read = client.download(&buffer).map(|_| ());
    assert_eq!(read.map_err(|e| e.code()), Err(ErrorCode::ServerGone));
    let sync = client.sync(client.default_stream());
    assert_eq!(sync.map_err(|e| e.code()), Err(ErrorCode::ServerGone));
    drop(buffer);
}

pub fn calls_queued_behind_a_shutdown_answer_server_gone(device: Device) {
    let client = open(device);
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let client = client.clone();
            thread::spawn(move || hammer(client))
        })
        .collect();
    // Let the workers get going, so commands queue behind the shutdown.
    while ok(client.server_stats(), "server_stats").commands < 200 {
        thread::yield_now();
    }
    ok(client.shutdown(), "shutdown");
    for worker in workers {
        let (_, error) = match worker.join() {
            Ok(seen) => seen,
            Err(_) => panic!("a client thread panicked"),
        };
        assert_eq!(error.map(|e| e.code()), Some(ErrorCode::ServerGone));
    }
}

pub fn opening_an_absent_device_is_unavailable() {
    // No machine has this many wgpu adapters or CUDA devices; CPU ordinals
    // stop at MAX_CPU_ORDINALS.
    let past_the_cpus = Device::Cpu(cistern::runtime::backend::cpu::MAX_CPU_ORDINALS);
    for device in [past_the_cpus, Device::Cuda(64), Device::Wgpu(1 << 20)] {
        let opened = ComputeClient::open(device, DeviceOptions::default()).map(|_| ());
        match opened {
            Err(ServerError::DeviceUnavailable { .. }) => {}
            // CUDA itself absent from this process or build.
            Err(ServerError::CudaUnavailable { .. }) if matches!(device, Device::Cuda(_)) => {}
            other => panic!("{device}: expected DeviceUnavailable, got {other:?}"),
        }
    }
}

//! Failures of asynchronous work reach their owner.

use cistern::client::ComputeClient;
use cistern::runtime::{
    Binding, ContextState, Device, DeviceOptions, ErrorCode, FaultPlan, KernelLaunch, ServerError,
};

use super::common::{ok, open, open_with};

fn open_with_faults(device: Device, faults: FaultPlan) -> ComputeClient {
    open_with(
        device,
        DeviceOptions::with_memory_limit(64 << 20).with_faults(faults),
    )
}

pub fn a_trap_surfaces_at_the_owners_token_and_sync(device: Device) {
    let client = open(device);
    let stream = ok(client.create_stream(), "create_stream");
    let buffer = ok(client.upload_f32(&[1.0; 16]), "upload");
    let token = ok(
        client.launch_tracked(stream, KernelLaunch::trap()),
        "launch",
    );
    let trapped = token.wait();
    assert!(matches!(trapped, Err(ServerError::ContextPoisoned(_))));
    // Whoever has seen the fault is causally after the server has: the very
    // next command is refused.
    let reserve = client.reserve(64).map(|_| ());
    assert_eq!(
        reserve.map_err(|e| e.code()),
        Err(ErrorCode::DevicePoisoned)
    );
    let synced = client.sync(stream);
    assert_eq!(synced.map_err(|e| e.code()), Err(ErrorCode::DevicePoisoned));
    // Sticky: every later command is refused, on every stream.
    let read = client.download(&buffer).map(|_| ());
    assert_eq!(read.map_err(|e| e.code()), Err(ErrorCode::DevicePoisoned));
    let later = ok(
        client.launch_tracked(client.default_stream(), KernelLaunch::empty()),
        "launch",
    );
    assert!(later.wait().is_err_and(|e| e.is_device_poisoned()));
}

pub fn a_refused_launch_is_latched_until_its_stream_syncs(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let buffer = ok(client.reserve(64), "reserve");
    let past_the_end = Binding {
        size: 128,
        ..buffer.whole()
    };
    ok(
        client.launch(stream, KernelLaunch::fill(past_the_end, 1.0)),
        "launch",
    );
    let synced = client.sync(stream);
    assert_eq!(synced.map_err(|e| e.code()), Err(ErrorCode::InvalidProgram));
    // Read once, the latch is clear; the device is not poisoned.
    ok(client.sync(stream), "second sync");
    ok(
        client.launch(stream, KernelLaunch::fill(buffer.whole(), 2.0)),
        "launch",
    );
    assert_eq!(ok(client.download_f32(&buffer), "download"), vec![2.0; 16]);
}

pub fn a_latched_error_is_reported_by_a_sync_on_an_idle_stream(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let buffer = ok(client.reserve(64), "reserve");
    let past_the_end = Binding {
        size: 128,
        ..buffer.whole()
    };
    ok(
        client.launch(stream, KernelLaunch::fill(past_the_end, 1.0)),
        "launch",
    );
    // Let the stream run dry, so a backend may answer the sync without a marker.
    let fill = client.launch_tracked(stream, KernelLaunch::fill(buffer.whole(), 3.0));
    ok(ok(fill, "launch").wait(), "fill");
    std::thread::sleep(std::time::Duration::from_millis(20));
    let synced = client.sync(stream);
    assert_eq!(synced.map_err(|e| e.code()), Err(ErrorCode::InvalidProgram));
    for _ in 0..3 {
        std::thread::sleep(std::time::Duration::from_millis(5));
        ok(client.sync(stream), "later sync");
    }
    assert_eq!(ok(client.download_f32(&buffer), "download"), vec![3.0; 16]);
}

pub fn a_batch_is_checked_before_any_of_it_runs(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let first = ok(client.upload_f32(&[0.0; 16]), "upload");
    let second = ok(client.reserve(64), "reserve");
    let aliased = KernelLaunch::copy(second.whole(), second.whole());
    let token = ok(
        client.launch_batch(
            stream,
            vec![KernelLaunch::fill(first.whole(), 5.0), aliased],
        ),
        "launch_batch",
    );
    assert_eq!(
        token.wait().map_err(|e| e.code()),
        Err(ErrorCode::InvalidProgram)
    );
    assert!(client.sync(stream).is_err());
    assert_eq!(ok(client.download_f32(&first), "download"), vec![0.0; 16]);
    let token = ok(
        client.launch_batch(
            stream,
            vec![
                KernelLaunch::fill(first.whole(), 5.0),
                KernelLaunch::copy(first.whole(), second.whole()),
            ],
        ),
        "launch_batch",
    );
    assert_eq!(token.wait(), Ok(()));
    assert_eq!(ok(client.download_f32(&second), "download"), vec![5.0; 16]);
}

pub fn the_nth_executed_launch_traps_and_poisons(device: Device) {
    let client = open_with_faults(device, FaultPlan::none().with_trap_at_launch(3));
    let stream = client.default_stream();
    let buffer = ok(client.reserve(64), "reserve");
    // A refused launch is not executed and does not count.
    let past_the_end = Binding {
        size: 128,
        ..buffer.whole()
    };
    ok(
        client.launch(stream, KernelLaunch::fill(past_the_end, 1.0)),
        "launch",
    );
    assert!(client.sync(stream).is_err());
    let tokens: Vec<_> = (0..4)
        .map(|_| {
            ok(
                client.launch_tracked(stream, KernelLaunch::empty()),
                "launch",
            )
        })
        .collect();
    let outcomes: Vec<_> = tokens
        .iter()
        .map(|token| token.wait().map_err(|e| e.code()))
        .collect();
    let poisoned = Err(ErrorCode::DevicePoisoned);
    assert_eq!(outcomes, vec![Ok(()), Ok(()), poisoned, poisoned]);
    assert_eq!(
        ok(client.server_stats(), "server_stats").empty_kernel_runs,
        2
    );
    assert!(ok(client.context_state(), "context_state").is_poisoned());
}

pub fn a_trap_inside_a_batch_poisons_and_no_later_launch_of_it_runs(device: Device) {
    let client = open_with_faults(device, FaultPlan::none().with_trap_at_launch(2));
    let token = ok(
        client.launch_batch(client.default_stream(), vec![KernelLaunch::empty(); 4]),
        "launch_batch",
    );
    assert!(token.wait().is_err_and(|e| e.is_device_poisoned()));
    assert_eq!(
        ok(client.server_stats(), "server_stats").empty_kernel_runs,
        1
    );
}

pub fn the_nth_reservation_fails_out_of_memory_and_does_not_poison(device: Device) {
    let client = open_with_faults(device, FaultPlan::none().with_failed_reservation(2));
    let first = ok(client.upload_f32(&[1.0; 4]), "upload");
    let second = client.reserve(64).map(|_| ());
    assert_eq!(
        second.map_err(|e| e.code()),
        Err(ErrorCode::DeviceOutOfMemory)
    );
    let third = ok(client.upload_f32(&[2.0; 4]), "upload");
    assert_eq!(ok(client.download_f32(&first), "download"), vec![1.0; 4]);
    assert_eq!(ok(client.download_f32(&third), "download"), vec![2.0; 4]);
    assert_eq!(
        ok(client.context_state(), "context_state"),
        ContextState::Active { generation: 0 }
    );
}

pub fn the_nth_transfer_fails_and_does_not_poison(device: Device) {
    let client = open_with_faults(device, FaultPlan::none().with_failed_transfer(2));
    let buffer = ok(client.upload_f32(&[1.0; 4]), "upload");
    let failed = client.download(&buffer).map(|_| ());
    assert!(matches!(failed, Err(ServerError::TransferFailed { .. })));
    assert_eq!(failed.map_err(|e| e.code()), Err(ErrorCode::TransferFailed));
    // Retried, it works, and the device was never poisoned.
    assert_eq!(ok(client.download_f32(&buffer), "download"), vec![1.0; 4]);
    ok(client.sync(client.default_stream()), "sync");
}

/// The launches (counting from 1) that trapped under a seeded rate,
/// recovering after each.
fn trapped_launches(device: Device, seed: u64) -> Vec<u64> {
    let client = open_with_faults(device, FaultPlan::none().with_trap_rate(seed, 0.25));
    let mut trapped = Vec::new();
    for index in 1..=40 {
        let token = ok(
            client.launch_tracked(client.default_stream(), KernelLaunch::empty()),
            "launch",
        );
        if let Err(ServerError::ContextPoisoned(poison)) = token.wait() {
            trapped.push(index);
            ok(client.invalidate(poison.generation), "invalidate");
        }
    }
    trapped
}

pub fn a_seeded_trap_rate_traps_the_same_launches_every_run(device: Device) {
    let first = trapped_launches(device, 11);
    assert!(!first.is_empty() && first.len() < 40, "{first:?}");
    assert_eq!(first, trapped_launches(device, 11));
}

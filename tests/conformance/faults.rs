//! Failures of asynchronous work reach their owner.

use cistern::runtime::{Binding, Device, ErrorCode, KernelLaunch, ServerError};

use super::common::{ok, open};

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

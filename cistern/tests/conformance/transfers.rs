//! Host/device transfers.

use cistern::runtime::{AllocationPolicy, Device, ErrorCode, ServerError};

use super::common::{ok, open};

pub fn bytes_and_f32s_round_trip(device: Device) {
    let client = open(device);
    let bytes: Vec<u8> = (0..=255).collect();
    let buffer = ok(client.upload(&bytes), "upload");
    assert_eq!(ok(client.download(&buffer), "download"), bytes);
    let values: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 7.0).collect();
    let buffer = ok(client.upload_f32(&values), "upload_f32");
    assert_eq!(ok(client.download_f32(&buffer), "download_f32"), values);
}

pub fn a_write_at_an_offset_changes_only_its_range(device: Device) {
    let client = open(device);
    let buffer = ok(client.upload(&[1u8; 64]), "upload");
    ok(client.write(&buffer, 16, &[9u8; 8]), "write");
    let bytes = ok(client.download(&buffer), "download");
    let expected: Vec<u8> = (0..64)
        .map(|i| if (16..24).contains(&i) { 9 } else { 1 })
        .collect();
    assert_eq!(bytes, expected);
    assert_eq!(ok(client.read(&buffer, 20, 4), "read"), vec![9u8; 4]);
}

pub fn a_range_past_the_end_is_an_invalid_argument(device: Device) {
    let client = open(device);
    let buffer = ok(client.reserve(64), "reserve");
    let write = client.write(&buffer, 60, &[0u8; 8]);
    assert!(matches!(write, Err(ServerError::InvalidArgument { .. })));
    let read = client.read(&buffer, 0, 65);
    assert_eq!(read.map_err(|e| e.code()), Err(ErrorCode::InvalidArgument));
    // Nothing is latched: the refusal was answered to its caller.
    ok(client.sync(client.default_stream()), "sync");
}

pub fn a_dry_run_reservation_is_backed_on_first_use(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let buffer = ok(
        client.reserve_with(4096, AllocationPolicy::DryRun, stream),
        "dry-run reserve",
    );
    ok(client.write(&buffer, 0, &[5u8; 4096]), "write");
    assert_eq!(ok(client.download(&buffer), "download"), vec![5u8; 4096]);
}

pub fn a_buffer_of_another_client_is_a_device_mismatch(device: Device) {
    let first = open(device);
    let second = open(device);
    let buffer = ok(first.reserve(64), "reserve");
    let read = second.download(&buffer);
    assert_eq!(read.map_err(|e| e.code()), Err(ErrorCode::DeviceMismatch));
    // The server checks too: a launch naming a stranger's buffer is refused.
    let token = ok(
        second.launch_tracked(
            second.default_stream(),
            cistern::runtime::KernelLaunch::fill(buffer.whole(), 1.0),
        ),
        "launch",
    );
    assert_eq!(
        token.wait().map_err(|e| e.code()),
        Err(ErrorCode::DeviceMismatch)
    );
}

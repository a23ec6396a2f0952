//! Exhausting a small memory limit.

use cistern::runtime::{Device, DeviceOptions, ErrorCode};

use super::common::{ok, open_with};

pub fn exhausting_a_small_limit_is_out_of_memory_after_one_retry(device: Device) {
    let client = open_with(device, DeviceOptions::with_memory_limit(16 << 20));
    let size = 1u64 << 20;
    let mut held = Vec::new();
    let failure = loop {
        match client.reserve(size) {
            Ok(buffer) => {
                let pattern = vec![held.len() as u8; size as usize];
                ok(client.write(&buffer, 0, &pattern), "write");
                held.push(buffer);
                assert!(held.len() <= 16, "a 16 MiB limit held more than 16 MiB");
            }
            Err(error) => break error,
        }
    };
    assert_eq!(failure.code(), ErrorCode::DeviceOutOfMemory);
    assert!(!held.is_empty());
    let stats = ok(client.memory_stats(), "memory_stats");
    assert_eq!(stats.ooms, 1);
    assert!(
        stats.retries >= 1,
        "the failing request released and retried once"
    );
    // Nothing already written was damaged.
    for (index, buffer) in held.iter().enumerate() {
        let bytes = ok(client.download(buffer), "download");
        assert!(bytes.iter().all(|b| *b == index as u8));
    }
    // Releasing memory makes room again.
    held.pop();
    held.pop();
    ok(client.reserve(size), "reserve after release");
}

pub fn a_buffer_larger_than_the_limit_is_buffer_too_big(device: Device) {
    let client = open_with(device, DeviceOptions::with_memory_limit(8 << 20));
    let error = client.reserve(64 << 20).err();
    assert_eq!(error.map(|e| e.code()), Some(ErrorCode::BufferTooBig));
}

//! What every check shares: the devices to run on and small helpers.

use cistern::client::ComputeClient;
use cistern::runtime::{Device, DeviceOptions, absent_backends, list_devices};

/// Every device present on this machine. A backend built in but absent is
/// said loudly; a missing wgpu adapter fails the run under
/// `CISTERN_REQUIRE_WGPU=1` (CI, where lavapipe is installed).
pub fn devices_present() -> Vec<Device> {
    for absent in absent_backends().iter().filter(|a| a.backend == "wgpu") {
        if std::env::var_os("CISTERN_REQUIRE_WGPU").is_some_and(|v| v == "1") {
            panic!(
                "CISTERN_REQUIRE_WGPU=1 but no wgpu device: {}",
                absent.reason
            );
        }
    }
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        use std::io::Write;
        for absent in absent_backends() {
            // Past the test harness's capture: a skip must be seen.
            let line = format!(
                "conformance: SKIPPING every {} check: {}\n",
                absent.backend, absent.reason
            );
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    });
    list_devices().into_iter().map(|info| info.device).collect()
}

/// A client on `device` with a small memory budget.
pub fn open(device: Device) -> ComputeClient {
    open_with(device, DeviceOptions::with_memory_limit(64 << 20))
}

/// A client on `device` with a small memory budget, its manager kept to
/// pages (no virtual range, also where the device could map memory).
pub fn open_paged(device: Device) -> ComputeClient {
    open_with(
        device,
        DeviceOptions {
            virtual_memory: false,
            ..DeviceOptions::with_memory_limit(64 << 20)
        },
    )
}

/// A client on `device` with `options`.
pub fn open_with(device: Device, options: DeviceOptions) -> ComputeClient {
    match ComputeClient::open(device, options) {
        Ok(client) => client,
        Err(error) => panic!("{device} opens: {error}"),
    }
}

/// The value of a call every check expects to succeed.
pub fn ok<T, E: std::fmt::Display>(result: Result<T, E>, what: &str) -> T {
    match result {
        Ok(value) => value,
        Err(error) => panic!("{what} failed: {error}"),
    }
}

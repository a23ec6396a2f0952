//! Finding wgpu adapters once per process, describing them, and opening a
//! device on one. No adapter is a normal answer, never a panic.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use super::memory;
use crate::error::ServerError;
use crate::host::default_cpu_memory_limit;
use crate::ids::{Device, DeviceInfo};

/// Bytes a wgpu device's server may hold by default when the adapter says
/// nothing of its memory (Metal, DX12: wgpu reports no device memory).
const GPU_DEFAULT_LIMIT: u64 = 2 << 30;

/// The adapters found, in ordinal order, or why there are none.
fn adapters() -> &'static Result<Vec<::wgpu::Adapter>, String> {
    static ADAPTERS: OnceLock<Result<Vec<::wgpu::Adapter>, String>> = OnceLock::new();
    ADAPTERS.get_or_init(|| {
        // `Instance::new` panics when no backend is compiled for this target.
        let found = catch_unwind(AssertUnwindSafe(|| {
            let mut descriptor = ::wgpu::InstanceDescriptor::new_without_display_handle();
            descriptor.backends = ::wgpu::Backends::all();
            let instance = ::wgpu::Instance::new(descriptor);
            pollster::block_on(instance.enumerate_adapters(::wgpu::Backends::all()))
        }));
        match found {
            Ok(adapters) if adapters.is_empty() => {
                Err("no wgpu adapter (Vulkan, Metal or DX12 driver) is present".to_string())
            }
            Ok(adapters) => Ok(adapters),
            Err(_) => Err("wgpu has no backend for this platform".to_string()),
        }
    })
}

/// Every wgpu adapter present, as `list_devices` shows it.
pub(crate) fn list() -> Vec<DeviceInfo> {
    let Ok(adapters) = adapters() else {
        return Vec::new();
    };
    adapters
        .iter()
        .enumerate()
        .map(|(ordinal, adapter)| {
            let info = adapter.get_info();
            let cpu = info.device_type == ::wgpu::DeviceType::Cpu;
            DeviceInfo {
                device: Device::Wgpu(ordinal),
                name: format!("{} ({:?})", info.name, info.backend),
                // wgpu reports no unit count; a CPU adapter runs on the host's cores.
                compute_units: if cpu {
                    std::thread::available_parallelism().map_or(1, |n| n.get())
                } else {
                    1
                },
                memory_bytes: memory::device_local_bytes(adapter),
                default_memory_limit: default_limit(adapter),
            }
        })
        .collect()
}

/// Why no wgpu device is listed, when none is.
pub(crate) fn absence() -> Option<String> {
    adapters().as_ref().err().cloned()
}

/// The memory limit of a server opened on `adapter` with default options
/// (a configured budget replaces it): the adapter's device-local memory where
/// its driver reports it (Vulkan), at most half the host memory for a CPU
/// adapter (it holds host memory the process shares), else 2 GiB.
pub(super) fn default_limit(adapter: &::wgpu::Adapter) -> u64 {
    let cpu = adapter.get_info().device_type == ::wgpu::DeviceType::Cpu;
    limit_from(
        memory::device_local_bytes(adapter),
        cpu,
        default_cpu_memory_limit(),
    )
}

/// The default limit from the adapter's reported memory, whether it is a CPU
/// adapter, and the host's default (half its memory).
fn limit_from(reported: Option<u64>, cpu: bool, host_default: u64) -> u64 {
    match (reported, cpu) {
        (Some(bytes), true) => bytes.min(host_default),
        (Some(bytes), false) => bytes,
        (None, true) => host_default,
        (None, false) => GPU_DEFAULT_LIMIT,
    }
}

/// Adapter `ordinal`, or why it is unavailable.
pub(super) fn adapter(ordinal: usize) -> Result<::wgpu::Adapter, ServerError> {
    let unavailable = |reason: String| ServerError::DeviceUnavailable {
        device: Device::Wgpu(ordinal).to_string(),
        reason,
    };
    match adapters() {
        Ok(adapters) => adapters.get(ordinal).cloned().ok_or_else(|| {
            unavailable(format!("only {} wgpu adapters are present", adapters.len()))
        }),
        Err(reason) => Err(unavailable(reason.clone())),
    }
}

/// A device and its queue on `adapter`, with the adapter's own limits (the
/// defaults cap a storage binding at 128 MiB).
pub(super) fn request_device(
    adapter: &::wgpu::Adapter,
    ordinal: usize,
) -> Result<(::wgpu::Device, ::wgpu::Queue), ServerError> {
    let descriptor = ::wgpu::DeviceDescriptor {
        label: Some("cistern"),
        required_limits: adapter.limits(),
        // Kernel timings where the adapter can take timestamps; never required.
        required_features: adapter.features() & ::wgpu::Features::TIMESTAMP_QUERY,
        ..Default::default()
    };
    pollster::block_on(adapter.request_device(&descriptor)).map_err(|error| {
        ServerError::DeviceUnavailable {
            device: Device::Wgpu(ordinal).to_string(),
            reason: format!("the adapter refused a device: {error}"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_adapter_that_reports_its_memory_takes_all_of_it() {
        assert_eq!(limit_from(Some(24 << 30), false, 8 << 30), 24 << 30);
    }

    #[test]
    fn a_cpu_adapter_never_takes_more_than_half_the_host() {
        assert_eq!(limit_from(Some(16 << 30), true, 8 << 30), 8 << 30);
        assert_eq!(limit_from(Some(4 << 30), true, 8 << 30), 4 << 30);
        assert_eq!(limit_from(None, true, 8 << 30), 8 << 30);
    }

    #[test]
    fn every_vulkan_adapter_reports_its_memory_and_a_default_limit_within_it() {
        let vulkan: Vec<_> = list()
            .into_iter()
            .filter(|info| info.name.ends_with("(Vulkan)"))
            .collect();
        if std::env::var_os("CISTERN_REQUIRE_WGPU").is_some_and(|v| v == "1") {
            assert!(
                !vulkan.is_empty(),
                "CISTERN_REQUIRE_WGPU=1 but no Vulkan adapter"
            );
        }
        for info in vulkan {
            let memory = info.memory_bytes;
            assert!(memory.is_some_and(|bytes| bytes > 0), "{}", info.name);
            assert!(memory.is_some_and(|bytes| info.default_memory_limit <= bytes));
        }
    }

    #[test]
    fn an_adapter_that_reports_no_memory_gets_the_gpu_default() {
        assert_eq!(limit_from(None, false, 8 << 30), GPU_DEFAULT_LIMIT);
    }
}

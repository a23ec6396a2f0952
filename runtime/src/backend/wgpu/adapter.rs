//! Finding wgpu adapters once per process, describing them, and opening a
//! device on one. No adapter is a normal answer, never a panic.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use crate::device::default_cpu_memory_limit;
use crate::{Device, DeviceInfo, ServerError};

/// Bytes a wgpu device's server may hold by default when the adapter is a
/// discrete or integrated GPU: wgpu does not report device memory.
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
                memory_bytes: None,
                default_memory_limit: default_limit(adapter),
            }
        })
        .collect()
}

/// Why no wgpu device is listed, when none is.
pub(crate) fn absence() -> Option<String> {
    adapters().as_ref().err().cloned()
}

/// The memory limit of a server opened on `adapter` with default options:
/// half the host memory for a CPU adapter (it uses host memory), else 2 GiB.
pub(super) fn default_limit(adapter: &::wgpu::Adapter) -> u64 {
    if adapter.get_info().device_type == ::wgpu::DeviceType::Cpu {
        default_cpu_memory_limit()
    } else {
        GPU_DEFAULT_LIMIT
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
        ..Default::default()
    };
    pollster::block_on(adapter.request_device(&descriptor)).map_err(|error| {
        ServerError::DeviceUnavailable {
            device: Device::Wgpu(ordinal).to_string(),
            reason: format!("the adapter refused a device: {error}"),
        }
    })
}

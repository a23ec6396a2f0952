//! Devices: naming one, listing those present, and the options to open one.

use serde::{Deserialize, Serialize};

use std::time::Duration;

use crate::fault::FaultPlan;
use crate::host::{default_cpu_memory_limit, host_memory_bytes};
use crate::ids::{Device, DeviceInfo};

/// Every device present: the host CPU, always, then each wgpu adapter
/// (with the `wgpu` feature) and each CUDA device (with the `cuda` feature).
pub fn list_devices() -> Vec<DeviceInfo> {
    #[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(unused_mut))]
    let mut devices = vec![DeviceInfo {
        device: Device::Cpu(0),
        name: "host CPU".to_string(),
        compute_units: std::thread::available_parallelism().map_or(1, |n| n.get()),
        memory_bytes: host_memory_bytes(),
        default_memory_limit: default_cpu_memory_limit(),
    }];
    #[cfg(feature = "wgpu")]
    devices.extend(crate::backend::wgpu::list());
    #[cfg(feature = "cuda")]
    if let Ok(cuda) = crate::backend::cuda::devices() {
        devices.extend(cuda.into_iter().map(|info| DeviceInfo {
            device: Device::Cuda(info.ordinal),
            name: info.name,
            compute_units: info.multiprocessors,
            memory_bytes: Some(info.memory_bytes),
            default_memory_limit: info.memory_bytes,
        }));
    }
    devices
}

/// A backend that lists no device, and why (no driver, not built).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbsentBackend {
    /// The backend kind, as devices of it print (`wgpu`, `cuda`).
    pub backend: String,
    /// Why it lists no device, in one line.
    pub reason: String,
}

/// Every backend kind with no device listed by [`list_devices`], with the
/// reason; never panics.
pub fn absent_backends() -> Vec<AbsentBackend> {
    #[cfg(feature = "wgpu")]
    let wgpu = crate::backend::wgpu::absence();
    #[cfg(not(feature = "wgpu"))]
    let wgpu = Some("built without the `wgpu` feature".to_string());
    #[cfg(feature = "cuda")]
    let cuda = crate::backend::cuda::devices().err().map(|why| why.reason);
    #[cfg(not(feature = "cuda"))]
    let cuda = Some("built without the `cuda` feature".to_string());
    [("wgpu", wgpu), ("cuda", cuda)]
        .into_iter()
        .filter_map(|(backend, reason)| {
            Some(AbsentBackend {
                backend: backend.to_string(),
                reason: reason?,
            })
        })
        .collect()
}

/// How long a drain, or one probe attempt, may take before the context is
/// declared unrecoverable, unless the device's options say otherwise.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How to open a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceOptions {
    /// The memory budget in bytes; `None` takes the device's default (half
    /// the host memory for the CPU).
    pub memory_limit: Option<u64>,
    /// Faults to inject (tests); the default injects none and costs nothing.
    pub faults: FaultPlan,
    /// How long an invalidate's drain, or one probe attempt, may take
    /// before the context is declared unrecoverable.
    pub drain_timeout: Duration,
    /// Where the device can map memory (CUDA with virtual memory management),
    /// place requests in one address range backed chunk by chunk (the
    /// default); `false` keeps the manager to pages, as on devices that
    /// cannot map.
    pub virtual_memory: bool,
    /// CPU devices only: the threads of a pool of the device's own for its
    /// kernels, so that several CPU ordinals share the cores without
    /// contending (`--devices cpu:0,cpu:1` gives each half). `None` runs
    /// them on the process's shared pool.
    pub cpu_threads: Option<usize>,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            memory_limit: None,
            faults: FaultPlan::default(),
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            virtual_memory: true,
            cpu_threads: None,
        }
    }
}

impl DeviceOptions {
    /// Options with the given memory budget.
    pub fn with_memory_limit(bytes: u64) -> Self {
        DeviceOptions {
            memory_limit: Some(bytes),
            ..DeviceOptions::default()
        }
    }

    /// These options with a pool of `threads` of the CPU device's own.
    pub fn with_cpu_threads(mut self, threads: usize) -> Self {
        self.cpu_threads = Some(threads);
        self
    }

    /// These options with `faults` injected.
    pub fn with_faults(mut self, faults: FaultPlan) -> Self {
        self.faults = faults;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_is_always_listed_with_a_positive_default_limit() {
        let devices = list_devices();
        assert_eq!(devices[0].device, Device::Cpu(0));
        assert!(devices[0].default_memory_limit > 0);
        assert!(devices[0].compute_units >= 1);
    }

    #[test]
    fn a_backend_is_either_listed_or_absent_with_a_reason() {
        let listed = list_devices();
        for absent in absent_backends() {
            assert!(!absent.reason.is_empty());
            let kind = format!("{}:", absent.backend);
            assert!(
                listed
                    .iter()
                    .all(|d| !d.device.to_string().starts_with(&kind))
            );
        }
    }

    #[test]
    fn devices_print_as_kind_and_ordinal() {
        assert_eq!(Device::Cpu(0).to_string(), "cpu:0");
        assert_eq!(Device::Cuda(2).to_string(), "cuda:2");
        assert_eq!(Device::Wgpu(1).ordinal(), 1);
    }
}

//! `GpuContext`: one opened wgpu device, its queue and limits, the state
//! its callbacks report (device lost, uncaptured errors), and submitting
//! work that is done when the call returns.

use std::sync::Arc;
use std::time::Duration;

use super::pipelines::Pipelines;
use crate::backend::stream::KernelFault;
use crate::sync::Mutex;

/// How long one submission may run before the device counts as hung.
const SUBMISSION_TIMEOUT: Duration = Duration::from_secs(120);

/// One wgpu device as every stream of a server shares it.
#[derive(Debug)]
pub(crate) struct GpuContext {
    pub(super) device: ::wgpu::Device,
    pub(super) queue: ::wgpu::Queue,
    /// The largest storage binding (lavapipe: 128 MiB), in bytes.
    pub(super) max_binding: u64,
    /// Storage bindings start at multiples of this (a power of two).
    pub(super) offset_alignment: u64,
    /// Workgroups per grid dimension.
    pub(super) max_groups: u32,
    /// Multiply-adds one GEMM submission may do (`gemm::bands`).
    pub(super) gemm_budget: u64,
    pub(super) pipelines: Pipelines,
    /// 16 zero bytes: the binding of an absent buffer.
    pub(super) zero: ::wgpu::Buffer,
    lost: Arc<Mutex<Option<String>>>,
    uncaptured: Arc<Mutex<Option<String>>>,
    /// Timestamp queries, where the device has them.
    pub(super) timestamps: Option<super::timing::Timestamps>,
    /// Transfer failures a unit test plants.
    #[cfg(test)]
    pub(super) faults: super::transfer::TransferFaults,
}

impl GpuContext {
    /// Wraps an opened device; its callbacks record instead of panicking.
    pub(super) fn new(device: ::wgpu::Device, queue: ::wgpu::Queue) -> Self {
        let limits = device.limits();
        let lost = Arc::new(Mutex::new(None));
        let recorded = lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            *recorded.lock() = Some(format!("{reason:?}: {message}"));
        });
        let uncaptured = Arc::new(Mutex::new(None));
        let recorded = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |error: ::wgpu::Error| {
            let mut slot = recorded.lock();
            if slot.is_none() {
                *slot = Some(error.to_string());
            }
        }));
        let zero = device.create_buffer(&::wgpu::BufferDescriptor {
            label: Some("cistern zero"),
            size: 16,
            usage: ::wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let offset_alignment = u64::from(limits.min_storage_buffer_offset_alignment)
            .max(4)
            .next_power_of_two();
        let timestamps = super::timing::Timestamps::of(&device, &queue);
        let gemm_budget = match device.adapter_info().device_type {
            ::wgpu::DeviceType::Cpu => super::gemm::CPU_BUDGET,
            _ => super::gemm::GPU_BUDGET,
        };
        GpuContext {
            max_binding: limits.max_storage_buffer_binding_size,
            offset_alignment,
            max_groups: limits.max_compute_workgroups_per_dimension.max(1),
            gemm_budget,
            pipelines: Pipelines::default(),
            zero,
            device,
            queue,
            timestamps,
            lost,
            uncaptured,
            #[cfg(test)]
            faults: Default::default(),
        }
    }

    /// The device-lost fault, once the device is lost.
    pub(super) fn lost(&self) -> Result<(), KernelFault> {
        match &*self.lost.lock() {
            Some(reason) => Err(KernelFault::Device(format!("device lost ({reason})"))),
            None => Ok(()),
        }
    }

    /// Submits `encoder`'s commands and waits until the device has run
    /// them. A validation error is `Err(Ok(message))`, the command's own;
    /// a lost or hung device is `Err(Err(fault))`, sticky.
    pub(super) fn submit(
        &self,
        encoder: ::wgpu::CommandEncoder,
    ) -> Result<(), Result<String, KernelFault>> {
        self.lost().map_err(Err)?;
        // Scopes are per thread: pushed and popped here, on the submitting one.
        let scope = self
            .device
            .push_error_scope(::wgpu::ErrorFilter::Validation);
        let index = self.queue.submit([encoder.finish()]);
        let error = pollster::block_on(scope.pop());
        let waited = self.device.poll(::wgpu::PollType::Wait {
            submission_index: Some(index),
            timeout: Some(SUBMISSION_TIMEOUT),
        });
        self.lost().map_err(Err)?;
        if let Err(error) = waited {
            return Err(Err(KernelFault::Device(format!(
                "waiting for a submission: {error}"
            ))));
        }
        match error
            .map(|error| error.to_string())
            .or_else(|| self.uncaptured())
        {
            Some(message) => Err(Ok(message)),
            None => Ok(()),
        }
    }

    /// As [`GpuContext::submit`], where a validation error is sticky too
    /// (a transfer has no caller to hand it to).
    pub(super) fn submit_all(&self, encoder: ::wgpu::CommandEncoder) -> Result<(), KernelFault> {
        self.submit(encoder).map_err(|error| match error {
            Ok(message) => KernelFault::Device(format!("validation: {message}")),
            Err(fault) => fault,
        })
    }

    /// A fresh command encoder.
    pub(super) fn encoder(&self) -> ::wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&::wgpu::CommandEncoderDescriptor { label: None })
    }

    /// The first error no scope caught since the last call, if any.
    fn uncaptured(&self) -> Option<String> {
        self.uncaptured.lock().take()
    }
}

#[cfg(test)]
impl GpuContext {
    /// A context on the first wgpu adapter, or `None` (said) when there is
    /// none; under `CISTERN_REQUIRE_WGPU=1` a missing adapter panics.
    pub(super) fn for_tests() -> Option<GpuContext> {
        let opened = super::adapter::adapter(0).and_then(|a| super::adapter::request_device(&a, 0));
        match opened {
            Ok((device, queue)) => Some(GpuContext::new(device, queue)),
            Err(error) if std::env::var_os("CISTERN_REQUIRE_WGPU").is_some_and(|v| v == "1") => {
                panic!("CISTERN_REQUIRE_WGPU=1 but no wgpu device: {error}")
            }
            Err(error) => {
                eprintln!("skipped: no wgpu device: {error}");
                None
            }
        }
    }
}

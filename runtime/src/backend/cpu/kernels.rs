//! The CPU bodies of the runtime's kernels, and the fault they can raise.
//!
//! `run` maps a resolved launch onto plain slices; the `f32` bodies are
//! `cistern-kernels`' (issue 8 adds the rest of its catalogue).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;

use super::executor::DeviceState;
use super::memory::HostSlice;
use crate::fault::panic_message;
use crate::{Kernel, KernelArgs};

/// A CPU kernel's launch with its bindings resolved.
#[derive(Debug)]
pub(super) struct CpuLaunch {
    pub(super) kernel: Kernel,
    pub(super) bindings: Vec<HostSlice>,
    pub(super) args: KernelArgs,
}

/// A sticky fault raised while running device work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum KernelFault {
    /// The kernel trapped, as the `Trap` kernel does.
    Trap,
    /// The work panicked.
    Panicked(String),
    /// The launch did not match its kernel (the server's checks should make this impossible).
    Malformed(String),
}

impl std::fmt::Display for KernelFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelFault::Trap => f.write_str("the kernel trapped"),
            KernelFault::Panicked(message) => write!(f, "the kernel panicked: {message}"),
            KernelFault::Malformed(message) => write!(f, "malformed launch: {message}"),
        }
    }
}

/// Runs `work`, turning a panic inside it into a fault.
pub(super) fn caught<T>(work: impl FnOnce() -> Result<T, KernelFault>) -> Result<T, KernelFault> {
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(result) => result,
        Err(payload) => Err(KernelFault::Panicked(panic_message(payload.as_ref()))),
    }
}

/// Runs one launch on this thread.
pub(super) fn run(launch: &CpuLaunch, device: &DeviceState) -> Result<(), KernelFault> {
    match (launch.kernel, launch.args) {
        (Kernel::Fill, KernelArgs::Fill { value }) => {
            let target = binding(launch, 0)?;
            // SAFETY: the server checked the written binding overlaps no other.
            cistern_kernels::fill(f32s_mut(unsafe { target.bytes_mut() })?, value);
        }
        (Kernel::Copy, KernelArgs::None) => {
            let (source, target) = (binding(launch, 0)?, binding(launch, 1)?);
            // SAFETY: as above; the source is only read.
            copy(unsafe { source.bytes() }, unsafe { target.bytes_mut() })?;
        }
        (Kernel::Identity, KernelArgs::None) => {
            let (source, target) = (binding(launch, 0)?, binding(launch, 1)?);
            // SAFETY: as above.
            let (source, target) = unsafe { (source.bytes(), target.bytes_mut()) };
            cistern_kernels::copy(f32s(source)?, f32s_mut(target)?)
                .map_err(|e| KernelFault::Malformed(e.to_string()))?;
        }
        (Kernel::Empty, KernelArgs::None) => {
            device.empty_kernel_runs.fetch_add(1, Ordering::Relaxed);
        }
        (Kernel::Trap, KernelArgs::None) => return Err(KernelFault::Trap),
        (kernel, args) => {
            return Err(KernelFault::Malformed(format!(
                "{} does not take {args:?}",
                kernel.name()
            )));
        }
    }
    device.kernels_run.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

fn binding(launch: &CpuLaunch, index: usize) -> Result<&HostSlice, KernelFault> {
    launch.bindings.get(index).ok_or_else(|| {
        KernelFault::Malformed(format!("{} has no binding {index}", launch.kernel.name()))
    })
}

fn f32s(bytes: &[u8]) -> Result<&[f32], KernelFault> {
    bytemuck::try_cast_slice(bytes).map_err(|e| KernelFault::Malformed(e.to_string()))
}

fn f32s_mut(bytes: &mut [u8]) -> Result<&mut [f32], KernelFault> {
    bytemuck::try_cast_slice_mut(bytes).map_err(|e| KernelFault::Malformed(e.to_string()))
}

fn copy(source: &[u8], target: &mut [u8]) -> Result<(), KernelFault> {
    if source.len() != target.len() {
        return Err(KernelFault::Malformed("copy sizes differ".into()));
    }
    target.copy_from_slice(source);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_work_becomes_a_fault() {
        let result: Result<(), _> = caught(|| panic!("index out of bounds"));
        assert_eq!(
            result,
            Err(KernelFault::Panicked("index out of bounds".into()))
        );
    }

    #[test]
    fn a_copy_of_unequal_sizes_is_malformed() {
        assert!(matches!(
            copy(&[1, 2, 3], &mut [0, 0]),
            Err(KernelFault::Malformed(_))
        ));
    }
}

//! How a CUDA driver result is classified: operation-local (the call failed
//! and changed nothing; the context still works) or sticky (the context is
//! unusable until reset: poison it). Unknown codes fail closed, as sticky.
//!
//! A pure function of the numeric `CUresult`, whose values are the driver's
//! stable ABI, so it is tested on machines without CUDA.

use cudarc::driver::DriverError;

use crate::backend::stream::{KernelFault, LaunchError};
use crate::error::ServerError;

/// What a failed driver call means for its context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultClass {
    /// The call failed and changed nothing; the context is healthy.
    OperationLocal,
    /// The context is corrupt (a fault inside a kernel, a lost device, an
    /// unknown code): poison it; only a reset recovers.
    Sticky,
}

/// The class of driver result `code` (a `CUresult`; 0 is success and is
/// never asked about).
pub fn classify(code: u32) -> FaultClass {
    match code {
        // invalid value, out of memory, profiler states
        1 | 2 | 5..=8
        // no binary, invalid image/context/ptx, unsupported ptx or jit absent
        | 200..=202 | 205..=213 | 215..=219 | 221..=225
        // invalid source, file not found, shared-object init, os call
        | 300..=304
        // invalid handle, illegal state, lossy query
        | 400..=402
        // symbol not found, not ready
        | 500 | 600
        // launch out of resources, incompatible texturing, peer access
        | 701 | 703..=705
        // primary context active, too many peers, host memory registration
        | 708 | 711..=713
        // cooperative launch too large, tensor memory leak
        | 720 | 721
        // not permitted, not supported, system not ready, driver mismatch,
        // compatibility, MPS, stream capture, timeouts of a query, graph update
        | 800..=812 | 900..=910 | 912 => FaultClass::OperationLocal,
        // not initialized and deinitialized (3, 4), no or unavailable device
        // (100, 101, 46), ECC / NVLink uncorrectable (214, 220), illegal
        // address (700), launch timeout (702), context destroyed (709),
        // assert, stack, illegal instruction, misaligned, address space,
        // invalid pc, launch failed (710, 714..=719), an external device's fault
        // (911), unknown (999) and every
        // code not listed: the context cannot be trusted.
        _ => FaultClass::Sticky,
    }
}

/// The numeric code of a driver error.
pub(super) fn code(error: &DriverError) -> u32 {
    error.0 as u32
}

/// A driver error as readable text: its name and code.
pub(super) fn describe(error: &DriverError) -> String {
    format!("{:?} ({})", error.0, code(error))
}

/// Whether a driver error is the driver's out-of-memory answer.
pub(super) fn is_out_of_memory(error: &DriverError) -> bool {
    code(error) == 2
}

/// A driver error met in device work on a stream: always a sticky fault
/// there (the stream's later items cannot be trusted after it).
pub(super) fn fault(operation: &str, error: &DriverError) -> KernelFault {
    KernelFault::Device(format!("{operation}: {}", describe(error)))
}

/// A driver error met launching a kernel: a refusal when operation-local
/// (nothing ran), else a sticky fault.
pub(super) fn launch_error(kernel: &str, error: &DriverError) -> LaunchError {
    match classify(code(error)) {
        FaultClass::OperationLocal => LaunchError::Refused(ServerError::KernelLaunchFailed {
            kernel: kernel.to_string(),
            message: describe(error),
        }),
        FaultClass::Sticky => LaunchError::Fault(fault(&format!("launch {kernel}"), error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_inside_kernels_are_sticky() {
        // illegal address, launch timeout, assert, illegal instruction,
        // misaligned address, launch failed (a `__trap()`)
        for code in [700, 702, 710, 715, 716, 719] {
            assert_eq!(classify(code), FaultClass::Sticky, "code {code}");
        }
    }

    #[test]
    fn refusals_that_change_nothing_are_operation_local() {
        // invalid value, out of memory, invalid ptx, unsupported ptx
        // version, not found, launch out of resources, cooperative launch
        // too large, not supported, stream capture unsupported
        for code in [1, 2, 218, 222, 500, 701, 720, 801, 900] {
            assert_eq!(classify(code), FaultClass::OperationLocal, "code {code}");
        }
    }

    #[test]
    fn unknown_and_lost_device_codes_fail_closed() {
        for code in [3, 4, 46, 100, 214, 220, 709, 999, 12345, u32::MAX] {
            assert_eq!(classify(code), FaultClass::Sticky, "code {code}");
        }
    }
}

//! How device work fails on a stream: sticky faults and operation-local
//! refusals.

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::error::ServerError;
use crate::fault::panic_message;

/// A sticky fault raised while running device work: it poisons the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelFault {
    /// The kernel trapped, as the `Trap` kernel does.
    Trap,
    /// The work panicked.
    Panicked(String),
    /// A binding the server's checks should have made impossible (missing,
    /// misaligned, of the wrong length).
    Malformed(String),
    /// The device reported a sticky status (a GPU backend's error code).
    Device(String),
}

impl std::fmt::Display for KernelFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelFault::Trap => f.write_str("the kernel trapped"),
            KernelFault::Panicked(message) => write!(f, "the kernel panicked: {message}"),
            KernelFault::Malformed(message) => write!(f, "malformed launch: {message}"),
            KernelFault::Device(status) => write!(f, "the device failed: {status}"),
        }
    }
}

/// Why a launch did not complete.
#[derive(Clone, Debug, PartialEq)]
pub enum LaunchError {
    /// Sticky: the device is poisoned.
    Fault(KernelFault),
    /// Operation-local: the kernel refused its data and changed nothing;
    /// only its owner and its stream's latch hear of it.
    Refused(ServerError),
}

impl From<KernelFault> for LaunchError {
    fn from(fault: KernelFault) -> Self {
        LaunchError::Fault(fault)
    }
}

/// Why a read did not answer its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadError {
    /// Sticky: the device is poisoned.
    Fault(KernelFault),
    /// Operation-local: this read failed (its staging memory did not map)
    /// and nothing else did; its caller hears `TransferFailed` and may retry.
    Failed(String),
}

impl From<KernelFault> for ReadError {
    fn from(fault: KernelFault) -> Self {
        ReadError::Fault(fault)
    }
}

impl ReadError {
    /// As a sticky fault, for work that has no caller to answer (a write
    /// that reads the bytes around it).
    pub fn into_fault(self) -> KernelFault {
        match self {
            ReadError::Fault(fault) => fault,
            ReadError::Failed(message) => KernelFault::Device(format!("a read failed: {message}")),
        }
    }
}

/// A read inside a launch (LAMB's norms) that fails is sticky: the launch
/// may have changed memory before it.
impl From<ReadError> for LaunchError {
    fn from(error: ReadError) -> Self {
        LaunchError::Fault(error.into_fault())
    }
}

/// Runs `work`, turning a panic inside it into a fault.
pub fn caught<T>(work: impl FnOnce() -> Result<T, KernelFault>) -> Result<T, KernelFault> {
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(result) => result,
        Err(payload) => Err(KernelFault::Panicked(panic_message(payload.as_ref()))),
    }
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
}

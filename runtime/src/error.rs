//! `ServerError`: what the device server answers when a command fails.

use cistern_memory::{DevicePoison, ErrorCode, IoError};
use serde::{Deserialize, Serialize};

/// A failed command, as the device server reports it.
///
/// Serializable; new variants go last (bincode encodes variants by position).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ServerError {
    /// The memory layer failed; the inner error says what to do.
    #[error(transparent)]
    Io(IoError),
    /// A kernel did not compile: never retry; report.
    #[error("kernel {kernel} failed to compile: {message}")]
    KernelCompileFailed {
        /// The kernel's name.
        kernel: String,
        /// The compiler's message.
        message: String,
    },
    /// A kernel could not be launched (not a fault while running, which
    /// poisons): retry the submission once, then report.
    #[error("kernel {kernel} failed to launch: {message}")]
    KernelLaunchFailed {
        /// The kernel's name.
        kernel: String,
        /// The backend's reason, for a report; branch on the variant, not on it.
        message: String,
    },
    /// A host/device transfer failed without poisoning the device: retry it.
    #[error("transfer failed: {message}")]
    TransferFailed {
        /// The backend's reason, for a report; branch on the variant, not on it.
        message: String,
    },
    /// An argument is invalid: fix the call; never retry.
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// What is wrong, naming the argument.
        message: String,
    },
    /// A kernel call is malformed (a binding too small, misaligned or
    /// aliased): fix the call; nothing ran; never retry.
    #[error("invalid program: {message}")]
    InvalidProgram {
        /// What is wrong with the call.
        message: String,
    },
    /// This device cannot do the operation: use another path or device; never retry.
    #[error("unsupported operation: {operation}")]
    UnsupportedOperation {
        /// The operation asked for.
        operation: String,
    },
    /// The device is not present or cannot be opened: pick another device.
    #[error("device {device} unavailable: {reason}")]
    DeviceUnavailable {
        /// The device asked for.
        device: String,
        /// Why it could not be opened.
        reason: String,
    },
    /// The call mixes objects of two devices: fix the call.
    #[error("device mismatch: expected {expected}, found {found}")]
    DeviceMismatch {
        /// The device the command went to.
        expected: String,
        /// The device the object belongs to.
        found: String,
    },
    /// A handle from an older context generation: take fresh handles; do not invalidate.
    #[error(
        "stale handle on device {ordinal}: made in generation {resource_generation}, \
         the context is in generation {current_generation}"
    )]
    StaleGeneration {
        /// The device ordinal.
        ordinal: usize,
        /// The generation the handle was made in.
        resource_generation: u64,
        /// The context's generation now.
        current_generation: u64,
    },
    /// The context is poisoned by a sticky fault: `invalidate` with the
    /// generation you saw, then take fresh handles.
    #[error("{0}")]
    ContextPoisoned(DevicePoison),
    /// The context is being invalidated: retry shortly.
    #[error("device {ordinal} is retiring its context: retry shortly")]
    ContextRetiring {
        /// The device ordinal.
        ordinal: usize,
    },
    /// Recovery failed; the device is unusable for the life of the process:
    /// restart the process.
    #[error("device {ordinal} is unrecoverable: {probe_error}")]
    ContextUnrecoverable {
        /// The device ordinal.
        ordinal: usize,
        /// Why the recovery probe failed.
        probe_error: String,
    },
    /// Another caller is capturing a graph on this device: retry shortly.
    #[error("device {ordinal} is capturing a graph: retry shortly")]
    CaptureInProgress {
        /// The device ordinal.
        ordinal: usize,
    },
    /// The server thread panicked holding device state: reopen the device.
    #[error("device {ordinal} server panicked: {message}")]
    ServerPanicked {
        /// The device ordinal.
        ordinal: usize,
        /// The panic message.
        message: String,
    },
    /// The server has shut down: reopen the device.
    #[error("device {ordinal} server is gone")]
    ServerGone {
        /// The device ordinal.
        ordinal: usize,
    },
    /// CUDA cannot be used in this process (no driver library, an old
    /// driver, a build without the `cuda` feature): use another device. A
    /// CUDA device that is merely absent is `DeviceUnavailable`.
    #[error("CUDA is unavailable: {reason}")]
    CudaUnavailable {
        /// What is missing.
        reason: String,
    },
}

impl From<IoError> for ServerError {
    /// A poisoned `IoError` becomes `ContextPoisoned`, so callers match one variant.
    fn from(error: IoError) -> Self {
        match error {
            IoError::DevicePoisoned(poison) => ServerError::ContextPoisoned(poison),
            other => ServerError::Io(other),
        }
    }
}

impl ServerError {
    /// The catalogue code of this failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            ServerError::Io(io) => io.code(),
            ServerError::KernelCompileFailed { .. } => ErrorCode::KernelCompileFailed,
            ServerError::KernelLaunchFailed { .. } => ErrorCode::DispatchFailed,
            ServerError::TransferFailed { .. } => ErrorCode::TransferFailed,
            ServerError::InvalidArgument { .. } => ErrorCode::InvalidArgument,
            ServerError::InvalidProgram { .. } => ErrorCode::InvalidProgram,
            ServerError::UnsupportedOperation { .. } => ErrorCode::UnsupportedFeature,
            ServerError::DeviceUnavailable { .. } => ErrorCode::UnsupportedFeature,
            ServerError::DeviceMismatch { .. } => ErrorCode::DeviceMismatch,
            ServerError::StaleGeneration { .. } => ErrorCode::StaleHandle,
            ServerError::ContextPoisoned(_) => ErrorCode::DevicePoisoned,
            ServerError::ContextRetiring { .. } | ServerError::CaptureInProgress { .. } => {
                ErrorCode::ContextBusy
            }
            ServerError::ContextUnrecoverable { .. } => ErrorCode::DeviceLost,
            ServerError::ServerPanicked { .. } => ErrorCode::PoisonedLock,
            ServerError::ServerGone { .. } => ErrorCode::ServerGone,
            ServerError::CudaUnavailable { .. } => ErrorCode::UnsupportedFeature,
        }
    }

    /// True for the transient states (retiring, capturing): retry shortly;
    /// they never poison anything.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ServerError::ContextRetiring { .. } | ServerError::CaptureInProgress { .. }
        )
    }

    /// True when the context is poisoned: `invalidate` before using the device.
    pub fn is_device_poisoned(&self) -> bool {
        match self {
            ServerError::ContextPoisoned(_) => true,
            ServerError::Io(io) => io.is_device_poisoned(),
            _ => false,
        }
    }

    /// True when releasing memory (dropping handles, `reclaim`) and retrying
    /// may succeed: the memory layer's out-of-memory family.
    pub fn may_succeed_after_reclaim(&self) -> bool {
        match self {
            ServerError::Io(io) => io.may_succeed_after_reclaim(),
            _ => false,
        }
    }
}

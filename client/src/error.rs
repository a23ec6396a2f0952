//! `BackendError` and `AutodiffError`: the project card's error vocabulary
//! for device and autodiff failures, each variant named for what the caller
//! does about it. `ComputeClient`'s calls return `ServerError`; a caller who
//! wants the card's names converts (`BackendError::from`), keeping the code.

use cistern_memory::{ErrorCode, IoError};
use cistern_runtime::ServerError;
use serde::{Deserialize, Serialize};

use crate::shape::ShapeError;

/// A device failure in the project card's vocabulary.
///
/// No client call returns it: `ComputeClient` returns [`ServerError`], and
/// `BackendError::from(error)` converts any of them with the same
/// [`code`](BackendError::code); `AutodiffError::Backend` and `ErrorReport`
/// carry it; the parameter store (`DeviceParamStore`) returns it. The
/// first eighteen variants are the card's, in its order (among them the
/// store's); the rest keep apart failures a caller handles differently (see
/// `docs/error-codes.md`). Serializable; new variants go last (bincode
/// encodes variants by position).
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, thiserror::Error, Serialize, Deserialize)]
pub enum BackendError {
    /// The CUDA driver or NVRTC library is not installed: use another backend.
    #[error("CUDA is unavailable: {0}")]
    CudaUnavailable(String),
    /// Operands of the wrong shape: fix the call; never retry.
    #[error("shape mismatch: {0}")]
    ShapeMismatch(ShapeError),
    /// Objects of two devices were mixed: fix the call (one device per store).
    #[error("device mismatch: the objects belong to different devices")]
    DeviceMismatch,
    /// The backend could not allocate and said why only in text: drop
    /// handles (reclaim) and retry.
    #[error("device allocation failed: {0}")]
    DeviceAllocationFailed(String),
    /// A kernel could not be submitted (nothing ran): retry once, then report.
    #[error("kernel launch failed: {0}")]
    KernelLaunchFailed(String),
    /// The device is absent or cannot be opened: pick another device.
    #[error("device unavailable: {0}")]
    DeviceUnavailable(String),
    /// A host/device transfer failed without poisoning the device: retry it.
    #[error("transfer failed: {0}")]
    TransferFailed(String),
    /// This device cannot do the operation: use another path or device; never retry.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The parameter store saw a device failure (`cause`, the failure that
    /// latched it) and refuses every call: handle `cause` as it says
    /// (`invalidate` a poisoned device), then rebuild the store from the
    /// last host copy (`sync_to_host`).
    #[error(
        "the parameter store is poisoned by an earlier device failure: {cause}; \
         rebuild it from the last host copy"
    )]
    StorePoisoned {
        /// The device failure that latched the store.
        cause: Box<BackendError>,
    },
    /// A `Var` or forward record from another tape: use the tape the
    /// forward was registered on.
    #[error("the tape does not match the one the forward was registered on")]
    TapeMismatch,
    /// A new forward was registered before the pending one was consumed by
    /// a backward: run backward (or drop the tape) first.
    #[error("a pending forward has not been consumed")]
    PendingForwardUnconsumed,
    /// A step needs a gradient the latest backward did not produce: run
    /// backward through that parameter first.
    #[error("missing gradient: {0}")]
    MissingGradient(String),
    /// An argument is invalid: fix the call; never retry.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A sticky fault poisoned the device context: `invalidate`, then take
    /// fresh handles (and rebuild stores).
    #[error("device context poisoned: {0}")]
    DeviceContextPoisoned(String),
    /// A handle from an older context generation: take fresh handles; do
    /// not invalidate.
    #[error(
        "stale handle on device {ordinal}: made in generation {resource_generation}, \
         the context is in generation {current_generation}"
    )]
    StaleDeviceGeneration {
        /// The device ordinal.
        ordinal: usize,
        /// The generation the handle was made in.
        resource_generation: u64,
        /// The context's generation now.
        current_generation: u64,
    },
    /// The context is being invalidated: retry shortly; nothing was poisoned.
    #[error("device {ordinal} is retiring its context: retry shortly")]
    DeviceContextRetiring {
        /// The device ordinal.
        ordinal: usize,
    },
    /// Recovery failed and the device is unusable for the life of the
    /// process: restart the process.
    #[error("device {ordinal} is unrecoverable: {probe_error}")]
    DeviceContextUnrecoverable {
        /// The device ordinal.
        ordinal: usize,
        /// Why the recovery probe failed.
        probe_error: String,
    },
    /// Another caller is capturing a graph on this device: retry shortly;
    /// nothing was poisoned.
    #[error("device {ordinal} is capturing a graph: retry shortly")]
    DeviceContextCaptureInProgress {
        /// The device ordinal.
        ordinal: usize,
    },
    /// The device has no room now, even after releasing what it could
    /// without waiting: drop handles (reclaim) and retry.
    #[error("out of device memory reserving {size} bytes")]
    OutOfMemory {
        /// Requested bytes.
        size: u64,
    },
    /// The buffer is larger than any page the device can hold and will
    /// never fit: do not retry as is; split it.
    #[error("buffer of {size} bytes is larger than any page the device can hold")]
    BufferTooBig {
        /// Requested bytes.
        size: u64,
    },
    /// A graph is being captured and the request needs a new page: warm
    /// the pools before capturing.
    #[error("reserving {size} bytes needs a new page while capturing")]
    AllocationForbidden {
        /// Requested bytes.
        size: u64,
    },
    /// A freed or unknown handle: a caller bug; do not retry.
    #[error("handle not found: {0}")]
    HandleNotFound(String),
    /// A kernel did not compile: never retry; report.
    #[error("kernel {kernel} failed to compile: {message}")]
    KernelCompileFailed {
        /// The kernel's name.
        kernel: String,
        /// The compiler's message.
        message: String,
    },
    /// A kernel call is malformed (a binding too small, misaligned or
    /// aliased); nothing ran: fix the call; never retry.
    #[error("invalid program: {0}")]
    InvalidProgram(String),
    /// The device server thread panicked holding device state: reopen the device.
    #[error("device {ordinal} server panicked: {message}")]
    ServerPanicked {
        /// The device ordinal.
        ordinal: usize,
        /// The panic message.
        message: String,
    },
    /// The device server has shut down: reopen the device.
    #[error("device {ordinal} server is gone")]
    ServerGone {
        /// The device ordinal.
        ordinal: usize,
    },
    /// Anything else the device reported: report it.
    #[error("unknown device error: {0}")]
    Unknown(String),
}

impl BackendError {
    /// The catalogue code of this failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            BackendError::CudaUnavailable(_)
            | BackendError::DeviceUnavailable(_)
            | BackendError::Unsupported(_) => ErrorCode::UnsupportedFeature,
            BackendError::ShapeMismatch(_)
            | BackendError::TapeMismatch
            | BackendError::PendingForwardUnconsumed
            | BackendError::MissingGradient(_)
            | BackendError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            BackendError::DeviceMismatch => ErrorCode::DeviceMismatch,
            BackendError::DeviceAllocationFailed(_) | BackendError::OutOfMemory { .. } => {
                ErrorCode::DeviceOutOfMemory
            }
            BackendError::KernelLaunchFailed(_) => ErrorCode::DispatchFailed,
            BackendError::TransferFailed(_) => ErrorCode::TransferFailed,
            BackendError::StorePoisoned { .. } => ErrorCode::StorePoisoned,
            BackendError::DeviceContextPoisoned(_) => ErrorCode::DevicePoisoned,
            BackendError::StaleDeviceGeneration { .. } => ErrorCode::StaleHandle,
            BackendError::DeviceContextRetiring { .. }
            | BackendError::DeviceContextCaptureInProgress { .. } => ErrorCode::ContextBusy,
            BackendError::DeviceContextUnrecoverable { .. } => ErrorCode::DeviceLost,
            BackendError::BufferTooBig { .. } => ErrorCode::BufferTooBig,
            BackendError::AllocationForbidden { .. } => ErrorCode::AllocationForbidden,
            BackendError::HandleNotFound(_) => ErrorCode::HandleNotFound,
            BackendError::KernelCompileFailed { .. } => ErrorCode::KernelCompileFailed,
            BackendError::InvalidProgram(_) => ErrorCode::InvalidProgram,
            BackendError::ServerPanicked { .. } => ErrorCode::PoisonedLock,
            BackendError::ServerGone { .. } => ErrorCode::ServerGone,
            BackendError::Unknown(_) => ErrorCode::Unknown,
        }
    }

    /// True for the transient context states (retiring, capturing): retry
    /// shortly. They never poison a store.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            BackendError::DeviceContextRetiring { .. }
                | BackendError::DeviceContextCaptureInProgress { .. }
        )
    }

    /// True when the device context is poisoned: `invalidate` before using
    /// the device again.
    pub fn is_device_poisoned(&self) -> bool {
        matches!(self, BackendError::DeviceContextPoisoned(_))
    }

    /// The context generation a `DeviceContextPoisoned` was poisoned in
    /// (what `invalidate` takes), read from its message; `None` for every
    /// other variant, or a message not made from a `DevicePoison`.
    pub fn poisoned_generation(&self) -> Option<u64> {
        self.poisoned_at().map(|(_, generation)| generation)
    }

    /// The device ordinal a `DeviceContextPoisoned` names, read from its
    /// message; `None` otherwise.
    pub fn poisoned_ordinal(&self) -> Option<usize> {
        self.poisoned_at().map(|(ordinal, _)| ordinal)
    }

    /// `(ordinal, generation)` from `DevicePoison`'s display, `device {o}
    /// poisoned in generation {g} during …`.
    fn poisoned_at(&self) -> Option<(usize, u64)> {
        let BackendError::DeviceContextPoisoned(message) = self else {
            return None;
        };
        let rest = message.strip_prefix("device ")?;
        let (ordinal, rest) = rest.split_once(" poisoned in generation ")?;
        let generation = rest.split(' ').next()?;
        Some((ordinal.parse().ok()?, generation.parse().ok()?))
    }

    /// A store latched by `cause`: what each later call of the store answers.
    pub fn store_poisoned(cause: BackendError) -> Self {
        BackendError::StorePoisoned {
            cause: Box::new(cause),
        }
    }

    /// The device failure that latched a store (`StorePoisoned`); `None`
    /// for every other variant.
    pub fn poison_cause(&self) -> Option<&BackendError> {
        match self {
            BackendError::StorePoisoned { cause } => Some(cause),
            _ => None,
        }
    }

    /// True when releasing memory (dropping handles, `reclaim`) and retrying
    /// may succeed.
    pub fn may_succeed_after_reclaim(&self) -> bool {
        matches!(
            self,
            BackendError::OutOfMemory { .. } | BackendError::DeviceAllocationFailed(_)
        )
    }
}

impl From<ShapeError> for BackendError {
    fn from(error: ShapeError) -> Self {
        BackendError::ShapeMismatch(error)
    }
}

impl From<ServerError> for BackendError {
    /// Keeps the code: `BackendError::from(e).code() == e.code()` for every `e`.
    fn from(error: ServerError) -> Self {
        match error {
            ServerError::Io(io) => from_io(io),
            ServerError::KernelCompileFailed { kernel, message } => {
                BackendError::KernelCompileFailed { kernel, message }
            }
            ServerError::KernelLaunchFailed { kernel, message } => {
                BackendError::KernelLaunchFailed(format!("{kernel}: {message}"))
            }
            ServerError::TransferFailed { message } => BackendError::TransferFailed(message),
            ServerError::InvalidArgument { message } => BackendError::InvalidArgument(message),
            ServerError::InvalidProgram { message } => BackendError::InvalidProgram(message),
            ServerError::UnsupportedOperation { operation } => BackendError::Unsupported(operation),
            ServerError::DeviceUnavailable { device, reason } => {
                BackendError::DeviceUnavailable(format!("{device}: {reason}"))
            }
            // The card's variant holds no fields; `ErrorReport` keeps the
            // `ServerError` with both device names.
            ServerError::DeviceMismatch { .. } => BackendError::DeviceMismatch,
            ServerError::StaleGeneration {
                ordinal,
                resource_generation,
                current_generation,
            } => BackendError::StaleDeviceGeneration {
                ordinal,
                resource_generation,
                current_generation,
            },
            ServerError::ContextPoisoned(poison) => {
                BackendError::DeviceContextPoisoned(poison.to_string())
            }
            ServerError::ContextRetiring { ordinal } => {
                BackendError::DeviceContextRetiring { ordinal }
            }
            ServerError::ContextUnrecoverable {
                ordinal,
                probe_error,
            } => BackendError::DeviceContextUnrecoverable {
                ordinal,
                probe_error,
            },
            ServerError::CaptureInProgress { ordinal } => {
                BackendError::DeviceContextCaptureInProgress { ordinal }
            }
            ServerError::ServerPanicked { ordinal, message } => {
                BackendError::ServerPanicked { ordinal, message }
            }
            ServerError::ServerGone { ordinal } => BackendError::ServerGone { ordinal },
            ServerError::CudaUnavailable { reason } => BackendError::CudaUnavailable(reason),
        }
    }
}

impl From<IoError> for BackendError {
    fn from(error: IoError) -> Self {
        BackendError::from(ServerError::from(error))
    }
}

fn from_io(error: IoError) -> BackendError {
    match error {
        IoError::BufferTooBig { size, .. } => BackendError::BufferTooBig { size },
        // Both clear with a reclaim; the caller does the same for each.
        IoError::OutOfMemory { size, .. } | IoError::PageSizesExhausted { size, .. } => {
            BackendError::OutOfMemory { size }
        }
        IoError::PageUpdateForbidden { size, .. } => BackendError::AllocationForbidden { size },
        unsupported @ (IoError::UnsupportedStrides { .. }
        | IoError::UnsupportedIoOperation { .. }) => {
            BackendError::Unsupported(unsupported.to_string())
        }
        missing @ (IoError::NotFound { .. } | IoError::StorageHandleNotFound { .. }) => {
            BackendError::HandleNotFound(missing.to_string())
        }
        // The source decides what the caller does, as it decides the code.
        IoError::StorageMappingFailed { source, .. } => from_io(*source),
        IoError::DevicePoisoned(poison) => BackendError::DeviceContextPoisoned(poison.to_string()),
        IoError::Unknown { description, .. } => BackendError::Unknown(description),
        refused @ IoError::AllocationFailed { .. } => {
            BackendError::DeviceAllocationFailed(refused.to_string())
        }
    }
}

/// An autodiff failure (recording on a tape, running backward, reading a
/// gradient), in the card's vocabulary.
///
/// Every [`Tape`](crate::Tape) and [`Gradients`](crate::Gradients) call
/// returns it; `ErrorReport` carries it. Serializable; new variants go last
/// (bincode encodes variants by position).
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, thiserror::Error, Serialize, Deserialize)]
pub enum AutodiffError {
    /// The device failed (or a device fault met earlier work of the tape);
    /// the inner error says what to do.
    #[error(transparent)]
    Backend(BackendError),
    /// The `Var` was not recorded on this tape (or the tape was reset): use
    /// a `Var` of this tape.
    #[error("var {var} is not recorded on this tape")]
    UnknownVar {
        /// The var's id on its own tape.
        var: u64,
    },
    /// The operands of a recorded operation do not fit: fix the call.
    #[error("shape mismatch: {0}")]
    ShapeMismatch(ShapeError),
    /// A `Var` (or gradients) of another tape: use values of the tape the
    /// call is made on.
    #[error("the var belongs to another tape")]
    TapeMismatch,
    /// A gradient was asked of a value recorded without tracking
    /// (`var_no_grad`, `detach`, or computed only from such values): make it
    /// with `Tape::var` to get its gradient.
    #[error("gradient tracking is disabled for this var")]
    GradientTrackingDisabled,
    /// An argument is invalid (a loss that is not a scalar, an empty
    /// tensor): fix the call; never retry.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl AutodiffError {
    /// The catalogue code of this failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            AutodiffError::Backend(backend) => backend.code(),
            AutodiffError::UnknownVar { .. } => ErrorCode::HandleNotFound,
            AutodiffError::ShapeMismatch(_)
            | AutodiffError::TapeMismatch
            | AutodiffError::GradientTrackingDisabled
            | AutodiffError::InvalidArgument(_) => ErrorCode::InvalidArgument,
        }
    }
}

/// A tape error where a device error is wanted (a replica's work, a
/// program's own step): its device error, or the same refusal under the
/// device vocabulary.
impl From<AutodiffError> for BackendError {
    fn from(error: AutodiffError) -> Self {
        match error {
            AutodiffError::Backend(error) => error,
            AutodiffError::ShapeMismatch(error) => BackendError::ShapeMismatch(error),
            AutodiffError::TapeMismatch => BackendError::TapeMismatch,
            other => BackendError::InvalidArgument(other.to_string()),
        }
    }
}

impl From<BackendError> for AutodiffError {
    fn from(error: BackendError) -> Self {
        AutodiffError::Backend(error)
    }
}

impl From<ServerError> for AutodiffError {
    /// Through [`BackendError::from`], keeping the code.
    fn from(error: ServerError) -> Self {
        AutodiffError::Backend(BackendError::from(error))
    }
}

impl From<ShapeError> for AutodiffError {
    fn from(error: ShapeError) -> Self {
        AutodiffError::ShapeMismatch(error)
    }
}

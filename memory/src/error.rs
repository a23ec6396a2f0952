//! `IoError` and the values it carries: what the memory layer reports.

use std::cell::Cell;

use serde::{Deserialize, Deserializer, Serialize};

use crate::{BackTrace, ErrorCode};

/// The longest chain of `StorageMappingFailed` sources a decoder accepts.
///
/// Real chains are one or two deep; the bound keeps a crafted input from
/// recursing until the stack overflows.
pub const MAX_SOURCE_DEPTH: usize = 16;

/// Why a handle or storage id could not be found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Reason {
    /// The id was never handed out by this manager.
    UnknownId,
    /// The id was valid once and has been freed.
    AlreadyFreed,
    /// The id belongs to another device.
    OtherDevice,
    /// The storage behind the slice has been released (reclaimed or invalidated).
    StorageReleased,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Reason::UnknownId => "unknown id",
            Reason::AlreadyFreed => "already freed",
            Reason::OtherDevice => "belongs to another device",
            Reason::StorageReleased => "storage released",
        })
    }
}

/// A sticky fault that poisoned a device context.
///
/// The device refuses all work until `invalidate`; memory of this
/// generation is never trusted again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicePoison {
    /// The device ordinal.
    pub ordinal: usize,
    /// The context generation the fault happened in.
    pub generation: u64,
    /// What was running (`"launch fill"`, `"sync"`, ...).
    pub operation: String,
    /// The fault's status text, as the backend reported it.
    pub status: String,
    /// Where the fault was observed.
    pub backtrace: BackTrace,
}

impl std::fmt::Display for DevicePoison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "device {} poisoned in generation {} during {}: {}",
            self.ordinal, self.generation, self.operation, self.status
        )
    }
}

/// A failure of the memory layer: reserving, resolving or mapping device memory.
///
/// Serializable; new variants go last (bincode encodes variants by position).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum IoError {
    /// The buffer is larger than any page the device can hold. It will never
    /// fit: do not retry as is; split it into smaller buffers.
    BufferTooBig {
        /// Requested bytes.
        size: u64,
        /// Where the request was made.
        backtrace: BackTrace,
    },
    /// The device has no room now, even after releasing what could be
    /// released without waiting. Drop handles (or `reclaim`) and retry.
    OutOfMemory {
        /// Requested bytes.
        size: u64,
        /// Where the request was made.
        backtrace: BackTrace,
    },
    /// New pages are forbidden (a graph is being captured) and the request
    /// does not fit in the pages held. Warm the pools before capturing.
    PageUpdateForbidden {
        /// Requested bytes.
        size: u64,
        /// Where the request was made.
        backtrace: BackTrace,
    },
    /// The request would need one more distinct page size than the pools
    /// allow. `reclaim` frees unused sizes; then retry.
    PageSizesExhausted {
        /// Requested bytes.
        size: u64,
        /// Where the request was made.
        backtrace: BackTrace,
    },
    /// This backend cannot do the requested stride pattern: use a contiguous
    /// copy or another device.
    UnsupportedStrides {
        /// Where the request was made.
        backtrace: BackTrace,
    },
    /// The allocation id is unknown or already freed: a caller bug; do not retry.
    NotFound {
        /// Where the lookup was made.
        backtrace: BackTrace,
        /// Why it was not found.
        reason: Reason,
    },
    /// The storage behind the slice is gone: the handle outlived its memory,
    /// a caller bug (the same class as `NotFound`). Do not retry it; take
    /// fresh handles.
    StorageHandleNotFound {
        /// Why it was not found.
        reason: Reason,
        /// Where the lookup was made.
        backtrace: BackTrace,
    },
    /// Backing a dry-run reservation on first use failed; `source` says why
    /// and decides what to do (reclaim and retry if it is an out-of-memory).
    StorageMappingFailed {
        /// Bytes that were being backed.
        size: u64,
        /// The failure of the storage allocation.
        #[serde(deserialize_with = "deserialize_source")]
        source: Box<IoError>,
        /// Where the mapping was attempted.
        backtrace: BackTrace,
    },
    /// The device context is poisoned: invalidate it, then take fresh handles.
    DevicePoisoned(DevicePoison),
    /// Anything else the storage reported: report it.
    Unknown {
        /// What the storage said.
        description: String,
        /// Where it was seen.
        backtrace: BackTrace,
    },
    /// The storage cannot do this operation at all: use another path; never retry.
    UnsupportedIoOperation {
        /// Where the request was made.
        backtrace: BackTrace,
    },
    /// The device refused an allocation or mapping for a reason other than
    /// exhaustion (a driver refusal, a failed map): release memory
    /// (`reclaim`) and retry once, then report it.
    AllocationFailed {
        /// Requested bytes.
        size: u64,
        /// What the device said.
        reason: String,
        /// Where the request was made.
        backtrace: BackTrace,
    },
}

impl std::fmt::Display for IoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IoError::BufferTooBig { size, .. } => write!(
                f,
                "buffer of {size} bytes is larger than any page the device can hold"
            ),
            IoError::OutOfMemory { size, .. } => write!(f, "out of memory reserving {size} bytes"),
            IoError::PageUpdateForbidden { size, .. } => write!(
                f,
                "reserving {size} bytes needs a new page, which the policy forbids"
            ),
            IoError::PageSizesExhausted { size, .. } => write!(
                f,
                "reserving {size} bytes needs a page size beyond the configured maximum"
            ),
            IoError::UnsupportedStrides { .. } => {
                f.write_str("the backend does not support this stride pattern")
            }
            IoError::NotFound { reason, .. } => write!(f, "allocation not found: {reason}"),
            IoError::StorageHandleNotFound { reason, .. } => {
                write!(f, "storage handle not found: {reason}")
            }
            IoError::StorageMappingFailed { size, .. } => {
                write!(f, "mapping storage for {size} bytes failed")
            }
            IoError::DevicePoisoned(poison) => write!(f, "{poison}"),
            IoError::Unknown { description, .. } => {
                write!(f, "unknown memory error: {description}")
            }
            IoError::UnsupportedIoOperation { .. } => {
                f.write_str("the storage does not support this I/O operation")
            }
            IoError::AllocationFailed { size, reason, .. } => {
                write!(f, "the device refused {size} bytes: {reason}")
            }
        }
    }
}

// Written out rather than derived: thiserror would report the `Box` as the
// source, and a caller's `downcast_ref::<IoError>()` on it would fail.
impl std::error::Error for IoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            IoError::StorageMappingFailed { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

impl From<DevicePoison> for IoError {
    fn from(poison: DevicePoison) -> Self {
        IoError::DevicePoisoned(poison)
    }
}

impl IoError {
    /// `BufferTooBig` with a captured backtrace.
    pub fn buffer_too_big(size: u64) -> Self {
        IoError::BufferTooBig {
            size,
            backtrace: BackTrace::capture(),
        }
    }

    /// `OutOfMemory` with a captured backtrace.
    pub fn out_of_memory(size: u64) -> Self {
        IoError::OutOfMemory {
            size,
            backtrace: BackTrace::capture(),
        }
    }

    /// `PageUpdateForbidden` with a captured backtrace.
    pub fn page_update_forbidden(size: u64) -> Self {
        IoError::PageUpdateForbidden {
            size,
            backtrace: BackTrace::capture(),
        }
    }

    /// `PageSizesExhausted` with a captured backtrace.
    pub fn page_sizes_exhausted(size: u64) -> Self {
        IoError::PageSizesExhausted {
            size,
            backtrace: BackTrace::capture(),
        }
    }

    /// `NotFound` with a captured backtrace.
    pub fn not_found(reason: Reason) -> Self {
        IoError::NotFound {
            backtrace: BackTrace::capture(),
            reason,
        }
    }

    /// `StorageHandleNotFound` with a captured backtrace.
    pub fn storage_handle_not_found(reason: Reason) -> Self {
        IoError::StorageHandleNotFound {
            reason,
            backtrace: BackTrace::capture(),
        }
    }

    /// `StorageMappingFailed` wrapping `source`, with a captured backtrace.
    pub fn storage_mapping_failed(size: u64, source: IoError) -> Self {
        IoError::StorageMappingFailed {
            size,
            source: Box::new(source),
            backtrace: BackTrace::capture(),
        }
    }

    /// `UnsupportedStrides` with a captured backtrace.
    pub fn unsupported_strides() -> Self {
        IoError::UnsupportedStrides {
            backtrace: BackTrace::capture(),
        }
    }

    /// `UnsupportedIoOperation` with a captured backtrace.
    pub fn unsupported_io_operation() -> Self {
        IoError::UnsupportedIoOperation {
            backtrace: BackTrace::capture(),
        }
    }

    /// `AllocationFailed` of `size` bytes for `reason`, with a captured backtrace.
    pub fn allocation_failed(size: u64, reason: impl Into<String>) -> Self {
        IoError::AllocationFailed {
            size,
            reason: reason.into(),
            backtrace: BackTrace::capture(),
        }
    }

    /// `Unknown` with a captured backtrace.
    pub fn unknown(description: impl Into<String>) -> Self {
        IoError::Unknown {
            description: description.into(),
            backtrace: BackTrace::capture(),
        }
    }

    /// True when the device context is poisoned (directly, or as the source
    /// of a failed mapping): invalidate before using the device again.
    pub fn is_device_poisoned(&self) -> bool {
        match self {
            IoError::DevicePoisoned(_) => true,
            IoError::StorageMappingFailed { source, .. } => source.is_device_poisoned(),
            _ => false,
        }
    }

    /// True when releasing memory (dropping handles, `reclaim`) and retrying
    /// may succeed.
    pub fn may_succeed_after_reclaim(&self) -> bool {
        match self {
            IoError::OutOfMemory { .. }
            | IoError::PageSizesExhausted { .. }
            | IoError::AllocationFailed { .. } => true,
            IoError::StorageMappingFailed { source, .. } => source.may_succeed_after_reclaim(),
            _ => false,
        }
    }

    /// The catalogue code of this failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            IoError::BufferTooBig { .. } => ErrorCode::BufferTooBig,
            IoError::OutOfMemory { .. }
            | IoError::PageSizesExhausted { .. }
            | IoError::AllocationFailed { .. } => ErrorCode::DeviceOutOfMemory,
            IoError::PageUpdateForbidden { .. } => ErrorCode::AllocationForbidden,
            IoError::UnsupportedStrides { .. } | IoError::UnsupportedIoOperation { .. } => {
                ErrorCode::UnsupportedFeature
            }
            IoError::NotFound { .. } | IoError::StorageHandleNotFound { .. } => {
                ErrorCode::HandleNotFound
            }
            IoError::StorageMappingFailed { source, .. } => source.code(),
            IoError::DevicePoisoned(_) => ErrorCode::DevicePoisoned,
            IoError::Unknown { .. } => ErrorCode::Unknown,
        }
    }

    /// The backtrace of where this error was made.
    pub fn backtrace(&self) -> &BackTrace {
        match self {
            IoError::BufferTooBig { backtrace, .. }
            | IoError::OutOfMemory { backtrace, .. }
            | IoError::PageUpdateForbidden { backtrace, .. }
            | IoError::PageSizesExhausted { backtrace, .. }
            | IoError::UnsupportedStrides { backtrace }
            | IoError::NotFound { backtrace, .. }
            | IoError::StorageHandleNotFound { backtrace, .. }
            | IoError::StorageMappingFailed { backtrace, .. }
            | IoError::Unknown { backtrace, .. }
            | IoError::AllocationFailed { backtrace, .. }
            | IoError::UnsupportedIoOperation { backtrace } => backtrace,
            IoError::DevicePoisoned(poison) => &poison.backtrace,
        }
    }
}

thread_local! {
    static SOURCE_DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Decodes the boxed source of a `StorageMappingFailed`, refusing chains
/// deeper than [`MAX_SOURCE_DEPTH`].
fn deserialize_source<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Box<IoError>, D::Error> {
    struct Level;
    impl Drop for Level {
        fn drop(&mut self) {
            SOURCE_DEPTH.with(|depth| depth.set(depth.get().saturating_sub(1)));
        }
    }
    let depth = SOURCE_DEPTH.with(|depth| {
        depth.set(depth.get() + 1);
        depth.get()
    });
    // Dropped on every exit, error paths included, so the count stays balanced.
    let _level = Level;
    if depth > MAX_SOURCE_DEPTH {
        return Err(serde::de::Error::custom(format_args!(
            "StorageMappingFailed sources nested deeper than {MAX_SOURCE_DEPTH}"
        )));
    }
    IoError::deserialize(deserializer).map(Box::new)
}

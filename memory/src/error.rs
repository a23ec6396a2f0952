//! `IoError` and the values it carries: what the memory layer reports.

use serde::{Deserialize, Serialize};

use crate::{BackTrace, ErrorCode};

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
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum IoError {
    /// The buffer is larger than any page the device can hold. It will never
    /// fit: do not retry as is; split it into smaller buffers.
    #[error("buffer of {size} bytes is larger than any page the device can hold")]
    BufferTooBig {
        /// Requested bytes.
        size: u64,
        /// Where the request was made.
        backtrace: BackTrace,
    },
    /// The device has no room now, even after releasing what could be
    /// released without waiting. Drop handles (or `reclaim`) and retry.
    #[error("out of memory reserving {size} bytes")]
    OutOfMemory {
        /// Requested bytes.
        size: u64,
        /// Where the request was made.
        backtrace: BackTrace,
    },
    /// New pages are forbidden (a graph is being captured) and the request
    /// does not fit in the pages held. Warm the pools before capturing.
    #[error("reserving {size} bytes needs a new page, which the policy forbids")]
    PageUpdateForbidden {
        /// Requested bytes.
        size: u64,
        /// Where the request was made.
        backtrace: BackTrace,
    },
    /// The request would need one more distinct page size than the pools
    /// allow. `reclaim` frees unused sizes; then retry.
    #[error("reserving {size} bytes needs a page size beyond the configured maximum")]
    PageSizesExhausted {
        /// Requested bytes.
        size: u64,
        /// Where the request was made.
        backtrace: BackTrace,
    },
    /// This backend cannot do the requested stride pattern: use a contiguous
    /// copy or another device.
    #[error("the backend does not support this stride pattern")]
    UnsupportedStrides {
        /// Where the request was made.
        backtrace: BackTrace,
    },
    /// The allocation id is unknown or already freed: a caller bug; do not retry.
    #[error("allocation not found: {reason}")]
    NotFound {
        /// Where the lookup was made.
        backtrace: BackTrace,
        /// Why it was not found.
        reason: Reason,
    },
    /// The storage behind the slice is gone (reclaimed, or released by an
    /// invalidate): take fresh handles.
    #[error("storage handle not found: {reason}")]
    StorageHandleNotFound {
        /// Why it was not found.
        reason: Reason,
        /// Where the lookup was made.
        backtrace: BackTrace,
    },
    /// Backing a dry-run reservation on first use failed; `source` says why
    /// and decides what to do (reclaim and retry if it is an out-of-memory).
    #[error("mapping storage for {size} bytes failed")]
    StorageMappingFailed {
        /// Bytes that were being backed.
        size: u64,
        /// The failure of the storage allocation.
        source: Box<IoError>,
        /// Where the mapping was attempted.
        backtrace: BackTrace,
    },
    /// The device context is poisoned: invalidate it, then take fresh handles.
    #[error("{0}")]
    DevicePoisoned(DevicePoison),
    /// Anything else the storage reported: report it.
    #[error("unknown memory error: {description}")]
    Unknown {
        /// What the storage said.
        description: String,
        /// Where it was seen.
        backtrace: BackTrace,
    },
    /// The storage cannot do this operation at all: use another path; never retry.
    #[error("the storage does not support this I/O operation")]
    UnsupportedIoOperation {
        /// Where the request was made.
        backtrace: BackTrace,
    },
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
            IoError::OutOfMemory { .. } | IoError::PageSizesExhausted { .. } => true,
            IoError::StorageMappingFailed { source, .. } => source.may_succeed_after_reclaim(),
            _ => false,
        }
    }

    /// The catalogue code of this failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            IoError::BufferTooBig { .. } => ErrorCode::BufferTooBig,
            IoError::OutOfMemory { .. } | IoError::PageSizesExhausted { .. } => {
                ErrorCode::DeviceOutOfMemory
            }
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
            | IoError::UnsupportedIoOperation { backtrace } => backtrace,
            IoError::DevicePoisoned(poison) => &poison.backtrace,
        }
    }
}

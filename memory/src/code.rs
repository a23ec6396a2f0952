//! `ErrorCode`: the stable, append-only catalogue every Cistern error maps to.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What kind of failure an error is, with an id that never changes.
///
/// Serialized as its stable id (a `u32`). Ids are append-only; the catalogue
/// with what a caller should do for each code is `docs/error-codes.md`.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The device has no room now: drop handles (reclaim) and retry.
    DeviceOutOfMemory,
    /// The operation is not supported here: use another path or device; never retry.
    UnsupportedFeature,
    /// A server or executor thread panicked holding device state: reopen the device.
    PoisonedLock,
    /// A kernel failed to compile: never retry; report.
    KernelCompileFailed,
    /// A submission failed: retry it once, then report.
    DispatchFailed,
    /// The kernel call is malformed (bindings, sizes): fix it; never retry.
    InvalidProgram,
    /// A cooperative launch does not fit: fall back to the non-cooperative path.
    CooperativeResidencyExceeded,
    /// The context is unrecoverable or gone: restart the process.
    DeviceLost,
    /// The device context is poisoned: invalidate, then take fresh handles.
    DevicePoisoned,
    /// The buffer can never fit: never retry as is; split it.
    BufferTooBig,
    /// Capturing forbids new pages: warm the pools before capturing.
    AllocationForbidden,
    /// A handle from an older context generation: take fresh handles; do not invalidate.
    StaleHandle,
    /// The context is retiring or capturing: retry shortly.
    ContextBusy,
    /// An argument is invalid: fix the call; never retry.
    InvalidArgument,
    /// A freed or unknown handle: a caller bug.
    HandleNotFound,
    /// A transfer failed: retry the transfer.
    TransferFailed,
    /// The parameter store refuses all calls: rebuild it from the last host copy.
    StorePoisoned,
    /// The device server ended: reopen the device.
    ServerGone,
    /// Objects of two devices were mixed: fix the call (one device per store).
    DeviceMismatch,
    /// A peer of a replica group died, hung past the group's timeout or
    /// failed its step: the run cannot go on; restart the job.
    PeerLost,
    /// Anything else: report it.
    Unknown,
}

impl ErrorCode {
    /// Every code, in catalogue order.
    pub const ALL: [ErrorCode; 21] = [
        ErrorCode::DeviceOutOfMemory,
        ErrorCode::UnsupportedFeature,
        ErrorCode::PoisonedLock,
        ErrorCode::KernelCompileFailed,
        ErrorCode::DispatchFailed,
        ErrorCode::InvalidProgram,
        ErrorCode::CooperativeResidencyExceeded,
        ErrorCode::DeviceLost,
        ErrorCode::DevicePoisoned,
        ErrorCode::BufferTooBig,
        ErrorCode::AllocationForbidden,
        ErrorCode::StaleHandle,
        ErrorCode::ContextBusy,
        ErrorCode::InvalidArgument,
        ErrorCode::HandleNotFound,
        ErrorCode::TransferFailed,
        ErrorCode::StorePoisoned,
        ErrorCode::ServerGone,
        ErrorCode::DeviceMismatch,
        ErrorCode::PeerLost,
        ErrorCode::Unknown,
    ];

    /// The id this code is stored and reported under; it never changes.
    pub const fn stable_id(self) -> u32 {
        match self {
            ErrorCode::DeviceOutOfMemory => 1001,
            ErrorCode::UnsupportedFeature => 1002,
            ErrorCode::PoisonedLock => 1003,
            ErrorCode::KernelCompileFailed => 1004,
            ErrorCode::DispatchFailed => 1005,
            ErrorCode::InvalidProgram => 1006,
            ErrorCode::CooperativeResidencyExceeded => 1007,
            ErrorCode::DeviceLost => 1008,
            ErrorCode::DevicePoisoned => 1009,
            ErrorCode::BufferTooBig => 1010,
            ErrorCode::AllocationForbidden => 1011,
            ErrorCode::StaleHandle => 1012,
            ErrorCode::ContextBusy => 1013,
            ErrorCode::InvalidArgument => 1014,
            ErrorCode::HandleNotFound => 1015,
            ErrorCode::TransferFailed => 1016,
            ErrorCode::StorePoisoned => 1017,
            ErrorCode::ServerGone => 1018,
            ErrorCode::DeviceMismatch => 1019,
            ErrorCode::PeerLost => 1020,
            ErrorCode::Unknown => 1999,
        }
    }

    /// The code with this stable id, if the catalogue has one.
    pub fn from_stable_id(id: u32) -> Option<ErrorCode> {
        ErrorCode::ALL
            .into_iter()
            .find(|code| code.stable_id() == id)
    }

    /// The code's name as written in the catalogue (`"DeviceOutOfMemory"`).
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::DeviceOutOfMemory => "DeviceOutOfMemory",
            ErrorCode::UnsupportedFeature => "UnsupportedFeature",
            ErrorCode::PoisonedLock => "PoisonedLock",
            ErrorCode::KernelCompileFailed => "KernelCompileFailed",
            ErrorCode::DispatchFailed => "DispatchFailed",
            ErrorCode::InvalidProgram => "InvalidProgram",
            ErrorCode::CooperativeResidencyExceeded => "CooperativeResidencyExceeded",
            ErrorCode::DeviceLost => "DeviceLost",
            ErrorCode::DevicePoisoned => "DevicePoisoned",
            ErrorCode::BufferTooBig => "BufferTooBig",
            ErrorCode::AllocationForbidden => "AllocationForbidden",
            ErrorCode::StaleHandle => "StaleHandle",
            ErrorCode::ContextBusy => "ContextBusy",
            ErrorCode::InvalidArgument => "InvalidArgument",
            ErrorCode::HandleNotFound => "HandleNotFound",
            ErrorCode::TransferFailed => "TransferFailed",
            ErrorCode::StorePoisoned => "StorePoisoned",
            ErrorCode::ServerGone => "ServerGone",
            ErrorCode::DeviceMismatch => "DeviceMismatch",
            ErrorCode::PeerLost => "PeerLost",
            ErrorCode::Unknown => "Unknown",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.stable_id())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u32(self.stable_id())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let id = u32::deserialize(deserializer)?;
        ErrorCode::from_stable_id(id)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown error code id {id}")))
    }
}

//! Why a run stopped: a device error (reported with its stable code and
//! what to do about it) or a usage error (a message).

use cistern_client::{AutodiffError, BackendError, ErrorCode, ReportedError};
use cistern_parallel::GroupError;
use cistern_runtime::ServerError;

/// A failed run.
#[derive(Debug)]
pub enum Failure {
    /// The device (or the runtime on it) refused or failed.
    Device(ReportedError),
    /// The arguments or the data: the message says what to change.
    Usage(String),
    /// The replica group failed or ended (a replica's device, a lost peer).
    Group(GroupError),
}

impl Failure {
    /// The line printed for it: for a device error, its code, stable id,
    /// message and what to do.
    pub fn describe(&self) -> String {
        match self {
            Failure::Usage(message) => message.clone(),
            Failure::Group(error) => {
                let code = error.code();
                format!(
                    "group error {} ({}): {error}; what to do: {}",
                    code.name(),
                    code.stable_id(),
                    what_to_do(code)
                )
            }
            Failure::Device(error) => {
                let code = error.code();
                format!(
                    "device error {} ({}): {}; what to do: {}",
                    code.name(),
                    code.stable_id(),
                    error.as_error(),
                    what_to_do(code)
                )
            }
        }
    }
}

impl From<ServerError> for Failure {
    fn from(error: ServerError) -> Self {
        Failure::Device(ReportedError::Server(error))
    }
}

impl From<AutodiffError> for Failure {
    fn from(error: AutodiffError) -> Self {
        match error {
            AutodiffError::InvalidArgument(message) => Failure::Usage(message),
            error => Failure::Device(ReportedError::Autodiff(error)),
        }
    }
}

impl From<BackendError> for Failure {
    fn from(error: BackendError) -> Self {
        match error {
            BackendError::InvalidArgument(message) => Failure::Usage(message),
            error => Failure::Device(ReportedError::Backend(error)),
        }
    }
}

impl From<GroupError> for Failure {
    fn from(error: GroupError) -> Self {
        match error {
            GroupError::InvalidArgument(message) => Failure::Usage(message),
            error => Failure::Group(error),
        }
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure::Usage(message)
    }
}

/// What a user of the command line should do, per code (the catalogue's
/// advice, `docs/error-codes.md`, said for someone running `cistern`).
pub fn what_to_do(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::DeviceOutOfMemory => "use a smaller --batch or --layers, or another device",
        ErrorCode::BufferTooBig => "use a smaller --batch or --layers: the buffer never fits",
        ErrorCode::UnsupportedFeature => "use another --device or option; retrying will not help",
        ErrorCode::DevicePoisoned | ErrorCode::StorePoisoned => {
            "the device faulted: run again (the run restarts the device)"
        }
        ErrorCode::DeviceLost | ErrorCode::ServerGone | ErrorCode::PoisonedLock => {
            "the device is gone for this process: run again"
        }
        ErrorCode::ContextBusy | ErrorCode::DispatchFailed | ErrorCode::TransferFailed => {
            "a transient failure: run again"
        }
        ErrorCode::InvalidArgument | ErrorCode::InvalidProgram => {
            "check the options (--lr, --layers, --batch); if they are sane, report it"
        }
        ErrorCode::PeerLost => {
            "a rank of the group was lost: restart the job (from a --save'd model)"
        }
        _ => "report it, with the --telemetry file",
    }
}

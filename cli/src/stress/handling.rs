//! What a stress client does about each error, decided from what the
//! error says of itself (`code()`, `is_transient()`, `is_device_poisoned()`,
//! `may_succeed_after_reclaim()`), never from its message: the client's
//! `ServerError`s ([`handling`]) and its parameter store's `BackendError`s
//! ([`store_handling`]) alike.

use cistern_client::{BackendError, ErrorCode};
use cistern_runtime::ServerError;

/// The handling an error asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handling {
    /// No room now: release memory (drop this client's buffers, reclaim),
    /// then retry or back off.
    Release,
    /// The request can never fit as is: split it.
    Split,
    /// A capture reservation did not fit the pages held: abort the capture
    /// (drop its guard); the next one may find the pools warmer.
    AbortCapture,
    /// The context is retiring or capturing: retry shortly.
    RetryShortly,
    /// A transfer or submission failed without harm: retry it (a few times).
    Retry,
    /// The context is poisoned in `generation`: invalidate with it, drop
    /// every handle of that generation, take fresh ones.
    Recover {
        /// The generation the poison was seen in.
        generation: u64,
    },
    /// A handle of an older generation was refused: drop it and every other
    /// handle older than `current`; do not invalidate.
    DropStale {
        /// The context's generation now.
        current: u64,
    },
    /// The parameter store is latched (`StorePoisoned`): drop it, and
    /// rebuild it from its last good values once the context is active.
    Rebuild,
    /// The device is gone for this process (unrecoverable, server ended or
    /// panicked): stop this client.
    Stop,
    /// The call was wrong (argument, program, unknown handle, mismatch, or a
    /// code this tool does not expect): a bug in the tool or the runtime;
    /// count it and move on.
    Unexpected,
}

/// The handling `error` asks for.
pub fn handling(error: &ServerError) -> Handling {
    if error.is_device_poisoned() {
        return match poisoned_generation(error) {
            Some(generation) => Handling::Recover { generation },
            None => Handling::Unexpected,
        };
    }
    if error.is_transient() {
        return Handling::RetryShortly;
    }
    if error.may_succeed_after_reclaim() {
        return Handling::Release;
    }
    match error.code() {
        ErrorCode::BufferTooBig => Handling::Split,
        ErrorCode::AllocationForbidden => Handling::AbortCapture,
        ErrorCode::TransferFailed | ErrorCode::DispatchFailed => Handling::Retry,
        ErrorCode::StaleHandle => match error {
            ServerError::StaleGeneration {
                current_generation, ..
            } => Handling::DropStale {
                current: *current_generation,
            },
            _ => Handling::Unexpected,
        },
        ErrorCode::ContextBusy => Handling::RetryShortly,
        ErrorCode::DeviceLost | ErrorCode::ServerGone | ErrorCode::PoisonedLock => Handling::Stop,
        _ => Handling::Unexpected,
    }
}

/// The handling a parameter store's `error` asks for: the same as the
/// `ServerError` with its code, and `Rebuild` for a latched store. The
/// store is small and steps with valid configs and finite moments, so an
/// argument error, a too-big buffer or a forbidden reservation is a bug.
pub fn store_handling(error: &BackendError) -> Handling {
    if error.is_device_poisoned() {
        return match error.poisoned_generation() {
            Some(generation) => Handling::Recover { generation },
            None => Handling::Unexpected,
        };
    }
    if error.is_transient() {
        return Handling::RetryShortly;
    }
    if error.may_succeed_after_reclaim() {
        return Handling::Release;
    }
    match error {
        BackendError::StorePoisoned { .. } => Handling::Rebuild,
        BackendError::TransferFailed(_) | BackendError::KernelLaunchFailed(_) => Handling::Retry,
        BackendError::StaleDeviceGeneration {
            current_generation, ..
        } => Handling::DropStale {
            current: *current_generation,
        },
        BackendError::DeviceContextUnrecoverable { .. }
        | BackendError::ServerGone { .. }
        | BackendError::ServerPanicked { .. } => Handling::Stop,
        _ => Handling::Unexpected,
    }
}

/// The generation a poisoned error names.
fn poisoned_generation(error: &ServerError) -> Option<u64> {
    match error {
        ServerError::ContextPoisoned(poison) => Some(poison.generation),
        ServerError::Io(cistern_memory::IoError::DevicePoisoned(poison)) => Some(poison.generation),
        ServerError::Io(cistern_memory::IoError::StorageMappingFailed { source, .. }) => {
            poisoned_generation(&ServerError::Io((**source).clone()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use cistern_memory::{BackTrace, DevicePoison, IoError, Reason};

    use super::*;

    fn poison(generation: u64) -> DevicePoison {
        DevicePoison {
            ordinal: 0,
            generation,
            operation: "launch trap".into(),
            status: "trap".into(),
            backtrace: BackTrace::none(),
        }
    }

    #[test]
    fn each_error_gets_the_handling_its_catalogue_entry_asks_for() {
        let cases = [
            (
                ServerError::from(IoError::out_of_memory(8)),
                Handling::Release,
            ),
            (
                ServerError::from(IoError::page_sizes_exhausted(8)),
                Handling::Release,
            ),
            (
                ServerError::from(IoError::buffer_too_big(8)),
                Handling::Split,
            ),
            (
                ServerError::ContextRetiring { ordinal: 0 },
                Handling::RetryShortly,
            ),
            (
                ServerError::CaptureInProgress { ordinal: 0 },
                Handling::RetryShortly,
            ),
            (
                ServerError::from(IoError::page_update_forbidden(8)),
                Handling::AbortCapture,
            ),
            (
                ServerError::TransferFailed {
                    message: "x".into(),
                },
                Handling::Retry,
            ),
            (
                ServerError::ContextPoisoned(poison(3)),
                Handling::Recover { generation: 3 },
            ),
            (
                ServerError::Io(IoError::DevicePoisoned(poison(2))),
                Handling::Recover { generation: 2 },
            ),
            (
                ServerError::StaleGeneration {
                    ordinal: 0,
                    resource_generation: 1,
                    current_generation: 2,
                },
                Handling::DropStale { current: 2 },
            ),
            (
                ServerError::ContextUnrecoverable {
                    ordinal: 0,
                    probe_error: "x".into(),
                },
                Handling::Stop,
            ),
            (ServerError::ServerGone { ordinal: 0 }, Handling::Stop),
            (
                ServerError::from(IoError::not_found(Reason::AlreadyFreed)),
                Handling::Unexpected,
            ),
            (
                ServerError::InvalidProgram {
                    message: "x".into(),
                },
                Handling::Unexpected,
            ),
        ];
        for (error, expected) in cases {
            assert_eq!(handling(&error), expected, "{error:?}");
        }
    }

    #[test]
    fn each_store_error_gets_the_handling_of_its_server_error_or_a_rebuild() {
        let server_errors = [
            ServerError::from(IoError::out_of_memory(8)),
            ServerError::ContextRetiring { ordinal: 0 },
            ServerError::CaptureInProgress { ordinal: 0 },
            ServerError::TransferFailed {
                message: "x".into(),
            },
            ServerError::ContextPoisoned(poison(4)),
            ServerError::StaleGeneration {
                ordinal: 0,
                resource_generation: 1,
                current_generation: 2,
            },
            ServerError::ServerGone { ordinal: 0 },
            ServerError::InvalidProgram {
                message: "x".into(),
            },
        ];
        for error in server_errors {
            let store_error = BackendError::from(error.clone());
            assert_eq!(store_handling(&store_error), handling(&error), "{error:?}");
        }
        assert_eq!(
            store_handling(&BackendError::store_poisoned(BackendError::Unknown(
                "trap".into()
            ))),
            Handling::Rebuild
        );
        for bug in [
            BackendError::InvalidArgument("lr".into()),
            BackendError::MissingGradient("slot 0".into()),
            BackendError::TapeMismatch,
            BackendError::DeviceContextPoisoned("not a poison's message".into()),
        ] {
            assert_eq!(store_handling(&bug), Handling::Unexpected, "{bug:?}");
        }
    }

    #[test]
    fn a_poison_behind_a_failed_mapping_is_recovered() {
        let error = ServerError::Io(IoError::storage_mapping_failed(
            64,
            IoError::DevicePoisoned(poison(5)),
        ));
        assert_eq!(handling(&error), Handling::Recover { generation: 5 });
    }
}

//! `ErrorReport`: one failure as a self-contained, serializable record for
//! logs and telemetry files.

use std::error::Error;
use std::io::{Read, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use cistern_memory::{BackTrace, ErrorCode, IoError};
use cistern_runtime::ServerError;
use serde::{Deserialize, Serialize};

use crate::codec::{self, CodecError};
use crate::error::{AutodiffError, BackendError};

/// The error a report carries, as the layer that raised it typed it.
///
/// Serializable; new variants go last.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ReportedError {
    /// A memory-layer failure.
    Io(IoError),
    /// A device-server failure.
    Server(ServerError),
    /// A device failure in the card's vocabulary (`BackendError`).
    Backend(BackendError),
    /// An autodiff failure.
    Autodiff(AutodiffError),
}

impl ReportedError {
    /// The catalogue code of the carried error.
    pub fn code(&self) -> ErrorCode {
        match self {
            ReportedError::Io(error) => error.code(),
            ReportedError::Server(error) => error.code(),
            ReportedError::Backend(error) => error.code(),
            ReportedError::Autodiff(error) => error.code(),
        }
    }

    /// The carried error, to walk its `source()` chain.
    pub fn as_error(&self) -> &(dyn Error + 'static) {
        match self {
            ReportedError::Io(error) => error,
            ReportedError::Server(error) => error,
            ReportedError::Backend(error) => error,
            ReportedError::Autodiff(error) => error,
        }
    }

    /// The backtrace the error itself carries, if it carries one.
    fn backtrace(&self) -> Option<&BackTrace> {
        match self {
            ReportedError::Io(error) => Some(error.backtrace()),
            ReportedError::Server(ServerError::Io(error)) => Some(error.backtrace()),
            ReportedError::Server(ServerError::ContextPoisoned(poison)) => Some(&poison.backtrace),
            _ => None,
        }
    }

    /// The device ordinal and context generation the error names, if any
    /// (a latched store's, those its cause names).
    fn device(&self) -> (Option<usize>, Option<u64>) {
        if let ReportedError::Backend(BackendError::StorePoisoned { cause })
        | ReportedError::Autodiff(AutodiffError::Backend(BackendError::StorePoisoned {
            cause,
        })) = self
        {
            return ReportedError::Backend((**cause).clone()).device();
        }
        let poison = match self {
            ReportedError::Io(IoError::DevicePoisoned(poison))
            | ReportedError::Server(ServerError::Io(IoError::DevicePoisoned(poison)))
            | ReportedError::Server(ServerError::ContextPoisoned(poison)) => Some(poison),
            _ => None,
        };
        if let Some(poison) = poison {
            return (Some(poison.ordinal), Some(poison.generation));
        }
        let backend = match self {
            ReportedError::Backend(backend)
            | ReportedError::Autodiff(AutodiffError::Backend(backend)) => Some(backend),
            _ => None,
        };
        if let Some(generation) = backend.and_then(BackendError::poisoned_generation) {
            let ordinal = backend.and_then(BackendError::poisoned_ordinal);
            return (ordinal, Some(generation));
        }
        match self {
            ReportedError::Server(ServerError::StaleGeneration {
                ordinal,
                current_generation,
                ..
            })
            | ReportedError::Backend(BackendError::StaleDeviceGeneration {
                ordinal,
                current_generation,
                ..
            }) => (Some(*ordinal), Some(*current_generation)),
            ReportedError::Server(
                ServerError::ContextRetiring { ordinal }
                | ServerError::ContextUnrecoverable { ordinal, .. }
                | ServerError::CaptureInProgress { ordinal }
                | ServerError::ServerPanicked { ordinal, .. }
                | ServerError::ServerGone { ordinal },
            )
            | ReportedError::Backend(
                BackendError::DeviceContextRetiring { ordinal }
                | BackendError::DeviceContextUnrecoverable { ordinal, .. }
                | BackendError::DeviceContextCaptureInProgress { ordinal }
                | BackendError::ServerPanicked { ordinal, .. }
                | BackendError::ServerGone { ordinal },
            ) => (Some(*ordinal), None),
            _ => (None, None),
        }
    }
}

impl From<IoError> for ReportedError {
    fn from(error: IoError) -> Self {
        ReportedError::Io(error)
    }
}

impl From<ServerError> for ReportedError {
    fn from(error: ServerError) -> Self {
        ReportedError::Server(error)
    }
}

impl From<BackendError> for ReportedError {
    fn from(error: BackendError) -> Self {
        ReportedError::Backend(error)
    }
}

impl From<AutodiffError> for ReportedError {
    fn from(error: AutodiffError) -> Self {
        ReportedError::Autodiff(error)
    }
}

/// One failure, with everything needed to read it later: its code, its
/// message, the typed error, the device, where it happened and when.
///
/// Encoded as one JSON line or as bincode (alone or in length-prefixed
/// frames); see [`crate::codec`]. New fields go last.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorReport {
    /// The catalogue code; serialized as its stable id.
    pub code: ErrorCode,
    /// `code.stable_id()`, spelled out for readers that do not know the catalogue.
    pub stable_id: u32,
    /// The error's message followed by each `source()`, joined by `": "`.
    pub message: String,
    /// The typed error, for code that branches on it (`message` is for people).
    pub error: ReportedError,
    /// The device ordinal, where known.
    pub ordinal: Option<usize>,
    /// The device's context generation, where known.
    pub generation: Option<u64>,
    /// Where the error was made, or where the report was made if the error
    /// carries no backtrace (empty when `CISTERN_BACKTRACE=0`).
    pub backtrace: BackTrace,
    /// When the report was made, in nanoseconds since the Unix epoch.
    pub unix_nanos: u64,
}

impl ErrorReport {
    /// A report of `error` made now. `ordinal` and `generation` override
    /// what the error itself names.
    pub fn new(
        error: impl Into<ReportedError>,
        ordinal: Option<usize>,
        generation: Option<u64>,
    ) -> Self {
        let error = error.into();
        let backtrace = match error.backtrace() {
            Some(trace) if !trace.is_empty() => trace.clone(),
            _ => BackTrace::capture(),
        };
        let unix_nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
            });
        ErrorReport::with_parts(error, ordinal, generation, backtrace, unix_nanos)
    }

    /// A report from given parts: for decoding tools and reproducible fixtures.
    pub fn with_parts(
        error: impl Into<ReportedError>,
        ordinal: Option<usize>,
        generation: Option<u64>,
        backtrace: BackTrace,
        unix_nanos: u64,
    ) -> Self {
        let error = error.into();
        let code = error.code();
        let (named_ordinal, named_generation) = error.device();
        ErrorReport {
            code,
            stable_id: code.stable_id(),
            message: message_chain(error.as_error()),
            ordinal: ordinal.or(named_ordinal),
            generation: generation.or(named_generation),
            error,
            backtrace,
            unix_nanos,
        }
    }

    /// A report of a memory-layer failure made now.
    pub fn from_io_error(error: &IoError, ordinal: Option<usize>, generation: Option<u64>) -> Self {
        ErrorReport::new(error.clone(), ordinal, generation)
    }

    /// A report of a device-server failure made now.
    pub fn from_server_error(
        error: &ServerError,
        ordinal: Option<usize>,
        generation: Option<u64>,
    ) -> Self {
        ErrorReport::new(error.clone(), ordinal, generation)
    }

    /// A report of a [`BackendError`] made now.
    pub fn from_backend_error(
        error: &BackendError,
        ordinal: Option<usize>,
        generation: Option<u64>,
    ) -> Self {
        ErrorReport::new(error.clone(), ordinal, generation)
    }

    /// A report of an autodiff failure made now.
    pub fn from_autodiff_error(
        error: &AutodiffError,
        ordinal: Option<usize>,
        generation: Option<u64>,
    ) -> Self {
        ErrorReport::new(error.clone(), ordinal, generation)
    }

    /// The report as one JSON line, without the terminator.
    pub fn to_json_line(&self) -> Result<String, CodecError> {
        codec::to_json_line(self)
    }

    /// Decodes a report from one JSON line.
    pub fn from_json_line(line: &str) -> Result<Self, CodecError> {
        codec::from_json_line(line)
    }

    /// The report in bincode.
    pub fn to_bincode(&self) -> Result<Vec<u8>, CodecError> {
        codec::to_bincode(self)
    }

    /// Decodes a report from bincode bytes.
    pub fn from_bincode(bytes: &[u8]) -> Result<Self, CodecError> {
        codec::from_bincode(bytes)
    }

    /// Appends the report to a telemetry stream as one length-prefixed frame.
    pub fn write_bincode_frame(&self, writer: &mut impl Write) -> Result<(), CodecError> {
        codec::write_bincode_frame(writer, self)
    }

    /// Reads the next report of a telemetry stream; `None` at its end.
    pub fn read_bincode_frame(reader: &mut impl Read) -> Option<Result<Self, CodecError>> {
        codec::read_bincode_frame(reader)
    }
}

impl std::fmt::Display for ErrorReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}] {}", self.code, self.message)?;
        match (self.ordinal, self.generation) {
            (Some(ordinal), Some(generation)) => {
                write!(f, " (device {ordinal}, generation {generation})")
            }
            (Some(ordinal), None) => write!(f, " (device {ordinal})"),
            _ => Ok(()),
        }
    }
}

fn message_chain(error: &(dyn Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut next = error.source();
    while let Some(source) = next {
        message.push_str(": ");
        message.push_str(&source.to_string());
        next = source.source();
    }
    message
}

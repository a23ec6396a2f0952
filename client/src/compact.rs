//! `CompactReport`: the telemetry form of an error — code, stable id,
//! message, device, generation and time, with backtrace frames only when
//! asked for. A few hundred bytes where a full [`ErrorReport`] with its
//! resolved backtrace is about ten kilobytes.

use std::io::{Read, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use cistern_memory::{BackTrace, ErrorCode};
use serde::{Deserialize, Serialize};

use crate::codec::{self, CodecError};
use crate::report::{ErrorReport, ReportedError};

/// The layout version a [`CompactReport`] is written with, its first
/// field; a decoder refuses any other. Bump it when a field changes
/// (new fields go last).
pub const COMPACT_LAYOUT: u32 = 1;

/// One failure as telemetry keeps it. Encoded as one JSON line or as
/// bincode (alone or in length-prefixed frames), both pinned by golden
/// bytes; the first field is the layout version.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompactReport {
    /// [`COMPACT_LAYOUT`] when written by this build.
    pub layout: u32,
    /// The catalogue code; serialized as its stable id.
    pub code: ErrorCode,
    /// `code.stable_id()`, spelled out for readers that do not know the catalogue.
    pub stable_id: u32,
    /// The error's message followed by each `source()`, joined by `": "`.
    pub message: String,
    /// The device ordinal, where known.
    pub ordinal: Option<usize>,
    /// The device's context generation, where known.
    pub generation: Option<u64>,
    /// When the report was made, in nanoseconds since the Unix epoch.
    pub unix_nanos: u64,
    /// Backtrace frames, one per entry; empty unless asked for.
    pub frames: Vec<String>,
}

impl CompactReport {
    /// A report of `error` made now. `ordinal` and `generation` override
    /// what the error names. With `frames`, the error's backtrace (or one
    /// captured here) is kept; without, none is captured.
    pub fn new(
        error: impl Into<ReportedError>,
        ordinal: Option<usize>,
        generation: Option<u64>,
        frames: bool,
    ) -> Self {
        if frames {
            return CompactReport::from_report(&ErrorReport::new(error, ordinal, generation), true);
        }
        let unix_nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
            });
        let report =
            ErrorReport::with_parts(error, ordinal, generation, BackTrace::none(), unix_nanos);
        CompactReport::from_report(&report, false)
    }

    /// The compact form of a full report, with its frames or without.
    pub fn from_report(report: &ErrorReport, frames: bool) -> Self {
        let frames = if frames {
            report
                .backtrace
                .text()
                .lines()
                .map(str::to_string)
                .collect()
        } else {
            Vec::new()
        };
        CompactReport {
            layout: COMPACT_LAYOUT,
            code: report.code,
            stable_id: report.stable_id,
            message: report.message.clone(),
            ordinal: report.ordinal,
            generation: report.generation,
            unix_nanos: report.unix_nanos,
            frames,
        }
    }

    /// The report as one JSON line, without the terminator.
    pub fn to_json_line(&self) -> Result<String, CodecError> {
        codec::to_json_line(self)
    }

    /// Decodes a report from one JSON line; another layout is an error.
    pub fn from_json_line(line: &str) -> Result<Self, CodecError> {
        codec::from_json_line::<CompactReport>(line)?
            .checked(|message| CodecError::Json { message })
    }

    /// The report in bincode.
    pub fn to_bincode(&self) -> Result<Vec<u8>, CodecError> {
        codec::to_bincode(self)
    }

    /// Decodes a report from bincode bytes; another layout is an error.
    pub fn from_bincode(bytes: &[u8]) -> Result<Self, CodecError> {
        codec::from_bincode::<CompactReport>(bytes)?
            .checked(|message| CodecError::Bincode { message })
    }

    /// Appends the report to a telemetry stream as one length-prefixed frame.
    pub fn write_bincode_frame(&self, writer: &mut impl Write) -> Result<(), CodecError> {
        codec::write_bincode_frame(writer, self)
    }

    /// Reads the next report of a telemetry stream; `None` at its end.
    pub fn read_bincode_frame(reader: &mut impl Read) -> Option<Result<Self, CodecError>> {
        codec::read_bincode_frame::<CompactReport>(reader).map(|decoded| {
            decoded.and_then(|r| r.checked(|message| CodecError::Bincode { message }))
        })
    }

    fn checked(self, error: impl FnOnce(String) -> CodecError) -> Result<Self, CodecError> {
        if self.layout == COMPACT_LAYOUT {
            Ok(self)
        } else {
            Err(error(format!(
                "compact report layout {}, this build reads {COMPACT_LAYOUT}",
                self.layout
            )))
        }
    }
}

impl std::fmt::Display for CompactReport {
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

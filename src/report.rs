//! `cistern report`: reads a telemetry file back (JSON lines or bincode
//! frames, detected or named) and counts its errors by code.

use std::collections::BTreeMap;
use std::path::PathBuf;

use cistern_client::{ErrorCode, ErrorReport};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::stress::TelemetryFormat;

/// Count the errors of a telemetry file by code and stable id.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// A file written by `cistern stress --telemetry`.
    pub file: PathBuf,
    /// Its encoding; detected when not given.
    #[arg(long, value_enum)]
    pub format: Option<TelemetryFormat>,
    /// Print JSON lines (one per code, then a total) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// How many reports of one code a file holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeCount {
    /// The code's catalogue name.
    pub code: String,
    /// Its stable id.
    pub stable_id: u32,
    /// Reports with it.
    pub count: u64,
}

/// Decodes every report of a telemetry file. With no `format`, a file
/// whose first byte (after whitespace) is `{` is JSON lines, any other
/// bincode frames. The error names the line or frame that is corrupt.
pub fn read_reports(
    bytes: &[u8],
    format: Option<TelemetryFormat>,
) -> Result<(TelemetryFormat, Vec<ErrorReport>), String> {
    let format = format.unwrap_or_else(|| detect(bytes));
    let reports = match format {
        TelemetryFormat::Jsonl => read_json_lines(bytes)?,
        TelemetryFormat::Bincode => read_frames(bytes)?,
    };
    Ok((format, reports))
}

fn detect(bytes: &[u8]) -> TelemetryFormat {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') | None => TelemetryFormat::Jsonl,
        Some(_) => TelemetryFormat::Bincode,
    }
}

fn read_json_lines(bytes: &[u8]) -> Result<Vec<ErrorReport>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        format!(
            "not a JSON-lines telemetry file: invalid UTF-8 at byte {}",
            e.valid_up_to()
        )
    })?;
    let mut reports = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let report = ErrorReport::from_json_line(line)
            .map_err(|e| format!("line {}: not an error report: {e}", index + 1))?;
        reports.push(report);
    }
    Ok(reports)
}

fn read_frames(bytes: &[u8]) -> Result<Vec<ErrorReport>, String> {
    let mut reader = bytes;
    let mut reports = Vec::new();
    while let Some(frame) = ErrorReport::read_bincode_frame(&mut reader) {
        let offset = bytes.len() - reader.len();
        let report = frame.map_err(|e| {
            format!(
                "frame {} (ending near byte {offset}): not an error report: {e}",
                reports.len() + 1
            )
        })?;
        reports.push(report);
    }
    Ok(reports)
}

/// Counts `reports` by code, in stable-id order.
pub fn count_by_code(reports: &[ErrorReport]) -> Vec<CodeCount> {
    let mut counts: BTreeMap<u32, (ErrorCode, u64)> = BTreeMap::new();
    for report in reports {
        counts
            .entry(report.code.stable_id())
            .or_insert((report.code, 0))
            .1 += 1;
    }
    counts
        .into_iter()
        .map(|(stable_id, (code, count))| CodeCount {
            code: code.name().to_string(),
            stable_id,
            count,
        })
        .collect()
}

/// `cistern report`: prints the counts of a telemetry file.
pub fn run_command(args: &ReportArgs) -> Result<(), String> {
    let bytes = std::fs::read(&args.file)
        .map_err(|e| format!("cannot read {}: {e}", args.file.display()))?;
    let (format, reports) =
        read_reports(&bytes, args.format).map_err(|e| format!("{}: {e}", args.file.display()))?;
    let counts = count_by_code(&reports);
    let format_name = match format {
        TelemetryFormat::Jsonl => "jsonl",
        TelemetryFormat::Bincode => "bincode",
    };
    if args.json {
        for count in &counts {
            println!("{}", json!(count));
        }
        println!(
            "{}",
            json!({"event": "total", "format": format_name, "reports": reports.len()})
        );
        return Ok(());
    }
    println!(
        "{}: {} reports ({format_name})",
        args.file.display(),
        reports.len()
    );
    let width = counts
        .iter()
        .map(|c| c.code.len())
        .max()
        .unwrap_or(0)
        .max("code".len());
    println!("{:<width$}  {:>4}  {:>8}", "code", "id", "count");
    for count in &counts {
        println!(
            "{:<width$}  {:>4}  {:>8}",
            count.code, count.stable_id, count.count
        );
    }
    println!("{:<width$}  {:>4}  {:>8}", "total", "", reports.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use cistern_memory::{BackTrace, IoError};
    use cistern_runtime::ServerError;

    use super::*;
    use crate::stress::write_report;

    fn sample_reports() -> Vec<ErrorReport> {
        let errors = [
            ServerError::from(IoError::out_of_memory(64)),
            ServerError::from(IoError::out_of_memory(128)),
            ServerError::ContextRetiring { ordinal: 0 },
        ];
        errors
            .into_iter()
            .map(|e| ErrorReport::with_parts(e, Some(0), Some(1), BackTrace::none(), 7))
            .collect()
    }

    fn encode(reports: &[ErrorReport], format: TelemetryFormat) -> Vec<u8> {
        let mut bytes = Vec::new();
        for report in reports {
            assert!(write_report(&mut bytes, report, format).is_ok());
        }
        bytes
    }

    #[test]
    fn both_encodings_are_detected_and_read_back_whole() {
        let reports = sample_reports();
        for format in [TelemetryFormat::Jsonl, TelemetryFormat::Bincode] {
            let bytes = encode(&reports, format);
            assert_eq!(read_reports(&bytes, None), Ok((format, reports.clone())));
        }
    }

    #[test]
    fn counts_are_by_code_in_stable_id_order() {
        let counts = count_by_code(&sample_reports());
        let rows: Vec<(u32, u64)> = counts.iter().map(|c| (c.stable_id, c.count)).collect();
        assert_eq!(rows, [(1001, 2), (1013, 1)]);
        assert_eq!(counts[0].code, "DeviceOutOfMemory");
    }

    #[test]
    fn a_corrupt_line_or_frame_is_an_error_naming_it() {
        let mut json = encode(&sample_reports(), TelemetryFormat::Jsonl);
        json.extend_from_slice(b"{\"code\": nonsense}\n");
        let error = read_reports(&json, None).expect_err("corrupt line");
        assert!(error.starts_with("line 4:"), "{error}");

        let mut frames = encode(&sample_reports(), TelemetryFormat::Bincode);
        frames.truncate(frames.len() - 3);
        let error = read_reports(&frames, None).expect_err("truncated frame");
        assert!(error.starts_with("frame 3"), "{error}");

        let garbage = [0xFFu8, 0xFF, 0xFF, 0x7F, 1, 2, 3];
        assert!(read_reports(&garbage, None).is_err());
        assert!(read_reports(&garbage, Some(TelemetryFormat::Jsonl)).is_err());
    }

    #[test]
    fn an_empty_file_holds_no_reports() {
        assert_eq!(
            read_reports(b"", None),
            Ok((TelemetryFormat::Jsonl, Vec::new()))
        );
    }
}

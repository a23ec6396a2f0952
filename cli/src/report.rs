//! `cistern report`: reads a telemetry file back (JSON lines or bincode
//! frames, detected or named; compact reports or full `ErrorReport`s,
//! each record on its own) and counts its errors by code.

use std::collections::BTreeMap;
use std::path::PathBuf;

use cistern_client::codec::BINCODE_LIMIT;
use cistern_client::{CompactReport, ErrorCode, ErrorReport};
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

/// Decodes every report of a telemetry file, compact or full (a full
/// report is read as its compact form, frames kept). With no `format`, a
/// file whose first byte (after whitespace) is `{` is JSON lines, any other
/// bincode frames. The error names the line or frame that is corrupt.
pub fn read_reports(
    bytes: &[u8],
    format: Option<TelemetryFormat>,
) -> Result<(TelemetryFormat, Vec<CompactReport>), String> {
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

fn read_json_lines(bytes: &[u8]) -> Result<Vec<CompactReport>, String> {
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
        let report = CompactReport::from_json_line(line)
            .or_else(|_| {
                ErrorReport::from_json_line(line).map(|r| CompactReport::from_report(&r, true))
            })
            .map_err(|e| format!("line {}: not an error report: {e}", index + 1))?;
        reports.push(report);
    }
    Ok(reports)
}

fn read_frames(bytes: &[u8]) -> Result<Vec<CompactReport>, String> {
    let mut rest = bytes;
    let mut reports = Vec::new();
    while !rest.is_empty() {
        let number = reports.len() + 1;
        let offset = bytes.len() - rest.len();
        let broken = |why: String| format!("frame {number} (at byte {offset}): {why}");
        let (prefix, body) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| broken("the stream ended inside a frame".into()))?;
        let len = u32::from_le_bytes(*prefix) as usize;
        if len > BINCODE_LIMIT {
            return Err(broken(format!(
                "claims {len} bytes, over the {BINCODE_LIMIT}-byte limit"
            )));
        }
        let frame = body
            .get(..len)
            .ok_or_else(|| broken("the stream ended inside a frame".into()))?;
        let report = CompactReport::from_bincode(frame)
            .or_else(|_| {
                ErrorReport::from_bincode(frame).map(|r| CompactReport::from_report(&r, true))
            })
            .map_err(|e| broken(format!("not an error report: {e}")))?;
        reports.push(report);
        rest = &body[len..];
    }
    Ok(reports)
}

/// Counts `reports` by code, in stable-id order.
pub fn count_by_code(reports: &[CompactReport]) -> Vec<CodeCount> {
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

    fn sample_reports() -> Vec<CompactReport> {
        let errors = [
            ServerError::from(IoError::out_of_memory(64)),
            ServerError::from(IoError::out_of_memory(128)),
            ServerError::ContextRetiring { ordinal: 0 },
        ];
        errors
            .into_iter()
            .map(|e| {
                let full = ErrorReport::with_parts(e, Some(0), Some(1), BackTrace::none(), 7);
                CompactReport::from_report(&full, false)
            })
            .collect()
    }

    fn encode(reports: &[CompactReport], format: TelemetryFormat) -> Vec<u8> {
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
    fn full_reports_of_older_files_are_read_as_their_compact_form() {
        let full = ErrorReport::with_parts(
            IoError::out_of_memory(64),
            Some(0),
            Some(1),
            BackTrace::from_text("0: reserve\n"),
            7,
        );
        let compact = CompactReport::from_report(&full, true);
        let mut json = full.to_json_line().unwrap_or_default();
        json.push('\n');
        assert_eq!(
            read_reports(json.as_bytes(), None),
            Ok((TelemetryFormat::Jsonl, vec![compact.clone()]))
        );
        let mut frames = Vec::new();
        assert!(full.write_bincode_frame(&mut frames).is_ok());
        assert!(compact.write_bincode_frame(&mut frames).is_ok());
        assert_eq!(
            read_reports(&frames, None),
            Ok((TelemetryFormat::Bincode, vec![compact.clone(), compact]))
        );
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

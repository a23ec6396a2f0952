//! `--telemetry` for `train`: the run's device error as a compact report.

use std::path::Path;

use cistern_client::{CompactReport, ReportedError};
use cistern_runtime::Device;

use super::args::TrainArgs;
use crate::stress::write_report;

/// Writes `error` to the telemetry file `path` in the run's format.
pub fn write(
    path: &Path,
    args: &TrainArgs,
    error: ReportedError,
    device: Device,
) -> Result<(), String> {
    let report = CompactReport::new(
        error,
        Some(device.ordinal()),
        None,
        args.telemetry_backtraces,
    );
    let mut bytes = Vec::new();
    write_report(&mut bytes, &report, args.telemetry_format)
        .map_err(|e| format!("cannot encode the telemetry report: {e}"))?;
    std::fs::write(path, bytes)
        .map_err(|e| format!("cannot write telemetry file {}: {e}", path.display()))
}

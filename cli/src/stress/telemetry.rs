//! Telemetry files: one `CompactReport` per error a stress run saw, as JSON
//! lines or as length-prefixed bincode frames, written by a thread of
//! their own so clients never wait on the disk (or on symbolizing a
//! backtrace).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::thread::JoinHandle;

use cistern_client::{CompactReport, codec};
use cistern_runtime::sync::{Sender, unbounded};
use serde::{Deserialize, Serialize};

/// How a telemetry file is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum TelemetryFormat {
    /// One JSON object per line.
    Jsonl,
    /// Length-prefixed bincode frames (`cistern_client::codec`).
    Bincode,
}

/// The writer of a telemetry file: send reports; [`finish`](Self::finish) flushes.
#[derive(Debug)]
pub struct TelemetryWriter {
    reports: Sender<CompactReport>,
    thread: JoinHandle<Result<u64, String>>,
}

impl TelemetryWriter {
    /// Creates (truncates) `path` and starts its writer thread. The error
    /// names the file.
    pub fn create(path: &Path, format: TelemetryFormat) -> Result<Self, String> {
        let file = File::create(path)
            .map_err(|e| format!("cannot create telemetry file {}: {e}", path.display()))?;
        let (reports, received) = unbounded::<CompactReport>();
        let path = path.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("cistern-stress-telemetry".into())
            .spawn(move || {
                let mut out = BufWriter::new(file);
                let mut written = 0u64;
                for report in received {
                    write_report(&mut out, &report, format)
                        .map_err(|e| failed(&path, &e.to_string()))?;
                    written += 1;
                }
                out.flush().map_err(|e| failed(&path, &e.to_string()))?;
                Ok(written)
            })
            .map_err(|e| format!("cannot start the telemetry writer: {e}"))?;
        Ok(TelemetryWriter { reports, thread })
    }

    /// Queues `report` for the file.
    pub fn send(&self, report: CompactReport) {
        // The writer only stops early after a write error, which `finish` reports.
        let _ = self.reports.send(report);
    }

    /// Writes what is queued and closes the file; returns how many reports it holds.
    pub fn finish(self) -> Result<u64, String> {
        drop(self.reports);
        self.thread
            .join()
            .map_err(|_| "the telemetry writer panicked".to_string())?
    }
}

fn failed(path: &Path, message: &str) -> String {
    format!(
        "writing telemetry file {} failed: {message}",
        path.display()
    )
}

/// Appends one report in `format`.
pub fn write_report(
    out: &mut impl Write,
    report: &CompactReport,
    format: TelemetryFormat,
) -> Result<(), codec::CodecError> {
    match format {
        TelemetryFormat::Jsonl => codec::write_json_line(out, report),
        TelemetryFormat::Bincode => report.write_bincode_frame(out),
    }
}

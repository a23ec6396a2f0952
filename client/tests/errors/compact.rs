//! `CompactReport`: its JSON and bincode layouts pinned by golden bytes
//! (`tests/fixtures/compact.txt`; `CISTERN_BLESS=1` rewrites it after an
//! intended change), its size, and its refusal of other layouts.

use std::path::PathBuf;

use cistern_client::{COMPACT_LAYOUT, CompactReport, ErrorReport};
use cistern_memory::{BackTrace, IoError};
use cistern_runtime::ServerError;

use super::samples::poison;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/compact.txt")
}

fn samples() -> Vec<CompactReport> {
    let full = |error: ServerError, frames: bool| {
        let trace = BackTrace::from_text("0: reserve\n1: main\n");
        let report =
            ErrorReport::with_parts(error, Some(0), Some(3), trace, 1_700_000_000_000_000_000);
        CompactReport::from_report(&report, frames)
    };
    vec![
        full(ServerError::from(IoError::out_of_memory(4096)), false),
        full(ServerError::ContextPoisoned(poison()), false),
        full(ServerError::ContextRetiring { ordinal: 0 }, true),
    ]
}

fn rendered() -> String {
    let mut text = String::new();
    for (index, report) in samples().iter().enumerate() {
        let bytes = report.to_bincode().unwrap_or_default();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let json = report.to_json_line().unwrap_or_default();
        text.push_str(&format!("bincode::{index} {hex}\njson::{index} {json}\n"));
    }
    text
}

#[test]
fn the_compact_layouts_match_the_golden_fixture() {
    let now = rendered();
    if std::env::var_os("CISTERN_BLESS").is_some_and(|v| v == "1") {
        assert!(std::fs::write(fixture(), &now).is_ok());
        return;
    }
    let stored = std::fs::read_to_string(fixture()).unwrap_or_default();
    assert_eq!(
        now, stored,
        "the compact layout changed: bump COMPACT_LAYOUT and bless"
    );
}

#[test]
fn compact_reports_round_trip_in_both_encodings() {
    for report in samples() {
        let line = report.to_json_line().unwrap_or_default();
        assert_eq!(
            CompactReport::from_json_line(&line).ok(),
            Some(report.clone())
        );
        let bytes = report.to_bincode().unwrap_or_default();
        assert_eq!(CompactReport::from_bincode(&bytes).ok(), Some(report));
    }
}

#[test]
fn a_compact_report_without_frames_is_a_few_hundred_bytes() {
    let error = ServerError::from(IoError::out_of_memory(1 << 20));
    let report = CompactReport::new(error, Some(0), Some(1), false);
    assert!(report.frames.is_empty());
    let bytes = report.to_json_line().unwrap_or_default().len();
    assert!(bytes < 400, "{bytes} bytes");
}

#[test]
fn another_layout_version_is_refused() {
    let mut report = samples().remove(0);
    report.layout = COMPACT_LAYOUT + 1;
    let line = report.to_json_line().unwrap_or_default();
    assert!(CompactReport::from_json_line(&line).is_err());
    let bytes = report.to_bincode().unwrap_or_default();
    assert!(CompactReport::from_bincode(&bytes).is_err());
    // A full report is not mistaken for a compact one.
    let full = ErrorReport::with_parts(IoError::out_of_memory(1), None, None, BackTrace::none(), 1);
    assert!(CompactReport::from_bincode(&full.to_bincode().unwrap_or_default()).is_err());
    assert!(CompactReport::from_json_line(&full.to_json_line().unwrap_or_default()).is_err());
}

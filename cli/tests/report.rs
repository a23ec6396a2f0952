//! End-to-end tests of `cistern report`: telemetry files written by
//! `cistern stress` read back in both encodings, and corrupt files refused.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

mod cli;
use cli::{cistern, text};

fn last_json(output: &Output) -> Value {
    let stdout = text(&output.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or(Value::Null)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cistern-report-test-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir.join(name)
}

/// A short faulty run writing telemetry in `format`; returns its summary.
fn stress_with_telemetry(path: &Path, format: &str) -> Value {
    let output = cistern(&[
        "stress",
        "--clients",
        "3",
        "--limit",
        "1MiB",
        "--max-size",
        "128KiB",
        "--ops",
        "1500",
        "--faults",
        "5",
        "--trap-rate",
        "0.01",
        "--json",
        "--telemetry",
        path.to_str().unwrap_or_default(),
        "--telemetry-format",
        format,
    ]);
    assert!(output.status.success(), "stderr: {}", text(&output.stderr));
    last_json(&output)
}

#[test]
fn telemetry_round_trips_through_report_in_both_encodings() {
    for format in ["jsonl", "bincode"] {
        let path = scratch(&format!("telemetry.{format}"));
        let summary = stress_with_telemetry(&path, format);
        let errors = summary["errors"].as_u64().unwrap_or(u64::MAX);
        assert!(errors > 0, "{summary}");

        // Detected, and named.
        for extra in [None, Some(format)] {
            let mut args = vec!["report", path.to_str().unwrap_or_default(), "--json"];
            if let Some(format) = extra {
                args.extend(["--format", format]);
            }
            let output = cistern(&args);
            assert!(output.status.success(), "stderr: {}", text(&output.stderr));
            let stdout = text(&output.stdout);
            let lines: Vec<Value> = stdout
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            let total = &lines[lines.len() - 1];
            assert_eq!(total["format"], format);
            assert_eq!(total["reports"].as_u64(), Some(errors), "{stdout}");
            let counted: u64 = lines[..lines.len() - 1]
                .iter()
                .filter_map(|l| l["count"].as_u64())
                .sum();
            assert_eq!(counted, errors);
            // Out-of-memory (1001) is among the codes of a run this tight.
            assert!(lines.iter().any(|l| l["stable_id"] == 1001), "{stdout}");
        }

        let table = cistern(&["report", path.to_str().unwrap_or_default()]);
        let stdout = text(&table.stdout);
        assert!(
            stdout.contains("DeviceOutOfMemory") && stdout.contains("1001"),
            "{stdout}"
        );
        let _ = std::fs::remove_file(path);
    }
}

#[test]
fn a_corrupt_or_missing_file_is_a_clear_error_not_a_panic() {
    let truncated = scratch("truncated.bin");
    let summary = stress_with_telemetry(&truncated, "bincode");
    assert!(summary["errors"].as_u64().unwrap_or(0) > 0);
    let mut bytes = std::fs::read(&truncated).unwrap_or_default();
    bytes.truncate(bytes.len() - 5);
    let _ = std::fs::write(&truncated, &bytes);

    let garbage = scratch("garbage.jsonl");
    let _ = std::fs::write(&garbage, b"{\"code\": 1001, \"truncated\n");

    let missing = scratch("missing.jsonl");
    for (path, expect) in [
        (&truncated, "frame"),
        (&garbage, "line 1"),
        (&missing, "cannot read"),
    ] {
        let output = cistern(&["report", path.to_str().unwrap_or_default()]);
        let stderr = text(&output.stderr);
        assert!(!output.status.success());
        assert!(stderr.contains(expect), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let _ = std::fs::remove_file(truncated);
    let _ = std::fs::remove_file(garbage);
}

//! End-to-end tests of `cistern stress`, through the built binary.

use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;

mod cli;
use cli::{cistern, text};

/// Every stdout line as JSON; the last one must be the summary.
fn json_lines(output: &Output) -> Vec<Value> {
    let stdout = text(&output.stdout);
    stdout
        .lines()
        .map(|line| match serde_json::from_str::<Value>(line) {
            Ok(value) => value,
            Err(error) => panic!("not a JSON line ({error}): {line}"),
        })
        .collect()
}

fn field(summary: &Value, name: &str) -> u64 {
    match summary[name].as_u64() {
        Some(value) => value,
        None => panic!("the summary has no integer {name}: {summary}"),
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cistern-stress-test-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir.join(name)
}

#[test]
fn a_faulty_run_under_a_tight_limit_recovers_handles_ooms_and_reads_back_clean() {
    let telemetry = scratch("faulty.jsonl");
    let plot = scratch("faulty.svg");
    let output = cistern(&[
        "stress",
        "--clients",
        "4",
        "--limit",
        "2MiB",
        "--max-size",
        "256KiB",
        // A count, not a duration: a loaded machine must not shrink the run.
        "--ops",
        "2000",
        "--seed",
        "3",
        "--faults",
        "7",
        "--trap-rate",
        "0.005",
        "--capture-weight",
        "4",
        "--json",
        "--telemetry",
        telemetry.to_str().unwrap_or_default(),
        "--plot",
        plot.to_str().unwrap_or_default(),
    ]);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "stderr: {stderr}");
    let lines = json_lines(&output);
    assert_eq!(lines[0]["event"], "start");
    let summary = &lines[lines.len() - 1];
    assert_eq!(summary["event"], "summary", "{summary}");
    assert_eq!(field(summary, "corrupted_reads"), 0);
    assert_eq!(field(summary, "lost_replies"), 0);
    assert!(field(summary, "poisons") >= 1, "{summary}");
    assert!(field(summary, "recoveries") >= 1, "{summary}");
    assert!(field(summary, "ooms") >= 1, "{summary}");
    assert!(field(summary, "verified_bytes") > 0, "{summary}");
    // No store steps unless asked for.
    assert_eq!(field(summary, "store_steps"), 0, "{summary}");
    // Graphs were captured, replayed and read back clean.
    assert!(field(summary, "captures") >= 1, "{summary}");
    assert!(field(summary, "replays_verified") >= 1, "{summary}");
    assert!(field(summary, "replays") >= field(summary, "replays_verified"));
    assert_eq!(field(summary, "limit"), 2 << 20);
    assert!(field(summary, "peak_reserved") <= 2 << 20, "{summary}");
    // Each poison and recovery was announced as an event line.
    let poison_lines = lines.iter().filter(|l| l["event"] == "poison").count() as u64;
    assert_eq!(poison_lines, field(summary, "poisons"));
    // Every error seen is in the telemetry file.
    let reports = std::fs::read_to_string(&telemetry).unwrap_or_default();
    assert_eq!(reports.lines().count() as u64, field(summary, "errors"));
    assert_eq!(
        field(summary, "telemetry_reports"),
        field(summary, "errors")
    );
    let svg = std::fs::read_to_string(&plot).unwrap_or_default();
    assert!(
        svg.starts_with("<svg") && svg.contains("poison ("),
        "not the plot"
    );
    let _ = std::fs::remove_file(telemetry);
    let _ = std::fs::remove_file(plot);
}

#[test]
fn a_run_without_json_prints_a_table_with_the_zeros() {
    let output = cistern(&[
        "stress",
        "--clients",
        "2",
        "--limit",
        "2MiB",
        "--ops",
        "2000",
        "--max-size",
        "64KiB",
    ]);
    assert!(output.status.success(), "stderr: {}", text(&output.stderr));
    let stdout = text(&output.stdout);
    for row in [
        "operations",
        "out of memory",
        "poisons",
        "recoveries",
        "graphs captured",
        "replays verified",
        "peak reserved / limit",
    ] {
        assert!(stdout.contains(row), "no {row} row in:\n{stdout}");
    }
    let zero_row = |label: &str| {
        stdout
            .lines()
            .find(|line| line.starts_with(label))
            .is_some_and(|line| line.trim_end().ends_with(" 0"))
    };
    assert!(zero_row("corrupted reads"), "{stdout}");
    assert!(zero_row("lost replies"), "{stdout}");
}

#[test]
fn a_capture_weight_of_zero_captures_nothing_and_a_high_one_replays_clean() {
    let run = |weight: &str| {
        let output = cistern(&[
            "stress",
            "--clients",
            "2",
            "--limit",
            "2MiB",
            "--ops",
            "600",
            "--max-size",
            "64KiB",
            "--seed",
            "5",
            "--capture-weight",
            weight,
            "--json",
        ]);
        assert!(output.status.success(), "stderr: {}", text(&output.stderr));
        let lines = json_lines(&output);
        lines[lines.len() - 1].clone()
    };
    let none = run("0");
    assert_eq!(field(&none, "captures"), 0, "{none}");
    assert_eq!(field(&none, "replays"), 0, "{none}");
    let many = run("30");
    assert!(field(&many, "captures") >= 10, "{many}");
    assert!(field(&many, "replays_verified") >= 1, "{many}");
    assert_eq!(field(&many, "corrupted_reads"), 0, "{many}");
    assert_eq!(field(&many, "unexpected_errors"), 0, "{many}");
}

/// A `--json` run of 4 clients under a 2 MiB limit with store steps in
/// the mix; its summary line.
fn store_run(extra: &[&str]) -> Value {
    let mut args = vec![
        "stress",
        "--clients",
        "4",
        "--limit",
        "2MiB",
        "--max-size",
        "256KiB",
        "--ops",
        "2400",
        "--seed",
        "4",
        "--store-weight",
        "30",
        "--json",
    ];
    args.extend_from_slice(extra);
    let output = cistern(&args);
    assert!(output.status.success(), "stderr: {}", text(&output.stderr));
    let lines = json_lines(&output);
    assert_eq!(lines[0]["store_weight"], 30, "{}", lines[0]);
    lines[lines.len() - 1].clone()
}

#[test]
fn store_steps_in_the_mix_match_the_reference_through_every_family() {
    let summary = store_run(&[]);
    let steps = field(&summary, "store_steps");
    assert!(steps >= 300, "{summary}");
    assert_eq!(field(&summary, "store_mismatches"), 0, "{summary}");
    assert_eq!(field(&summary, "unexpected_errors"), 0, "{summary}");
    // Out-of-memory and capture refusals may decline a step or put one
    // back; the rest are verified against the reference.
    assert!(
        field(&summary, "store_verified") * 10 >= steps * 9,
        "{summary}"
    );
    // Stores go after 16 steps and the next takes the next family: the
    // AMP forms are reached, and their non-finite steps skipped.
    assert!(field(&summary, "store_builds") >= 12, "{summary}");
    assert!(field(&summary, "store_amp_skips") >= 1, "{summary}");
    // Without faults nothing is poisoned, so no store goes stale, and none
    // latches: an AMP flag read waits out another client's capture.
    assert_eq!(field(&summary, "poisons"), 0, "{summary}");
    assert_eq!(field(&summary, "store_stale"), 0, "{summary}");
    assert_eq!(field(&summary, "store_refused"), 0, "{summary}");
    assert_eq!(field(&summary, "store_rebuilds"), 0, "{summary}");
    // Every client dropped its store and buffers: memory is back at the baseline.
    assert_eq!(field(&summary, "final_in_use"), 0, "{summary}");
}

#[test]
fn store_steps_survive_faults_and_memory_pressure_and_latched_stores_are_rebuilt() {
    let summary = store_run(&["--faults", "4", "--trap-rate", "0.005"]);
    assert!(field(&summary, "poisons") >= 1, "{summary}");
    assert!(field(&summary, "ooms") >= 1, "{summary}");
    assert_eq!(field(&summary, "store_mismatches"), 0, "{summary}");
    assert_eq!(field(&summary, "unexpected_errors"), 0, "{summary}");
    assert_eq!(field(&summary, "lost_replies"), 0, "{summary}");
    // Stores were latched or made stale by the poisons, refused, and rebuilt.
    let retired = field(&summary, "store_refused") + field(&summary, "store_stale");
    assert!(retired >= 1, "{summary}");
    assert!(field(&summary, "store_rebuilds") >= 1, "{summary}");
    assert!(field(&summary, "store_verified") >= 100, "{summary}");
    assert_eq!(field(&summary, "final_in_use"), 0, "{summary}");
}

#[test]
fn bad_arguments_exit_non_zero_with_a_message() {
    let cases: [&[&str]; 8] = [
        &["stress", "--limit", "12XB"],
        &["stress", "--clients", "0"],
        &["stress", "--seconds", "-1"],
        &["stress", "--seconds", "0"],
        &["stress", "--faults", "1", "--trap-rate", "2"],
        &[
            "stress",
            "--sizes",
            "log-uniform",
            "--min-size",
            "2MiB",
            "--max-size",
            "1MiB",
        ],
        &["stress", "--device", "tpu:0"],
        &["stress", "--device", "cuda:0", "--ops", "10"],
    ];
    for args in cases {
        let output = cistern(args);
        let stderr = text(&output.stderr);
        assert!(!output.status.success(), "{args:?} succeeded");
        assert!(!stderr.trim().is_empty(), "{args:?}: no message");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

//! End-to-end tests of `cistern train` and `cistern predict`, through the
//! built binary.

use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;

mod cli;
use cli::{cistern, text};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cistern-train-{}", std::process::id()));
    assert!(std::fs::create_dir_all(&dir).is_ok());
    dir.join(name)
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().unwrap_or_default()
}

fn json_lines(output: &Output) -> Vec<Value> {
    text(&output.stdout)
        .lines()
        .map(|line| match serde_json::from_str::<Value>(line) {
            Ok(value) => value,
            Err(error) => panic!("not a JSON line ({error}): {line}"),
        })
        .collect()
}

/// A small regression CSV: y depends on a and b, with a constant column.
fn write_csv(name: &str) -> PathBuf {
    let file = scratch(name);
    let mut text = String::from("a,b,c,y\n");
    for i in 0..120 {
        let (a, b) = ((i % 11) as f32 * 0.3, (i % 7) as f32 - 3.0);
        text.push_str(&format!("{a},{b},1,{}\n", 2.0 * a - b + 0.5 * a * b));
    }
    assert!(std::fs::write(&file, text).is_ok());
    file
}

fn fails_with(output: &Output, needle: &str) {
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "should fail; stderr: {stderr}");
    assert!(stderr.contains(needle), "expected `{needle}` in: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn training_on_the_cpu_beats_the_mean_baseline_and_its_json_lines_parse() {
    let output = cistern(&["train", "--steps", "300", "--json", "--optimizer", "adam"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let lines = json_lines(&output);
    assert_eq!(lines[0]["event"], "start");
    let summary = lines.last().cloned().unwrap_or_default();
    assert_eq!(summary["event"], "summary");
    for field in [
        "dataset",
        "device",
        "layers",
        "batch",
        "optimizer",
        "lr",
        "steps_per_s",
        "peak_reserved",
    ] {
        assert!(!summary[field].is_null(), "no `{field}` in {summary}");
    }
    assert_eq!(summary["steps"], 300);
    let (val, baseline) = (
        summary["val_mse"].as_f64(),
        summary["baseline_mse"].as_f64(),
    );
    assert!(
        val < baseline,
        "validation {val:?} vs baseline {baseline:?}"
    );
}

/// The summary line of a successful `train --json` run.
fn summary_of(args: &[&str]) -> Value {
    let mut all = vec!["train", "--json"];
    all.extend_from_slice(args);
    let output = cistern(&all);
    assert!(output.status.success(), "{all:?}: {}", text(&output.stderr));
    let summary = json_lines(&output).last().cloned().unwrap_or_default();
    assert_eq!(summary["event"], "summary", "{all:?}");
    summary
}

fn beats_the_baseline(summary: &Value) {
    let (val, baseline) = (
        summary["val_mse"].as_f64().unwrap_or(f64::NAN),
        summary["baseline_mse"].as_f64().unwrap_or(f64::NAN),
    );
    assert!(
        val < baseline,
        "validation {val} vs baseline {baseline}: {summary}"
    );
}

#[test]
fn the_default_step_is_the_device_chain_and_agrees_with_the_tape_step() {
    let chain = summary_of(&["--steps", "200"]);
    assert_eq!(chain["step"], "device-chain");
    beats_the_baseline(&chain);
    let tape = summary_of(&["--steps", "200", "--step", "tape"]);
    assert_eq!(tape["step"], "tape");
    // The same SGD steps on the same batches: the two paths differ only by
    // float rounding in their kernels' order of work.
    for field in ["train_mse", "val_mse"] {
        let (a, b) = (chain[field].as_f64(), tape[field].as_f64());
        let (a, b) = (a.unwrap_or(f64::NAN), b.unwrap_or(f64::NAN));
        assert!(
            (a - b).abs() <= 1e-3 * b.abs(),
            "{field}: chain {a} vs tape {b}"
        );
    }
}

#[test]
fn every_optimizer_trains_through_the_store_with_and_without_amp() {
    for optimizer in ["adamw", "rmsprop", "adagrad", "lamb"] {
        let summary = summary_of(&["--steps", "150", "--optimizer", optimizer]);
        assert_eq!(summary["step"], "tape", "{optimizer}");
        beats_the_baseline(&summary);
    }
    for optimizer in ["sgd", "adam"] {
        let summary = summary_of(&["--steps", "150", "--optimizer", optimizer, "--amp"]);
        assert_eq!(summary["step"], "tape-amp", "{optimizer}");
        assert_eq!(summary["amp"], true);
        assert_eq!(summary["skipped_steps"], 0, "{optimizer}: {summary}");
        beats_the_baseline(&summary);
    }
}

#[test]
fn a_device_fault_during_training_is_reported_with_its_code_and_kept_as_telemetry() {
    let telemetry = scratch("fault.jsonl");
    let output = cistern(&[
        "train",
        "--steps",
        "100",
        "--inject-trap-at-launch",
        "40",
        "--telemetry",
        path(&telemetry),
    ]);
    fails_with(&output, "device error DevicePoisoned (1009)");
    fails_with(&output, "what to do:");
    let report = cistern(&["report", path(&telemetry)]);
    assert!(report.status.success(), "{}", text(&report.stderr));
    let listed = text(&report.stdout);
    assert!(
        listed.contains("DevicePoisoned  1009         1"),
        "{listed}"
    );
}

#[test]
fn a_saved_model_predicts_exactly_what_the_trained_one_did() {
    let csv = write_csv("data.csv");
    let (model, trained, predicted) =
        (scratch("m.safetensors"), scratch("t.csv"), scratch("p.csv"));
    let output = cistern(&[
        "train",
        "--csv",
        path(&csv),
        "--target",
        "y",
        "--steps",
        "60",
        "--layers",
        "8",
        "--save",
        path(&model),
        "--predictions",
        path(&trained),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let output = cistern(&[
        "predict",
        "--model",
        path(&model),
        "--csv",
        path(&csv),
        "--output",
        path(&predicted),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let (trained, predicted) = (
        std::fs::read_to_string(trained),
        std::fs::read_to_string(predicted),
    );
    assert!(trained.is_ok());
    assert_eq!(trained.ok(), predicted.ok());
}

#[test]
fn a_truncated_model_file_is_a_clear_error() {
    let csv = write_csv("cut.csv");
    let model = scratch("cut.safetensors");
    let output = cistern(&[
        "train",
        "--csv",
        path(&csv),
        "--target",
        "y",
        "--steps",
        "2",
        "--save",
        path(&model),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let bytes = std::fs::read(&model).unwrap_or_default();
    assert!(std::fs::write(&model, &bytes[..bytes.len() / 2]).is_ok());
    let output = cistern(&["predict", "--model", path(&model), "--csv", path(&csv)]);
    fails_with(&output, "not a whole safetensors file");
}

#[test]
fn every_bad_csv_is_a_clear_error_naming_the_line_or_column() {
    let cases = [
        ("empty.csv", "", "empty"),
        ("header.csv", "a,y\n", "no data rows"),
        ("cell.csv", "a,y\n1,2\n3,oops\n", "line 3, column 2"),
        ("ragged.csv", "a,y\n1,2\n3\n", "line 3"),
    ];
    for (name, contents, needle) in cases {
        let file = scratch(name);
        assert!(std::fs::write(&file, contents).is_ok());
        fails_with(
            &cistern(&["train", "--csv", path(&file), "--target", "y"]),
            needle,
        );
    }
    let file = write_csv("nocolumn.csv");
    fails_with(
        &cistern(&["train", "--csv", path(&file), "--target", "z"]),
        "no column `z`",
    );
    fails_with(&cistern(&["train", "--csv", path(&file)]), "--target");
}

#[test]
fn zero_steps_an_empty_split_and_bad_arguments_are_clear_errors() {
    fails_with(&cistern(&["train", "--steps", "0"]), "--steps 0");
    let tiny = scratch("tiny.csv");
    assert!(std::fs::write(&tiny, "a,y\n1,2\n").is_ok());
    fails_with(
        &cistern(&["train", "--csv", path(&tiny), "--target", "y"]),
        "both parts need rows",
    );
    fails_with(&cistern(&["train", "--lr=-1"]), "--lr");
    fails_with(&cistern(&["train", "--device", "tpu"]), "--device");
    fails_with(
        &cistern(&["train", "--amp", "--optimizer", "lamb"]),
        "--amp with --optimizer lamb",
    );
    fails_with(
        &cistern(&["train", "--step", "chain", "--optimizer", "adam"]),
        "--step chain runs sgd",
    );
    fails_with(&cistern(&["train", "--layers", "8,x"]), "invalid");
}

#[test]
fn training_beats_the_baseline_on_every_device_present() {
    let devices: Vec<String> = cistern::runtime::list_devices()
        .into_iter()
        .map(|info| info.device.to_string())
        .collect();
    if std::env::var_os("CISTERN_REQUIRE_WGPU").is_some_and(|v| v == "1") {
        assert!(
            devices.iter().any(|d| d.starts_with("wgpu")),
            "CISTERN_REQUIRE_WGPU=1 but no wgpu device in {devices:?}"
        );
    }
    for device in &devices {
        let chain = summary_of(&["--steps", "100", "--device", device]);
        assert_eq!(chain["device"], device.as_str());
        beats_the_baseline(&chain);
        let amp = summary_of(&[
            "--steps",
            "60",
            "--device",
            device,
            "--optimizer",
            "adam",
            "--amp",
        ]);
        beats_the_baseline(&amp);
    }
}

/// `train` on `--devices`/`--distributed` or one device: the summary.
fn group_summary(extra: &[&str]) -> Value {
    let mut args = vec!["--steps", "200", "--optimizer", "adam"];
    args.extend_from_slice(extra);
    summary_of(&args)
}

#[test]
fn two_cpu_devices_in_one_process_train_as_one_device_does() {
    let one = group_summary(&[]);
    let two = group_summary(&["--devices", "cpu:0,cpu:1"]);
    assert_eq!(two["device"], "cpu:0,cpu:1");
    assert_eq!(two["step"], "group");
    let (a, b) = (one["val_mse"].as_f64(), two["val_mse"].as_f64());
    let (Some(a), Some(b)) = (a, b) else {
        panic!("no val_mse: {one} {two}");
    };
    assert!((a - b).abs() < 1e-3, "one device {a}, two {b}");
    beats_the_baseline(&two);
}

#[test]
fn a_fault_injected_into_a_group_is_recovered_in_place_and_changes_nothing() {
    let clean = group_summary(&["--devices", "cpu:0,cpu:1"]);
    let faulted = group_summary(&["--devices", "cpu:0,cpu:1", "--inject-trap-at-launch", "200"]);
    assert_eq!(clean["recovered_replicas"], 0);
    assert_eq!(faulted["recovered_replicas"], 1, "{faulted}");
    assert_eq!(faulted["steps"], clean["steps"], "no step lost");
    assert_eq!(
        faulted["val_mse"], clean["val_mse"],
        "bit-identical training"
    );
}

#[test]
fn a_group_refuses_a_device_named_twice_a_batch_below_its_size_and_the_chain_step() {
    let twice = cistern(&["train", "--devices", "cpu:0,cpu:0"]);
    fails_with(&twice, "cpu:0 is named twice");
    let small = cistern(&["train", "--devices", "cpu:0,cpu:1,cpu:2", "--batch", "2"]);
    fails_with(&small, "--batch 2: smaller than the group's 3 replicas");
    let chain = cistern(&["train", "--devices", "cpu:0,cpu:1", "--step", "chain"]);
    fails_with(&chain, "--step chain runs on one device");
    let absent = cistern(&["train", "--devices", "cpu:0,cpu:99"]);
    fails_with(&absent, "cpu:0 to cpu:63");
}

#[cfg(not(feature = "mpi"))]
#[test]
fn distributed_mpi_in_a_build_without_mpi_names_the_feature() {
    let output = cistern(&["train", "--distributed", "mpi"]);
    fails_with(&output, "--features mpi");
}

#[cfg(feature = "mpi")]
mod mpi {
    use super::*;
    use std::process::Command;

    /// `cistern train` as `ranks` MPI ranks.
    fn under_mpirun(ranks: usize, args: &[&str]) -> Output {
        let output = Command::new("mpirun")
            .args(["--allow-run-as-root", "--oversubscribe"])
            .args(["--mca", "btl_vader_single_copy_mechanism", "none"])
            .args(["-np", &ranks.to_string(), env!("CARGO_BIN_EXE_cistern")])
            .args(args)
            .output();
        match output {
            Ok(output) => output,
            Err(error) => panic!("mpirun (install openmpi-bin): {error}"),
        }
    }

    #[test]
    fn outside_mpirun_distributed_mpi_names_the_launcher() {
        let output = cistern(&["train", "--distributed", "mpi"]);
        fails_with(&output, "mpirun -np N");
    }

    #[test]
    fn two_and_three_ranks_train_as_one_device_does_and_rank_zero_alone_reports_and_saves() {
        let one = group_summary(&[]);
        for ranks in [1, 2, 3] {
            let saved = scratch(&format!("ranks-{ranks}.safetensors"));
            let _ = std::fs::remove_file(&saved);
            let output = under_mpirun(
                ranks,
                &[
                    "train",
                    "--steps",
                    "200",
                    "--json",
                    "--optimizer",
                    "adam",
                    "--distributed",
                    "mpi",
                    "--save",
                    path(&saved),
                ],
            );
            assert!(output.status.success(), "{}", text(&output.stderr));
            let lines = json_lines(&output);
            let summaries: Vec<&Value> = lines.iter().filter(|l| l["event"] == "summary").collect();
            assert_eq!(summaries.len(), 1, "rank 0 alone reports");
            let starts = lines.iter().filter(|l| l["event"] == "start").count();
            assert_eq!(starts, 1);
            let summary = summaries[0];
            assert_eq!(summary["device"], format!("cpu:0 x {ranks} ranks (mpi)"));
            let (Some(a), Some(b)) = (one["val_mse"].as_f64(), summary["val_mse"].as_f64()) else {
                panic!("no val_mse: {summary}");
            };
            assert!((a - b).abs() < 1e-3, "{ranks} ranks: {b}, one device {a}");
            assert!(saved.exists(), "--save wrote the model");
        }
    }

    #[test]
    fn two_ranks_resumed_from_a_checkpoint_end_as_the_run_that_never_stopped() {
        let dir = scratch("mpi-checkpoints");
        let _ = std::fs::remove_dir_all(&dir);
        let (whole, resumed) = (scratch("mpi-whole.st"), scratch("mpi-resumed.st"));
        let args = |save: &std::path::Path| {
            let mut args = vec![
                "train",
                "--steps",
                "60",
                "--json",
                "--optimizer",
                "adam",
                "--amp",
                "--distributed",
                "mpi",
                "--checkpoint-every",
                "20",
                "--keep",
                "5",
                "--checkpoint-dir",
                path(&dir),
                "--save",
            ]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>();
            args.push(path(save).to_string());
            args
        };
        let run = |args: Vec<String>| {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            let output = under_mpirun(2, &refs);
            assert!(output.status.success(), "{}", text(&output.stderr));
            json_lines(&output)
        };
        run(args(&whole));
        for step in [40, 60] {
            let file = dir.join(format!("checkpoint-{step:012}.safetensors"));
            assert!(
                std::fs::remove_file(&file).is_ok(),
                "rank 0 saved {}",
                file.display()
            );
        }
        let mut again = args(&resumed);
        again.extend(["--resume".to_string(), path(&dir).to_string()]);
        let lines = run(again);
        let resume: Vec<&Value> = lines.iter().filter(|l| l["event"] == "resume").collect();
        assert_eq!(resume.len(), 1, "rank 0 alone says where it resumed");
        assert_eq!(resume[0]["step"], 20);
        assert_eq!(cli::tensors(&resumed), cli::tensors(&whole));
    }

    #[test]
    fn a_batch_smaller_than_the_world_is_refused_before_anything_runs() {
        let args = ["train", "--distributed", "mpi", "--batch", "2", "--json"];
        let output = under_mpirun(3, &args);
        let stderr = text(&output.stderr);
        assert!(!output.status.success());
        // mpirun ends the job at the first rank's refusal: one to three say it.
        assert!(
            stderr.contains("--batch 2: smaller than the group's 3 replicas"),
            "{stderr}"
        );
        assert_eq!(text(&output.stdout), "", "refused before anything ran");
    }
}

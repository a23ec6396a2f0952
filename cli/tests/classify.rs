//! End-to-end tests of `cistern train --task classify` (the default for
//! the digits and breast-cancer datasets) and `cistern predict` of a saved
//! classifier, through the built binary.

use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;

mod cli;
use cli::{cistern, text};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cistern-classify-{}", std::process::id()));
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

fn summary(output: &Output) -> Value {
    assert!(output.status.success(), "{}", text(&output.stderr));
    let summary = json_lines(output).last().cloned().unwrap_or_default();
    assert_eq!(summary["event"], "summary");
    summary
}

fn fails_with(output: &Output, needle: &str) {
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "should fail; stderr: {stderr}");
    assert!(stderr.contains(needle), "expected `{needle}` in: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Three flower species on a plane, well apart, with names for classes.
fn write_flowers(name: &str, rows: usize) -> PathBuf {
    let file = scratch(name);
    let mut text = String::from("x1,x2,species\n");
    for i in 0..rows {
        let (species, centre) = [("setosa", 0.0), ("versicolor", 2.5), ("virginica", 5.0)][i % 3];
        let jitter = ((i * 7919) % 100) as f32 / 100.0 - 0.5;
        text.push_str(&format!(
            "{},{},{species}\n",
            centre + jitter,
            -centre + 0.5 * jitter
        ));
    }
    assert!(std::fs::write(&file, text).is_ok());
    file
}

#[test]
fn digits_with_the_defaults_reach_97_percent_validation_accuracy() {
    let output = cistern(&["train", "--dataset", "digits", "--json"]);
    let summary = summary(&output);
    let lines = json_lines(&output);
    assert_eq!(lines[0]["task"], "classify");
    assert_eq!(lines[0]["classes"], 10);
    let evals: Vec<&Value> = lines.iter().filter(|l| l["event"] == "eval").collect();
    assert!(evals.len() >= 10, "{} evaluations", evals.len());
    assert!(
        evals
            .iter()
            .all(|e| e["val_accuracy"].is_f64() && e["val_log_loss"].is_f64())
    );
    let accuracy = summary["val_accuracy"].as_f64().unwrap_or(0.0);
    assert!(accuracy >= 0.97, "validation accuracy {accuracy}");
    let baseline = summary["baseline_accuracy"].as_f64().unwrap_or(1.0);
    assert!(baseline < 0.2, "the majority of ten digits: {baseline}");
    let confusion = summary["confusion"].as_array().cloned().unwrap_or_default();
    assert_eq!(confusion.len(), 10);
    let counted: u64 = confusion
        .iter()
        .flat_map(|row| row.as_array().cloned().unwrap_or_default())
        .filter_map(|c| c.as_u64())
        .sum();
    assert_eq!(Some(counted), summary["val_rows"].as_u64());
    let diagonal: u64 = (0..10).filter_map(|i| confusion[i][i].as_u64()).sum();
    assert!((diagonal as f64 / counted as f64 - accuracy).abs() < 1e-9);
}

#[test]
fn breast_cancer_beats_the_majority_class_and_plots_loss_and_accuracy() {
    let plot = scratch("cancer.svg");
    let output = cistern(&[
        "train",
        "--dataset",
        "breast-cancer",
        "--json",
        "--plot",
        path(&plot),
    ]);
    let summary = summary(&output);
    assert_eq!(
        summary["classes"],
        serde_json::json!(["malignant", "benign"])
    );
    let (accuracy, baseline) = (
        summary["val_accuracy"].as_f64().unwrap_or(0.0),
        summary["baseline_accuracy"].as_f64().unwrap_or(1.0),
    );
    assert!(
        accuracy >= 0.9 && accuracy > baseline + 0.2,
        "{accuracy} vs {baseline}"
    );
    let svg = std::fs::read_to_string(&plot).unwrap_or_default();
    for label in [
        "validation accuracy",
        "validation log-loss",
        "majority class",
    ] {
        assert!(svg.contains(label), "the plot has no `{label}`");
    }
}

#[test]
fn a_csv_classifier_keeps_its_class_names_through_save_and_predict() {
    let data = write_flowers("flowers.csv", 240);
    let model = scratch("flowers.st");
    let every = scratch("flowers-predicted.csv");
    let output = cistern(&[
        "train",
        "--csv",
        path(&data),
        "--target",
        "species",
        "--task",
        "classify",
        "--save",
        path(&model),
        "--steps",
        "300",
        "--json",
        "--predictions",
        path(&every),
    ]);
    let summary = summary(&output);
    assert!(
        summary["val_accuracy"].as_f64().unwrap_or(0.0) >= 0.95,
        "{summary}"
    );
    // --predictions: every row's class name, in input order.
    let predicted = std::fs::read_to_string(&every).unwrap_or_default();
    let names: Vec<&str> = predicted.lines().collect();
    assert_eq!((names.len(), names[0]), (241, "species"));
    let right = (1..241)
        .filter(|&row| names[row] == ["setosa", "versicolor", "virginica"][(row - 1) % 3])
        .count();
    assert!(right >= 228, "{right} of 240 rows predicted as their class");
    let rows = scratch("new.csv");
    assert!(std::fs::write(&rows, "x2,x1\n0.1,0.0\n-5.0,5.0\n-2.4,2.5\n").is_ok());
    let predicted = cistern(&["predict", "--model", path(&model), "--csv", path(&rows)]);
    assert!(predicted.status.success(), "{}", text(&predicted.stderr));
    assert_eq!(
        text(&predicted.stdout),
        "species\nsetosa\nvirginica\nversicolor\n"
    );
    let with = cistern(&[
        "predict",
        "--model",
        path(&model),
        "--csv",
        path(&rows),
        "--probabilities",
    ]);
    let printed = text(&with.stdout);
    let mut lines = printed.lines();
    assert_eq!(
        lines.next(),
        Some("species,p_setosa,p_versicolor,p_virginica")
    );
    for line in lines {
        let total: f64 = line
            .split(',')
            .skip(1)
            .filter_map(|p| p.parse::<f64>().ok())
            .sum();
        assert!((total - 1.0).abs() < 1e-5, "{line}");
    }
}

#[test]
fn a_class_the_saved_model_never_saw_is_refused_at_predict_naming_it() {
    let data = write_flowers("known.csv", 90);
    let model = scratch("known.st");
    let trained = cistern(&[
        "train",
        "--csv",
        path(&data),
        "--target",
        "species",
        "--save",
        path(&model),
        "--task",
        "classify",
        "--steps",
        "20",
    ]);
    assert!(trained.status.success(), "{}", text(&trained.stderr));
    let rows = scratch("unknown.csv");
    assert!(std::fs::write(&rows, "x1,x2,species\n0,0,setosa\n1,1,rose\n").is_ok());
    let output = cistern(&["predict", "--model", path(&model), "--csv", path(&rows)]);
    fails_with(&output, "line 3: class `rose`");
    fails_with(&output, "setosa, versicolor, virginica");
}

#[test]
fn too_many_classes_and_an_empty_class_are_refused_saying_what_to_do() {
    let file = scratch("numbers.csv");
    let mut csv = String::from("a,y\n");
    for i in 0..40 {
        csv.push_str(&format!("{i},{}\n", i as f32 * 0.5));
    }
    assert!(std::fs::write(&file, csv).is_ok());
    let output = cistern(&[
        "train",
        "--csv",
        path(&file),
        "--target",
        "y",
        "--task",
        "classify",
        "--max-classes",
        "10",
    ]);
    fails_with(&output, "40 distinct values");
    fails_with(&output, "--task regress");
    let empty = scratch("empty-class.csv");
    assert!(std::fs::write(&empty, "a,y\n1,x\n2,\n3,z\n").is_ok());
    let output = cistern(&[
        "train",
        "--csv",
        path(&empty),
        "--target",
        "y",
        "--task",
        "classify",
    ]);
    fails_with(&output, "line 3: the class `y` is empty");
}

#[test]
fn other_optimizers_classify_through_the_tape() {
    let output = cistern(&[
        "train",
        "--dataset",
        "digits",
        "--optimizer",
        "adam",
        "--steps",
        "300",
        "--json",
    ]);
    let summary = summary(&output);
    assert_eq!(summary["step"], "tape");
    assert!(
        summary["val_accuracy"].as_f64().unwrap_or(0.0) > 0.9,
        "{summary}"
    );
}

#[test]
fn the_cross_entropy_bench_prints_one_line_with_both_timings() {
    let output = cistern(&["bench", "cross-entropy", "--samples", "3"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let lines = json_lines(&output);
    assert_eq!(lines.len(), 1);
    let line = &lines[0];
    assert_eq!(line["bench"], "cross_entropy");
    assert_eq!(
        (line["rows"].as_u64(), line["classes"].as_u64()),
        (Some(256), Some(1000))
    );
    for field in ["ms", "kernel_ms"] {
        assert!(
            line[field].as_f64().is_some_and(|v| v > 0.0),
            "{field}: {line}"
        );
    }
    // Uniform-ish logits over 1,000 classes: the loss is near ln 1000.
    let loss = line["loss"].as_f64().unwrap_or(0.0);
    assert!(loss > 4.0 && loss < 12.0, "{loss}");
}

#[test]
fn the_vision_transformer_learns_the_digits_in_a_few_steps() {
    let output = cistern(&[
        "train",
        "--dataset",
        "digits",
        "--model",
        "vit",
        "--optimizer",
        "adamw",
        "--steps",
        "12",
        "--batch",
        "16",
        "--validation",
        "0.1",
        "--json",
    ]);
    let summary = summary(&output);
    assert_eq!(summary["model"], "vit");
    assert_eq!(summary["parameters"], 68_938);
    let losses: Vec<f64> = json_lines(&output)
        .iter()
        .filter(|line| line["event"] == "eval")
        .filter_map(|line| line["train_loss"].as_f64())
        .collect();
    assert_eq!(losses.len(), 12, "one evaluation a step");
    let (first, last) = (
        losses[..3].iter().sum::<f64>(),
        losses[9..].iter().sum::<f64>(),
    );
    assert!(last < first - 1.0, "the loss falls: {losses:?}");
    // Ten classes: chance is about 0.1.
    let accuracy = summary["val_accuracy"].as_f64().unwrap_or(0.0);
    assert!(accuracy > 0.3, "validation accuracy {accuracy}");
}

#[test]
fn the_vision_transformer_takes_the_digits_only_and_says_so() {
    for dataset in ["winequality", "breast-cancer"] {
        let output = cistern(&["train", "--dataset", dataset, "--model", "vit"]);
        fails_with(&output, "--model vit classifies the 8×8 digits");
    }
    let output = cistern(&[
        "train",
        "--dataset",
        "digits",
        "--model",
        "vit",
        "--task",
        "regress",
    ]);
    fails_with(&output, "--model vit classifies the 8×8 digits");
    let output = cistern(&[
        "train",
        "--dataset",
        "digits",
        "--model",
        "vit",
        "--save",
        "x.safetensors",
    ]);
    fails_with(&output, "--save is not supported with --model vit");
}

//! Resumable runs through the built binary: `cistern train` killed with
//! SIGKILL at seeded moments (between steps, during a step, during a
//! checkpoint write) and resumed each time ends with the very parameters
//! of a run that never stopped, for SGD's device chain, Adam, AMP, a
//! replica group and a classifier; a
//! damaged newest checkpoint is passed over, saying so; another run's
//! checkpoint is refused, naming the argument that differs.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use cistern::memory::SplitMix64;
use serde_json::Value;

mod cli;
use cli::{cistern, tensors, text};

/// Kills per run, each after a seeded number of checkpoints.
const KILLS: usize = 4;
/// Steps of each run; a checkpoint every `EVERY`.
const STEPS: u64 = 240;
const EVERY: u64 = 7;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cistern-resume-{}", std::process::id()));
    assert!(std::fs::create_dir_all(&dir).is_ok());
    let path = dir.join(name);
    let _ = std::fs::remove_dir_all(&path);
    path
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A small regression CSV (fast to load in a debug build).
fn csv() -> PathBuf {
    let file = scratch("data.csv");
    let mut text = String::from("a,b,y\n");
    for i in 0..160 {
        let (a, b) = ((i % 13) as f32 * 0.25, (i % 5) as f32 - 2.0);
        text.push_str(&format!("{a},{b},{}\n", a - 0.5 * b + 0.3 * a * b));
    }
    assert!(std::fs::write(&file, text).is_ok());
    file
}

/// A small three-class CSV.
fn class_csv() -> PathBuf {
    let file = scratch("classes.csv");
    let mut text = String::from("a,b,kind\n");
    for i in 0..150 {
        let (a, b) = ((i % 13) as f32 * 0.25, (i % 5) as f32 - 2.0);
        let kind = ["low", "mid", "high"][((a + b + 2.0) / 2.2).clamp(0.0, 2.0) as usize];
        text.push_str(&format!("{a},{b},{kind}\n"));
    }
    assert!(std::fs::write(&file, text).is_ok());
    file
}

/// `cistern train` on the CSV for `steps` with `family`'s arguments,
/// saving to `save`.
fn train_args(data: &Path, family: &[&str], save: &Path, steps: u64) -> Vec<String> {
    let target = match data.ends_with("classes.csv") {
        true => "kind",
        false => "y",
    };
    let mut args: Vec<String> = [
        "train",
        "--csv",
        &path(data),
        "--target",
        target,
        "--layers",
        "8",
        "--batch",
        "8",
        "--steps",
        &steps.to_string(),
        "--seed",
        "5",
        "--json",
        "--save",
        &path(save),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(family.iter().map(|s| s.to_string()));
    args
}

fn run(args: &[String]) -> Vec<Value> {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = cistern(&refs);
    assert!(output.status.success(), "{}", text(&output.stderr));
    text(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// Starts `args`, waits for `checkpoints` checkpoint lines (or the end),
/// sleeps `pause`, and kills it with SIGKILL. Returns the steps of the
/// checkpoints it saw.
fn kill_after(args: &[String], checkpoints: usize, pause: Duration) -> Vec<u64> {
    let mut child = match Command::new(env!("CARGO_BIN_EXE_cistern"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(child) => child,
        Err(error) => panic!("cannot start cistern: {error}"),
    };
    let mut seen = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        let mut lines = BufReader::new(stdout).lines();
        while seen.len() < checkpoints {
            let Some(Ok(line)) = lines.next() else { break };
            let value: Value = serde_json::from_str(&line).unwrap_or_default();
            if value["event"] == "checkpoint" {
                seen.push(value["step"].as_u64().unwrap_or_default());
            }
        }
        std::thread::sleep(pause);
        // SIGKILL on Unix: no handler, no flush, no cleanup.
        let _ = child.kill();
        drop(lines);
    }
    let _ = child.wait();
    seen
}

/// Whether a killed write left its partial file in `dir`.
fn has_partial(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".partial"))
    })
}

/// Kills a checkpointing run `KILLS` times at seeded moments, resuming
/// each time, and compares its final parameters with a run that never
/// stopped, bit for bit.
fn killed_and_resumed_ends_as_the_uninterrupted_run(name: &str, family: &[&str], seed: u64) {
    let data = match family.contains(&"classify") {
        true => class_csv(),
        false => csv(),
    };
    let reference = scratch(&format!("{name}-reference.safetensors"));
    run(&train_args(&data, family, &reference, STEPS));
    let dir = scratch(&format!("{name}-checkpoints"));
    let out = scratch(&format!("{name}-resumed.safetensors"));
    let mut args = train_args(&data, family, &out, STEPS);
    for flag in [
        "--checkpoint-every".to_string(),
        EVERY.to_string(),
        "--resume".to_string(),
        path(&dir),
    ] {
        args.push(flag);
    }
    let mut rng = SplitMix64::new(seed);
    let (mut reached, mut in_writes) = (Vec::new(), 0);
    for _ in 0..KILLS {
        let checkpoints = 1 + rng.below(4) as usize;
        let pause = Duration::from_micros(rng.below(20_000));
        let seen = kill_after(&args, checkpoints, pause);
        assert!(
            !std::fs::exists(&out).unwrap_or(true),
            "a killed run must not have finished"
        );
        reached.push(seen);
        in_writes += usize::from(has_partial(&dir));
    }
    // Which moments the seeds hit, for the log (a kill during a write
    // leaves a partial file, which the next save removes).
    eprintln!("{name}: {in_writes} of {KILLS} kills during a checkpoint write; saw {reached:?}");
    let lines = run(&args);
    let resumed_at = lines
        .iter()
        .find(|l| l["event"] == "resume")
        .map(|l| l["step"].as_u64().unwrap_or_default());
    assert!(
        resumed_at.is_some_and(|step| step > 0),
        "the last run resumed at {resumed_at:?}; kills saw checkpoints {reached:?}"
    );
    assert_eq!(
        tensors(&out),
        tensors(&reference),
        "{name}: resumed after kills {reached:?} differs from the uninterrupted run"
    );
}

#[test]
fn sgd_on_the_device_chain_killed_four_times_ends_bit_identical() {
    killed_and_resumed_ends_as_the_uninterrupted_run("sgd", &["--optimizer", "sgd"], 1);
}

#[test]
fn adam_killed_four_times_ends_bit_identical() {
    killed_and_resumed_ends_as_the_uninterrupted_run("adam", &["--optimizer", "adam"], 2);
}

#[test]
fn adam_with_amp_killed_four_times_ends_bit_identical() {
    killed_and_resumed_ends_as_the_uninterrupted_run("amp", &["--optimizer", "adam", "--amp"], 3);
}

#[test]
fn a_replica_group_of_two_devices_killed_four_times_ends_bit_identical() {
    killed_and_resumed_ends_as_the_uninterrupted_run(
        "group",
        &["--optimizer", "adam", "--devices", "cpu:0,cpu:1"],
        5,
    );
}

#[test]
fn a_classifier_killed_four_times_ends_bit_identical() {
    killed_and_resumed_ends_as_the_uninterrupted_run(
        "classify",
        &["--task", "classify", "--optimizer", "adam"],
        4,
    );
}

fn stderr_of(args: &[String]) -> (bool, String) {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = cistern(&refs);
    let stderr = text(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    (output.status.success(), stderr)
}

#[test]
fn a_damaged_newest_checkpoint_is_passed_over_saying_so_and_another_run_s_or_layout_s_is_refused() {
    let data = csv();
    let dir = scratch("damaged-checkpoints");
    let out = scratch("damaged.safetensors");
    let mut args = train_args(&data, &["--optimizer", "adam"], &out, 30);
    args.retain(|a| a != "--json");
    let with = |extra: &[&str]| {
        let mut all = args.clone();
        all.extend(extra.iter().map(|s| s.to_string()));
        all
    };
    let first = with(&["--checkpoint-every", "10", "--checkpoint-dir", &path(&dir)]);
    assert!(stderr_of(&first).0);
    let newest = dir.join("checkpoint-000000000030.safetensors");
    let bytes = std::fs::read(&newest).unwrap_or_default();
    assert!(bytes.len() > 100, "no newest checkpoint");
    assert!(std::fs::write(&newest, &bytes[..bytes.len() / 2]).is_ok());
    let (ok, stderr) = stderr_of(&with(&["--resume", &path(&dir)]));
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("passed over a damaged checkpoint"),
        "{stderr}"
    );
    assert!(
        stderr.contains("checkpoint-000000000020.safetensors at step 20 of 30"),
        "{stderr}"
    );
    let (ok, stderr) = stderr_of(&with(&["--resume", &path(&dir), "--lr", "0.5"]));
    assert!(!ok);
    assert!(
        stderr.contains("another run: --lr 0.001 there, 0.5 here"),
        "{stderr}"
    );
    let (ok, stderr) = stderr_of(&with(&["--checkpoint-every", "5"]));
    assert!(!ok);
    assert!(
        stderr.contains("--checkpoint-every needs a directory"),
        "{stderr}"
    );
    // A checkpoint from before the [in, out] weights names no layout: its
    // square weights would pass the shape check, so it is refused.
    let older = dir.join("checkpoint-000000000020.safetensors");
    let bytes = std::fs::read(&older).unwrap_or_default();
    let Ok(mut contents) = cistern::client::read_checkpoint(&bytes) else {
        panic!("the step-20 checkpoint reads back");
    };
    if let Some(identity) = contents.run["identity"].as_object_mut() {
        assert!(identity.remove("weight_layout").is_some(), "{identity:?}");
    }
    let mut rewritten = Vec::new();
    let written = cistern::client::write_checkpoint(&mut rewritten, &contents.store, &contents.run);
    assert!(written.is_ok() && std::fs::write(&older, rewritten).is_ok());
    let (ok, stderr) = stderr_of(&with(&["--resume", &path(&dir)]));
    assert!(!ok);
    assert!(stderr.contains("stores its weights [out, in]"), "{stderr}");
}

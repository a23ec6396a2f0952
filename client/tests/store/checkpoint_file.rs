//! The checkpoint file and directory: every family's checkpoint reads back
//! equal; a truncated, corrupt, foreign or newer file is refused saying
//! which; the directory keeps the newest `keep`, leaves nothing half
//! written, and resumes from the newest file that reads back whole.

use std::path::Path;

use cistern_client::{
    CheckpointDir, CheckpointError, StoreCheckpoint, read_checkpoint, write_checkpoint,
};
use cistern_optim::{AdamConfig, LambConfig, OptimizerConfig, SgdConfig};
use serde_json::json;

use super::common::{model, ok, open, step_with, store, with_gradients};

/// A store's checkpoint after `steps` steps of `config`.
fn checkpoint_after(config: &OptimizerConfig, steps: usize) -> StoreCheckpoint {
    let client = open();
    let model = model(41);
    let mut store = store(&client, &model);
    for _ in 0..steps {
        with_gradients(&client, &mut store, &model, |store, gradients| {
            ok(step_with(store, gradients, config), "step")
        });
    }
    ok(store.checkpoint(), "checkpoint")
}

fn file_of(checkpoint: &StoreCheckpoint) -> Vec<u8> {
    let mut bytes = Vec::new();
    ok(
        write_checkpoint(&mut bytes, checkpoint, &json!({"step": 3})),
        "write",
    );
    bytes
}

fn adam() -> OptimizerConfig {
    OptimizerConfig::Adam(AdamConfig {
        amsgrad: true,
        ..Default::default()
    })
}

#[test]
fn every_family_s_checkpoint_reads_back_equal_with_its_run_state() {
    let families = [
        OptimizerConfig::Sgd(SgdConfig {
            lr: 0.01,
            momentum: 0.9,
            ..Default::default()
        }),
        adam(),
        OptimizerConfig::Lamb(LambConfig::default()),
    ];
    for config in &families {
        let checkpoint = checkpoint_after(config, 3);
        let read = ok(read_checkpoint(&file_of(&checkpoint)), "read");
        assert_eq!(read.store, checkpoint, "{config:?}");
        assert_eq!(read.run, json!({"step": 3}));
    }
    let never_stepped = checkpoint_after(&adam(), 0);
    let read = ok(read_checkpoint(&file_of(&never_stepped)), "read");
    assert_eq!(read.store, never_stepped);
}

#[test]
fn the_file_is_safetensors_with_one_tensor_per_slot_and_state_buffer() {
    let bytes = file_of(&checkpoint_after(&adam(), 1));
    let tensors = ok(safetensors::SafeTensors::deserialize(&bytes), "safetensors");
    let mut names = tensors.names();
    names.sort();
    assert_eq!(
        names.len(),
        4 * 4,
        "param, exp_avg, exp_avg_sq, max_exp_avg_sq"
    );
    let first = ok(tensors.tensor("param.0"), "param.0");
    assert_eq!(first.shape(), &[4, 6]);
    assert!(names.contains(&"exp_avg.3"), "{names:?}");
}

fn damaged(bytes: &[u8]) -> String {
    match read_checkpoint(bytes) {
        Err(CheckpointError::Damaged(why)) => why,
        other => panic!("read a damaged file: {other:?}"),
    }
}

#[test]
fn a_truncated_or_corrupt_file_is_refused_as_damaged() {
    let bytes = file_of(&checkpoint_after(&adam(), 2));
    for cut in [0, 5, 8, 100, bytes.len() / 2, bytes.len() - 1] {
        damaged(&bytes[..cut]);
    }
    // A flipped bit in the last tensor's data.
    let mut flipped = bytes.clone();
    let last = flipped.len() - 3;
    flipped[last] ^= 0x10;
    assert!(damaged(&flipped).contains("CRC-32"));
    let mut longer = bytes;
    longer.extend([0; 4]);
    damaged(&longer);
}

/// `bytes` with its metadata entry `key` set to `value` (same length).
fn with_metadata(bytes: &[u8], key: &str, from: &str, to: &str) -> Vec<u8> {
    let text = format!("\"{key}\":\"{from}\"");
    let swapped = format!("\"{key}\":\"{to}\"");
    assert_eq!(text.len(), swapped.len());
    let at = bytes
        .windows(text.len())
        .position(|w| w == text.as_bytes())
        .unwrap_or_else(|| panic!("no {text}"));
    let mut out = bytes.to_vec();
    out[at..at + text.len()].copy_from_slice(swapped.as_bytes());
    out
}

#[test]
fn another_format_version_or_another_kind_of_file_is_refused_saying_so() {
    let bytes = file_of(&checkpoint_after(&adam(), 1));
    match read_checkpoint(&with_metadata(&bytes, "format_version", "1", "2")) {
        Err(CheckpointError::Version { found, expected }) => {
            assert_eq!((found.as_str(), expected), ("2", 1))
        }
        other => panic!("read another version: {other:?}"),
    }
    let foreign = with_metadata(&bytes, "format", "cistern-checkpoint", "cistern-savedmodel");
    assert!(matches!(
        read_checkpoint(&foreign),
        Err(CheckpointError::Foreign(_))
    ));
    let plain = ok(
        safetensors::serialize(Vec::<(&str, safetensors::tensor::TensorView)>::new(), None),
        "plain safetensors",
    );
    assert!(matches!(
        read_checkpoint(&plain),
        Err(CheckpointError::Foreign(_))
    ));
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cistern-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = ok(std::fs::read_dir(dir), "read_dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

#[test]
fn the_directory_keeps_the_newest_and_clears_a_killed_writer_s_leftovers() {
    let dir = temp_dir("keep");
    let checkpoints = ok(CheckpointDir::create(&dir, 2), "dir");
    let checkpoint = checkpoint_after(&adam(), 1);
    std::fs::write(
        dir.join("checkpoint-000000000007.safetensors.partial"),
        b"torn",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    for step in [10, 20, 30] {
        ok(
            checkpoints.save(step, &checkpoint, &json!({"step": step})),
            "save",
        );
    }
    assert_eq!(
        names(&dir),
        [
            "checkpoint-000000000020.safetensors",
            "checkpoint-000000000030.safetensors"
        ]
    );
    let newest = ok(checkpoints.newest(), "newest").unwrap_or_else(|| panic!("none"));
    assert_eq!(
        (newest.step, newest.contents.run.clone()),
        (30, json!({"step": 30}))
    );
    assert!(newest.passed_over.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_damaged_newest_checkpoint_is_passed_over_for_the_one_before() {
    let dir = temp_dir("damaged");
    let checkpoints = ok(CheckpointDir::create(&dir, 2), "dir");
    assert_eq!(ok(checkpoints.newest(), "empty"), None);
    let checkpoint = checkpoint_after(&adam(), 1);
    ok(checkpoints.save(1, &checkpoint, &json!(1)), "save 1");
    let newest = ok(checkpoints.save(2, &checkpoint, &json!(2)), "save 2");
    let bytes = ok(std::fs::read(&newest), "read");
    ok(
        std::fs::write(&newest, &bytes[..bytes.len() / 3]),
        "truncate",
    );
    let resumed = ok(checkpoints.newest(), "newest").unwrap_or_else(|| panic!("none"));
    assert_eq!(resumed.step, 1);
    assert_eq!(resumed.contents.store, checkpoint);
    assert_eq!(resumed.passed_over.len(), 1);
    assert_eq!(resumed.passed_over[0].0, newest);
    ok(
        std::fs::write(dir.join("checkpoint-000000000001.safetensors"), b"x"),
        "ruin",
    );
    match checkpoints.newest() {
        Err(CheckpointError::Damaged(why)) => assert!(why.contains("no checkpoint"), "{why}"),
        other => panic!("resumed from ruins: {other:?}"),
    }
    assert!(matches!(
        CheckpointDir::create(&dir, 0),
        Err(CheckpointError::InvalidArgument(_))
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_store_saved_streamed_reads_back_as_its_checkpoint() {
    let dir = temp_dir("streamed");
    let checkpoints = ok(CheckpointDir::create(&dir, 3), "dir");
    let client = open();
    let model = model(43);
    let mut store = store(&client, &model);
    let never = ok(checkpoints.save_store(0, &store, &json!("never")), "save 0");
    let read = |path: &Path| ok(read_checkpoint(&ok(std::fs::read(path), "file")), "read");
    assert_eq!(read(&never).store, ok(store.checkpoint(), "checkpoint 0"));
    for _ in 0..2 {
        with_gradients(&client, &mut store, &model, |store, gradients| {
            ok(step_with(store, gradients, &adam()), "step")
        });
    }
    let stepped = ok(
        checkpoints.save_store(2, &store, &json!({"step": 2})),
        "save 2",
    );
    let back = read(&stepped);
    assert_eq!(back.store, ok(store.checkpoint(), "checkpoint 2"));
    assert_eq!(back.run, json!({"step": 2}));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_download_failing_mid_save_leaves_the_earlier_checkpoint_whole() {
    use cistern_runtime::{DeviceOptions, FaultPlan};
    let model = model(44);
    // The first transfer that fails inside the second save.
    for failing in 1..40 {
        let plan = FaultPlan::none().with_failed_transfer(failing);
        let client = super::common::open_with(DeviceOptions::default().with_faults(plan));
        let refs: Vec<_> = model.params.iter().collect();
        let Ok(store) =
            cistern_client::DeviceParamStore::new(&cistern_client::Tape::new(&client), &refs)
        else {
            continue;
        };
        let dir = temp_dir(&format!("failing-{failing}"));
        let checkpoints = ok(CheckpointDir::create(&dir, 2), "dir");
        if checkpoints.save_store(1, &store, &json!(1)).is_err() {
            continue;
        }
        match checkpoints.save_store(2, &store, &json!(2)) {
            Ok(_) => continue,
            Err(CheckpointError::Device(_)) => {}
            Err(other) => panic!("a failed download answered {other:?}"),
        }
        let newest = ok(checkpoints.newest(), "newest").unwrap_or_else(|| panic!("none left"));
        assert_eq!((newest.step, newest.passed_over.len()), (1, 0));
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    panic!("no injected transfer failure landed in a save");
}

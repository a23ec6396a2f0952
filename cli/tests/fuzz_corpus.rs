//! The fuzz targets on the stable toolchain: each body (`cistern_cli::fuzzing`)
//! runs on its checked-in corpus (`fuzz/corpus/<target>/`), on the seeds
//! its encoders make, then on deterministic mutations of them (bit flips,
//! truncations, splices, insertions). `CISTERN_FUZZ_MUTATIONS=N` runs N
//! mutations per target instead of the default.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use cistern::memory::SplitMix64;
use cistern_cli::fuzzing::{TARGETS, Target, seeds};

/// Mutations per target by default: the whole file stays well under 20 s
/// in a debug build.
const DEFAULT_MUTATIONS: usize = 1500;

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

fn target(name: &str) -> Target {
    match TARGETS.iter().find(|target| target.name == name) {
        Some(target) => *target,
        None => panic!("no fuzz target {name}"),
    }
}

/// The corpus files of `target`, sorted by name, and the seeds made now.
fn inputs(target: &str) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir(target))
        .map(|dir| {
            dir.filter_map(|entry| entry.ok().map(|e| e.path()))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    let mut inputs: Vec<(String, Vec<u8>)> = files
        .into_iter()
        .filter_map(|path| {
            let bytes = std::fs::read(&path).ok()?;
            Some((path.display().to_string(), bytes))
        })
        .collect();
    assert!(!inputs.is_empty(), "{target} has no corpus");
    for seed in seeds().into_iter().filter(|seed| seed.target == target) {
        inputs.push((format!("seed {}", seed.name), seed.bytes));
    }
    inputs
}

/// Runs the body; on a panic, saves the input and fails naming the file.
fn run_one(target: Target, label: &str, input: &[u8]) {
    if catch_unwind(AssertUnwindSafe(|| (target.body)(input))).is_err() {
        let saved = std::env::temp_dir().join(format!(
            "cistern-fuzz-{}-{}",
            target.name,
            std::process::id()
        ));
        let _ = std::fs::write(&saved, input);
        panic!(
            "{} panicked on {label} ({} bytes, saved to {}): add it to fuzz/corpus/{} and fix it",
            target.name,
            input.len(),
            saved.display(),
            target.name
        );
    }
}

fn mutations() -> usize {
    std::env::var("CISTERN_FUZZ_MUTATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(DEFAULT_MUTATIONS)
}

/// Bytes the mutator likes to insert: boundaries of integers and the
/// separators of the text formats.
const INTERESTING: &[u8] = b"\x00\x01\x7f\x80\xfb\xfc\xfd\xfe\xff\n\r,\"{}[]:-.e 0123456789";

/// One to four stacked mutations of `base` (with `other` for splices).
fn mutate(rng: &mut SplitMix64, base: &[u8], other: &[u8]) -> Vec<u8> {
    let mut bytes = base.to_vec();
    for _ in 0..=rng.below(4) {
        let len = bytes.len() as u64;
        let at = |rng: &mut SplitMix64| rng.below(len + 1) as usize;
        match rng.below(7) {
            0 if len > 0 => {
                let bit = rng.below(len * 8);
                bytes[(bit / 8) as usize] ^= 1 << (bit % 8);
            }
            1 => bytes.truncate(at(rng)),
            2 => {
                let cut = at(rng);
                let from = rng.below(other.len() as u64 + 1) as usize;
                bytes.truncate(cut);
                bytes.extend_from_slice(&other[from..]);
            }
            3 => {
                let position = at(rng);
                let count = 1 + rng.below(8) as usize;
                let fresh: Vec<u8> = (0..count).map(|_| rng.next_u64() as u8).collect();
                bytes.splice(position..position, fresh);
            }
            4 => {
                let position = at(rng);
                bytes.insert(position, rng.choose(INTERESTING));
            }
            5 if len > 0 => {
                let position = rng.below(len) as usize;
                bytes[position] = rng.choose(INTERESTING);
            }
            6 if len > 0 => {
                let start = rng.below(len) as usize;
                let end = start + rng.below((len - start as u64).min(64) + 1) as usize;
                let chunk = bytes[start..end].to_vec();
                let position = at(rng);
                bytes.splice(position..position, chunk);
            }
            _ => bytes.push(rng.next_u64() as u8),
        }
    }
    bytes
}

/// The corpus and the seeds, then the mutations, for one target.
fn exercise(name: &str) {
    let target = target(name);
    let inputs = inputs(name);
    for (label, input) in &inputs {
        run_one(target, label, input);
    }
    let mut rng = SplitMix64::new(0xf022_c0de ^ name.len() as u64);
    for case in 0..mutations() {
        let (label, base) = &inputs[rng.below(inputs.len() as u64) as usize];
        let (_, other) = &inputs[rng.below(inputs.len() as u64) as usize];
        let input = mutate(&mut rng, base, other);
        run_one(target, &format!("mutation {case} of {label}"), &input);
    }
}

#[test]
fn error_reports_survive_their_corpus_and_its_mutations() {
    exercise("error_report");
}

#[test]
fn compact_reports_survive_their_corpus_and_its_mutations() {
    exercise("compact_report");
}

#[test]
fn server_errors_survive_their_corpus_and_its_mutations() {
    exercise("server_error");
}

#[test]
fn io_errors_survive_their_corpus_and_its_mutations() {
    exercise("io_error");
}

#[test]
fn the_memory_manager_keeps_its_accounting_under_its_corpus_and_its_mutations() {
    exercise("memory_manager");
}

#[test]
fn alloc_traces_survive_their_corpus_and_its_mutations() {
    exercise("alloc_trace");
}

#[test]
fn csv_tables_survive_their_corpus_and_its_mutations() {
    exercise("csv_table");
}

#[test]
fn saved_models_survive_their_corpus_and_its_mutations() {
    exercise("saved_model");
}

#[test]
fn checkpoint_files_survive_their_corpus_and_its_mutations() {
    exercise("checkpoint_file");
}

#[test]
fn every_target_has_a_corpus_and_a_cargo_fuzz_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    for target in TARGETS {
        assert!(
            corpus_dir(target.name).is_dir(),
            "{} has no corpus",
            target.name
        );
        let file = root
            .join("fuzz_targets")
            .join(format!("{}.rs", target.name));
        assert!(file.is_file(), "{} has no {}", target.name, file.display());
    }
    let folders = std::fs::read_dir(root.join("corpus")).map_or(0, |dir| dir.count());
    assert_eq!(folders, TARGETS.len(), "a corpus folder names no target");
}

#[test]
#[ignore = "rewrites fuzz/corpus from the encoders: run when a layout changes"]
fn the_seed_corpus_is_written_by_the_encoders() {
    for seed in seeds() {
        let dir = corpus_dir(seed.target);
        assert!(std::fs::create_dir_all(&dir).is_ok());
        assert!(std::fs::write(dir.join(&seed.name), &seed.bytes).is_ok());
    }
}

//! The files a user hands the command line: `bench alloc` traces, the
//! `--csv` tables of `train` and `predict`, saved models and checkpoints.

use cistern_client::{OptimizerCheckpoint, StoreCheckpoint, read_checkpoint, write_checkpoint};
use cistern_memory::MemoryConfig;
use cistern_optim::{AdamConfig, OptimizerConfig};

use super::seeds::{Seed, seed};

use crate::bench::alloc::Replay;
use crate::train::csv_file;
use crate::train::model::{ActivationName, Layout};
use crate::train::model_file::SavedModel;
use crate::train::prep::Standardisation;

/// Traces longer than this are parsed, not replayed, so one input stays fast.
const MAX_REPLAYED: usize = 4096;

/// A `bench alloc` trace: what parses re-serialises to text that parses to
/// the same requests, and short traces replay (with and without mapping)
/// under a small limit without panicking.
pub fn alloc_trace(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(replay) = Replay::parse(text) else {
        return;
    };
    let again = Replay::parse(&replay.to_text());
    assert_eq!(again.as_ref(), Ok(&replay), "the trace re-serialises");
    if replay.ops.len() <= MAX_REPLAYED {
        let config = MemoryConfig::with_limit(1 << 30);
        for mapping in [false, true] {
            // A request over the limit is an error, not a finding.
            let _ = replay.run(&config, mapping);
        }
    }
}

/// A `--csv` table, read as `train` reads it (target column `y`) and as
/// `predict` reads it (columns `x`, `z`): what reads is whole and finite.
pub fn csv_table(data: &[u8]) {
    if let Ok(table) = csv_file::training_table("input.csv", data, "y") {
        let rows = table.targets.len();
        assert!(rows > 0, "a table without rows reads");
        assert!(!table.columns.is_empty(), "a table without features reads");
        assert!(!table.columns.iter().any(|column| column == "y"));
        assert_eq!(table.features.len(), rows * table.columns.len());
        let finite = |values: &[f32]| values.iter().all(|v| v.is_finite());
        assert!(finite(&table.features) && finite(&table.targets));
    }
    let wanted = ["x".to_string(), "z".to_string()];
    if let Ok((values, rows)) = csv_file::feature_rows("input.csv", data, &wanted) {
        assert!(rows > 0, "rows without a row read");
        assert_eq!(values.len(), rows * wanted.len());
        assert!(values.iter().all(|v| v.is_finite()));
    }
}

/// A saved model, as `predict` loads it: what loads saves to bytes that
/// load to the same model, bit for bit.
pub fn saved_model(data: &[u8]) {
    let Ok(model) = SavedModel::decode(data) else {
        return;
    };
    let bytes = match model.encode() {
        Ok(bytes) => bytes,
        Err(error) => panic!("a loaded model does not save: {error}"),
    };
    match SavedModel::decode(&bytes) {
        Ok(again) => assert!(same_bits(&again, &model), "the model round-trips"),
        Err(error) => panic!("a saved model does not load back: {error}"),
    }
}

/// A checkpoint file, as `--resume` reads it: what reads writes to bytes
/// that read back to the same checkpoint, bit for bit, and what reads
/// holds tensors that fill its shapes.
pub fn checkpoint_file(data: &[u8]) {
    let Ok(read) = read_checkpoint(data) else {
        return;
    };
    let mut bytes = Vec::new();
    if let Err(error) = write_checkpoint(&mut bytes, &read.store, &read.run) {
        panic!("a checkpoint that reads does not write: {error}");
    }
    match read_checkpoint(&bytes) {
        Ok(again) => {
            assert!(
                same_checkpoint(&again.store, &read.store),
                "the checkpoint round-trips"
            );
            assert_eq!(again.run, read.run, "the run state round-trips");
        }
        Err(error) => panic!("a written checkpoint does not read back: {error}"),
    }
}

/// Equality with every float compared by its bits.
fn same_checkpoint(a: &StoreCheckpoint, b: &StoreCheckpoint) -> bool {
    let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let optimizer = match (&a.optimizer, &b.optimizer) {
        (None, None) => true,
        (Some(x), Some(y)) => {
            x.config == y.config
                && x.steps == y.steps
                && x.device_amp == y.device_amp
                && x.state.len() == y.state.len()
                && x.state
                    .iter()
                    .zip(&y.state)
                    .all(|(p, q)| bits(p) == bits(q))
        }
        _ => false,
    };
    a.shapes == b.shapes && bits(&a.params) == bits(&b.params) && optimizer
}

/// Equality with every float compared by its bits (a parameter may be NaN).
fn same_bits(a: &SavedModel, b: &SavedModel) -> bool {
    let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let (sa, sb) = (&a.standardisation, &b.standardisation);
    a.layout == b.layout
        && a.columns == b.columns
        && a.target == b.target
        && a.parameters.len() == b.parameters.len()
        && a.parameters
            .iter()
            .zip(&b.parameters)
            .all(|(x, y)| bits(x) == bits(y))
        && bits(&sa.feature_mean) == bits(&sb.feature_mean)
        && bits(&sa.feature_std) == bits(&sb.feature_std)
        && bits(&[sa.target_mean, sa.target_std]) == bits(&[sb.target_mean, sb.target_std])
}

/// The file parsers' seeds made by code: small tables and a saved model.
/// Traces come from `shared/traces/gen_trace.py` and are checked in.
pub(super) fn seeds() -> Vec<Seed> {
    let mut seeds = vec![seed(
        "alloc_trace",
        "small.trace".into(),
        SMALL_TRACE.into(),
    )];
    for (index, table) in TABLES.iter().enumerate() {
        seeds.push(seed(
            "csv_table",
            format!("{index:02}.csv"),
            table.as_bytes().to_vec(),
        ));
    }
    for (name, hidden, activation) in [
        ("relu", &[3][..], ActivationName::Relu),
        ("gelu-deep", &[4, 2][..], ActivationName::Gelu),
    ] {
        let layout = Layout::new(2, hidden, activation);
        let model = SavedModel {
            parameters: layout.initial_parameters(1),
            layout,
            standardisation: Standardisation {
                feature_mean: vec![0.5, -1.5],
                feature_std: vec![2.0, 1.0],
                target_mean: 3.0,
                target_std: 0.25,
            },
            columns: vec!["x".into(), "z".into()],
            target: "y".into(),
            classes: None,
        };
        if let Ok(bytes) = model.encode() {
            seeds.push(seed("saved_model", format!("{name}.safetensors"), bytes));
        }
    }
    let params: Vec<f32> = (0..9).map(|i| i as f32 * 0.25 - 1.0).collect();
    let adam = StoreCheckpoint {
        shapes: vec![vec![2, 3], vec![3]],
        params: params.clone(),
        optimizer: Some(OptimizerCheckpoint {
            config: OptimizerConfig::Adam(AdamConfig::default()),
            steps: 3,
            state: vec![params.iter().map(|p| p * 0.1).collect(), vec![0.5; 9]],
            device_amp: None,
        }),
    };
    let run = serde_json::json!({"step": 3, "seed": 7});
    for (name, checkpoint) in [
        (
            "never-stepped",
            StoreCheckpoint {
                optimizer: None,
                ..adam.clone()
            },
        ),
        ("adam", adam),
    ] {
        let mut bytes = Vec::new();
        if write_checkpoint(&mut bytes, &checkpoint, &run).is_ok() {
            seeds.push(seed(
                "checkpoint_file",
                format!("{name}.safetensors"),
                bytes,
            ));
        }
    }
    seeds
}

const SMALL_TRACE: &str = "# a small trace\nr 0 100\nr 7 50\nf 0\nr 9 80\nc\nf 7\nf 9\n";

const TABLES: &[&str] = &[
    "x,y,z\n1,2,3\n4,5,6\n",
    "y,x,z,w\n-1.5e3, 2 ,3.25,0\n7,8,9,10\n",
    "\"x\",\"y\",\"z\"\r\n\"1\",\"2\",\"3\"\r\n",
    "x,y\n1,2\n3,nan\n",
    "x,y,z\n1,2\n",
    "z,x\n1,2\n",
];

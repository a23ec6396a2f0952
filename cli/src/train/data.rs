//! The data a run trains on: a built-in dataset shipped by `linfa-datasets`
//! or the user's CSV file, as rows of `f32` features and one target each.

use std::path::Path;

use super::csv_file;

/// A table of samples: `features` is row-major, `columns` values per row.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// What the data is called in the summary (`winequality`, a file name).
    pub name: String,
    /// The feature columns' names, in order.
    pub columns: Vec<String>,
    /// The target column's name.
    pub target: String,
    /// `rows × columns.len()` feature values, row-major.
    pub features: Vec<f32>,
    /// One target per row.
    pub targets: Vec<f32>,
}

impl Table {
    /// Rows held.
    pub fn rows(&self) -> usize {
        self.targets.len()
    }

    /// Features per row.
    pub fn width(&self) -> usize {
        self.columns.len()
    }

    /// The features of row `index`.
    pub fn row(&self, index: usize) -> &[f32] {
        let width = self.width();
        &self.features[index * width..(index + 1) * width]
    }
}

/// The built-in datasets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BuiltIn {
    /// Red wine quality: 1,599 wines, 11 physico-chemical features, quality 0–10.
    Winequality,
    /// Diabetes progression: 442 patients, 10 features.
    Diabetes,
    /// Handwritten digits (`smartcore`): 1,797 8×8 images, 64 pixel
    /// features, 10 classes (classification by default).
    Digits,
    /// Breast cancer Wisconsin (`smartcore`): 569 tumours, 30 features,
    /// malignant or benign (classification by default).
    BreastCancer,
}

impl BuiltIn {
    /// Whether its target is a class (then `--task` defaults to classify).
    pub fn is_classification(self) -> bool {
        matches!(self, BuiltIn::Digits | BuiltIn::BreastCancer)
    }
}

/// Loads `dataset`, or `csv` with its `target` column when a file is given.
pub fn load(dataset: BuiltIn, csv: Option<&Path>, target: Option<&str>) -> Result<Table, String> {
    match (csv, target) {
        (Some(path), Some(target)) => csv_file::read_training_table(path, target),
        (Some(_), None) => Err("--csv needs --target COLUMN (the column to predict)".into()),
        (None, Some(_)) => Err("--target names a column of a --csv file; give --csv FILE".into()),
        (None, None) => Ok(built_in(dataset)),
    }
}

fn built_in(dataset: BuiltIn) -> Table {
    // A classification dataset regressed on (`--task regress`): its class index.
    if let Some(table) = super::classify::regression_table(dataset) {
        return table;
    }
    // Both datasets are arrays of `f64` in standard (row-major) layout.
    let (name, target, columns, features, targets) = match dataset {
        BuiltIn::Winequality => {
            let data = linfa_datasets::winequality();
            let features = data.records().iter().map(|&v| v as f32).collect();
            let targets = data.targets().iter().map(|&t| t as f32).collect();
            (
                "winequality",
                "quality",
                data.feature_names().to_vec(),
                features,
                targets,
            )
        }
        BuiltIn::Diabetes | BuiltIn::Digits | BuiltIn::BreastCancer => {
            let data = linfa_datasets::diabetes();
            let features = data.records().iter().map(|&v| v as f32).collect();
            let targets = data.targets().iter().map(|&t| t as f32).collect();
            (
                "diabetes",
                "progression",
                data.feature_names().to_vec(),
                features,
                targets,
            )
        }
    };
    Table {
        name: name.to_string(),
        columns,
        target: target.to_string(),
        features,
        targets,
    }
}

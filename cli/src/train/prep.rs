//! Preparing a table for training: a seeded train / validation split and
//! standardisation with the training part's statistics only.

use cistern_memory::SplitMix64;
use serde::{Deserialize, Serialize};

use super::data::Table;

/// Per-column mean and standard deviation of the training part, features
/// and target; what a saved model needs to read new data the same way.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Standardisation {
    /// Mean of each feature column.
    pub feature_mean: Vec<f32>,
    /// Standard deviation of each feature column (1 where it is constant).
    pub feature_std: Vec<f32>,
    /// Mean of the target.
    pub target_mean: f32,
    /// Standard deviation of the target (1 where it is constant).
    pub target_std: f32,
}

impl Standardisation {
    /// The statistics of `rows` of `table`.
    fn fit(table: &Table, rows: &[usize]) -> Self {
        let columns: Vec<(f32, f32)> = (0..table.width())
            .map(|c| mean_std(rows.iter().map(|&r| table.row(r)[c])))
            .collect();
        let (target_mean, target_std) = mean_std(rows.iter().map(|&r| table.targets[r]));
        Standardisation {
            feature_mean: columns.iter().map(|c| c.0).collect(),
            feature_std: columns.iter().map(|c| c.1).collect(),
            target_mean,
            target_std,
        }
    }

    /// Standardises row-major `features` of this width in place.
    pub fn features(&self, features: &mut [f32]) {
        let width = self.feature_mean.len().max(1);
        for row in features.chunks_exact_mut(width) {
            for ((value, mean), std) in row
                .iter_mut()
                .zip(&self.feature_mean)
                .zip(&self.feature_std)
            {
                *value = (*value - mean) / std;
            }
        }
    }

    /// A target in the model's (standardised) units.
    pub fn target(&self, value: f32) -> f32 {
        (value - self.target_mean) / self.target_std
    }

    /// A model output back in the target's units.
    pub fn untarget(&self, value: f32) -> f32 {
        value * self.target_std + self.target_mean
    }
}

fn mean_std(values: impl Iterator<Item = f32> + Clone) -> (f32, f32) {
    let count = values.clone().count().max(1) as f64;
    let mean = values.clone().map(f64::from).sum::<f64>() / count;
    let variance = values.map(|v| (f64::from(v) - mean).powi(2)).sum::<f64>() / count;
    let std = variance.sqrt();
    (mean as f32, if std > 1e-12 { std as f32 } else { 1.0 })
}

/// One part of the data, standardised: `features` row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Part {
    /// `rows × width` standardised features.
    pub features: Vec<f32>,
    /// Standardised targets.
    pub targets: Vec<f32>,
    /// The targets in their own units.
    pub raw_targets: Vec<f32>,
}

impl Part {
    /// Rows held.
    pub fn rows(&self) -> usize {
        self.targets.len()
    }
}

/// A table split and standardised.
#[derive(Clone, Debug, PartialEq)]
pub struct Prepared {
    /// The training part.
    pub train: Part,
    /// The validation part.
    pub validation: Part,
    /// The training part's statistics.
    pub standardisation: Standardisation,
}

/// Splits `table` (a seeded shuffle, `validation` of the rows held out)
/// and standardises both parts with the training part's statistics. A
/// part left empty is an error saying how to avoid it.
pub fn prepare(table: &Table, validation: f64, seed: u64) -> Result<Prepared, String> {
    if !(0.0..1.0).contains(&validation) {
        return Err(format!(
            "--validation {validation}: the held-out fraction must be in [0, 1)"
        ));
    }
    let rows = table.rows();
    let held_out = ((rows as f64) * validation).round() as usize;
    let mut order: Vec<usize> = (0..rows).collect();
    let mut rng = SplitMix64::new(seed);
    for i in (1..rows).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    let (validation_rows, train_rows) = order.split_at(held_out.min(rows));
    if train_rows.is_empty() || validation_rows.is_empty() {
        return Err(format!(
            "{}: {rows} rows split {} for training and {} for validation; both parts need \
             rows (more data, or another --validation)",
            table.name,
            train_rows.len(),
            validation_rows.len()
        ));
    }
    let standardisation = Standardisation::fit(table, train_rows);
    let part = |rows: &[usize]| {
        let mut features: Vec<f32> = rows.iter().flat_map(|&r| table.row(r).to_vec()).collect();
        standardisation.features(&mut features);
        let raw_targets: Vec<f32> = rows.iter().map(|&r| table.targets[r]).collect();
        Part {
            features,
            targets: raw_targets
                .iter()
                .map(|&t| standardisation.target(t))
                .collect(),
            raw_targets,
        }
    };
    Ok(Prepared {
        train: part(train_rows),
        validation: part(validation_rows),
        standardisation,
    })
}

/// The mean squared difference of `predictions` from `targets`.
pub fn mse(predictions: &[f32], targets: &[f32]) -> f64 {
    let count = targets.len().max(1) as f64;
    predictions
        .iter()
        .zip(targets)
        .map(|(p, t)| (f64::from(*p) - f64::from(*t)).powi(2))
        .sum::<f64>()
        / count
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(rows: usize) -> Table {
        Table {
            name: "t".into(),
            columns: vec!["a".into()],
            target: "y".into(),
            features: (0..rows).map(|r| r as f32).collect(),
            targets: (0..rows).map(|r| 2.0 * r as f32).collect(),
        }
    }

    #[test]
    fn the_split_is_seeded_and_standardised_by_the_training_part() {
        let once = prepare(&table(100), 0.2, 7);
        let again = prepare(&table(100), 0.2, 7);
        assert_eq!(once, again);
        let prepared = once.expect("a split");
        assert_eq!(prepared.validation.rows(), 20);
        let mean: f32 = prepared.train.features.iter().sum::<f32>() / 80.0;
        assert!(mean.abs() < 1e-5, "{mean}");
    }

    #[test]
    fn an_empty_part_is_an_error() {
        let error = prepare(&table(1), 0.2, 7).expect_err("one row cannot split");
        assert!(error.contains("both parts need rows"), "{error}");
    }
}

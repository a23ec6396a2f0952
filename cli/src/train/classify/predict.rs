//! `cistern predict` for a saved classifier: each row's class name, and
//! with `--probabilities` every class's probability.

use std::io::{Read, Write};
use std::path::Path;

use cistern_client::ComputeClient;
use cistern_runtime::DeviceOptions;

use super::super::args::PredictArgs;
use super::super::csv_file;
use super::super::failure::Failure;
use super::super::model_file::SavedModel;
use super::data;
use super::model::Classifier;

/// Predicts with `saved` (a classifier: `classes` is its class names) for
/// the rows of `args.csv`. Where the file also has the model's target
/// column, a class the model was not trained on is an error naming it.
pub fn run_command(
    args: &PredictArgs,
    saved: &SavedModel,
    classes: &[String],
) -> Result<(), String> {
    let mut text = Vec::new();
    std::fs::File::open(&args.csv)
        .and_then(|mut file| file.read_to_end(&mut text))
        .map_err(|e| format!("cannot read {}: {e}", args.csv.display()))?;
    let name = args.csv.display().to_string();
    check_known_classes(&name, &text, &saved.target, classes)?;
    let (mut features, _rows) = csv_file::feature_rows(&name, &text[..], &saved.columns)?;
    saved.standardisation.features(&mut features);
    let device = crate::devices::choose(&args.device)?;
    let probabilities = probabilities(saved, device, &features).map_err(|f| f.describe())?;
    write_classes(
        args.output.as_deref(),
        &saved.target,
        classes,
        &probabilities,
        args.probabilities,
    )
}

/// Where CSV `text` has the `target` column, every value is one of `classes`.
fn check_known_classes(
    name: &str,
    text: &[u8],
    target: &str,
    classes: &[String],
) -> Result<(), String> {
    let Ok((_, values)) = data::target_column(name, text, target) else {
        // No target column (or none readable as one): nothing to check.
        return Ok(());
    };
    for (row, value) in values.iter().enumerate() {
        if !classes.contains(value) {
            return Err(format!(
                "{name}: line {}: class `{value}` of `{target}` is not one the model was trained \
                 on ({}): retrain with rows of it, or drop the column",
                row + 2,
                classes.join(", ")
            ));
        }
    }
    Ok(())
}

fn probabilities(
    saved: &SavedModel,
    device: cistern_runtime::Device,
    features: &[f32],
) -> Result<Vec<f32>, Failure> {
    let client = ComputeClient::open(device, DeviceOptions::default())?;
    let model = Classifier::upload(&client, saved.layout.clone(), &saved.parameters)?;
    model.probabilities(features)
}

/// Writes each row's class name (the most probable), and with
/// `with_probabilities` a column per class, as CSV (names quoted where
/// they need it) to `path` or stdout.
pub fn write_classes(
    path: Option<&Path>,
    target: &str,
    classes: &[String],
    probabilities: &[f32],
    with_probabilities: bool,
) -> Result<(), String> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    let failed = |e: csv::Error| format!("cannot write the predictions: {e}");
    let mut header = vec![target.to_string()];
    if with_probabilities {
        header.extend(classes.iter().map(|class| format!("p_{class}")));
    }
    writer.write_record(&header).map_err(failed)?;
    let guesses = super::metrics::predicted(probabilities, classes.len());
    for (row, guess) in probabilities.chunks(classes.len().max(1)).zip(guesses) {
        let mut record = vec![classes.get(guess).cloned().unwrap_or_default()];
        if with_probabilities {
            record.extend(row.iter().map(|p| p.to_string()));
        }
        writer.write_record(&record).map_err(failed)?;
    }
    let text = writer
        .into_inner()
        .map_err(|e| format!("cannot write the predictions: {e}"))?;
    match path {
        Some(path) => {
            std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
        }
        None => std::io::stdout()
            .write_all(&text)
            .map_err(|e| format!("cannot write the predictions: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_names_that_need_quotes_are_quoted() {
        let path = std::env::temp_dir().join(format!("cistern-classes-{}.csv", std::process::id()));
        let classes = ["a, b".to_string(), "plain".to_string()];
        let written = write_classes(Some(&path), "kind", &classes, &[0.9, 0.1, 0.2, 0.8], true);
        assert_eq!(written, Ok(()));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            text,
            "kind,\"p_a, b\",p_plain\n\"a, b\",0.9,0.1\nplain,0.2,0.8\n"
        );
    }
}

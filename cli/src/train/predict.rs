//! `cistern predict`: a saved model's predictions for the rows of a CSV file.

use std::io::Write;
use std::path::Path;

use cistern_client::ComputeClient;
use cistern_runtime::DeviceOptions;

use super::args::PredictArgs;
use super::csv_file;
use super::failure::Failure;
use super::model_file::SavedModel;
use super::store_model::StoreModel;

/// Runs `cistern predict`; the error is the message to print.
pub fn run_command(args: &PredictArgs) -> Result<(), String> {
    let saved = SavedModel::load(&args.model)?;
    if let Some(classes) = &saved.classes {
        return super::classify::run_predict(args, &saved, classes);
    }
    let (mut features, _rows) = csv_file::read_feature_rows(&args.csv, &saved.columns)?;
    saved.standardisation.features(&mut features);
    let device = crate::devices::choose(&args.device)?;
    let predictions = predict(&saved, device, &features).map_err(|f| f.describe())?;
    write_predictions(args.output.as_deref(), &saved.target, &predictions)
}

fn predict(
    saved: &SavedModel,
    device: cistern_runtime::Device,
    features: &[f32],
) -> Result<Vec<f32>, Failure> {
    let client = ComputeClient::open(device, DeviceOptions::default())?;
    let model = StoreModel::upload(&client, saved.layout.clone(), &saved.parameters)?;
    let outputs = model.predict(features)?;
    Ok(outputs
        .iter()
        .map(|&z| saved.standardisation.untarget(z))
        .collect())
}

/// Writes `predictions` as a one-column CSV (header `target`) to `path`,
/// or to stdout. Each value is written so that it reads back exactly.
pub fn write_predictions(
    path: Option<&Path>,
    target: &str,
    predictions: &[f32],
) -> Result<(), String> {
    let mut text = format!("{target}\n");
    for value in predictions {
        text.push_str(&format!("{value}\n"));
    }
    match path {
        Some(path) => {
            std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
        }
        None => std::io::stdout()
            .write_all(text.as_bytes())
            .map_err(|e| format!("cannot write the predictions: {e}")),
    }
}

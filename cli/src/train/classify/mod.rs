//! `cistern train --task classify` (the default for `--dataset digits`
//! and `--dataset breast-cancer`): an MLP classifier trained with
//! cross-entropy on a device, reported with accuracy, log-loss, the
//! majority-class baseline and a confusion matrix, saved with its class
//! names; and `cistern predict` for such a model.
//!
//! `data` reads the classes (built-in or CSV), `model` is the classifier
//! on its store, `metrics` scores it, `plot` draws loss and accuracy,
//! `predict` reads a saved classifier back. The split, standardisation,
//! batch order and saved-file format are the regression run's.

mod data;
mod metrics;
mod model;
mod plot;
mod predict;
mod vit;

use std::time::Instant;

use cistern_client::{
    ComputeClient, CrossEntropyOptions, DeviceParamStore, ResidentDataset, Tensor,
};
use cistern_optim::OptimizerConfig;
use cistern_runtime::{Device, DeviceOptions, FaultPlan};
use serde_json::json;

pub use predict::run_command as run_predict;

use super::args::{ModelName, StepPath, TrainArgs};
use super::batches::{Batches, Feed};
use super::checkpoints::Checkpointing;
use super::failure::Failure;
use super::model::Layout;
use super::model_file::SavedModel;
use super::output::Output;
use super::prep::{self, Part, Prepared};
use super::telemetry;
use data::ClassTable;
use metrics::ClassSummary;
use model::Classifier;
use plot::AccuracyPoint;
use vit::Vit;

/// The model a classification run trains.
enum Model {
    Mlp(Classifier),
    Vit(Vit),
}

impl Model {
    /// One step (the chain's where `chain` is given, for an MLP); the
    /// batch's loss before the update.
    fn step(
        &mut self,
        (features, labels): (&Tensor<f32>, &[i64]),
        options: &CrossEntropyOptions,
        config: &OptimizerConfig,
        chain: Option<&cistern_optim::SgdConfig>,
    ) -> Result<f32, Failure> {
        match (self, chain) {
            (Model::Mlp(model), Some(sgd)) => model.chain_step(features, labels, options, sgd),
            (Model::Mlp(model), None) => model.tape_step(features, labels, options, config),
            (Model::Vit(model), _) => model.tape_step(features, labels, options, config),
        }
    }

    fn logits(&self, features: &[f32]) -> Result<Vec<f32>, Failure> {
        match self {
            Model::Mlp(model) => model.logits(features),
            Model::Vit(model) => model.logits(features),
        }
    }

    /// The training part as a resident dataset, for an MLP's chain steps
    /// (`None` for a ViT: its batches come from the host).
    fn upload_dataset(
        &self,
        features: &Tensor<f32>,
        labels: &[i64],
        batch: usize,
        seed: u64,
    ) -> Result<Option<ResidentDataset>, Failure> {
        match self {
            Model::Mlp(model) => model
                .upload_dataset(features, labels, batch, seed)
                .map(Some),
            Model::Vit(_) => Ok(None),
        }
    }

    /// An MLP's chain step on the dataset's next batch, drawn on the device.
    fn dataset_step(
        &mut self,
        dataset: &ResidentDataset,
        options: &CrossEntropyOptions,
        config: &cistern_optim::SgdConfig,
    ) -> Result<f32, Failure> {
        match self {
            Model::Mlp(model) => model.dataset_step(dataset, options, config),
            Model::Vit(_) => Err(Failure::Usage(
                "a resident dataset steps an MLP's device chain only".into(),
            )),
        }
    }

    fn store(&self) -> &DeviceParamStore {
        match self {
            Model::Mlp(model) => model.store(),
            Model::Vit(model) => model.store(),
        }
    }
}

/// A classification dataset as a regression table (its class index the
/// target), for `--task regress`; `None` for the regression datasets.
pub(crate) fn regression_table(dataset: super::data::BuiltIn) -> Option<super::data::Table> {
    data::built_in(dataset).map(|table| table.as_table())
}

/// Evaluations of the validation part over a run (the plot's points).
const EVALUATIONS: u64 = 20;

/// Runs a classification `cistern train`; the error is the message to print.
pub fn run_command(args: &TrainArgs) -> Result<(), String> {
    args.check()?;
    if args.is_group() {
        return Err("--devices / --distributed train regressors only for now: \
                    drop them for --task classify"
            .into());
    }
    if args.amp {
        return Err("--amp trains regressors only for now: drop --amp for --task classify".into());
    }
    let table = load(args)?;
    let mut prepared = prep::prepare(&table.as_table(), args.validation, args.seed)?;
    // The batches carry the class indices, not standardised targets.
    for part in [&mut prepared.train, &mut prepared.validation] {
        part.targets = part.raw_targets.clone();
    }
    let device = crate::devices::choose(&args.device)?;
    tracing::info!(%device, rows = table.rows(), classes = table.classes.len(), "classifying");
    match train(args, &table, &prepared, device) {
        Ok(()) => Ok(()),
        Err(Failure::Device(error)) => {
            let message = Failure::Device(error.clone()).describe();
            if let Some(path) = &args.telemetry {
                telemetry::write(path, args, error, device)?;
            }
            Err(message)
        }
        Err(failure) => Err(failure.describe()),
    }
}

fn load(args: &TrainArgs) -> Result<ClassTable, String> {
    match (&args.csv, &args.target) {
        (Some(path), Some(target)) => data::read_csv(path, target, args.max_classes),
        (Some(_), None) => Err("--csv needs --target COLUMN (the column to predict)".into()),
        (None, Some(_)) => Err("--target names a column of a --csv file; give --csv FILE".into()),
        (None, None) => match data::built_in(args.dataset) {
            Some(table) => Ok(table),
            None => {
                let table = super::data::load(args.dataset, None, None)?;
                data::from_values(&table, args.max_classes)
            }
        },
    }
}

/// The labels of a batch's target column.
fn labels_of(targets: &[f32]) -> Vec<i64> {
    targets.iter().map(|&t| t as i64).collect()
}

fn part_labels(part: &Part) -> Vec<usize> {
    part.raw_targets.iter().map(|&t| t as usize).collect()
}

fn train(
    args: &TrainArgs,
    table: &ClassTable,
    prepared: &Prepared,
    device: Device,
) -> Result<(), Failure> {
    let started = Instant::now();
    let faults = FaultPlan {
        trap_launch: args.inject_trap_at_launch,
        ..FaultPlan::none()
    };
    let client = ComputeClient::open(device, DeviceOptions::default().with_faults(faults))?;
    let width = table.columns.len();
    let classes = table.classes.len();
    let mut layout = Layout::new(width, &args.layers, args.activation);
    if let Some(last) = layout.widths.last_mut() {
        *last = classes;
    }
    let mut checkpoints =
        Checkpointing::new(args, &table.name, &prepared.standardisation, &layout)?;
    let mut model = match (args.model, checkpoints.resume()) {
        (ModelName::Vit, _) => Model::Vit(Vit::new(&client, args.seed, width, classes)?),
        (ModelName::Mlp, Some(resume)) => {
            Model::Mlp(Classifier::restore(&client, layout.clone(), &resume.store)?)
        }
        (ModelName::Mlp, None) => Model::Mlp(Classifier::upload(
            &client,
            layout.clone(),
            &layout.initial_parameters(args.seed),
        )?),
    };
    let (model_name, parameters) = match &model {
        Model::Mlp(_) => ("mlp", layout.parameter_count()),
        Model::Vit(vit) => ("vit", vit.parameter_count()),
    };
    let config = args.optimizer.config(args.lr());
    let chain = match (args.step_path(), &config) {
        (StepPath::Chain, OptimizerConfig::Sgd(sgd)) => Some(sgd.clone()),
        _ => None,
    };
    let path = if chain.is_some() {
        "device-chain"
    } else {
        "tape"
    };
    let options = CrossEntropyOptions::default();
    let mut feed = match &chain {
        Some(_) => {
            let rows = prepared.train.rows();
            let features = Tensor::new([rows, width], prepared.train.features.clone())
                .map_err(|e| Failure::Usage(format!("the training part: {e}")))?;
            let labels = labels_of(&prepared.train.targets);
            let batch = args.batch.min(rows).max(1);
            let seed = Feed::device_seed(args.seed);
            match model.upload_dataset(&features, &labels, batch, seed)? {
                Some(dataset) => Feed::Device(dataset),
                None => Feed::Host(Batches::new(rows, args.batch, args.seed)),
            }
        }
        None => Feed::Host(Batches::new(prepared.train.rows(), args.batch, args.seed)),
    };
    let steps = args.steps.unwrap_or(args.epochs * feed.per_epoch() as u64);
    let resumed_at = checkpoints.resumed_at();
    feed.resume(model.store(), resumed_at.unwrap_or(0))?;
    let output = Output::new(args.json, steps);
    output.record(json!({
        "event": "start",
        "task": "classify",
        "resumed_at": resumed_at,
        "dataset": table.name,
        "device": device.to_string(),
        "rows": table.rows(),
        "features": width,
        "classes": classes,
        "model": model_name,
        "layers": args.layers,
        "batch": feed.batch(),
        "optimizer": args.optimizer.name(),
        "lr": args.lr(),
        "steps": steps,
        "step": path,
        "parameters": parameters,
    }));
    let validation_labels = part_labels(&prepared.validation);
    let every = (steps / EVALUATIONS).max(1);
    let (mut points, mut interval_loss, mut interval_steps) = (Vec::new(), 0.0, 0u64);
    checkpoints.announce(&output, args, steps);
    let mut step_seconds = 0.0;
    let first = resumed_at.unwrap_or(0) + 1;
    for step in first..=steps {
        // Timed like PyTorch's loop: the batch's gather, the step, its loss.
        let begun = Instant::now();
        let loss = f64::from(match (&mut feed, &chain) {
            (Feed::Device(dataset), Some(sgd)) => model.dataset_step(dataset, &options, sgd)?,
            (Feed::Host(batches), _) => {
                let (features, targets) = batches.next(&prepared.train, width)?;
                let labels = labels_of(targets.data());
                let batch = (&features, labels.as_slice());
                model.step(batch, &options, &config, chain.as_ref())?
            }
            (Feed::Device(_), None) => {
                return Err(Failure::Usage(
                    "a resident dataset steps the device chain only".into(),
                ));
            }
        });
        step_seconds += begun.elapsed().as_secs_f64();
        if !loss.is_finite() {
            output.finish();
            return Err(Failure::Usage(format!(
                "the loss diverged ({loss}) at step {step}: use a smaller --lr"
            )));
        }
        interval_loss += loss;
        interval_steps += 1;
        let rate = (step + 1 - first) as f64 / step_seconds.max(1e-9);
        output.step(step, loss, rate);
        checkpoints.after_step(&output, step, model.store(), 0, None)?;
        if step % every == 0 || step == steps {
            let logits = model.logits(&prepared.validation.features)?;
            let guess = metrics::predicted(&logits, classes);
            let point = AccuracyPoint {
                step,
                train_loss: interval_loss / interval_steps as f64,
                val_log_loss: metrics::log_loss(&logits, classes, &validation_labels),
                val_accuracy: metrics::accuracy(&guess, &validation_labels),
            };
            show_eval(&output, &point, rate);
            points.push(point);
            (interval_loss, interval_steps) = (0.0, 0);
        }
    }
    output.finish();
    let train_labels = part_labels(&prepared.train);
    let train_logits = model.logits(&prepared.train.features)?;
    let val_logits = model.logits(&prepared.validation.features)?;
    let (train_guess, val_guess) = (
        metrics::predicted(&train_logits, classes),
        metrics::predicted(&val_logits, classes),
    );
    let (majority, _) = metrics::majority(&train_labels, classes);
    let baseline_accuracy = metrics::accuracy(&vec![majority; val_guess.len()], &validation_labels);
    let summary = ClassSummary {
        event: "summary",
        task: "classify",
        dataset: table.name.clone(),
        device: device.to_string(),
        model: model_name,
        layers: args.layers.clone(),
        activation: match args.model {
            ModelName::Vit => "gelu".into(),
            ModelName::Mlp => format!("{:?}", args.activation).to_lowercase(),
        },
        batch: feed.batch(),
        optimizer: args.optimizer.name(),
        lr: args.lr(),
        steps,
        parameters,
        classes: table.classes.clone(),
        train_rows: prepared.train.rows(),
        val_rows: prepared.validation.rows(),
        train_accuracy: metrics::accuracy(&train_guess, &train_labels),
        val_accuracy: metrics::accuracy(&val_guess, &validation_labels),
        train_log_loss: metrics::log_loss(&train_logits, classes, &train_labels),
        val_log_loss: metrics::log_loss(&val_logits, classes, &validation_labels),
        baseline_accuracy,
        baseline_class: table.classes.get(majority).cloned().unwrap_or_default(),
        confusion: metrics::confusion(&val_guess, &validation_labels, classes),
        train_seconds: step_seconds,
        seconds: started.elapsed().as_secs_f64(),
        steps_per_s: (steps + 1).saturating_sub(first) as f64 / step_seconds.max(1e-9),
        step: path,
        resumed_at,
        checkpoints: checkpoints.saved().0,
    };
    keep(args, table, prepared, &model)?;
    if let Some(path) = &args.plot {
        let title = format!("cistern train: {} ({})", table.name, device);
        plot::draw(path, &title, &points, baseline_accuracy)?;
    }
    if args.json {
        println!("{}", json!(summary));
    } else {
        summary.print();
    }
    Ok(())
}

fn show_eval(output: &Output, point: &AccuracyPoint, rate: f64) {
    match output {
        Output::Json => println!(
            "{}",
            json!({
                "event": "eval",
                "step": point.step,
                "train_loss": point.train_loss,
                "val_log_loss": point.val_log_loss,
                "val_accuracy": point.val_accuracy,
                "steps_per_s": rate,
            })
        ),
        Output::Bar(bar) => bar.set_message(format!(
            "loss {:.4}  val accuracy {:.2}%  log-loss {:.4}  {rate:.0} steps/s",
            point.train_loss,
            100.0 * point.val_accuracy,
            point.val_log_loss
        )),
        Output::Silent => {}
    }
}

/// `--save` (with the class names) and `--predictions` (class names).
fn keep(
    args: &TrainArgs,
    table: &ClassTable,
    prepared: &Prepared,
    model: &Model,
) -> Result<(), Failure> {
    // `--save` and `--predictions` are refused for a ViT (`args.check`).
    let Model::Mlp(model) = model else {
        return Ok(());
    };
    if let Some(path) = &args.save {
        let mut standardisation = prepared.standardisation.clone();
        // Outputs are logits: nothing to un-standardise.
        (standardisation.target_mean, standardisation.target_std) = (0.0, 1.0);
        let saved = SavedModel {
            layout: model.layout.clone(),
            parameters: model.parameters()?,
            standardisation,
            columns: table.columns.clone(),
            target: table.target.clone(),
            classes: Some(table.classes.clone()),
        };
        saved.save(path)?;
    }
    if let Some(path) = &args.predictions {
        let mut features = table.features.clone();
        prepared.standardisation.features(&mut features);
        let probabilities = model.probabilities(&features)?;
        predict::write_classes(
            Some(path),
            &table.target,
            &table.classes,
            &probabilities,
            false,
        )?;
    }
    Ok(())
}

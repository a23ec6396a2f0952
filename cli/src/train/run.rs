//! `cistern train`: load, split, train through a [`Trainer`], evaluate,
//! then report, plot and save.

use std::time::Instant;

use cistern_client::ComputeClient;
use cistern_runtime::{Device, DeviceOptions, FaultPlan};
use serde_json::json;

use super::args::TrainArgs;
use super::checkpoints::Checkpointing;
use super::data::{self, Table};
use super::distributed;
use super::failure::Failure;
use super::model::Layout;
use super::model_file::SavedModel;
use super::output::Output;
use super::plot::{self, LossPoint};
use super::prep::{self, Prepared, mse};
use super::store_model::StoreModel;
use super::summary::Summary;
use super::telemetry;
use super::trainer::Trainer;

/// Evaluations of the validation part over a run (the plot's points).
const EVALUATIONS: u64 = 20;

/// Runs `cistern train`; the error is the message to print.
pub fn run_command(args: &TrainArgs) -> Result<(), String> {
    if args.task() == super::args::Task::Classify {
        return super::classify::run_command(args);
    }
    args.check()?;
    let table = data::load(args.dataset, args.csv.as_deref(), args.target.as_deref())?;
    let prepared = prep::prepare(&table, args.validation, args.seed)?;
    let device = crate::devices::choose(&args.device)?;
    tracing::info!(%device, rows = table.rows(), "training");
    match train(args, &table, &prepared, device) {
        Ok(()) => Ok(()),
        Err(Failure::Usage(message)) => Err(message),
        Err(failure @ Failure::Group(_)) => Err(failure.describe()),
        Err(Failure::Device(error)) => {
            let message = Failure::Device(error.clone()).describe();
            if let Some(path) = &args.telemetry {
                telemetry::write(path, args, error, device)?;
            }
            Err(message)
        }
    }
}

fn train(
    args: &TrainArgs,
    table: &Table,
    prepared: &Prepared,
    device: Device,
) -> Result<(), Failure> {
    let started = Instant::now();
    let faults = FaultPlan {
        trap_launch: args.inject_trap_at_launch,
        ..FaultPlan::none()
    };
    let width = table.width();
    let layout = Layout::new(width, &args.layers, args.activation);
    let mut checkpoints =
        Checkpointing::new(args, &table.name, &prepared.standardisation, &layout)?;
    let initial = layout.initial_parameters(args.seed);
    let (model, device_name) = match distributed::placement(args, &faults)? {
        Some(placement) => {
            let label = placement.label.clone();
            let model = match checkpoints.resume() {
                Some(resume) => {
                    StoreModel::restore_group(placement, layout.clone(), &resume.store)?
                }
                None => StoreModel::upload_group(placement, layout.clone(), &initial)?,
            };
            (model, label)
        }
        None => {
            let options = DeviceOptions::default().with_faults(faults);
            let client = ComputeClient::open(device, options)?;
            let model = match checkpoints.resume() {
                Some(resume) => StoreModel::restore(&client, layout.clone(), &resume.store)?,
                None => StoreModel::upload(&client, layout.clone(), &initial)?,
            };
            (model, device.to_string())
        }
    };
    let client = model.client().clone();
    if args.batch < model.replicas() {
        return Err(Failure::Usage(format!(
            "--batch {}: smaller than the group's {} replicas; each needs at least one sample",
            args.batch,
            model.replicas()
        )));
    }
    // Rank 0 alone shows the run, plots and saves; every rank trains alike.
    let shows = model.rank() == 0;
    let config = args.optimizer.config(args.lr());
    let mut trainer = Trainer::new(model, config, args.step_path(), args.amp)?;
    let mut feed = trainer.feed(&prepared.train, width, args.batch, args.seed)?;
    let steps = args.steps.unwrap_or(args.epochs * feed.per_epoch() as u64);
    if let Some(resume) = checkpoints.resume() {
        trainer.resume(resume.state.scaler.clone(), resume.state.skipped)?;
        feed.resume(trainer.model().store(), resume.state.step)?;
    }
    let resumed_at = checkpoints.resumed_at();
    let output = match shows {
        true => Output::new(args.json, steps),
        false => Output::silent(),
    };
    output.record(json!({
        "event": "start",
        "dataset": table.name,
        "device": device_name,
        "rows": table.rows(),
        "features": width,
        "layers": args.layers,
        "batch": feed.batch(),
        "optimizer": args.optimizer.name(),
        "lr": args.lr(),
        "steps": steps,
        "step": trainer.path(),
        "parameters": layout.parameter_count(),
        "resumed_at": resumed_at,
    }));
    checkpoints.announce(&output, args, steps);
    let scale = f64::from(prepared.standardisation.target_std).powi(2);
    let every = (steps / EVALUATIONS).max(1);
    let (mut points, mut interval_loss, mut interval_steps) = (Vec::new(), 0.0, 0u64);
    let mut step_seconds = 0.0;
    let first = resumed_at.unwrap_or(0) + 1;
    for step in first..=steps {
        // Timed like PyTorch's loop: the batch (a host gather, or the
        // device's draw inside the step), the step, its loss.
        let begun = Instant::now();
        let loss = f64::from(trainer.step_from(&mut feed, &prepared.train, width)?) * scale;
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
        // Rank 0 alone saves: every replica holds the same state.
        if shows {
            let store = trainer.model().store();
            let scaler = trainer.scaler();
            checkpoints.after_step(&output, step, store, trainer.skipped(), scaler)?;
        }
        if shows && (step % every == 0 || step == steps) {
            let validation = evaluate(trainer.model(), prepared, &prepared.validation)?;
            let train = interval_loss / interval_steps as f64;
            output.eval(step, train, validation, rate);
            points.push(LossPoint {
                step,
                train,
                validation,
            });
            (interval_loss, interval_steps) = (0.0, 0);
        }
    }
    output.finish();
    if !shows {
        return Ok(());
    }
    let model = trainer.model();
    let train_mse = evaluate(model, prepared, &prepared.train)?;
    let val_mse = evaluate(model, prepared, &prepared.validation)?;
    let train_mean = prepared
        .train
        .raw_targets
        .iter()
        .map(|&t| f64::from(t))
        .sum::<f64>()
        / prepared.train.rows() as f64;
    let baseline = vec![train_mean as f32; prepared.validation.rows()];
    let baseline_mse = mse(&baseline, &prepared.validation.raw_targets);
    let stats = client.memory_stats()?;
    let summary = Summary {
        event: "summary",
        dataset: table.name.clone(),
        device: device_name.clone(),
        layers: args.layers.clone(),
        activation: format!("{:?}", args.activation).to_lowercase(),
        batch: feed.batch(),
        optimizer: args.optimizer.name(),
        lr: args.lr(),
        steps,
        parameters: layout.parameter_count(),
        train_rows: prepared.train.rows(),
        val_rows: prepared.validation.rows(),
        train_mse,
        val_mse,
        baseline_mse,
        train_seconds: step_seconds,
        seconds: started.elapsed().as_secs_f64(),
        steps_per_s: (steps + 1).saturating_sub(first) as f64 / step_seconds.max(1e-9),
        peak_reserved: stats.peak_reserved_bytes,
        peak_in_use: stats.peak_in_use_bytes,
        reclaims: stats.reclaims,
        step: trainer.path(),
        amp: args.amp,
        skipped_steps: trainer.skipped(),
        recovered_replicas: trainer.recoveries(),
        resumed_at,
        checkpoints: checkpoints.saved().0,
        checkpoint_seconds: checkpoints.saved().1,
    };
    keep(args, table, prepared, model)?;
    if let Some(path) = &args.plot {
        let title = format!("cistern train: {} ({})", table.name, device_name);
        plot::draw(path, &title, &points, baseline_mse)?;
    }
    if args.json {
        println!("{}", json!(summary));
    } else {
        summary.print();
    }
    Ok(())
}

/// The MSE of the model on `part`, in the target's units.
fn evaluate(model: &StoreModel, prepared: &Prepared, part: &prep::Part) -> Result<f64, Failure> {
    let outputs = model.predict(&part.features)?;
    let predictions: Vec<f32> = outputs
        .iter()
        .map(|&z| prepared.standardisation.untarget(z))
        .collect();
    Ok(mse(&predictions, &part.raw_targets))
}

/// `--save` and `--predictions`.
fn keep(
    args: &TrainArgs,
    table: &Table,
    prepared: &Prepared,
    model: &StoreModel,
) -> Result<(), Failure> {
    if let Some(path) = &args.save {
        let saved = SavedModel {
            layout: model.layout.clone(),
            parameters: model.parameters()?,
            standardisation: prepared.standardisation.clone(),
            columns: table.columns.clone(),
            target: table.target.clone(),
            classes: None,
        };
        saved.save(path)?;
    }
    if let Some(path) = &args.predictions {
        let mut features = table.features.clone();
        prepared.standardisation.features(&mut features);
        let outputs = model.predict(&features)?;
        let predictions: Vec<f32> = outputs
            .iter()
            .map(|&z| prepared.standardisation.untarget(z))
            .collect();
        super::predict::write_predictions(Some(path), &table.target, &predictions)?;
    }
    Ok(())
}

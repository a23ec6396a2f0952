//! `cistern train` and `cistern predict` arguments.

use std::path::PathBuf;

use cistern_optim::{
    AdagradConfig, AdamConfig, AdamWConfig, LambConfig, OptimizerConfig, RmsPropConfig, SgdConfig,
};

use super::data::BuiltIn;
use super::model::ActivationName;
use crate::stress::TelemetryFormat;

/// The optimizers, by their command-line names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OptimizerName {
    /// Plain SGD (PyTorch's defaults: no momentum).
    Sgd,
    /// Adam.
    Adam,
    /// AdamW (decoupled weight decay 0.01).
    Adamw,
    /// RMSprop.
    Rmsprop,
    /// Adagrad.
    Adagrad,
    /// LAMB.
    Lamb,
}

/// The engines of `--distributed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DistributedEngine {
    /// MPI: one process per rank, under `mpirun`.
    Mpi,
}

/// What a run learns, by its command-line name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Task {
    /// Predict a number (MSE).
    Regress,
    /// Predict a class among the target's values (cross-entropy).
    Classify,
}

/// The model a run trains, by its command-line name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ModelName {
    /// A multilayer perceptron of `--layers` and `--activation`.
    #[default]
    Mlp,
    /// The small vision transformer of `examples/vit_digits.rs` (each 8×8
    /// digit as 8 row tokens): `--dataset digits` only, through the tape.
    Vit,
}

/// How a step runs, by its command-line name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StepPath {
    /// The device chain's step, captured once and replayed (SGD only).
    Chain,
    /// A tape forward, the store's backward, the store's fused step.
    Tape,
}

impl OptimizerName {
    /// Its name as printed.
    pub fn name(self) -> &'static str {
        match self {
            OptimizerName::Sgd => "sgd",
            OptimizerName::Adam => "adam",
            OptimizerName::Adamw => "adamw",
            OptimizerName::Rmsprop => "rmsprop",
            OptimizerName::Adagrad => "adagrad",
            OptimizerName::Lamb => "lamb",
        }
    }

    /// The learning rate used when `--lr` is not given.
    pub fn default_lr(self) -> f64 {
        match self {
            OptimizerName::Sgd | OptimizerName::Adagrad => 0.05,
            OptimizerName::Lamb => 0.01,
            _ => 1e-3,
        }
    }

    /// The config with PyTorch's defaults and `lr`.
    pub fn config(self, lr: f64) -> OptimizerConfig {
        match self {
            OptimizerName::Sgd => OptimizerConfig::Sgd(SgdConfig {
                lr,
                ..Default::default()
            }),
            OptimizerName::Adam => OptimizerConfig::Adam(AdamConfig {
                lr,
                ..Default::default()
            }),
            OptimizerName::Adamw => OptimizerConfig::AdamW(AdamWConfig {
                lr,
                ..Default::default()
            }),
            OptimizerName::Rmsprop => OptimizerConfig::RmsProp(RmsPropConfig {
                lr,
                ..Default::default()
            }),
            OptimizerName::Adagrad => OptimizerConfig::Adagrad(AdagradConfig {
                lr,
                ..Default::default()
            }),
            OptimizerName::Lamb => OptimizerConfig::Lamb(LambConfig {
                lr,
                ..Default::default()
            }),
        }
    }
}

/// Train an MLP regressor on a real dataset (red wine quality by default)
/// or a CSV file, on a device; report, plot and save it.
///
/// The parameters live in one device parameter store, updated in place by
/// fused optimizer kernels. SGD steps by default through the device chain:
/// the whole step (forward, loss, backward, update) captured once and
/// replayed; other optimizers and --amp through the tape and the store.
#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// A built-in dataset (from `linfa-datasets`).
    #[arg(
        long,
        value_enum,
        default_value = "winequality",
        conflicts_with = "csv"
    )]
    pub dataset: BuiltIn,
    /// Train on this CSV file instead (a header row, then numbers); needs --target.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// The CSV column to predict; every other column is a feature.
    #[arg(long, value_name = "COLUMN")]
    pub target: Option<String>,
    /// `regress` (a number) or `classify` (the target's values are the
    /// classes) [default: classify for digits and breast-cancer, else regress].
    #[arg(long, value_enum)]
    pub task: Option<Task>,
    /// The most distinct classes a classification target may have.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub max_classes: usize,
    /// The model: `mlp`, or `vit` (the vision transformer of
    /// `examples/vit_digits.rs`, for `--dataset digits`; try `--optimizer
    /// adamw`).
    #[arg(long, value_enum, default_value = "mlp")]
    pub model: ModelName,
    /// Hidden layer widths, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "64,64",
        value_name = "WIDTHS"
    )]
    pub layers: Vec<usize>,
    /// The hidden layers' activation.
    #[arg(long, value_enum, default_value = "relu")]
    pub activation: ActivationName,
    /// Samples per step.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Passes over the training part (a pass drops its last partial batch).
    #[arg(long, default_value_t = 20, conflicts_with = "steps")]
    pub epochs: u64,
    /// Steps to take instead of --epochs.
    #[arg(long)]
    pub steps: Option<u64>,
    /// The optimizer (PyTorch's defaults for everything but the learning rate).
    #[arg(long, value_enum, default_value = "sgd")]
    pub optimizer: OptimizerName,
    /// Learning rate [default: 0.05 for sgd and adagrad, 0.01 for lamb, 0.001 otherwise].
    #[arg(long)]
    pub lr: Option<f64>,
    /// Seed of the split, the initial parameters and the batch order.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The fraction of rows held out for validation.
    #[arg(long, default_value_t = 0.2)]
    pub validation: f64,
    /// `cpu`, `auto` (the best device present; never a CPU-type adapter
    /// over the CPU backend), or `cpu:N`, `wgpu:N`, `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Train one model on several devices of this process, data parallel
    /// (e.g. `cpu:0,cpu:1`: each CPU ordinal gets its share of the cores).
    #[arg(long, value_delimiter = ',', value_name = "DEVICES", conflicts_with_all = ["device", "distributed"])]
    pub devices: Vec<String>,
    /// Train data parallel with one process per rank, started by `mpirun
    /// -np N cistern train --distributed mpi` (a build with `--features
    /// mpi`); each rank trains on --device.
    #[arg(long, value_enum, value_name = "ENGINE")]
    pub distributed: Option<DistributedEngine>,
    /// With --distributed: how long a rank waits for its peers in one
    /// collective before it ends the run (PeerLost, exit status 75).
    #[arg(
        long,
        default_value_t = 60.0,
        value_name = "SECONDS",
        requires = "distributed"
    )]
    pub peer_timeout: f64,
    /// Mixed precision: the loss scaled by a gradient scaler (PyTorch's
    /// `GradScaler` defaults), unscaled and checked on the device, a step
    /// with non-finite gradients skipped. With sgd, adam or adamw.
    #[arg(long)]
    pub amp: bool,
    /// Inject a device trap at the Nth launch (to see the error path:
    /// the report, the telemetry, the exit status; in a replica group, on
    /// the last device or rank, which the group recovers in place).
    #[arg(long, value_name = "N")]
    pub inject_trap_at_launch: Option<u64>,
    /// How each step runs [default: chain for sgd without --amp, else tape].
    #[arg(long, value_enum)]
    pub step: Option<StepPath>,
    /// Print JSON lines (ending with a summary line) instead of the bar.
    #[arg(long)]
    pub json: bool,
    /// Draw train and validation loss over steps into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Save the trained model here (safetensors, written atomically).
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,
    /// Save a checkpoint every N steps (the parameters, the optimizer's
    /// state, the step and the data order), atomically, into
    /// --checkpoint-dir.
    #[arg(long, value_name = "N")]
    pub checkpoint_every: Option<u64>,
    /// Where checkpoints go [default: the --resume directory].
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoints kept: the newest N.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub keep: usize,
    /// Resume from the newest checkpoint in DIR that reads back whole (an
    /// older one where the newest is damaged, saying so); with none there,
    /// start at step 0. The run's other arguments must be those it was
    /// started with.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// Write the trained model's prediction for every row of the data, in
    /// input order, to this CSV file (as `predict` would write them).
    #[arg(long, value_name = "FILE")]
    pub predictions: Option<PathBuf>,
    /// Write an ErrorReport for every device error to FILE.
    #[arg(long, value_name = "FILE")]
    pub telemetry: Option<PathBuf>,
    /// The telemetry file's encoding.
    #[arg(long, value_enum, default_value = "jsonl", requires = "telemetry")]
    pub telemetry_format: TelemetryFormat,
    /// Include each error's backtrace frames in the telemetry (larger).
    #[arg(long, requires = "telemetry")]
    pub telemetry_backtraces: bool,
}

impl TrainArgs {
    /// The task in effect.
    pub fn task(&self) -> Task {
        match self.task {
            Some(task) => task,
            None if self.csv.is_none() && self.dataset.is_classification() => Task::Classify,
            None => Task::Regress,
        }
    }

    /// Whether the run trains a replica group (--devices or --distributed).
    pub fn is_group(&self) -> bool {
        !self.devices.is_empty() || self.distributed.is_some()
    }

    /// The step path in effect (a group steps through the tape).
    pub fn step_path(&self) -> StepPath {
        match self.step {
            Some(path) => path,
            None if self.optimizer == OptimizerName::Sgd
                && !self.amp
                && !self.is_group()
                && self.model == ModelName::Mlp =>
            {
                StepPath::Chain
            }
            None => StepPath::Tape,
        }
    }

    /// The learning rate in effect.
    pub fn lr(&self) -> f64 {
        self.lr.unwrap_or_else(|| self.optimizer.default_lr())
    }

    /// Checks what clap cannot; the message says what to change.
    pub fn check(&self) -> Result<(), String> {
        let amp_family = matches!(
            self.optimizer,
            OptimizerName::Sgd | OptimizerName::Adam | OptimizerName::Adamw
        );
        if self.amp && !amp_family {
            return Err(format!(
                "--amp with --optimizer {}: mixed precision steps sgd, adam or adamw",
                self.optimizer.name()
            ));
        }
        if self.step == Some(StepPath::Chain) && (self.amp || self.optimizer != OptimizerName::Sgd)
        {
            return Err(
                "--step chain runs sgd without --amp: use --step tape for other optimizers".into(),
            );
        }
        if self.step == Some(StepPath::Chain) && self.is_group() {
            return Err(
                "--step chain runs on one device: a replica group (--devices, --distributed) \
                 steps through the tape"
                    .into(),
            );
        }
        if !(self.peer_timeout.is_finite() && self.peer_timeout > 0.0) {
            return Err(format!(
                "--peer-timeout {}: give a positive number of seconds",
                self.peer_timeout
            ));
        }
        if self.steps == Some(0) || (self.steps.is_none() && self.epochs == 0) {
            return Err("--steps 0 / --epochs 0: nothing to train; give at least one step".into());
        }
        if self.batch == 0 {
            return Err("--batch 0: a step needs at least one sample".into());
        }
        if self.layers.contains(&0) {
            return Err(format!(
                "--layers {:?}: every width must be at least 1",
                self.layers
            ));
        }
        self.check_checkpoints()?;
        self.check_model()?;
        let lr = self.lr();
        if !(lr.is_finite() && lr > 0.0) {
            return Err(format!(
                "--lr {lr}: the learning rate must be positive and finite"
            ));
        }
        Ok(())
    }
}

impl TrainArgs {
    /// The checkpoint directory in effect: --checkpoint-dir, else --resume's.
    pub fn checkpoint_dir(&self) -> Option<&PathBuf> {
        self.checkpoint_dir.as_ref().or(self.resume.as_ref())
    }

    /// `--model vit` takes the digits' images, through the tape, without
    /// what saves or splits an MLP.
    fn check_model(&self) -> Result<(), String> {
        if self.model != ModelName::Vit {
            return Ok(());
        }
        if self.csv.is_some() || self.dataset != BuiltIn::Digits || self.task() != Task::Classify {
            return Err(
                "--model vit classifies the 8×8 digits: use --dataset digits (no --csv, \
                 no --task regress), or --model mlp"
                    .into(),
            );
        }
        let unsupported = [
            (self.step == Some(StepPath::Chain), "--step chain"),
            (self.amp, "--amp"),
            (self.is_group(), "--devices / --distributed"),
            (self.save.is_some(), "--save"),
            (self.predictions.is_some(), "--predictions"),
            (self.checkpoint_every.is_some(), "--checkpoint-every"),
            (self.resume.is_some(), "--resume"),
        ];
        match unsupported.iter().find(|(given, _)| *given) {
            Some((_, flag)) => Err(format!(
                "{flag} is not supported with --model vit yet: drop it, or use --model mlp"
            )),
            None => Ok(()),
        }
    }

    fn check_checkpoints(&self) -> Result<(), String> {
        if self.checkpoint_every == Some(0) {
            return Err("--checkpoint-every 0: give a number of steps of at least 1".into());
        }
        if self.keep == 0 {
            return Err("--keep 0: keep at least the newest checkpoint".into());
        }
        if self.checkpoint_every.is_some() && self.checkpoint_dir().is_none() {
            return Err(
                "--checkpoint-every needs a directory: --checkpoint-dir DIR (or --resume DIR)"
                    .into(),
            );
        }
        if self.checkpoint_dir.is_some() && self.checkpoint_every.is_none() {
            return Err(
                "--checkpoint-dir without --checkpoint-every: say how often to save".into(),
            );
        }
        Ok(())
    }
}

/// Predict with a model saved by `cistern train --save`.
#[derive(Debug, clap::Args)]
pub struct PredictArgs {
    /// The saved model (safetensors).
    #[arg(long, value_name = "FILE")]
    pub model: PathBuf,
    /// Rows to predict: a CSV file with a header holding the model's feature columns.
    #[arg(long, value_name = "FILE")]
    pub csv: PathBuf,
    /// Write the predictions here (CSV) instead of printing them.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// `cpu`, `auto`, or `cpu:N`, `wgpu:N`, `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// For a classifier: a probability column per class after its name.
    #[arg(long)]
    pub probabilities: bool,
}

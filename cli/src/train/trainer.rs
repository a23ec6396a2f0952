//! One training step, entirely through the model's `DeviceParamStore`:
//! the device chain's captured and replayed step (SGD, the default), or a
//! tape forward, the store's backward and the store's fused step of any
//! family, with or without AMP.

use cistern_client::{Tape, Tensor};
use cistern_optim::{GradScaler, GradScalerConfig, OptimizerConfig, SgdConfig};

use super::args::StepPath;
use super::failure::Failure;
use super::store_model::StoreModel;

/// How each step runs.
#[derive(Debug)]
enum Step {
    /// `train_step_device_chain`: forward, loss, backward and SGD as one
    /// replayed graph; its loss read is the step's one synchronisation.
    Chain(SgdConfig),
    /// The tape's forward over resident leaves, `store.backward`, then the
    /// store's step of `config`; with a scaler, its synchronising AMP step.
    Tape(OptimizerConfig, Option<GradScaler>),
}

/// Trains a [`StoreModel`] in place.
#[derive(Debug)]
pub struct Trainer {
    model: StoreModel,
    step: Step,
    skipped: u64,
}

impl Trainer {
    /// A trainer of `model` with `config` along `path`; `amp` scales the
    /// loss with PyTorch's `GradScaler` defaults (SGD, Adam, AdamW only).
    pub fn new(
        model: StoreModel,
        config: OptimizerConfig,
        path: StepPath,
        amp: bool,
    ) -> Result<Self, Failure> {
        let step = match (path, config) {
            (StepPath::Chain, OptimizerConfig::Sgd(sgd)) if !amp => Step::Chain(sgd),
            (StepPath::Chain, _) => {
                return Err(Failure::Usage(
                    "--step chain runs SGD without --amp only: use --step tape".into(),
                ));
            }
            (StepPath::Tape, config) => {
                let scaler = match amp {
                    true => Some(
                        GradScaler::new(GradScalerConfig::default())
                            .map_err(|e| Failure::Usage(format!("--amp: {e}")))?,
                    ),
                    false => None,
                };
                Step::Tape(config, scaler)
            }
        };
        Ok(Trainer {
            model,
            step,
            skipped: 0,
        })
    }

    /// One step on the batch `features` (`rows × inputs`) and `targets`
    /// (`rows × 1`). Returns the batch's loss before the update.
    pub fn step(&mut self, features: &Tensor<f32>, targets: &Tensor<f32>) -> Result<f32, Failure> {
        match &mut self.step {
            Step::Chain(config) => chain_step(&mut self.model, features, targets, config),
            Step::Tape(config, scaler) => {
                let (loss, skipped) =
                    tape_step(&mut self.model, features, targets, config, scaler)?;
                self.skipped += u64::from(skipped);
                Ok(loss)
            }
        }
    }

    /// The model as it stands after the steps taken.
    pub fn model(&self) -> &StoreModel {
        &self.model
    }

    /// AMP steps skipped for non-finite gradients.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The path's name, as the summary shows it.
    pub fn path(&self) -> &'static str {
        match &self.step {
            Step::Chain(_) => "device-chain",
            Step::Tape(_, None) => "tape",
            Step::Tape(_, Some(_)) => "tape-amp",
        }
    }
}

fn chain_step(
    model: &mut StoreModel,
    features: &Tensor<f32>,
    targets: &Tensor<f32>,
    config: &SgdConfig,
) -> Result<f32, Failure> {
    let tape = Tape::new(model.client());
    let leaves = model.store().snapshot_resident_params(&tape)?;
    let chain = model.chain(&leaves);
    let store = model.store_mut();
    let loss = store.train_step_device_chain(&chain, features, targets, config)?;
    Ok(store.read_train_step_loss(&loss)?)
}

/// One tape step; whether AMP skipped it.
fn tape_step(
    model: &mut StoreModel,
    features: &Tensor<f32>,
    targets: &Tensor<f32>,
    config: &OptimizerConfig,
    scaler: &mut Option<GradScaler>,
) -> Result<(f32, bool), Failure> {
    let tape = Tape::new(model.client());
    let activations: Vec<_> = (0..model.layout.widths.len() - 1)
        .map(|index| model.activation(index))
        .collect();
    let store = model.store_mut();
    let leaves = store.register_resident_params(&tape)?;
    let mut h = tape.upload(features)?;
    let target = tape.upload(targets)?;
    for (pair, activation) in leaves.chunks(2).zip(activations) {
        h = store.linear_forward_with_activation(&tape, &h, &pair[0], pair.get(1), activation)?;
    }
    let loss = tape.mse_loss(&h, &target)?;
    let skipped = match scaler {
        None => {
            let gradients = store.backward(&tape, &loss)?;
            match config {
                OptimizerConfig::Sgd(c) => store.step(&gradients, c)?,
                OptimizerConfig::Adam(c) => store.step_adam(&gradients, c)?,
                OptimizerConfig::AdamW(c) => store.step_adamw(&gradients, c)?,
                OptimizerConfig::RmsProp(c) => store.step_rmsprop(&gradients, c)?,
                OptimizerConfig::Adagrad(c) => store.step_adagrad(&gradients, c)?,
                OptimizerConfig::Lamb(c) => store.step_lamb(&gradients, c)?,
            }
            false
        }
        Some(scaler) => {
            let scaled = tape.scale_loss(&loss, scaler)?;
            let gradients = store.backward(&tape, &scaled)?;
            match config {
                OptimizerConfig::Sgd(c) => store.step_amp(&gradients, c, scaler)?,
                OptimizerConfig::Adam(c) => store.step_adam_amp(&gradients, c, scaler)?,
                OptimizerConfig::AdamW(c) => store.step_adamw_amp(&gradients, c, scaler)?,
                _ => {
                    return Err(Failure::Usage(
                        "--amp works with --optimizer sgd, adam or adamw".into(),
                    ));
                }
            }
        }
    };
    Ok((loss.item()?, skipped))
}

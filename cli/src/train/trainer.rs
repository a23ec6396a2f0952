//! One training step, entirely through the model's `DeviceParamStore`:
//! the device chain's captured and replayed step (SGD, the default), or a
//! tape forward, the store's backward and the store's fused step of any
//! family, with or without AMP.

use std::ops::Range;

use cistern_client::{
    AutodiffError, BackendError, ChainLayer, ComputeClient, DatasetLoss, DatasetTargets,
    DeviceParamStore, ResidentDataset, Tape, Tensor, TrainStepLoss,
};
use cistern_optim::{GradScaler, GradScalerConfig, OptimizerConfig, SgdConfig};
use cistern_parallel::{Replica, Shard};
use cistern_runtime::Activation;

use super::args::StepPath;
use super::batches::{Batches, Feed};
use super::failure::Failure;
use super::prep::Part;
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
    /// The tape step on every replica of a group, each on its shard of the
    /// batch, the gradients averaged across the group before the step.
    Group(OptimizerConfig, Option<GradScaler>),
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
        let scaler = || match amp {
            true => GradScaler::new(GradScalerConfig::default())
                .map(Some)
                .map_err(|e| Failure::Usage(format!("--amp: {e}"))),
            false => Ok(None),
        };
        let step = match (path, config) {
            (_, config) if model.is_group() => Step::Group(config, scaler()?),
            (StepPath::Chain, OptimizerConfig::Sgd(sgd)) if !amp => Step::Chain(sgd),
            (StepPath::Chain, _) => {
                return Err(Failure::Usage(
                    "--step chain runs SGD without --amp only: use --step tape".into(),
                ));
            }
            (StepPath::Tape, config) => Step::Tape(config, scaler()?),
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
            Step::Group(config, scaler) => {
                let (loss, skipped) =
                    group_step(&mut self.model, features, targets, config, scaler)?;
                self.skipped += u64::from(skipped);
                Ok(loss)
            }
        }
    }

    /// Where the batches of `part` (`width` features a row) come from: the
    /// device, uploaded once, where this trainer steps the device chain of
    /// one store; else the host.
    pub fn feed(
        &self,
        part: &Part,
        width: usize,
        batch: usize,
        seed: u64,
    ) -> Result<Feed, Failure> {
        let rows = part.rows();
        let host = || Feed::Host(Batches::new(rows, batch, seed));
        if !matches!(self.step, Step::Chain(_)) || self.model.is_group() {
            return Ok(host());
        }
        let batch = batch.min(rows).max(1);
        let features = Tensor::new([rows, width], part.features.clone())
            .map_err(|e| Failure::Usage(format!("the training part: {e}")))?;
        let targets = Tensor::new([rows, 1], part.targets.clone())
            .map_err(|e| Failure::Usage(format!("the training part: {e}")))?;
        let dataset = self.model.store().upload_resident_dataset(
            &features,
            DatasetTargets::Values(&targets),
            batch,
            Feed::device_seed(seed),
        )?;
        Ok(Feed::Device(dataset))
    }

    /// One step on the next batch of `feed`: drawn on the device, or
    /// gathered from `part` on the host. Returns the batch's loss before
    /// the update.
    pub fn step_from(
        &mut self,
        feed: &mut Feed,
        part: &Part,
        width: usize,
    ) -> Result<f32, Failure> {
        match (feed, &self.step) {
            (Feed::Device(dataset), Step::Chain(config)) => {
                dataset_step(&mut self.model, dataset, config)
            }
            (Feed::Host(batches), _) => {
                let (features, targets) = batches.next(part, width)?;
                self.step(&features, &targets)
            }
            (Feed::Device(_), _) => Err(Failure::Usage(
                "a resident dataset steps the device chain only".into(),
            )),
        }
    }

    /// The model as it stands after the steps taken.
    pub fn model(&self) -> &StoreModel {
        &self.model
    }

    /// Replicas its group recovered in place (0 on one device).
    pub fn recoveries(&self) -> u64 {
        self.model.recoveries()
    }

    /// AMP steps skipped for non-finite gradients.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The AMP scaler as it stands (with --amp).
    pub fn scaler(&self) -> Option<&GradScaler> {
        match &self.step {
            Step::Chain(_) => None,
            Step::Tape(_, scaler) | Step::Group(_, scaler) => scaler.as_ref(),
        }
    }

    /// Carries on a checkpointed run: its scaler and skip count. A scaler
    /// where this run has none, or none where it has one, is refused.
    pub fn resume(&mut self, scaler: Option<GradScaler>, skipped: u64) -> Result<(), Failure> {
        let mine = match &mut self.step {
            Step::Chain(_) => None,
            Step::Tape(_, scaler) | Step::Group(_, scaler) => scaler.as_mut(),
        };
        match (mine, scaler) {
            (Some(mine), Some(saved)) => *mine = saved,
            (None, None) => {}
            _ => {
                return Err(Failure::Usage(
                    "--resume: the checkpoint's AMP scaler does not fit this run's --amp".into(),
                ));
            }
        }
        self.skipped = skipped;
        Ok(())
    }

    /// The path's name, as the summary shows it.
    pub fn path(&self) -> &'static str {
        match &self.step {
            Step::Chain(_) => "device-chain",
            Step::Tape(_, None) => "tape",
            Step::Tape(_, Some(_)) => "tape-amp",
            Step::Group(_, None) => "group",
            Step::Group(_, Some(_)) => "group-amp",
        }
    }
}

fn chain_step(
    model: &mut StoreModel,
    features: &Tensor<f32>,
    targets: &Tensor<f32>,
    config: &SgdConfig,
) -> Result<f32, Failure> {
    step_chain(model, |store, chain| {
        store.train_step_device_chain(chain, features, targets, config)
    })
}

fn dataset_step(
    model: &mut StoreModel,
    dataset: &ResidentDataset,
    config: &SgdConfig,
) -> Result<f32, Failure> {
    step_chain(model, |store, chain| {
        store.train_step_device_chain_dataset(chain, dataset, DatasetLoss::Mse, config)
    })
}

/// One chain step `send` makes over the model's current parameters, and
/// its loss read (the step's one synchronisation).
fn step_chain(
    model: &mut StoreModel,
    send: impl FnOnce(&mut DeviceParamStore, &[ChainLayer<'_>]) -> Result<TrainStepLoss, BackendError>,
) -> Result<f32, Failure> {
    let tape = Tape::new(model.client());
    let leaves = model.store().snapshot_resident_params(&tape)?;
    let chain = model.chain(&leaves);
    let store = model.store_mut()?;
    let loss = send(store, &chain)?;
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
    let activations = activations(model);
    let client = model.client().clone();
    let store = model.store_mut()?;
    let scale = scaler.as_ref().map(GradScaler::scale);
    let loss = forward_backward(store, &client, &activations, features, targets, scale)?;
    let skipped = match scaler {
        None => {
            store.step_staged(config)?;
            false
        }
        Some(scaler) => store.step_staged_amp(config, scaler)?,
    };
    Ok((loss, skipped))
}

/// One step of the model's replica group: each replica's forward and
/// backward on its shard of the batch; the loss over the whole batch and
/// whether AMP skipped the step.
fn group_step(
    model: &mut StoreModel,
    features: &Tensor<f32>,
    targets: &Tensor<f32>,
    config: &OptimizerConfig,
    scaler: &mut Option<GradScaler>,
) -> Result<(f32, bool), Failure> {
    let activations = activations(model);
    let group = model
        .group_mut()
        .ok_or_else(|| Failure::Usage("a group step needs a replica group".into()))?;
    let scale = scaler.as_ref().map(GradScaler::scale);
    let work = |replica: &mut Replica| {
        let rows = shard(features.shape()[0], replica.index(), replica.count());
        let (x, y) = (rows_of(features, &rows)?, rows_of(targets, &rows)?);
        let client = replica.client().clone();
        let loss = forward_backward(replica.store_mut(), &client, &activations, &x, &y, scale)
            .map_err(BackendError::from)?;
        Ok(Shard {
            loss,
            examples: rows.len(),
        })
    };
    let report = match scaler {
        None => group.step(config, work)?,
        Some(scaler) => group.step_amp(config, scaler, work)?,
    };
    Ok((report.loss as f32, report.skipped))
}

/// The forward over the store's resident parameters, the MSE and the
/// store's backward (of the loss times `scale`, for AMP): the gradients
/// are staged in the store. Returns the loss.
fn forward_backward(
    store: &mut DeviceParamStore,
    client: &ComputeClient,
    activations: &[Activation],
    features: &Tensor<f32>,
    targets: &Tensor<f32>,
    scale: Option<f32>,
) -> Result<f32, AutodiffError> {
    let tape = Tape::new(client);
    let leaves = store.register_resident_params(&tape)?;
    let mut h = tape.upload(features)?;
    let target = tape.upload(targets)?;
    for (pair, &activation) in leaves.chunks(2).zip(activations) {
        h = store.linear_forward_with_activation(&tape, &h, &pair[0], pair.get(1), activation)?;
    }
    let loss = tape.mse_loss(&h, &target)?;
    match scale {
        None => store.backward(&tape, &loss)?,
        Some(scale) => store.backward(&tape, &tape.scale(&loss, scale)?)?,
    };
    loss.item()
}

/// Each layer's activation, in order.
fn activations(model: &StoreModel) -> Vec<Activation> {
    (0..model.layout.widths.len() - 1)
        .map(|index| model.activation(index))
        .collect()
}

/// The rows of replica `index` of `count` in a batch of `rows`.
fn shard(rows: usize, index: usize, count: usize) -> Range<usize> {
    rows * index / count..rows * (index + 1) / count
}

/// The rows `rows` of a row-major matrix.
fn rows_of(matrix: &Tensor<f32>, rows: &Range<usize>) -> Result<Tensor<f32>, BackendError> {
    let width = matrix.shape().get(1).copied().unwrap_or(1);
    let data = matrix
        .data()
        .get(rows.start * width..rows.end * width)
        .ok_or_else(|| BackendError::InvalidArgument("a shard past the batch".into()))?;
    Ok(Tensor::new([rows.len(), width], data.to_vec())?)
}

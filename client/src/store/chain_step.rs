//! The device-chain train step: forward, the loss (MSE, or cross-entropy
//! over class indices), backward and SGD for the whole chain as one launch
//! batch on the store's stream, with no synchronisation. After a warm-up step the step is recorded as a graph
//! and replayed; `TrainStepLoss` names the loss of one step.

use cistern_optim::{OptimizerConfig, SgdConfig};
use cistern_runtime::{
    Activation, ClassInput, ClassLossSpec, FailureToken, KernelLaunch, OptimizerStep, Reduction,
};

use super::chain::{ChainLayer, ResidentInput};
use super::chain_plan::{ChainRun, ClassLossBuffers, FeedKey, LayerPlan, LossPlan, fused};
use super::dataset::{DatasetLoss, ResidentDataset};
use super::device_check::Backoff;
use super::state::OptimizerRun;
use super::store::DeviceParamStore;
use crate::compute::{Buffer, bytes_f32, f32_bytes};
use crate::error::BackendError;
use crate::shape::ShapeError;
use crate::tape::{CrossEntropyOptions, Tensor, WeightLayout};

/// The loss of a chain's train step, with its targets.
#[derive(Clone, Copy, Debug)]
pub enum ChainLoss<'a> {
    /// Mean squared error against targets of the last layer's shape.
    Mse(&'a Tensor<f32>),
    /// Cross-entropy of the last layer's output (the logits) against one
    /// class index per row, with PyTorch's options; the reduction is mean
    /// or sum (the step's loss is one number).
    CrossEntropy {
        /// One class index per row.
        targets: &'a [i64],
        /// Weight, ignore_index, reduction, label smoothing.
        options: &'a CrossEntropyOptions,
    },
}

/// The loss of one train step: bound to its store and a step serial. Read
/// it with [`DeviceParamStore::read_train_step_loss`] before the next step.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainStepLoss {
    store: u64,
    serial: u64,
    host: Option<f32>,
}

/// Where a chain step's batch comes from: written from the host, copied
/// from resident inputs, or drawn from a resident dataset on the device.
#[derive(Clone, Copy, Debug)]
pub(super) enum Feed<'a> {
    Host {
        input: &'a Tensor<f32>,
        loss: ChainLoss<'a>,
    },
    Resident {
        x: &'a ResidentInput,
        y: &'a ResidentInput,
    },
    Dataset {
        data: &'a ResidentDataset,
        loss: DatasetLoss<'a>,
    },
}

impl Feed<'_> {
    /// The batch's shape, `rows×features`.
    fn shape(&self) -> Vec<usize> {
        match self {
            Feed::Host { input, .. } => input.shape().to_vec(),
            Feed::Resident { x, .. } => x.shape.clone(),
            Feed::Dataset { data, .. } => vec![data.batch(), data.width()],
        }
    }

    /// What a recorded step with this feed is bound to.
    fn key(&self) -> FeedKey {
        match self {
            Feed::Host { .. } => FeedKey::Host,
            Feed::Resident { x, y } => FeedKey::Resident(x.id, y.id),
            Feed::Dataset { data, .. } => FeedKey::Dataset(data.id),
        }
    }
}

impl TrainStepLoss {
    /// The loss of step `serial` of store `store`, read from the device.
    pub(super) fn on_device(store: u64, serial: u64) -> Self {
        TrainStepLoss {
            store,
            serial,
            host: None,
        }
    }

    /// The step serial it belongs to.
    pub fn serial(&self) -> u64 {
        self.serial
    }
}

impl DeviceParamStore {
    /// One SGD train step of `chain` (covering every slot once) on
    /// `input` and `target`: forward, MSE (mean), backward and the step as
    /// one launch batch, returned once queued, with no synchronisation.
    /// The second step with one batch shape and config is recorded as a
    /// graph; later ones replay it (a new shape or config records again).
    ///
    /// Refusals are those of [`validate_train_step_device_chain`] and
    /// change nothing. While another client captures, the whole step is
    /// retried for up to 2 s, then `DeviceContextCaptureInProgress`
    /// (nothing changed: retry later). A device failure latches the store.
    ///
    /// [`validate_train_step_device_chain`]: Self::validate_train_step_device_chain
    pub fn train_step_device_chain(
        &mut self,
        chain: &[ChainLayer<'_>],
        input: &Tensor<f32>,
        target: &Tensor<f32>,
        config: &SgdConfig,
    ) -> Result<TrainStepLoss, BackendError> {
        self.train_step_device_chain_with_loss(chain, input, ChainLoss::Mse(target), config)
    }

    /// [`train_step_device_chain`](Self::train_step_device_chain) with the
    /// loss as a parameter: MSE, or cross-entropy over the last layer's
    /// output (logits) and class indices. A class index out of range is
    /// `InvalidArgument` naming its row, before anything changes; a new
    /// loss (or new class weights) makes a new workspace and records again.
    pub fn train_step_device_chain_with_loss(
        &mut self,
        chain: &[ChainLayer<'_>],
        input: &Tensor<f32>,
        loss: ChainLoss<'_>,
        config: &SgdConfig,
    ) -> Result<TrainStepLoss, BackendError> {
        let mut backoff = Backoff::new();
        loop {
            match self.try_chain_step(chain, Feed::Host { input, loss }, config) {
                Err(error) if error.is_transient() && backoff.wait() => {}
                answer => return answer,
            }
        }
    }

    /// Every check of [`train_step_device_chain`](Self::train_step_device_chain),
    /// with no side effect: a pending forward is `PendingForwardUnconsumed`;
    /// a leaf of another store, a chain that does not cover every slot
    /// exactly once, an input of rank ≠ 2, or an invalid or changed config
    /// `InvalidArgument`; shapes that do not chain `ShapeMismatch`.
    pub fn validate_train_step_device_chain(
        &self,
        chain: &[ChainLayer<'_>],
        input: &Tensor<f32>,
        target: &Tensor<f32>,
        config: &SgdConfig,
    ) -> Result<(), BackendError> {
        self.enter()?;
        let loss = ChainLoss::Mse(target);
        self.check_train(chain, Feed::Host { input, loss }, config)
            .map(|_| ())
    }

    /// The checks of [`train_step_device_chain_with_loss`], with no side
    /// effect: those of [`validate_train_step_device_chain`], and for
    /// cross-entropy one target per row, each in range or `ignore_index`,
    /// weights one per class, a reduction of mean or sum (`InvalidArgument`).
    ///
    /// [`train_step_device_chain_with_loss`]: Self::train_step_device_chain_with_loss
    /// [`validate_train_step_device_chain`]: Self::validate_train_step_device_chain
    pub fn validate_train_step_device_chain_with_loss(
        &self,
        chain: &[ChainLayer<'_>],
        input: &Tensor<f32>,
        loss: ChainLoss<'_>,
        config: &SgdConfig,
    ) -> Result<(), BackendError> {
        self.enter()?;
        self.check_train(chain, Feed::Host { input, loss }, config)
            .map(|_| ())
    }

    /// [`train_step_device_chain_with_loss`] over a feed (waiting out
    /// another client's capture as it does).
    ///
    /// [`train_step_device_chain_with_loss`]: Self::train_step_device_chain_with_loss
    pub(super) fn chain_step_with_retry(
        &mut self,
        chain: &[ChainLayer<'_>],
        feed: Feed<'_>,
        config: &SgdConfig,
    ) -> Result<TrainStepLoss, BackendError> {
        let mut backoff = Backoff::new();
        loop {
            match self.try_chain_step(chain, feed, config) {
                Err(error) if error.is_transient() && backoff.wait() => {}
                answer => return answer,
            }
        }
    }

    /// The loss of the latest train step: one 4-byte read (the step's one
    /// synchronisation), or none for a loss recorded from the host. A loss
    /// of an older step or of another store is `InvalidArgument`.
    pub fn read_train_step_loss(&self, loss: &TrainStepLoss) -> Result<f32, BackendError> {
        self.enter()?;
        let latest = self.state.loss_serial();
        if loss.store != self.id || loss.serial != latest {
            return Err(BackendError::InvalidArgument(format!(
                "the loss is of step {} (of store {}); the latest is step {} of store {}",
                loss.serial, loss.store, latest, self.id
            )));
        }
        if let Some(value) = loss.host {
            return Ok(value);
        }
        let buffer = match (self.state.graph_loss(latest), self.state.chain_run()) {
            (Some(loss), _) => loss,
            (None, Some(run)) => &run.loss,
            (None, None) => return Err(BackendError::InvalidArgument("no train step ran".into())),
        };
        let read = self.client.read_on(self.stream.id, buffer, 0, 4);
        let bytes = self.after_wait(read)?;
        bytes_f32(&bytes)
            .first()
            .copied()
            .ok_or_else(|| BackendError::TransferFailed("the loss read was empty".into()))
    }

    /// Records a loss computed on the host (another path's step) under a
    /// new serial; reading it needs no synchronisation.
    pub fn record_host_train_step_loss(
        &mut self,
        value: f32,
    ) -> Result<TrainStepLoss, BackendError> {
        self.enter_mut()?;
        Ok(TrainStepLoss {
            store: self.id,
            serial: self.state.record_host_loss(),
            host: Some(value),
        })
    }

    pub(super) fn check_train(
        &self,
        chain: &[ChainLayer<'_>],
        feed: Feed<'_>,
        config: &SgdConfig,
    ) -> Result<(Vec<LayerPlan>, LossPlan), BackendError> {
        let shape = feed.shape();
        let plan = self.check_chain(chain, &shape)?;
        let mut seen = vec![0usize; self.layout.slots().len()];
        for layer in &plan {
            for slot in std::iter::once(layer.weight).chain(layer.bias) {
                if let Some(count) = seen.get_mut(slot) {
                    *count += 1;
                }
            }
        }
        if let Some(slot) = seen.iter().position(|&count| count != 1) {
            return Err(BackendError::InvalidArgument(format!(
                "a train chain uses every slot exactly once; slot {slot} is used {} times",
                seen[slot]
            )));
        }
        let width = plan.last().map_or(0, |layer| layer.n);
        let loss_plan = match feed {
            Feed::Host { loss, .. } => check_loss(loss, shape[0], width)?,
            Feed::Resident { x, y } => {
                self.check_input(x)?;
                self.check_input(y)?;
                ShapeError::check_dims(&[shape[0], width], &y.shape)?;
                LossPlan::Mse
            }
            Feed::Dataset { data, loss } => self.check_dataset(data, loss, width)?,
        };
        self.check_config(&OptimizerConfig::Sgd(config.clone()))?;
        Ok((plan, loss_plan))
    }

    fn try_chain_step(
        &mut self,
        chain: &[ChainLayer<'_>],
        feed: Feed<'_>,
        config: &SgdConfig,
    ) -> Result<TrainStepLoss, BackendError> {
        self.enter_mut()?;
        let (plan, loss_plan) = self.check_train(chain, feed, config)?;
        let rows = feed.shape()[0];
        // A workspace of another shape gives its buffers back before the new one is reserved.
        let held = self
            .state
            .take_chain_run()
            .filter(|run| run.fits(rows, &plan, &loss_plan));
        let run = match held {
            Some(run) => run,
            None => self.workspace(rows, plan, loss_plan)?,
        };
        let optimizer = OptimizerConfig::Sgd(config.clone());
        let mut launches = Vec::new();
        let (state, steps) = match self.chain_optimizer_state(&optimizer, &mut launches) {
            Ok(found) => found,
            Err(error) => {
                // The workspace outlives a refused step.
                self.state.keep_chain_run(run);
                return Err(error);
            }
        };
        let token = self.send_chain_step(run, feed, config, &state, steps, launches)?;
        let committed = OptimizerRun {
            config: optimizer,
            state,
            steps: steps + 1,
            device_amp: None,
        };
        Ok(TrainStepLoss {
            store: self.id,
            serial: self.state.commit_chain_step(token, committed),
            host: None,
        })
    }

    /// The optimizer state a chain step updates and the steps counted so
    /// far; the first step reserves the state (its zero fills join
    /// `launches`). After an AMP step with no synchronisation the count is
    /// on the device: `InvalidArgument`.
    fn chain_optimizer_state(
        &self,
        optimizer: &OptimizerConfig,
        launches: &mut Vec<KernelLaunch>,
    ) -> Result<(Vec<Buffer>, u64), BackendError> {
        match self.state.optimizer() {
            Some(run) if run.device_amp.is_some() => Err(BackendError::InvalidArgument(
                "a chain step after an AMP step with no synchronisation: the step count is on the device"
                    .to_string(),
            )),
            Some(run) => Ok((run.state.clone(), run.steps)),
            None => Ok((self.allocate_state(optimizer, launches)?, 0)),
        }
    }

    /// Writes a host batch, then replays the recorded step, records it,
    /// or (warm-up, first step) launches it directly; a resident feed's
    /// copies or gather are the step's first launches. Keeps `run` in the
    /// store.
    fn send_chain_step(
        &mut self,
        mut run: ChainRun,
        feed: Feed<'_>,
        config: &SgdConfig,
        state: &[Buffer],
        steps: u64,
        mut launches: Vec<KernelLaunch>,
    ) -> Result<FailureToken, BackendError> {
        let stream = self.stream.id;
        if let Feed::Host { input, loss } = feed {
            let written = self
                .client
                .write_on(stream, &run.x, 0, &f32_bytes(input.data()))
                .and_then(|()| self.client.write_on(stream, &run.y, 0, &target_bytes(loss)));
            if let Err(error) = written {
                self.state.keep_chain_run(run);
                return Err(self.state.fail(BackendError::from(error)));
            }
        }
        let key = feed.key();
        let replay = run
            .graph
            .as_ref()
            .filter(|(_, recorded, fed)| recorded == config && *fed == key)
            .map(|(graph, _, _)| graph.clone());
        let step = OptimizerStep::new(
            OptimizerConfig::Sgd(config.clone()),
            steps + 1,
            self.segments.clone(),
            self.params.whole(),
            self.staging.whole(),
            state.iter().map(Buffer::whole).collect(),
        );
        let sent = match replay {
            Some(graph) => self.client.replay_tracked(stream, &graph),
            None => {
                launches.extend(feed_launches(feed, &run));
                launches.extend(self.chain_launches(&run));
                launches.push(step.into_launch());
                // SGD's kernel differs only at step 1: a step ≥ 2 recorded once
                // replays every later one.
                if run.warmed && steps >= 1 {
                    match self.record_graph(&launches) {
                        Ok(graph) => {
                            run.graph = Some((graph.clone(), config.clone(), key));
                            self.client.replay_tracked(stream, &graph)
                        }
                        Err(error) => Err(error),
                    }
                } else {
                    run.warmed = true;
                    self.client.launch_batch(stream, launches)
                }
            }
        };
        self.state.keep_chain_run(run);
        sent.map_err(|error| self.state.fail(BackendError::from(error)))
    }

    /// The forward, loss and backward launches of one step over `run`.
    fn chain_launches(&self, run: &ChainRun) -> Vec<KernelLaunch> {
        let rows = run.rows;
        let mut launches = Vec::new();
        let input_of = |l: usize| if l == 0 { &run.x } else { &run.outs[l - 1] };
        for (l, layer) in run.plan.iter().enumerate() {
            let x = input_of(l).whole();
            launches.extend(self.layer_forward(layer, rows, x, &run.outs[l], run.pres[l].as_ref()));
        }
        let last = run.plan.len() - 1;
        let (pred, y) = (run.outs[last].whole(), run.y.whole());
        let grad = run.grads[last].whole();
        match (&run.loss_plan, &run.class_buffers) {
            (LossPlan::CrossEntropy { spec, .. }, Some(buffers)) => {
                let weight = buffers.weight.as_ref().map(Buffer::whole);
                let one = buffers.one.whole();
                let loss = run.loss.whole();
                launches.push(KernelLaunch::class_loss(*spec, pred, y, weight, loss));
                let backward = KernelLaunch::class_loss_backward(*spec, pred, y, weight, one, grad);
                launches.push(backward);
            }
            _ => {
                launches.push(KernelLaunch::mse_loss(pred, y, run.loss.whole()));
                launches.push(KernelLaunch::mse_loss_backward(pred, y, 1.0, grad));
            }
        }
        for (l, layer) in run.plan.iter().enumerate().rev() {
            let mut g = &run.grads[l];
            if let Some(act_grad) = &run.act_grads[l] {
                let at = run.pres[l].as_ref().unwrap_or(&run.outs[l]);
                launches.push(KernelLaunch::activation_backward(
                    layer.activation,
                    at.whole(),
                    g.whole(),
                    act_grad.whole(),
                ));
                g = act_grad;
            }
            let (n, k) = (layer.n, layer.k);
            let weight_grad = self.slot_binding(&self.staging, layer.weight);
            let (spec, a, b) =
                WeightLayout::InOut.weight_gradient((rows, n, k), g.whole(), input_of(l).whole());
            launches.push(KernelLaunch::gemm(spec, a, b, None, weight_grad));
            if let Some(bias) = layer.bias {
                let sums = self.slot_binding(&self.staging, bias);
                launches.push(KernelLaunch::column_sum(
                    g.whole(),
                    rows as u64,
                    n as u64,
                    sums,
                ));
            }
            if l > 0 {
                let weight = self.slot_binding(&self.params, layer.weight);
                launches.push(KernelLaunch::gemm(
                    WeightLayout::InOut.input_gradient(rows, n, k),
                    g.whole(),
                    weight,
                    None,
                    run.grads[l - 1].whole(),
                ));
            }
        }
        launches
    }

    /// The buffers of a chain step over `rows`-row batches.
    fn workspace(
        &self,
        rows: usize,
        plan: Vec<LayerPlan>,
        loss_plan: LossPlan,
    ) -> Result<ChainRun, BackendError> {
        let first = plan.first().map_or(0, |layer| layer.k);
        let last = plan.last().map_or(0, |layer| layer.n);
        let (mut outs, mut pres, mut grads, mut act_grads) = (vec![], vec![], vec![], vec![]);
        for layer in &plan {
            let len = rows * layer.n;
            outs.push(self.reserve_floats(len)?);
            grads.push(self.reserve_floats(len)?);
            pres.push(match fused(layer.activation) {
                true => None,
                false => Some(self.reserve_floats(len)?),
            });
            act_grads.push(match layer.activation {
                Activation::Identity => None,
                _ => Some(self.reserve_floats(len)?),
            });
        }
        let (targets, class_buffers) = match &loss_plan {
            LossPlan::Mse => (rows * last, None),
            LossPlan::CrossEntropy { weight, .. } => (rows, Some(self.class_loss_buffers(weight)?)),
        };
        Ok(ChainRun {
            rows,
            x: self.reserve_floats(rows * first)?,
            y: self.reserve_floats(targets)?,
            loss_plan,
            class_buffers,
            plan,
            outs,
            pres,
            grads,
            act_grads,
            loss: self.reserve_floats(1)?,
            warmed: false,
            graph: None,
        })
    }
}

impl DeviceParamStore {
    /// A cross-entropy workspace's weights and upstream gradient, written
    /// on the store's stream.
    fn class_loss_buffers(
        &self,
        weight: &Option<Vec<f32>>,
    ) -> Result<ClassLossBuffers, BackendError> {
        let stream = self.stream.id;
        let one = self.reserve_floats(1)?;
        self.client
            .write_on(stream, &one, 0, &f32_bytes(&[1.0]))
            .map_err(|error| self.state.fail(BackendError::from(error)))?;
        let weight = match weight {
            Some(values) => {
                let buffer = self.reserve_floats(values.len())?;
                self.client
                    .write_on(stream, &buffer, 0, &f32_bytes(values))
                    .map_err(|error| self.state.fail(BackendError::from(error)))?;
                Some(buffer)
            }
            None => None,
        };
        Ok(ClassLossBuffers { weight, one })
    }
}

/// The launches that bring a resident feed's batch into the workspace:
/// two copies, or the dataset's gather (which advances its counter).
fn feed_launches(feed: Feed<'_>, run: &ChainRun) -> Vec<KernelLaunch> {
    match feed {
        Feed::Host { .. } => Vec::new(),
        Feed::Resident { x, y } => vec![
            KernelLaunch::copy(x.buffer.whole(), run.x.whole()),
            KernelLaunch::copy(y.buffer.whole(), run.y.whole()),
        ],
        Feed::Dataset { data, .. } => vec![data.gather(&run.x, &run.y)],
    }
}

/// The targets' bytes as the workspace holds them: `f32`s, or `i32`
/// class indices (checked to fit by [`check_loss`]).
fn target_bytes(loss: ChainLoss<'_>) -> Vec<u8> {
    match loss {
        ChainLoss::Mse(target) => f32_bytes(target.data()),
        ChainLoss::CrossEntropy { targets, .. } => targets
            .iter()
            .flat_map(|&t| i32::try_from(t).unwrap_or(i32::MIN).to_ne_bytes())
            .collect(),
    }
}

/// The loss's checks against a batch of `rows` rows and a last layer of
/// `width` outputs.
fn check_loss(loss: ChainLoss<'_>, rows: usize, width: usize) -> Result<LossPlan, BackendError> {
    let invalid = BackendError::InvalidArgument;
    match loss {
        ChainLoss::Mse(target) => {
            ShapeError::check_dims(&[rows, width], target.shape())?;
            Ok(LossPlan::Mse)
        }
        ChainLoss::CrossEntropy { targets, options } => {
            ShapeError::check_dims(&[rows], &[targets.len()])?;
            let plan = class_loss_plan(options, rows, width)?;
            cistern_runtime::check_targets(targets, width, options.ignore_index)
                .map_err(|error| invalid(error.to_string()))?;
            Ok(plan)
        }
    }
}

/// A cross-entropy chain loss over `rows×width` logits with `options`:
/// a reduction of mean or sum, an `i32` ignore index, one weight per class.
pub(super) fn class_loss_plan(
    options: &CrossEntropyOptions,
    rows: usize,
    width: usize,
) -> Result<LossPlan, BackendError> {
    let invalid = BackendError::InvalidArgument;
    if options.reduction == Reduction::None {
        return Err(invalid(
            "a chain step's loss is one number: reduction mean or sum, not none".into(),
        ));
    }
    let ignore_index = i32::try_from(options.ignore_index).map_err(|_| {
        invalid(format!(
            "ignore_index {} does not fit in i32",
            options.ignore_index
        ))
    })?;
    if let Some(weight) = &options.weight
        && weight.len() != width
    {
        return Err(invalid(format!(
            "weight has {} elements, one per class is {width}",
            weight.len()
        )));
    }
    let spec = ClassLossSpec {
        rows,
        classes: width,
        input: ClassInput::Logits,
        reduction: options.reduction,
        ignore_index,
        label_smoothing: options.label_smoothing,
        weighted: options.weight.is_some(),
    };
    spec.validate()
        .map_err(|error| invalid(error.to_string()))?;
    Ok(LossPlan::CrossEntropy {
        spec,
        weight: options.weight.clone(),
    })
}

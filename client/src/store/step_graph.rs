//! A tape's training step recorded once as a graph and replayed: the
//! forward, loss and backward launches the tape sent, then the store's
//! fused step in its counted form. The step count lives in a device word
//! that the counted step advances, so the bias corrections and a counted
//! dropout's masks move on with every replay and the host sends one
//! command a step (the batch's writes aside).

use std::borrow::Cow;

use cistern_optim::OptimizerConfig;
use cistern_runtime::{FailureToken, KernelLaunch, ServerError};

use super::chain_step::TrainStepLoss;
use super::device_check::Backoff;
use super::state::OptimizerRun;
use super::store::DeviceParamStore;
use crate::compute::{Buffer, Graph, f32_bytes};
use crate::error::BackendError;
use crate::tape::{ClassTargets, Gradients, Tape, Var};

/// The step counter's words: the found-inf flag the counted step reads
/// (always 0), then the count.
const FLAG: u64 = 0;
const COUNT: u64 = 4;

/// What a recorded step reads from the host: a value uploaded to its tape
/// (`Tape::upload`), or class targets (`Tape::class_targets`). A replay
/// writes the next batch into them, in the order given.
#[derive(Clone, Copy, Debug)]
pub enum GraphInput<'a, 't> {
    /// `f32` values of the tape (the batch's features).
    Values(&'a Var<'t>),
    /// Class indices of the tape (the batch's labels).
    Classes(&'a ClassTargets),
}

/// One replay's batch: an entry per [`GraphInput`], in order and of the
/// same kind and length.
#[derive(Clone, Copy, Debug)]
pub enum BatchInput<'a> {
    /// The values of a [`GraphInput::Values`].
    Values(&'a [f32]),
    /// The labels of a [`GraphInput::Classes`].
    Classes(&'a [i64]),
}

/// A training step of one store recorded as one graph by
/// [`DeviceParamStore::capture_step`] and run by
/// [`DeviceParamStore::replay_step`]. It holds the tape's buffers (and so
/// the step's device memory) until it drops.
#[derive(Debug)]
pub struct StepGraph {
    store: u64,
    graph: Graph,
    inputs: Vec<RecordedInput>,
    loss: Buffer,
    config: OptimizerConfig,
    launches: usize,
}

#[derive(Debug)]
struct RecordedInput {
    buffer: Buffer,
    kind: InputKind,
}

#[derive(Debug)]
enum InputKind {
    Values(usize),
    /// Rows, and the classes and ignore index of every loss reading them.
    Classes(usize, Vec<(usize, i64)>),
}

impl StepGraph {
    /// The kernel launches one replay runs (the tape's and the step's).
    pub fn launches(&self) -> usize {
        self.launches
    }

    /// The optimizer config its step was recorded with.
    pub fn config(&self) -> &OptimizerConfig {
        &self.config
    }
}

impl DeviceParamStore {
    /// A device word holding the optimizer steps this store applied (a
    /// `u32`), for [`Tape::dropout_counted`]: a forward registered on the
    /// store, and a replayed step, see it hold the steps before theirs.
    /// Reserved on first use. After an AMP step with no synchronisation
    /// the count is elsewhere: `InvalidArgument`.
    pub fn step_counter(&mut self) -> Result<Buffer, BackendError> {
        self.enter_mut()?;
        self.refuse_count_on_device()?;
        let words = self.step_words()?;
        self.write_counter()?;
        words
            .view(COUNT, 4)
            .ok_or_else(|| BackendError::InvalidArgument("the step counter's word".into()))
    }

    /// Records the step that `gradients` (this store's latest backward of
    /// `tape`) ends as one graph, and queues its optimizer step of
    /// `config` as [`step_staged`](Self::step_staged) would: later batches
    /// of the same shapes run with [`replay_step`](Self::replay_step).
    /// `loss` (one element) is what a replay's [`TrainStepLoss`] reads;
    /// `inputs` are what a replay writes anew. The tape's launches since it
    /// was made or reset are the step, and its buffers become the graph's
    /// (its next reset takes new ones).
    ///
    /// The tape must be on the store's stream and every input and the loss
    /// of it (`InvalidArgument`, `TapeMismatch`); LAMB, whose step decides
    /// on the host between passes, and a store whose count is on the device
    /// after an AMP step are `InvalidArgument`. The step's own refusals are
    /// those of `step_staged`. Another client's capture answers
    /// `DeviceContextCaptureInProgress` with nothing changed.
    pub fn capture_step<'t>(
        &mut self,
        tape: &'t Tape,
        gradients: &Gradients<'t>,
        config: &OptimizerConfig,
        loss: &Var<'t>,
        inputs: &[GraphInput<'_, 't>],
    ) -> Result<StepGraph, BackendError> {
        self.enter_mut()?;
        let invalid = |message: &str| Err(BackendError::InvalidArgument(message.into()));
        if tape.stream() != self.stream.id {
            return invalid(
                "capture_step: record the step on the store's stream (Tape::on_stream)",
            );
        }
        if matches!(config, OptimizerConfig::Lamb(_)) {
            return invalid("capture_step: LAMB's step decides on the host between its passes");
        }
        if loss.tape_id() != tape.id() {
            return Err(BackendError::TapeMismatch);
        }
        if loss.len() != 1 {
            return invalid("capture_step: the loss is one element");
        }
        self.refuse_count_on_device()?;
        let recorded = recorded_inputs(tape, inputs)?;
        let mut prepared = self.prepare_step(config.clone(), gradients)?;
        let words = self.step_words()?;
        self.write_counter()?;
        let counted = prepared
            .step
            .clone()
            .with_found_inf(words.range(FLAG, 4))
            .into_counted_launch(words.range(COUNT, 4))
            .ok_or_else(|| BackendError::InvalidArgument("a counted step needs a flag".into()))?;
        let mut launches = tape.launches();
        launches.push(counted.clone());
        let graph = self
            .record_graph(&launches)
            .map_err(|error| self.state.fail(BackendError::from(error)))?;
        let mut batch = std::mem::take(&mut prepared.before);
        batch.push(counted);
        let requires = std::mem::take(&mut prepared.requires);
        let sent = self
            .client
            .launch_batch_requiring(self.stream.id, batch, requires);
        let token = sent.map_err(|error| self.state.fail(BackendError::from(error)))?;
        self.commit(token, &prepared, prepared.steps + 1);
        self.state.counter_now_current();
        tape.give_buffers_to_graph();
        Ok(StepGraph {
            store: self.id,
            graph,
            inputs: recorded,
            loss: loss.buffer(),
            config: config.clone(),
            launches: launches.len(),
        })
    }

    /// One training step of `graph` on `batch` (an entry per recorded
    /// input): the batch is written into the graph's inputs, then the whole
    /// step runs as one command, returned once queued. The step count
    /// advances as for any step; read the loss with
    /// [`read_train_step_loss`](Self::read_train_step_loss).
    ///
    /// Refused with nothing changed: a graph of another store, a batch
    /// that does not match the recorded inputs, a label out of its loss's
    /// range, or a store whose latest step used another config (an `lr`
    /// change: capture again) are `InvalidArgument`; a pending forward is
    /// `PendingForwardUnconsumed`. While another client captures, the step
    /// is retried for up to 2 s, then `DeviceContextCaptureInProgress`. A
    /// device failure latches the store.
    pub fn replay_step(
        &mut self,
        graph: &StepGraph,
        batch: &[BatchInput<'_>],
    ) -> Result<TrainStepLoss, BackendError> {
        let mut backoff = Backoff::new();
        loop {
            match self.try_replay(graph, batch) {
                Err(error) if error.is_transient() && backoff.wait() => {}
                answer => return answer,
            }
        }
    }

    fn try_replay(
        &mut self,
        graph: &StepGraph,
        batch: &[BatchInput<'_>],
    ) -> Result<TrainStepLoss, BackendError> {
        self.enter_mut()?;
        if graph.store != self.id {
            return Err(BackendError::InvalidArgument(
                "the step graph was recorded by another store".into(),
            ));
        }
        self.state.check_no_pending_forward()?;
        self.refuse_count_on_device()?;
        let run = match self.state.optimizer() {
            Some(run) if run.config == graph.config => run.clone(),
            _ => {
                return Err(BackendError::InvalidArgument(
                    "the store's latest step used another config than the graph's: \
                     capture the step again"
                        .into(),
                ));
            }
        };
        let bytes = batch_bytes(&graph.inputs, batch)?;
        for (input, bytes) in graph.inputs.iter().zip(&bytes) {
            let written = self
                .client
                .write_on(self.stream.id, &input.buffer, 0, bytes);
            written.map_err(|error| self.state.fail(BackendError::from(error)))?;
        }
        self.write_counter()?;
        let token: FailureToken = self
            .client
            .replay_tracked(self.stream.id, &graph.graph)
            .map_err(|error| self.state.fail(BackendError::from(error)))?;
        let committed = OptimizerRun {
            steps: run.steps + 1,
            ..run
        };
        let serial = self.state.commit_chain_step(token, committed);
        self.state.counter_now_current();
        self.state.keep_graph_loss(serial, graph.loss.clone());
        Ok(TrainStepLoss::on_device(self.id, serial))
    }

    /// Records `launches` as a graph on the store's stream.
    pub(super) fn record_graph(&self, launches: &[KernelLaunch]) -> Result<Graph, ServerError> {
        let (token, guard) = self.client.begin_capture(self.stream.id)?;
        token.launch_batch(launches.to_vec())?;
        self.client.end_capture(guard)
    }

    /// The counter's words, reserved (the flag 0) on first use.
    fn step_words(&mut self) -> Result<Buffer, BackendError> {
        if let Some(words) = self.state.step_words() {
            return Ok(words.clone());
        }
        let words = self.reserve_floats(2)?;
        self.client
            .write_on(self.stream.id, &words, 0, &f32_bytes(&[0.0, 0.0]))
            .map_err(|error| self.state.fail(BackendError::from(error)))?;
        self.state.keep_step_words(words.clone());
        Ok(words)
    }

    /// Writes the committed step count into the counter unless the queued
    /// work already leaves it there. Nothing to do with no counter yet, or
    /// once the count moved to the device after an AMP step (the counter
    /// keeps the count of the last step before it).
    pub(super) fn write_counter(&mut self) -> Result<(), BackendError> {
        let Some(words) = self.state.step_words() else {
            return Ok(());
        };
        if self.state.counter_is_current() || self.refuse_count_on_device().is_err() {
            return Ok(());
        }
        let steps = u32::try_from(self.state.steps()).map_err(|_| {
            BackendError::InvalidArgument(format!(
                "{} steps do not fit the device's u32 step counter",
                self.state.steps()
            ))
        })?;
        self.client
            .write_on(self.stream.id, words, COUNT, &steps.to_ne_bytes())
            .map_err(|error| self.state.fail(BackendError::from(error)))?;
        self.state.counter_now_current();
        Ok(())
    }

    fn refuse_count_on_device(&self) -> Result<(), BackendError> {
        match self.state.optimizer() {
            Some(run) if run.device_amp.is_some() => Err(BackendError::InvalidArgument(
                "this store's step count is on the device after an AMP step with no \
                 synchronisation: a step counter or a recorded step cannot follow it"
                    .into(),
            )),
            _ => Ok(()),
        }
    }
}

/// The inputs a graph writes anew each replay, checked to be `tape`'s.
fn recorded_inputs(
    tape: &Tape,
    inputs: &[GraphInput<'_, '_>],
) -> Result<Vec<RecordedInput>, BackendError> {
    inputs
        .iter()
        .map(|input| match *input {
            GraphInput::Values(var) if var.tape_id() == tape.id() => Ok(RecordedInput {
                buffer: var.buffer(),
                kind: InputKind::Values(var.len()),
            }),
            GraphInput::Classes(targets) if targets.tape_id() == tape.id() => Ok(RecordedInput {
                buffer: targets.buffer().clone(),
                kind: InputKind::Classes(targets.len(), tape.class_limits(targets)),
            }),
            _ => Err(BackendError::TapeMismatch),
        })
        .collect()
}

/// Each input's bytes as the device holds them, after every check (the
/// values as they are, the labels converted to `i32` words).
fn batch_bytes<'a>(
    inputs: &[RecordedInput],
    batch: &[BatchInput<'a>],
) -> Result<Vec<Cow<'a, [u8]>>, BackendError> {
    let invalid = |message: String| BackendError::InvalidArgument(message);
    if inputs.len() != batch.len() {
        return Err(invalid(format!(
            "the graph reads {} inputs; the batch has {}",
            inputs.len(),
            batch.len()
        )));
    }
    let mut all = Vec::with_capacity(batch.len());
    for (i, (input, given)) in inputs.iter().zip(batch).enumerate() {
        let bytes = match (&input.kind, given) {
            (InputKind::Values(len), BatchInput::Values(values)) if *len == values.len() => {
                Cow::Borrowed(bytemuck::cast_slice(values))
            }
            (InputKind::Classes(rows, limits), BatchInput::Classes(labels))
                if *rows == labels.len() =>
            {
                for &(classes, ignore_index) in limits {
                    cistern_runtime::check_targets(labels, classes, ignore_index)
                        .map_err(|error| invalid(format!("input {i}: {error}")))?;
                }
                let mut bytes = Vec::with_capacity(4 * labels.len());
                for (row, &label) in labels.iter().enumerate() {
                    let word = i32::try_from(label).map_err(|_| {
                        invalid(format!(
                            "input {i}: row {row}'s label {label} does not fit in i32"
                        ))
                    })?;
                    bytes.extend(word.to_ne_bytes());
                }
                Cow::Owned(bytes)
            }
            (InputKind::Values(len), _) => {
                return Err(invalid(format!("input {i} is {len} f32 values")));
            }
            (InputKind::Classes(rows, _), _) => {
                return Err(invalid(format!("input {i} is {rows} class labels")));
            }
        };
        all.push(bytes);
    }
    Ok(all)
}

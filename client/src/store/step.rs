//! The optimizer step: validated in full before any device work, then one
//! fused kernel over the concatenated buffer, reading the staged gradients.

use cistern_optim::{OptimizerConfig, SgdConfig};
use cistern_runtime::ScaleRule;
use cistern_runtime::{
    AllocationPolicy, FailureToken, KernelLaunch, OptimizerStep, optimizer_error,
};

use super::state::OptimizerRun;
use super::store::DeviceParamStore;
use crate::compute::Buffer;
use crate::error::BackendError;
use crate::tape::Gradients;

/// A validated step, ready to send: the launches that go before it in
/// its batch (state fills, gathered gradients), the step, its state, the
/// step count before it, and the work that made its gradients (if any of
/// it failed, the device runs none of the batch).
#[derive(Clone, Debug)]
pub(super) struct PreparedStep {
    pub(super) before: Vec<KernelLaunch>,
    pub(super) requires: Vec<FailureToken>,
    pub(super) step: OptimizerStep,
    pub(super) state: Vec<Buffer>,
    pub(super) steps: u64,
    pub(super) device_amp: Option<ScaleRule>,
}

/// Where a step's gradients come from.
pub(super) enum GradientSource {
    /// The staging buffer, as the latest backward left it.
    Staged,
    /// Gradients handed over by `Gradients::from_host`, one buffer per
    /// slot: copied into the staging buffer on the device first, once the
    /// tape's launches behind the tokens succeeded.
    Gather(Vec<Buffer>, Vec<FailureToken>),
}

impl DeviceParamStore {
    /// One SGD step (every option of [`SgdConfig`]: momentum, dampening,
    /// Nesterov, weight decay, maximize) of every parameter, from
    /// `gradients`: those of the latest [`backward`](Self::backward) (taken
    /// from the staging buffer) or handed over by `Gradients::from_host`
    /// for the pending forward's tape. Consumes the pending forward;
    /// returns once the step is queued.
    ///
    /// Everything is validated before any device work, and a refusal
    /// changes nothing (the pending forward is kept): no pending forward,
    /// gradients of an earlier backward or of another store, or an invalid
    /// config are `InvalidArgument` (naming the field), gradients of
    /// another tape `TapeMismatch`, a slot without a gradient
    /// `MissingGradient`. A failure of the queued step reaches the next
    /// call and latches the store. A launch of the gradients' tape that the
    /// device refused as transient refuses the step in the same way as a
    /// transient refusal of the step itself (put back, answered once):
    /// record the forward and backward again.
    pub fn step(
        &mut self,
        gradients: &Gradients<'_>,
        config: &SgdConfig,
    ) -> Result<(), BackendError> {
        self.run_step(OptimizerConfig::Sgd(config.clone()), gradients)
            .map(|_| ())
    }

    /// Validates, then queues a step of `config`; the token of its launch.
    /// A LAMB step waits for its kernel, which refuses non-finite moments
    /// or norms: that refusal changes nothing and never poisons.
    pub(super) fn run_step(
        &mut self,
        config: OptimizerConfig,
        gradients: &Gradients<'_>,
    ) -> Result<FailureToken, BackendError> {
        let prepared = self.prepare_step(config, gradients)?;
        self.run_prepared(prepared)
    }

    /// Queues a prepared step; the token of its launch (see [`run_step`](Self::run_step)).
    pub(super) fn run_prepared(
        &mut self,
        mut prepared: PreparedStep,
    ) -> Result<FailureToken, BackendError> {
        refuse_device_count(&prepared)?;
        let lamb = matches!(prepared.step.args.config, OptimizerConfig::Lamb(_));
        // Moved out: what is committed below needs neither.
        let sent = self.send_step(
            prepared.step.clone(),
            std::mem::take(&mut prepared.before),
            std::mem::take(&mut prepared.requires),
        );
        let token = sent?;
        self.commit(token.clone(), &prepared, prepared.steps + 1);
        if lamb {
            self.settle_refusable(&token)?;
        }
        Ok(token)
    }

    /// Every check of a step, then its state (allocated on a first step)
    /// and launches: nothing is sent.
    pub(super) fn prepare_step(
        &mut self,
        config: OptimizerConfig,
        gradients: &Gradients<'_>,
    ) -> Result<PreparedStep, BackendError> {
        self.enter_mut()?;
        let source = self.gradient_source(gradients)?;
        self.prepare_from(config, source)
    }

    /// [`prepare_step`](Self::prepare_step) once the gradients are checked.
    pub(super) fn prepare_from(
        &mut self,
        config: OptimizerConfig,
        source: GradientSource,
    ) -> Result<PreparedStep, BackendError> {
        self.check_config(&config)?;
        let mut before = Vec::new();
        let (state, steps, device_amp) = match self.state.optimizer() {
            Some(run) => (run.state.clone(), run.steps, run.device_amp),
            None => (self.allocate_state(&config, &mut before)?, 0, None),
        };
        let requires = match source {
            GradientSource::Staged => self
                .state
                .staged_gradients()
                .map(|staged| staged.made_by().to_vec())
                .unwrap_or_default(),
            GradientSource::Gather(buffers, requires) => {
                for (buffer, layout) in buffers.iter().zip(self.layout.slots()) {
                    let (offset, size) = layout.bytes();
                    let target = self.staging.range(offset, size);
                    before.push(KernelLaunch::identity(buffer.whole(), target));
                }
                requires
            }
        };
        let step = OptimizerStep::new(
            config,
            steps + 1,
            self.segments.clone(),
            self.params.whole(),
            self.staging.whole(),
            state.iter().map(Buffer::whole).collect(),
        );
        Ok(PreparedStep {
            before,
            requires,
            step,
            state,
            steps,
            device_amp,
        })
    }

    /// Waits for a queued step whose kernel may refuse it (`InvalidArgument`:
    /// nothing ran). A refusal puts back the store's state from before the
    /// step, clears the stream's latched error and is returned; any other
    /// failure latches the store.
    pub(super) fn settle_refusable(&mut self, token: &FailureToken) -> Result<(), BackendError> {
        let error = match token.wait() {
            Ok(()) => return Ok(()),
            Err(error) => BackendError::from(error),
        };
        if !matches!(error, BackendError::InvalidArgument(_)) && !error.is_transient() {
            return Err(self.state.fail(error));
        }
        self.state.put_back_latest();
        // The refusal is latched on the stream too; this sync answers and
        // clears it, so the next wait does not mistake it for a fault.
        let _ = self.client.sync(self.stream.id);
        Err(error)
    }

    /// The gradients' checks: tape, store and serial, then every slot.
    fn gradient_source(&self, gradients: &Gradients<'_>) -> Result<GradientSource, BackendError> {
        self.check_tape_device(gradients.tape())?;
        let pending = self.state.pending_forward().ok_or_else(|| {
            BackendError::InvalidArgument(
                "a step needs a registered forward and its backward".into(),
            )
        })?;
        if gradients.tape_id() != pending.tape() {
            return Err(BackendError::TapeMismatch);
        }
        let Some(tag) = gradients.staging() else {
            return self.gathered(gradients, pending.leaves());
        };
        if tag.store != self.id {
            return Err(BackendError::InvalidArgument(
                "the gradients were staged by another parameter store".into(),
            ));
        }
        let staged = self
            .state
            .staged_gradients()
            .filter(|staged| staged.serial() == tag.serial)
            .ok_or_else(|| {
                BackendError::InvalidArgument(format!(
                    "the gradients are of backward {}; the latest is {}",
                    tag.serial,
                    self.state.backward_serial()
                ))
            })?;
        match staged.filled().iter().position(|&filled| !filled) {
            Some(slot) => Err(self.missing(slot)),
            None => Ok(GradientSource::Staged),
        }
    }

    /// Host-made gradients: one per slot, each as long as its slot.
    fn gathered(
        &self,
        gradients: &Gradients<'_>,
        leaves: &[usize],
    ) -> Result<GradientSource, BackendError> {
        let mut buffers = Vec::with_capacity(leaves.len());
        for (slot, layout) in self.layout.slots().iter().enumerate() {
            let buffer = leaves
                .get(slot)
                .and_then(|&leaf| gradients.buffer_at(leaf))
                .filter(|buffer| buffer.size() == layout.bytes().1)
                .ok_or_else(|| self.missing(slot))?;
            buffers.push(buffer.clone());
        }
        let requires = gradients
            .tape()
            .unsettled_launches()
            .map_err(|error| self.state.fail(BackendError::from(error)))?;
        Ok(GradientSource::Gather(buffers, requires))
    }

    pub(super) fn missing(&self, slot: usize) -> BackendError {
        let shape = self.layout.slot(slot).map(|slot| slot.shape.clone());
        BackendError::MissingGradient(format!(
            "slot {slot} (shape {:?}): the backward did not reach it",
            shape.unwrap_or_default()
        ))
    }

    /// The config's own checks, then the store's: one family per store,
    /// and every hyper-parameter but `lr` fixed by the first step.
    pub(super) fn check_config(&self, config: &OptimizerConfig) -> Result<(), BackendError> {
        config
            .validate()
            .map_err(|error| BackendError::from(optimizer_error("step", error)))?;
        let Some(run) = self.state.optimizer() else {
            return Ok(());
        };
        if std::mem::discriminant(&run.config) != std::mem::discriminant(config) {
            return Err(BackendError::InvalidArgument(format!(
                "this store steps with {}; a {} step is refused (one family per store)",
                family(&run.config),
                family(config)
            )));
        }
        match changed_field(&run.config, config) {
            Some(field) => Err(BackendError::InvalidArgument(format!(
                "step `{field}`: fixed by the first step (only `lr` may change)"
            ))),
            None => Ok(()),
        }
    }

    /// Sends the step: alone as the optimizer command, or after `before`
    /// in one batch (checked as a whole before any of it runs), which runs
    /// only if none of the work behind `requires` failed.
    pub(super) fn send_step(
        &self,
        step: OptimizerStep,
        mut before: Vec<KernelLaunch>,
        requires: Vec<FailureToken>,
    ) -> Result<FailureToken, BackendError> {
        let stream = self.stream.id;
        let sent = if before.is_empty() && requires.is_empty() {
            self.client.optimizer_step(stream, step)
        } else {
            before.push(step.into_launch());
            self.client.launch_batch_requiring(stream, before, requires)
        };
        sent.map_err(|error| self.state.fail(BackendError::from(error)))
    }

    /// Records a queued step: the pending forward and staged gradients are
    /// consumed and the step count becomes `steps` (put back if the device
    /// refuses the step as transient; any other failure latches the store).
    pub(super) fn commit(&mut self, token: FailureToken, prepared: &PreparedStep, steps: u64) {
        let run = OptimizerRun {
            config: prepared.step.args.config.clone(),
            state: prepared.state.clone(),
            steps,
            device_amp: prepared.device_amp,
        };
        self.state.commit_step(token, run);
    }

    /// The state buffers of `config` from the pools, and the fills that
    /// set their initial values (queued with the step). A failed
    /// reservation is returned; nothing is kept.
    pub(super) fn allocate_state(
        &self,
        config: &OptimizerConfig,
        launches: &mut Vec<KernelLaunch>,
    ) -> Result<Vec<Buffer>, BackendError> {
        let mut state = Vec::new();
        for buffer in config.state_layout().buffers {
            let reserved = self.client.reserve_with(
                self.layout.bytes(),
                AllocationPolicy::Allow,
                self.stream.id,
            );
            let reserved = reserved.map_err(|error| self.state.fail(BackendError::from(error)))?;
            launches.push(KernelLaunch::fill(
                reserved.whole(),
                buffer.initial_value as f32,
            ));
            state.push(reserved);
        }
        Ok(state)
    }
}

/// Refuses a step that counts on the host once the count is on the device
/// (an AMP step with no synchronisation ran): the host no longer knows it.
pub(super) fn refuse_device_count(prepared: &PreparedStep) -> Result<(), BackendError> {
    match prepared.device_amp {
        None => Ok(()),
        Some(_) => Err(BackendError::InvalidArgument(
            "this store's step count is on the device (an AMP step with no \
             synchronisation ran): step it with the `*_amp_on_device` calls"
                .into(),
        )),
    }
}

/// The family's name, as PyTorch spells the optimizer.
fn family(config: &OptimizerConfig) -> &'static str {
    match config {
        OptimizerConfig::Sgd(_) => "SGD",
        OptimizerConfig::Adam(_) => "Adam",
        OptimizerConfig::AdamW(_) => "AdamW",
        OptimizerConfig::RmsProp(_) => "RMSprop",
        OptimizerConfig::Adagrad(_) => "Adagrad",
        OptimizerConfig::Lamb(_) => "LAMB",
    }
}

/// The first hyper-parameter other than `lr` that differs between two
/// configs of one family (compared field by field through their serde form).
fn changed_field(old: &OptimizerConfig, new: &OptimizerConfig) -> Option<String> {
    let fields = |config: &OptimizerConfig| match serde_json::to_value(config) {
        Ok(serde_json::Value::Object(outer)) => outer
            .into_iter()
            .next()
            .and_then(|(_, inner)| inner.as_object().cloned()),
        _ => None,
    };
    let (old, new) = (fields(old)?, fields(new)?);
    old.iter()
        .filter(|(name, _)| name.as_str() != "lr")
        .find(|(name, value)| new.get(name.as_str()) != Some(value))
        .map(|(name, _)| name.clone())
}

//! Mixed-precision steps: the gradients are unscaled on the device, which
//! sets a found-inf flag; the step kernel skips itself when the flag is
//! set. The synchronising form reads the flag's four bytes and updates the
//! host `GradScaler` from it; the form with no synchronisation keeps the
//! scale, growth tracker, skip count and step count on the device and
//! updates them there.

use cistern_optim::{AdamConfig, AdamWConfig, GradScaler, OptimizerConfig, SgdConfig};
use cistern_runtime::{AllocationPolicy, KernelLaunch, ScaleRule};

use super::device_check::Backoff;
use super::state::latches;
use super::step::{PreparedStep, refuse_device_count};
use super::store::DeviceParamStore;
use crate::compute::Buffer;
use crate::error::{AutodiffError, BackendError};
use crate::tape::Gradients;

impl DeviceParamStore {
    /// One SGD step of gradients scaled by `scaler`'s scale: unscaled on
    /// the device, skipped there if any is non-finite. Returns `Ok(true)`
    /// when skipped: the parameters and optimizer state are untouched, the
    /// pending forward is consumed, the step count does not advance and the
    /// scaler backs off; otherwise its growth tracker advances (PyTorch's
    /// `_amp_update_scale_`). One sync: the 4-byte flag read, retried once
    /// after a failed transfer and for up to 2 s while another client
    /// captures. A device failure, or a flag read that still fails, is
    /// returned (latching the store: the queued step's outcome is unknown)
    /// and leaves the scaler as it was; a backoff that would make the scale 0 or subnormal is
    /// `InvalidArgument` after the (skipped) step, the scaler unchanged.
    pub fn step_amp(
        &mut self,
        gradients: &Gradients<'_>,
        config: &SgdConfig,
        scaler: &mut GradScaler,
    ) -> Result<bool, AutodiffError> {
        self.run_amp_step(OptimizerConfig::Sgd(config.clone()), gradients, scaler)
    }

    /// [`step_amp`](Self::step_amp) for Adam.
    pub fn step_adam_amp(
        &mut self,
        gradients: &Gradients<'_>,
        config: &AdamConfig,
        scaler: &mut GradScaler,
    ) -> Result<bool, AutodiffError> {
        self.run_amp_step(OptimizerConfig::Adam(config.clone()), gradients, scaler)
    }

    /// [`step_amp`](Self::step_amp) for AdamW.
    pub fn step_adamw_amp(
        &mut self,
        gradients: &Gradients<'_>,
        config: &AdamWConfig,
        scaler: &mut GradScaler,
    ) -> Result<bool, AutodiffError> {
        self.run_amp_step(OptimizerConfig::AdamW(config.clone()), gradients, scaler)
    }

    fn run_amp_step(
        &mut self,
        config: OptimizerConfig,
        gradients: &Gradients<'_>,
        scaler: &mut GradScaler,
    ) -> Result<bool, AutodiffError> {
        let prepared = self.prepare_step(config, gradients)?;
        self.run_prepared_amp(prepared, scaler)
    }

    /// Queues a prepared AMP step and reads its flag (see [`step_amp`](Self::step_amp)).
    pub(super) fn run_prepared_amp(
        &mut self,
        mut prepared: PreparedStep,
        scaler: &mut GradScaler,
    ) -> Result<bool, AutodiffError> {
        refuse_device_count(&prepared)?;
        let flag = self.reserved_amp_words()?;
        let word = flag.range(FLAG, 4);
        prepared.before.push(KernelLaunch::fill(word, 0.0));
        prepared.before.push(KernelLaunch::amp_unscale(
            self.staging.whole(),
            scaler.inv_scale(),
            word,
        ));
        let step = prepared.step.clone().with_found_inf(word);
        let (before, requires) = (
            std::mem::take(&mut prepared.before),
            std::mem::take(&mut prepared.requires),
        );
        let token = self.send_step(step, before, requires)?;
        self.commit(token, &prepared, prepared.steps + 1);
        let skipped = self.read_flag_of_queued_step(&flag)?;
        if skipped {
            self.state.recount_latest_step(prepared.steps);
        }
        scaler
            .update(skipped)
            .map_err(|error| AutodiffError::InvalidArgument(error.to_string()))?;
        Ok(skipped)
    }

    /// The found-inf flag of a step already queued. Its value decides the
    /// step count and the scaler's update, so an error here must not look
    /// like a refusal that changed nothing: a read refused by a transient
    /// state (another client's capture) is retried for up to 2 s, an
    /// operation-local failure (a transfer) once, and any failure after
    /// that latches the store, unless the step itself was refused as
    /// transient (it changed nothing and is put back).
    fn read_flag_of_queued_step(&self, flag: &Buffer) -> Result<bool, BackendError> {
        let mut backoff = Backoff::new();
        let mut transfer_retried = false;
        let read = loop {
            let read = self.client.read_found_inf(self.stream.id, flag);
            let Err(error) = &read else { break read };
            let error = BackendError::from(error.clone());
            if error.is_transient() {
                if !self.state.work_refused_transiently() && backoff.wait() {
                    continue;
                }
            } else if !latches(&error) && !transfer_retried {
                transfer_retried = true;
                continue;
            }
            break read;
        };
        self.after_wait(read).map_err(|error| {
            let refused = error.is_transient() && self.state.work_refused_transiently();
            if self.state.is_poisoned() || refused {
                error
            } else {
                self.state.latch(error)
            }
        })
    }

    /// The store's AMP words (the found-inf flag, then the device form's
    /// scale, growth tracker, skip count and step count), reserved on
    /// first use.
    pub(super) fn reserved_amp_words(&mut self) -> Result<Buffer, BackendError> {
        if let Some(words) = self.state.amp_words() {
            return Ok(words.clone());
        }
        let reserved = self
            .client
            .reserve_with(AMP_WORDS * 4, AllocationPolicy::Allow, self.stream.id)
            .map_err(|error| self.state.fail(BackendError::from(error)))?;
        self.state.keep_amp_words(reserved.clone());
        Ok(reserved)
    }
}

/// Byte offsets of the store's AMP words.
const FLAG: u64 = 0;
const SCALE: u64 = 4;
const TRACKER: u64 = 8;
const SKIPPED: u64 = 12;
const COUNT: u64 = 16;
/// `f32` words: the flag, the scale, the tracker, the skips, the count.
const AMP_WORDS: u64 = 5;

/// What the device form of AMP keeps on the device, as read by
/// [`DeviceParamStore::device_amp_state`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceAmpState {
    /// The loss scale for the next step.
    pub scale: f32,
    /// Clean steps since the scale last changed (`GradScaler::growth_tracker`).
    pub growth_tracker: u32,
    /// Steps skipped for non-finite gradients by the device form.
    pub skipped: u32,
    /// Steps applied, the synchronising ones before the first device-form step included.
    pub steps: u32,
}

impl DeviceParamStore {
    /// [`step_amp`](Self::step_amp) with no synchronisation: the loss
    /// scale, growth tracker, skip count and step count stay on the
    /// device, updated there after the step (`_amp_update_scale_`), and
    /// the call returns once queued, without reading the flag. The first
    /// such step seeds them from `scaler` (its scale and tracker) and the
    /// store's step count; later ones take only `scaler`'s rule, which must
    /// not change (`InvalidArgument`). Read them with
    /// [`device_amp_state`](Self::device_amp_state). From then on the
    /// store's count is on the device: plain and synchronising steps are
    /// `InvalidArgument`. A backoff that would make the scale 0 or
    /// subnormal keeps the scale. The results are those of `step_amp`, bit
    /// for bit.
    pub fn step_amp_on_device(
        &mut self,
        gradients: &Gradients<'_>,
        config: &SgdConfig,
        scaler: &GradScaler,
    ) -> Result<(), BackendError> {
        self.run_amp_on_device(OptimizerConfig::Sgd(config.clone()), gradients, scaler)
    }

    /// [`step_amp_on_device`](Self::step_amp_on_device) for Adam.
    pub fn step_adam_amp_on_device(
        &mut self,
        gradients: &Gradients<'_>,
        config: &AdamConfig,
        scaler: &GradScaler,
    ) -> Result<(), BackendError> {
        self.run_amp_on_device(OptimizerConfig::Adam(config.clone()), gradients, scaler)
    }

    /// [`step_amp_on_device`](Self::step_amp_on_device) for AdamW.
    pub fn step_adamw_amp_on_device(
        &mut self,
        gradients: &Gradients<'_>,
        config: &AdamWConfig,
        scaler: &GradScaler,
    ) -> Result<(), BackendError> {
        self.run_amp_on_device(OptimizerConfig::AdamW(config.clone()), gradients, scaler)
    }

    /// The device form's scale, tracker, skips and step count, in one
    /// 16-byte read (a sync of the store's stream); `None` before its first
    /// step. A failed step or read is returned and latches the store.
    pub fn device_amp_state(&self) -> Result<Option<DeviceAmpState>, BackendError> {
        self.enter()?;
        let seeded = self.state.optimizer().and_then(|run| run.device_amp);
        let (Some(_), Some(words)) = (seeded, self.state.amp_words()) else {
            return Ok(None);
        };
        let read = self.client.read_on(self.stream.id, words, SCALE, 16);
        let bytes = self.after_wait(read)?;
        let word = |at: usize| -> Result<[u8; 4], BackendError> {
            bytes
                .get(at..at + 4)
                .and_then(|word| word.try_into().ok())
                .ok_or_else(|| {
                    BackendError::InvalidArgument(format!(
                        "the AMP words read {} bytes, expected 16",
                        bytes.len()
                    ))
                })
        };
        Ok(Some(DeviceAmpState {
            scale: f32::from_ne_bytes(word(0)?),
            growth_tracker: u32::from_ne_bytes(word(4)?),
            skipped: u32::from_ne_bytes(word(8)?),
            steps: u32::from_ne_bytes(word(12)?),
        }))
    }

    fn run_amp_on_device(
        &mut self,
        config: OptimizerConfig,
        gradients: &Gradients<'_>,
        scaler: &GradScaler,
    ) -> Result<(), BackendError> {
        let mut prepared = self.prepare_step(config, gradients)?;
        let rule = scale_rule(scaler);
        match prepared.device_amp {
            Some(seeded) if seeded != rule => {
                return Err(BackendError::InvalidArgument(
                    "step_amp_on_device `scaler`: its growth, backoff and interval \
                     are fixed by the first step on the device"
                        .into(),
                ));
            }
            Some(_) => {}
            None => {
                let steps = u32::try_from(prepared.steps).map_err(|_| {
                    BackendError::InvalidArgument(format!(
                        "step_amp_on_device: {} steps do not fit the device's u32 count",
                        prepared.steps
                    ))
                })?;
                let words = self.reserved_amp_words()?;
                self.seed_amp_words(&words, scaler.scale(), scaler.growth_tracker(), 0, steps)?;
                prepared.device_amp = Some(rule);
            }
        }
        let words = self.reserved_amp_words()?;
        let at = |offset| words.range(offset, 4);
        let mut launches = std::mem::take(&mut prepared.before);
        launches.push(KernelLaunch::fill(at(FLAG), 0.0));
        launches.push(KernelLaunch::amp_unscale_by_device_scale(
            self.staging.whole(),
            at(FLAG),
            at(SCALE),
        ));
        let step = prepared.step.clone().with_found_inf(at(FLAG));
        launches.extend(step.into_counted_launch(at(COUNT)));
        launches.push(KernelLaunch::amp_update_scale(
            rule,
            at(FLAG),
            at(SCALE),
            at(TRACKER),
            at(SKIPPED),
        ));
        let requires = std::mem::take(&mut prepared.requires);
        let sent = self
            .client
            .launch_batch_requiring(self.stream.id, launches, requires);
        let token = sent.map_err(|error| self.state.fail(BackendError::from(error)))?;
        self.commit(token, &prepared, prepared.steps);
        Ok(())
    }

    /// Writes the device form's words: the scale, the tracker, the skips
    /// and the steps applied.
    pub(super) fn seed_amp_words(
        &self,
        words: &Buffer,
        scale: f32,
        tracker: u32,
        skipped: u32,
        steps: u32,
    ) -> Result<(), BackendError> {
        let mut bytes = Vec::with_capacity(16);
        bytes.extend(scale.to_ne_bytes());
        bytes.extend(tracker.to_ne_bytes());
        bytes.extend(skipped.to_ne_bytes());
        bytes.extend(steps.to_ne_bytes());
        self.client
            .write_on(self.stream.id, words, SCALE, &bytes)
            .map_err(|error| self.state.fail(BackendError::from(error)))
    }
}

/// `scaler`'s growth, backoff and interval, as the device applies them.
fn scale_rule(scaler: &GradScaler) -> ScaleRule {
    let config = scaler.config();
    ScaleRule {
        growth_factor: config.growth_factor,
        backoff_factor: config.backoff_factor,
        growth_interval: config.growth_interval,
    }
}

//! The staged gradients between a backward and its step, as a replica
//! group reduces them: read a range to the host, write the reduced values
//! back (as `f32`s, or as the bytes the device answered, with no copy),
//! then step from them with no `Gradients` in hand.

use std::ops::Range;
use std::sync::Arc;

use cistern_optim::{GradScaler, OptimizerConfig};
use cistern_runtime::first_failure;

use super::step::GradientSource;
use super::store::DeviceParamStore;
use crate::compute::bytes_f32;
use crate::error::{AutodiffError, BackendError};

impl DeviceParamStore {
    /// Each slot's range of `f32`s in the store's concatenated buffers (its
    /// parameters and its staged gradients), in registration order.
    pub fn slot_ranges(&self) -> Vec<Range<usize>> {
        self.layout
            .slots()
            .iter()
            .map(|slot| slot.offset..slot.offset + slot.numel)
            .collect()
    }

    /// The staged gradients of the latest backward in `floats` (a range of
    /// [`numel`](Self::numel)), once the kernels that write them ran: one
    /// download. Before a backward or after its step, or a range past the
    /// end, is `InvalidArgument`; a device failure latches the store.
    pub fn read_staged(&self, floats: Range<usize>) -> Result<Vec<f32>, BackendError> {
        Ok(bytes_f32(&self.read_staged_bytes(floats)?))
    }

    /// [`read_staged`](Self::read_staged) as the device answers it: the
    /// `f32`s' native-endian bytes, with no conversion pass on the host.
    /// A launch of the backward's tape that the device refused is the
    /// answer (the gradients are stale): transient ones, such as another
    /// client's capture, as they are; record the step again.
    pub fn read_staged_bytes(&self, floats: Range<usize>) -> Result<Vec<u8>, BackendError> {
        self.enter()?;
        self.check_staged_range(&floats)?;
        let (offset, size) = byte_span(&floats);
        let read = self
            .client
            .read_on(self.stream.id, &self.staging, offset, size);
        let bytes = self.after_wait(read)?;
        let made_by = self.state.staged_gradients().map(|staged| staged.made_by());
        match made_by.and_then(first_failure) {
            Some(error) => Err(self.state.fail(BackendError::from(error))),
            None => Ok(bytes),
        }
    }

    /// Overwrites the staged gradients from `start` with `values` (the
    /// group's reduced mean), queued on the store's stream before its step.
    /// The same refusals as [`read_staged`](Self::read_staged), changing
    /// nothing; a failed write latches the store.
    pub fn write_staged(&mut self, start: usize, values: &[f32]) -> Result<(), BackendError> {
        self.write_staged_bytes(start, &Arc::new(bytemuck::cast_slice(values).to_vec()))
    }

    /// [`write_staged`](Self::write_staged) of `f32`s given as their
    /// native-endian bytes, shared with the device with no copy on the host
    /// (a buffer from [`read_staged_bytes`](Self::read_staged_bytes) goes
    /// back as it is; one buffer may be written to several stores). A
    /// length that is not a whole number of `f32`s is `InvalidArgument`, as
    /// are the refusals of `write_staged`.
    pub fn write_staged_bytes(
        &mut self,
        start: usize,
        bytes: &Arc<Vec<u8>>,
    ) -> Result<(), BackendError> {
        self.enter_mut()?;
        if bytes.len() % 4 != 0 {
            return Err(BackendError::InvalidArgument(format!(
                "{} bytes are not a whole number of f32s",
                bytes.len()
            )));
        }
        let floats = start..start.saturating_add(bytes.len() / 4);
        self.check_staged_range(&floats)?;
        let (offset, _) = byte_span(&floats);
        let written =
            self.client
                .write_shared_on(self.stream.id, &self.staging, offset, Arc::clone(bytes));
        written.map_err(|error| self.state.fail(BackendError::from(error)))
    }

    /// One step of `config` (any family) from the staged gradients of the
    /// latest backward, as the family's own step would take them: the
    /// same checks and refusals, and nothing changed by a refusal. No
    /// backward since the last step is `InvalidArgument`; a slot the
    /// backward did not reach `MissingGradient`.
    pub fn step_staged(&mut self, config: &OptimizerConfig) -> Result<(), BackendError> {
        self.enter_mut()?;
        let source = self.staged_source()?;
        let prepared = self.prepare_from(config.clone(), source)?;
        self.run_prepared(prepared).map(|_| ())
    }

    /// [`step_staged`](Self::step_staged) for gradients scaled by
    /// `scaler`, as [`step_amp`](Self::step_amp): `Ok(true)` when skipped
    /// for a non-finite gradient. SGD, Adam and AdamW only; another family
    /// is `InvalidArgument`.
    pub fn step_staged_amp(
        &mut self,
        config: &OptimizerConfig,
        scaler: &mut GradScaler,
    ) -> Result<bool, AutodiffError> {
        if !matches!(
            config,
            OptimizerConfig::Sgd(_) | OptimizerConfig::Adam(_) | OptimizerConfig::AdamW(_)
        ) {
            return Err(AutodiffError::InvalidArgument(
                "an AMP step is SGD, Adam or AdamW".into(),
            ));
        }
        self.enter_mut()?;
        let source = self.staged_source()?;
        let prepared = self.prepare_from(config.clone(), source)?;
        self.run_prepared_amp(prepared, scaler)
    }

    /// The staged gradients as a step's source: a pending forward, its
    /// backward, every slot filled.
    fn staged_source(&self) -> Result<GradientSource, BackendError> {
        let staged = match (self.state.pending_forward(), self.state.staged_gradients()) {
            (Some(_), Some(staged)) => staged,
            _ => {
                return Err(BackendError::InvalidArgument(
                    "a step from the staged gradients needs a forward and its backward".into(),
                ));
            }
        };
        match staged.filled().iter().position(|&filled| !filled) {
            Some(slot) => Err(self.missing(slot)),
            None => Ok(GradientSource::Staged),
        }
    }

    fn check_staged_range(&self, floats: &Range<usize>) -> Result<(), BackendError> {
        if self.state.staged_gradients().is_none() {
            return Err(BackendError::InvalidArgument(
                "the staged gradients are readable and writable after backward and before the step"
                    .into(),
            ));
        }
        if floats.start > floats.end || floats.end > self.layout.numel() {
            return Err(BackendError::InvalidArgument(format!(
                "staged range {}..{} is outside the store's {} floats",
                floats.start,
                floats.end,
                self.layout.numel()
            )));
        }
        Ok(())
    }
}

/// The byte offset and length of a range of `f32`s.
fn byte_span(floats: &Range<usize>) -> (u64, u64) {
    (
        floats.start as u64 * 4,
        (floats.end - floats.start) as u64 * 4,
    )
}

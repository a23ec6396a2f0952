//! The store's backward: the tape's walk, with the registered parameters'
//! gradients written into the staging buffer (by the kernels that compute
//! them, or copied there), tagged with a serial.

use cistern_runtime::KernelLaunch;

use super::store::DeviceParamStore;
use crate::error::AutodiffError;
use crate::tape::{Gradients, Sinks, StagedBy, Tape, Var};

impl DeviceParamStore {
    /// The gradients of the scalar `loss` on `tape` (as
    /// [`Tape::backward`]), with every registered parameter's gradient also
    /// in the store's staging buffer, tagged with a new backward serial:
    /// the next [`step`](Self::step) takes them from there without an
    /// upload. Nothing waits for the device.
    ///
    /// A parameter used once (a layer's weight or bias) has its gradient
    /// written there by the kernel that computes it, with no copy and no
    /// buffer of its own: its entry in the returned [`Gradients`] is a view
    /// of the staging buffer, which the next backward through the store
    /// overwrites and an AMP step unscales in place. Read it before then.
    ///
    /// No pending forward is `InvalidArgument`; a tape other than the
    /// pending forward's `TapeMismatch`; a tape of another device
    /// `DeviceMismatch`. The tape's own errors are returned as the tape
    /// gives them. A parameter the loss does not reach gets no gradient
    /// (the step then answers `MissingGradient`). The step requires every
    /// launch of the tape: one the device refused (another client's
    /// capture) is this call's answer if already seen, else the step's.
    pub fn backward<'t>(
        &mut self,
        tape: &'t Tape,
        loss: &Var<'t>,
    ) -> Result<Gradients<'t>, AutodiffError> {
        self.enter_mut()?;
        self.check_tape_device(tape)?;
        let leaves = self.state.begin_backward(tape.id())?;
        let views = leaves.iter().enumerate().filter_map(|(slot, &leaf)| {
            let (offset, size) = self.layout.slot(slot)?.bytes();
            Some((leaf, self.staging.view(offset, size)?))
        });
        let mut sinks = Sinks::new(views);
        let gradients = tape
            .backward_walk(loss, true, &mut sinks)
            .map_err(|error| self.fail_autodiff(error))?;
        let serial = self.state.new_backward_serial();
        let mut filled = vec![false; leaves.len()];
        for (slot, &leaf) in leaves.iter().enumerate() {
            let (Some(gradient), Some(layout)) =
                (gradients.buffer_at(leaf), self.layout.slot(slot))
            else {
                continue;
            };
            let token = match sinks.written(leaf) {
                Some(token) => token.clone(),
                None => {
                    let (offset, size) = layout.bytes();
                    let target = self.staging.range(offset, size);
                    tape.launch(KernelLaunch::identity(gradient.whole(), target))
                        .map_err(|error| self.fail_autodiff(error))?
                }
            };
            self.state.queue_staging(token, serial);
            filled[slot] = true;
        }
        let made_by = tape
            .unsettled_launches()
            .map_err(|error| self.fail_autodiff(error))?;
        self.state.stage_backward(serial, filled, made_by);
        Ok(gradients.staged_by(StagedBy {
            store: self.id,
            serial,
        }))
    }

    /// A tape error met by a store call, latching the store when it is
    /// device-level.
    fn fail_autodiff(&self, error: AutodiffError) -> AutodiffError {
        match error {
            AutodiffError::Backend(error) => AutodiffError::Backend(self.state.fail(error)),
            other => other,
        }
    }
}

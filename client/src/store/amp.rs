//! Mixed-precision steps: the gradients are unscaled on the device, which
//! sets a found-inf flag; the step kernel skips itself when the flag is
//! set; the flag's four bytes are the step's one read, and the host
//! `GradScaler` is updated from it.

use cistern_optim::{AdamConfig, AdamWConfig, GradScaler, OptimizerConfig, SgdConfig};
use cistern_runtime::{AllocationPolicy, KernelLaunch};

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
    /// `_amp_update_scale_`). One sync: the 4-byte flag read. A device
    /// failure is returned (latching the store) and leaves the scaler as it
    /// was; a backoff that would make the scale 0 or subnormal is
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
        let mut prepared = self.prepare_step(config, gradients)?;
        let flag = self.found_inf_flag()?;
        prepared.before.push(KernelLaunch::fill(flag.whole(), 0.0));
        prepared.before.push(KernelLaunch::amp_unscale(
            self.staging.whole(),
            scaler.inv_scale(),
            flag.whole(),
        ));
        let step = prepared.step.clone().with_found_inf(flag.whole());
        let token = self.send_step(step, prepared.before.clone())?;
        self.commit(token, &prepared, prepared.steps + 1);
        let read = self.client.read_found_inf(self.stream.id, &flag);
        let skipped = self.after_wait(read)?;
        if skipped {
            self.recount(prepared.steps);
        }
        scaler
            .update(skipped)
            .map_err(|error| AutodiffError::InvalidArgument(error.to_string()))?;
        Ok(skipped)
    }

    /// The store's found-inf flag (one `f32`), reserved on first use.
    fn found_inf_flag(&mut self) -> Result<Buffer, BackendError> {
        if let Some(flag) = &self.found_inf {
            return Ok(flag.clone());
        }
        let reserved = self
            .client
            .reserve_with(4, AllocationPolicy::Allow, self.stream.id)
            .map_err(|error| self.fail(BackendError::from(error)))?;
        self.found_inf = Some(reserved.clone());
        Ok(reserved)
    }
}

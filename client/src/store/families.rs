//! One step method per optimizer family besides SGD (`step.rs`). The first
//! step fixes the family and every hyper-parameter but `lr`.

use cistern_optim::{
    AdagradConfig, AdamConfig, AdamWConfig, LambConfig, OptimizerConfig, RmsPropConfig,
};

use super::store::DeviceParamStore;
use crate::error::BackendError;
use crate::tape::Gradients;

impl DeviceParamStore {
    /// One Adam step (`torch.optim.Adam`, every option), as
    /// [`step`](Self::step) does SGD: the same checks, the same refusals.
    /// The first step allocates the moments from the pools; a failed
    /// allocation is returned and changes nothing.
    pub fn step_adam(
        &mut self,
        gradients: &Gradients<'_>,
        config: &AdamConfig,
    ) -> Result<(), BackendError> {
        self.run_step(OptimizerConfig::Adam(config.clone()), gradients)
            .map(|_| ())
    }

    /// One AdamW step (`torch.optim.AdamW`), as [`step_adam`](Self::step_adam).
    pub fn step_adamw(
        &mut self,
        gradients: &Gradients<'_>,
        config: &AdamWConfig,
    ) -> Result<(), BackendError> {
        self.run_step(OptimizerConfig::AdamW(config.clone()), gradients)
            .map(|_| ())
    }

    /// One RMSprop step (`torch.optim.RMSprop`), as [`step_adam`](Self::step_adam).
    pub fn step_rmsprop(
        &mut self,
        gradients: &Gradients<'_>,
        config: &RmsPropConfig,
    ) -> Result<(), BackendError> {
        self.run_step(OptimizerConfig::RmsProp(config.clone()), gradients)
            .map(|_| ())
    }

    /// One Adagrad step (`torch.optim.Adagrad`), as
    /// [`step_adam`](Self::step_adam); its accumulator starts at
    /// `initial_accumulator_value`.
    pub fn step_adagrad(
        &mut self,
        gradients: &Gradients<'_>,
        config: &AdagradConfig,
    ) -> Result<(), BackendError> {
        self.run_step(OptimizerConfig::Adagrad(config.clone()), gradients)
            .map(|_| ())
    }

    /// One LAMB step (apex `FusedLAMB`), with one trust ratio per slot.
    /// It waits for its kernel: non-finite moments or norms are
    /// `InvalidArgument`, change nothing, never poison, put back the
    /// pending forward and commit no step count.
    pub fn step_lamb(
        &mut self,
        gradients: &Gradients<'_>,
        config: &LambConfig,
    ) -> Result<(), BackendError> {
        self.run_step(OptimizerConfig::Lamb(config.clone()), gradients)
            .map(|_| ())
    }
}

//! One optimizer step as a launch: its arguments and its bindings.
//!
//! A step is one kernel: [`OptimizerStep::into_launch`] turns it into a
//! [`KernelLaunch`] of [`Kernel::OptimizerStep`], so it is checked, queued,
//! tracked and reported exactly as every other launch.

use cistern_optim::OptimizerConfig;
use serde::{Deserialize, Serialize};

use super::{Binding, Kernel, KernelLaunch};
use crate::optimizer::{OptimizerArgs, SegmentTable};

/// One optimizer step: `params` updated in place from `grads` (the store's
/// gradient staging buffer or any other), the `state` buffers in
/// [`cistern_optim::StateLayout`] order, each binding as long as `params`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptimizerStep {
    /// Config, step count, segments.
    pub args: OptimizerArgs,
    /// The parameters, written.
    pub params: Binding,
    /// The gradients, read.
    pub grads: Binding,
    /// The state buffers, written.
    pub state: Vec<Binding>,
    /// The AMP found-inf flag (one `f32`), read.
    pub found_inf: Option<Binding>,
}

impl OptimizerStep {
    /// Step `step` of `config` over `segments`, without AMP.
    pub fn new(
        config: OptimizerConfig,
        step: u64,
        segments: impl Into<SegmentTable>,
        params: Binding,
        grads: Binding,
        state: Vec<Binding>,
    ) -> Self {
        OptimizerStep {
            args: OptimizerArgs {
                config,
                step,
                segments: segments.into(),
                found_inf: false,
            },
            params,
            grads,
            state,
            found_inf: None,
        }
    }

    /// The same step, skipped on the device when `found_inf` (written by
    /// [`KernelLaunch::amp_unscale`]) is set.
    pub fn with_found_inf(mut self, found_inf: Binding) -> Self {
        self.args.found_inf = true;
        self.found_inf = Some(found_inf);
        self
    }

    /// The step as one kernel launch.
    pub fn into_launch(self) -> KernelLaunch {
        let mut bindings = Vec::with_capacity(3 + self.state.len());
        bindings.push(self.params);
        bindings.push(self.grads);
        bindings.extend(self.found_inf);
        bindings.extend(self.state);
        KernelLaunch::new(Kernel::OptimizerStep(Box::new(self.args)), bindings)
    }

    /// The step as one launch of [`Kernel::OptimizerStepCounted`]: its
    /// count read from and advanced in `count` (one `u32`), skipped on
    /// `found_inf`. `None` when the step has no found-inf flag.
    pub fn into_counted_launch(self, count: Binding) -> Option<KernelLaunch> {
        let found_inf = self.found_inf?;
        let mut bindings = Vec::with_capacity(4 + self.state.len());
        bindings.extend([self.params, self.grads, found_inf, count]);
        bindings.extend(self.state);
        let kernel = Kernel::OptimizerStepCounted(Box::new(self.args));
        Some(KernelLaunch::new(kernel, bindings))
    }
}

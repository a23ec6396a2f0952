//! The optimizer-step command's values: one fused step of any optimizer
//! family over a concatenated parameter buffer, its state living in device
//! buffers like any other allocation.
//!
//! A step is one kernel: [`OptimizerStep::into_launch`] turns it into a
//! [`KernelLaunch`] of [`Kernel::OptimizerStep`], so it is checked, queued,
//! tracked and reported exactly as every other launch.

use std::ops::Deref;
use std::sync::Arc;

use cistern_kernels::{KernelId, Segment};
use cistern_optim::{OptimError, OptimizerConfig};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ServerError;
use crate::kernel::{Binding, Kernel, KernelLaunch};

/// A segment table, shared rather than copied as a launch travels from the
/// client through the server to an executor.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SegmentTable(Arc<[Segment]>);

impl SegmentTable {
    /// The table of `segments`.
    pub fn new(segments: impl Into<Arc<[Segment]>>) -> Self {
        SegmentTable(segments.into())
    }
}

impl Deref for SegmentTable {
    type Target = [Segment];

    fn deref(&self) -> &[Segment] {
        &self.0
    }
}

impl From<Vec<Segment>> for SegmentTable {
    fn from(segments: Vec<Segment>) -> Self {
        SegmentTable(segments.into())
    }
}

impl From<&[Segment]> for SegmentTable {
    fn from(segments: &[Segment]) -> Self {
        SegmentTable(segments.into())
    }
}

impl Serialize for SegmentTable {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.as_ref().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for SegmentTable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<Segment>::deserialize(deserializer).map(SegmentTable::from)
    }
}

/// The arguments of [`Kernel::OptimizerStep`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptimizerArgs {
    /// Which optimizer, with its hyper-parameters (validated by the server).
    pub config: OptimizerConfig,
    /// The step count, from 1 (PyTorch's `state['step']` after its increment).
    pub step: u64,
    /// One segment per parameter tensor, in elements of the parameter buffer.
    pub segments: SegmentTable,
    /// Whether a found-inf flag is bound: a set flag makes the step change nothing.
    pub found_inf: bool,
}

impl OptimizerArgs {
    /// The catalogue entry of this config's step kernel.
    pub fn kernel_id(&self) -> KernelId {
        match self.config {
            OptimizerConfig::Sgd(_) => KernelId::SgdStep,
            OptimizerConfig::Adam(_) => KernelId::AdamStep,
            OptimizerConfig::AdamW(_) => KernelId::AdamWStep,
            OptimizerConfig::RmsProp(_) => KernelId::RmsPropStep,
            OptimizerConfig::Adagrad(_) => KernelId::AdagradStep,
            OptimizerConfig::Lamb(_) => KernelId::LambStep,
        }
    }
}

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

/// An optimizer error as the server reports it: `InvalidArgument` naming
/// `context` (a kernel, a call) and the field; a loss scale out of range
/// names `scale`. Fix the call; never retry it unchanged.
pub fn optimizer_error(context: &str, error: OptimError) -> ServerError {
    let message = match error {
        OptimError::InvalidArgument { field, reason } => format!("{context} `{field}`: {reason}"),
        OptimError::ScaleOutOfRange { scale, reason } => {
            format!("{context} `scale`: would become {scale}: {reason}")
        }
    };
    ServerError::InvalidArgument { message }
}

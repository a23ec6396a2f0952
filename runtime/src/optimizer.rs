//! The optimizer-step kernel's arguments: one fused step of any optimizer
//! family over a concatenated parameter buffer, its state living in device
//! buffers like any other allocation. (The launch that carries them,
//! `OptimizerStep`, is `kernel/optimizer_step.rs`'s.)

use std::ops::Deref;
use std::sync::Arc;

use cistern_kernels::{KernelId, Segment};
use cistern_optim::{OptimError, OptimizerConfig};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::ServerError;

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

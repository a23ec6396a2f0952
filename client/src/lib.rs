//! Cistern's client side: `ComputeClient` and its handles, the training
//! tape (`Tape`, `Var`, `Gradients`), the parameter store
//! (`DeviceParamStore`), `BackendError`, `AutodiffError`, and
//! `ErrorReport` with its JSON and bincode codecs.
//!
//! Depends on `cistern-runtime`, `cistern-memory` and `cistern-optim`; never
//! on the facade.

pub mod codec;
mod compact;
mod compute;
mod error;
mod report;
mod shape;
mod store;
mod tape;

pub use cistern_memory::ErrorCode;
pub use cistern_runtime::Reduction;
pub use codec::CodecError;
pub use compact::{COMPACT_LAYOUT, CompactReport};
pub use compute::{
    Buffer, CaptureGuard, CaptureToken, ComputeClient, Event, Graph, OptimizerState,
};
pub use error::{AutodiffError, BackendError};
pub use report::{ErrorReport, ReportedError};
pub use shape::ShapeError;
pub use store::{
    BatchInput, ChainLayer, ChainLoss, DatasetLoss, DatasetTargets, DeviceAmpCheckpoint,
    DeviceAmpState, DeviceParamStore, GraphInput, OptimizerCheckpoint, ResidentDataset,
    ResidentInput, ResidentLeaf, StepGraph, StoreCheckpoint, TrainStepLoss, argmax_rows,
};
pub use store::{
    CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_VERSION, CheckpointContents, CheckpointDir,
    CheckpointError, ResumePoint, read_checkpoint, write_checkpoint,
};
pub use tape::{
    BceWithLogitsOptions, ClassTargets, CrossEntropyOptions, DimIndices, Gradient, Gradients,
    NllLossOptions, Tape, TapeId, Tensor, Var, WeightLayout,
};

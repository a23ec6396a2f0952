//! `DeviceParamStore`: a training program's parameters, resident on the
//! device in one buffer, updated in place, and refused once a device
//! failure may have left them half-updated. `docs/param-store.md` has the
//! design.

// From the ground up: data and device checks; the state; the store;
// its entry checks; then the calls.
mod chain_plan;
mod convert;
mod device_check;
mod layout;
mod work;

mod state;

#[allow(clippy::module_inception)]
mod store;

mod entry;

mod amp;
mod backward;
mod chain;
mod chain_step;
mod checkpoint;
mod checkpoint_dir;
mod checkpoint_file;
mod dataset;
mod families;
mod forward;
mod readers;
mod staged;
mod step;
mod step_graph;

pub use amp::DeviceAmpState;
pub use chain::{ChainLayer, ResidentInput, argmax_rows};
pub use chain_step::{ChainLoss, TrainStepLoss};
pub use checkpoint::{DeviceAmpCheckpoint, OptimizerCheckpoint, StoreCheckpoint};
pub use checkpoint_dir::{CheckpointDir, ResumePoint};
pub use checkpoint_file::{
    CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_VERSION, CheckpointContents, CheckpointError,
    read_checkpoint, write_checkpoint,
};
pub use dataset::{DatasetLoss, DatasetTargets, ResidentDataset};
pub use forward::ResidentLeaf;
pub use step_graph::{BatchInput, GraphInput, StepGraph};
pub use store::DeviceParamStore;

//! Cistern's device server: one thread per device owning its backend, memory
//! manager, streams and context state, and the commands clients send it.
//!
//! Depends on `cistern-memory`, `cistern-kernels` and `cistern-optim`; never
//! on the client or the facade.

pub mod backend;
mod command;
mod context_state;
mod device;
mod error;
mod failure;
mod fault;
mod graph;
mod host;
mod ids;
mod inbox;
mod kernel;
mod oneshot;
mod optimizer;
mod server;
pub mod sync;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use cistern_kernels::{
    Activation, AttentionSpec, BatchedGemmSpec, BinaryOp, BroadcastSpec, ClassInput, ClassLossSpec,
    DropoutSpec, EmbeddingSpec, GatherSpec, GemmSpec, LayerNormSpec, MAX_RANK, MapOp, MapScalars,
    MaxDimSpec, Reduction, ScaleRule, Segment, SumSpec, check_targets,
};
pub use cistern_memory::{
    AllocationId, AllocationPolicy, ErrorCode, MemorySnapshot, MemoryStats, StreamId,
};
pub use cistern_optim::OptimizerConfig;
pub use command::{Command, CompactionReport, Reservation, ServerStats, StridedCopy};
pub use context_state::ContextState;
pub use device::{
    AbsentBackend, DEFAULT_DRAIN_TIMEOUT, DeviceOptions, absent_backends, list_devices,
};
pub use error::ServerError;
pub use failure::{FailureToken, PendingToken, first_failure};
pub use fault::{FaultPlan, ProbeFault, TrapRate};
pub use graph::{CaptureId, GraphInfo, GraphRef};
pub use host::host_memory_bytes;
pub use ids::{BufferRef, DEFAULT_STREAM, Device, DeviceInfo, EventId, Region, ServerId};
pub use kernel::{
    Access, AttentionPart, Binding, Contract, Kernel, KernelLaunch, OptimizerStep, ShapeRule,
};
pub use optimizer::{OptimizerArgs, SegmentTable, optimizer_error};
pub use server::{
    DeviceState, Flow, Health, PublishedState, ServerCore, ServerEnd, ServerHandle, next_server_id,
    open, spawn,
};

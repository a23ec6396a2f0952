//! Cistern's device server: one thread per device owning its backend, memory
//! manager, streams and context state, and the commands clients send it.
//!
//! Depends on `cistern-memory`, `cistern-kernels` and `cistern-optim`; never
//! on the client or the facade.

pub mod backend;
mod command;
mod device;
mod error;
mod failure;
mod fault;
mod graph;
mod inbox;
mod kernel;
mod oneshot;
mod optimizer;
mod server;
pub mod sync;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use cistern_kernels::{Activation, GemmSpec, ScaleRule, Segment};
pub use cistern_memory::{
    AllocationId, AllocationPolicy, ErrorCode, MemorySnapshot, MemoryStats, StreamId,
};
pub use cistern_optim::OptimizerConfig;
pub use command::{
    BufferRef, Command, CompactionReport, EventId, Region, Reservation, ServerId, ServerStats,
    StridedCopy,
};
pub use device::{
    AbsentBackend, Device, DeviceInfo, DeviceOptions, absent_backends, host_memory_bytes,
    list_devices,
};
pub use error::ServerError;
pub use failure::{FailureToken, PendingToken};
pub use fault::{FaultPlan, ProbeFault, TrapRate};
pub use graph::{CaptureId, GraphInfo, GraphRef};
pub use kernel::{Access, Binding, Contract, Kernel, KernelLaunch, ShapeRule};
pub use optimizer::{OptimizerArgs, OptimizerStep, SegmentTable, optimizer_error};
pub use server::DEFAULT_DRAIN_TIMEOUT;
pub use server::{
    ContextState, DeviceState, Flow, Health, PublishedState, ServerCore, ServerEnd, ServerHandle,
    next_server_id, open, spawn,
};

/// The stream every server starts with; it cannot be destroyed.
pub const DEFAULT_STREAM: StreamId = StreamId(0);

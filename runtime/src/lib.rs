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
mod ids;
mod kernel;
mod server;
pub mod sync;

pub use cistern_memory::{
    AllocationId, AllocationPolicy, ErrorCode, MemorySnapshot, MemoryStats, StreamId,
};
pub use command::{
    BufferRef, Command, CompactionReport, EventId, Region, Reservation, ServerId, ServerStats,
    StridedCopy,
};
pub use device::{Device, DeviceInfo, DeviceOptions, host_memory_bytes, list_devices};
pub use error::ServerError;
pub use failure::{FailureToken, PendingToken};
pub use fault::FaultPlan;
pub use kernel::{Access, Binding, Kernel, KernelArgs, KernelLaunch};
pub use server::{
    ContextState, Flow, ServerCore, ServerEnd, ServerHandle, next_server_id, open, spawn,
};

/// The stream every server starts with; it cannot be destroyed.
pub const DEFAULT_STREAM: StreamId = StreamId(0);

//! The ids every part of the runtime names: a server, an allocation of it,
//! a byte range, an event, the default stream, a device (and what a
//! backend reports of one). A leaf: it imports nothing of the crate, so the
//! commands, the kernels and the graphs all take them from here.

use cistern_memory::{AllocationId, StreamId};
use serde::{Deserialize, Serialize};

/// Names one server instance in this process, so a handle of one server is
/// refused by another (`DeviceMismatch`) instead of naming a stranger's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServerId(pub u64);

/// Names an allocation of one server in one context generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BufferRef {
    /// The server that made it; any other refuses it (`DeviceMismatch`).
    pub server: ServerId,
    /// Its id in that server's memory manager.
    pub id: AllocationId,
    /// The context generation it was made in; after a recovery it is
    /// refused as `StaleGeneration`.
    pub generation: u64,
}

/// A byte range of an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Region {
    /// The allocation the range lies in.
    pub buffer: BufferRef,
    /// First byte, from the allocation's start.
    pub offset: u64,
    /// Length in bytes; a range past the allocation's end is `InvalidArgument`.
    pub size: u64,
}

/// Names an event recorded on a stream; other streams can wait for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EventId(pub u64);

/// The stream every server starts with; it cannot be destroyed.
pub const DEFAULT_STREAM: StreamId = StreamId(0);

/// A device a server can own: a backend kind and an ordinal within it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Device {
    /// The host CPU; ordinal 0 is the only one present.
    Cpu(usize),
    /// A wgpu adapter (Vulkan, Metal, DX12), numbered as `list_devices` lists them.
    Wgpu(usize),
    /// A CUDA device (with the `cuda` feature; absent CUDA is `DeviceUnavailable`).
    Cuda(usize),
}

impl Device {
    /// The ordinal within the backend kind.
    pub fn ordinal(self) -> usize {
        match self {
            Device::Cpu(n) | Device::Wgpu(n) | Device::Cuda(n) => n,
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu(n) => write!(f, "cpu:{n}"),
            Device::Wgpu(n) => write!(f, "wgpu:{n}"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// What is known about a device present on this machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// What to pass to `open` to get a server for it.
    pub device: Device,
    /// A readable name (`"host CPU"`, an adapter name).
    pub name: String,
    /// Parallel compute units (CPU cores, multiprocessors).
    pub compute_units: usize,
    /// Total memory in bytes, when the platform says.
    pub memory_bytes: Option<u64>,
    /// The memory limit a server opened with default options would use.
    pub default_memory_limit: u64,
}

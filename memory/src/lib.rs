//! Cistern's memory layer: the error model every crate reports through, and
//! the memory manager (storage, paged pools) every backend drives, and the
//! seeded generator (`SplitMix64`) that tests, fault plans and tools share.
//!
//! It knows nothing of devices, servers or kernels, and depends on no other
//! Cistern crate.

mod code;
mod error;
mod trace;

pub use code::ErrorCode;
pub use error::{DevicePoison, IoError, MAX_SOURCE_DEPTH, Reason};
pub use trace::BackTrace;

mod allocations;
mod compaction;
mod config;
mod id_hash;
mod ids;
mod manager;
mod policy;
mod pool;
pub mod rng;
mod snapshot;
mod stats;
mod storage;
mod streams;

pub use compaction::{CompactionPlan, Relocation};
pub use config::MemoryConfig;
pub use id_hash::{IdHasher, IdMap};
pub use ids::{AllocationId, SliceLocation, StreamId};
pub use manager::MemoryManager;
pub use policy::AllocationPolicy;
pub use rng::SplitMix64;
pub use snapshot::{MemorySnapshot, PageSnapshot, PoolKind, SliceSnapshot, SliceUse};
pub use stats::MemoryStats;
pub use storage::{BookkeepingStorage, HostBuffer, HostStorage, Storage, StorageHandle, StorageId};

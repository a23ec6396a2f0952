//! Cistern's replica groups: one model trained on several devices,
//! processes or hosts, data parallel.
//!
//! A [`ReplicaGroup`] holds one `DeviceParamStore` per device of this
//! process; a [`Collective`] engine joins it with the other processes:
//! [`InProcess`] for a group in one process, `Mpi` (feature `mpi`) for one
//! process per rank under `mpirun`, `nccl::Nccl` (feature `nccl`) for CUDA
//! GPUs. `docs/parallel.md` has the design.

pub mod buckets;
mod collective;
mod digest;
mod error;
mod group;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;
mod recovery;
mod sum;

pub use collective::{Collective, CollectiveError, InProcess};
pub use error::GroupError;
pub use group::{MAX_RECOVERIES_PER_STEP, Replica, ReplicaGroup, Shard, StepReport};

//! `Nccl`: the engine of a group over CUDA GPUs through NCCL (cudarc's
//! `nccl`, loaded at run time as the driver is): one process driving
//! several GPUs ([`Nccl::from_devices`]) or, with the `mpi` feature, one
//! process per GPU ([`Nccl::over_mpi`], the unique id broadcast over MPI).
//!
//! Like every engine it reduces the group's host-staged buffers: each is
//! copied to its GPU, all-reduced there by NCCL, and the first copied back.
//! Not yet run on a GPU (`docs/parallel.md`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cudarc::nccl::{Comm, ReduceOp};

use crate::collective::{Collective, CollectiveError};

/// NCCL communicators, one per local GPU, and their device buffers.
pub struct Nccl {
    comms: Vec<Comm>,
    scratch: Vec<Option<CudaSlice<f32>>>,
    rank: usize,
    size: usize,
    /// The processes' own collectives (gathers, broadcasts) when the group
    /// spans several; `None` in one process.
    #[cfg(feature = "mpi")]
    bootstrap: Option<crate::mpi::Mpi>,
}

// SAFETY: a communicator is used by one thread at a time: every call takes
// `&mut self`, and NCCL allows a communicator to move between threads.
unsafe impl Send for Nccl {}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl")
            .field("gpus", &self.comms.len())
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

fn engine_error(reason: impl std::fmt::Display) -> CollectiveError {
    CollectiveError::Engine {
        engine: "nccl",
        reason: reason.to_string(),
    }
}

/// Whether the CUDA driver and NCCL libraries load here; why not, if not.
fn libraries() -> Result<(), CollectiveError> {
    // SAFETY: the probes only try to load the libraries.
    let driver = catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() });
    if !matches!(driver, Ok(true)) {
        return Err(engine_error(
            "no CUDA driver library (libcuda) on this machine",
        ));
    }
    let nccl = catch_unwind(|| unsafe { cudarc::nccl::sys::is_culib_present() });
    if !matches!(nccl, Ok(true)) {
        return Err(engine_error(
            "no NCCL library (libnccl.so.2) on this machine: install NCCL \
             (for example pip's nvidia-nccl-cu12) and put it on LD_LIBRARY_PATH",
        ));
    }
    Ok(())
}

/// The default stream of GPU `ordinal`'s primary context.
fn stream(ordinal: usize) -> Result<Arc<CudaStream>, CollectiveError> {
    let context = catch_unwind(|| CudaContext::new(ordinal))
        .map_err(|_| engine_error("the CUDA driver could not be called"))?
        .map_err(|error| engine_error(format!("cuda:{ordinal}: {error:?}")))?;
    Ok(context.default_stream())
}

impl Nccl {
    /// One process driving the GPUs `ordinals`, one replica each.
    /// Without CUDA or NCCL this is `Engine` saying which is missing.
    pub fn from_devices(ordinals: &[usize]) -> Result<Nccl, CollectiveError> {
        libraries()?;
        let streams = ordinals
            .iter()
            .map(|&ordinal| stream(ordinal))
            .collect::<Result<Vec<_>, _>>()?;
        let comms = catch_unwind(AssertUnwindSafe(|| Comm::from_devices(streams)))
            .map_err(|_| engine_error("NCCL could not be called"))?
            .map_err(|error| engine_error(format!("ncclCommInitAll: {error:?}")))?;
        Ok(Nccl {
            scratch: (0..comms.len()).map(|_| None).collect(),
            comms,
            rank: 0,
            size: 1,
            #[cfg(feature = "mpi")]
            bootstrap: None,
        })
    }

    /// One process per GPU: this rank of `mpi` drives GPU `ordinal`; rank
    /// 0's NCCL id reaches the others over MPI, which also carries the
    /// group's gathers and broadcasts.
    #[cfg(feature = "mpi")]
    pub fn over_mpi(mut mpi: crate::mpi::Mpi, ordinal: usize) -> Result<Nccl, CollectiveError> {
        libraries()?;
        let (rank, size) = (mpi.rank(), mpi.size());
        let mut words = [0.0f32; 32];
        if rank == 0 {
            let id = cudarc::nccl::Id::new()
                .map_err(|error| engine_error(format!("ncclGetUniqueId: {error:?}")))?;
            for (word, bytes) in words.iter_mut().zip(id.internal().chunks(4)) {
                let bytes: Vec<u8> = bytes.iter().map(|&b| b as u8).collect();
                *word =
                    f32::from_bits(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]));
            }
        }
        mpi.broadcast(0, &mut words)?;
        let mut internal = [0 as std::ffi::c_char; 128];
        for (chunk, word) in internal.chunks_mut(4).zip(words) {
            for (byte, value) in chunk.iter_mut().zip(word.to_bits().to_le_bytes()) {
                *byte = value as std::ffi::c_char;
            }
        }
        let id = cudarc::nccl::Id::uninit(internal);
        let comm = Comm::from_rank(stream(ordinal)?, rank, size, id)
            .map_err(|error| engine_error(format!("ncclCommInitRank: {error:?}")))?;
        Ok(Nccl {
            comms: vec![comm],
            scratch: vec![None],
            rank,
            size,
            bootstrap: Some(mpi),
        })
    }
}

impl Collective for Nccl {
    fn name(&self) -> &'static str {
        "nccl"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce_sum(&mut self, buffers: &mut [Vec<f32>]) -> Result<(), CollectiveError> {
        if buffers.len() != self.comms.len() {
            return Err(CollectiveError::Mismatch(format!(
                "{} buffers for {} GPUs",
                buffers.len(),
                self.comms.len()
            )));
        }
        for ((comm, scratch), buffer) in self.comms.iter().zip(&mut self.scratch).zip(&*buffers) {
            let stream = comm.stream();
            *scratch = Some(stream.clone_htod(buffer).map_err(engine_error_debug)?);
        }
        cudarc::nccl::result::group_start().map_err(engine_error_debug)?;
        let mut reduced = Ok(());
        for (comm, scratch) in self.comms.iter().zip(&mut self.scratch) {
            if let Some(slice) = scratch {
                if let Err(error) = comm.all_reduce_in_place(slice, &ReduceOp::Sum) {
                    reduced = Err(engine_error_debug(error));
                }
            }
        }
        cudarc::nccl::result::group_end().map_err(engine_error_debug)?;
        reduced?;
        let (Some(comm), Some(Some(slice)), Some(first)) = (
            self.comms.first(),
            self.scratch.first(),
            buffers.first_mut(),
        ) else {
            return Ok(());
        };
        comm.stream()
            .memcpy_dtoh(slice, first.as_mut_slice())
            .map_err(engine_error_debug)?;
        comm.stream().synchronize().map_err(engine_error_debug)
    }

    fn broadcast(&mut self, root: usize, data: &mut [f32]) -> Result<(), CollectiveError> {
        #[cfg(feature = "mpi")]
        if let Some(mpi) = &mut self.bootstrap {
            return mpi.broadcast(root, data);
        }
        let _ = data;
        match root {
            0 => Ok(()),
            _ => Err(CollectiveError::Mismatch(format!(
                "broadcast from rank {root} in a group of one process"
            ))),
        }
    }

    fn all_gather(&mut self, words: &[u64]) -> Result<Vec<u64>, CollectiveError> {
        #[cfg(feature = "mpi")]
        if let Some(mpi) = &mut self.bootstrap {
            return mpi.all_gather(words);
        }
        Ok(words.to_vec())
    }
}

fn engine_error_debug(error: impl std::fmt::Debug) -> CollectiveError {
    engine_error(format!("{error:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_gpu_communicator_sums_or_says_loudly_why_it_cannot_run_here() {
        let mut engine = match Nccl::from_devices(&[0]) {
            Ok(engine) => engine,
            Err(why) => {
                eprintln!("SKIPPED: the NCCL engine cannot run on this machine: {why}");
                return;
            }
        };
        let mut buffers = vec![vec![1.5f32, -2.0, 3.0]];
        assert_eq!(engine.all_reduce_sum(&mut buffers), Ok(()));
        assert_eq!(buffers[0], vec![1.5, -2.0, 3.0]);
    }
}

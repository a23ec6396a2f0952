//! What the test device does with one resolved launch: the only place it
//! knows kernels and their arguments.

use cistern_kernels::MapOp;

use super::memory::SimulatedMemory;
use crate::backend::{DeviceCounters, ResolvedLaunch};
use crate::kernel::Kernel;

/// A launch that faulted on the device, as the `Trap` kernel does.
pub(super) struct Trapped;

/// Runs `launch` on `memory`: copies and identity move bytes, `fill` writes
/// its value, `Trap` faults, every other kernel runs without touching
/// memory (the suites that use this device check the server, not the
/// arithmetic). Returns the kernel that ran, and counts it.
pub(super) fn run_launch(
    memory: &mut SimulatedMemory,
    counters: &mut DeviceCounters,
    launch: &ResolvedLaunch,
) -> Result<Kernel, Trapped> {
    match &launch.kernel {
        Kernel::Trap => return Err(Trapped),
        Kernel::Identity | Kernel::Copy => {
            memory.copy(launch.bindings[0], launch.bindings[1]);
        }
        Kernel::Map {
            op: MapOp::Fill,
            scalars,
        } => {
            let value = scalars.as_slice().first().copied().unwrap_or(0.0);
            for chunk in memory.bytes_mut(launch.bindings[0]).chunks_exact_mut(4) {
                chunk.copy_from_slice(&value.to_ne_bytes());
            }
        }
        Kernel::Empty => counters.empty_kernel_runs += 1,
        // Counted, not computed.
        Kernel::Map { .. }
        | Kernel::ActivationForward { .. }
        | Kernel::ActivationBackward { .. }
        | Kernel::Gemm { .. }
        | Kernel::ColumnSum { .. }
        | Kernel::MseLoss
        | Kernel::SegmentSum { .. }
        | Kernel::SegmentSumSquares { .. }
        | Kernel::AmpUnscale { .. }
        | Kernel::OptimizerStep(_)
        | Kernel::AmpUnscaleByDeviceScale
        | Kernel::AmpUpdateScale { .. }
        | Kernel::OptimizerStepCounted(_)
        | Kernel::Softmax { .. }
        | Kernel::SoftmaxBackward { .. }
        | Kernel::ClassLoss(_)
        | Kernel::ClassLossBackward(_)
        | Kernel::BroadcastBinary(_)
        | Kernel::StridedSum(_)
        | Kernel::LayerNorm(_)
        | Kernel::LayerNormBackward(_)
        | Kernel::Embedding(_)
        | Kernel::EmbeddingBackward(_)
        | Kernel::Dropout(_)
        | Kernel::BatchGather(_)
        | Kernel::BatchedGemm(_)
        | Kernel::MaxDim(_)
        | Kernel::MaxDimBackward(_)
        | Kernel::Attention(_)
        | Kernel::AttentionBackwardQueries(_)
        | Kernel::AttentionBackwardKeys(_)
        | Kernel::DropoutCounted(_) => {}
    }
    counters.kernels_run += 1;
    Ok(launch.kernel.clone())
}

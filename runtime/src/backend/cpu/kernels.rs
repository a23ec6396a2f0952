//! The CPU bodies of the runtime's kernels, and how they fail.
//!
//! `run` maps a resolved launch onto plain `f32` slices of its bindings and
//! calls `cistern-kernels`. A launch fails in one of two ways:
//! - a [`KernelFault`] (a trap, a panic, a launch that does not match its
//!   kernel) is sticky: it poisons the device;
//! - a `KernelError` the kernel returns (LAMB's non-finite norms, say) is
//!   operation-local: the kernel changed nothing, its owner gets
//!   `InvalidArgument` through the token and the stream's latch, and the
//!   device stays healthy.

use std::panic::{AssertUnwindSafe, catch_unwind};

use cistern_kernels::map::MAX_BINDINGS;
use cistern_kernels::{GemmSpec, KernelError, StepContext};

use super::device::CpuLaunch;
use super::memory::HostSlice;
use crate::backend::stream::{KernelFault, LaunchError};
use crate::error::ServerError;
use crate::fault::panic_message;
use crate::kernel::Kernel;
use crate::optimizer::OptimizerArgs;

/// How a batch went: its result (with the failing launch's index) and the
/// kernels that ran to completion, `Empty` ones apart.
#[derive(Debug, PartialEq)]
pub(super) struct BatchOutcome {
    pub(super) result: Result<(), (usize, LaunchError)>,
    pub(super) empty: u64,
    pub(super) others: u64,
}

/// Runs `launches` in order on this thread, stopping at the first failure;
/// a panic is a fault. Counted once per call, so a replayed graph pays no
/// shared-counter traffic per launch.
pub(super) fn run_all(launches: &[CpuLaunch]) -> BatchOutcome {
    let mut index = 0;
    let mut empty = 0;
    let mut others = 0;
    // One unwind guard per batch: `index` names the launch that panicked.
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        while let Some(launch) = launches.get(index) {
            if matches!(launch.kernel, Kernel::Empty) {
                // The cheapest path: launch-overhead benchmarks count on it.
                empty += 1;
            } else {
                run(launch)?;
                others += 1;
            }
            index += 1;
        }
        Ok(())
    }));
    let result = match outcome {
        Ok(result) => result.map_err(|error| (index, error)),
        Err(payload) => Err((
            index,
            KernelFault::Panicked(panic_message(payload.as_ref())).into(),
        )),
    };
    BatchOutcome {
        result,
        empty,
        others,
    }
}

/// Runs one launch on this thread.
fn run(launch: &CpuLaunch) -> Result<(), LaunchError> {
    let refused = |error: KernelError| {
        LaunchError::Refused(ServerError::InvalidArgument {
            message: format!("{}: {error}", launch.kernel.name()),
        })
    };
    let b = Bound(launch);
    match &launch.kernel {
        Kernel::Map { op, scalars } => {
            let definition = op.definition();
            let written = definition.written();
            let mut read: [&[f32]; MAX_BINDINGS] = [&[]; MAX_BINDINGS];
            let mut inputs = 0;
            for index in (0..definition.bindings()).filter(|&index| index != written) {
                *read
                    .get_mut(inputs)
                    .ok_or_else(|| malformed("too many bindings"))? = b.read(index)?;
                inputs += 1;
            }
            let written = b.write(written)?;
            cistern_kernels::map(*op, written, &read[..inputs], scalars.as_slice())
                .map_err(refused)?;
        }
        Kernel::Copy => copy_bytes(b.bytes(0)?, b.bytes_mut(1)?)?,
        Kernel::Identity => {
            cistern_kernels::copy(b.read(0)?, b.write(1)?).map_err(refused)?;
        }
        // Counted by `run_all` without a call.
        Kernel::Empty => {}
        Kernel::Trap => return Err(KernelFault::Trap.into()),
        &Kernel::ActivationForward { activation } => {
            cistern_kernels::activation_forward(activation, b.read(0)?, b.write(1)?)
                .map_err(refused)?;
        }
        &Kernel::ActivationBackward { activation } => {
            let (x, grad_out, grad_in) = (b.read(0)?, b.read(1)?, b.write(2)?);
            cistern_kernels::activation_backward(activation, x, grad_out, grad_in)
                .map_err(refused)?;
        }
        Kernel::Gemm { spec, bias } => gemm(&b, spec, *bias, refused)?,
        &Kernel::ColumnSum { rows, cols } => {
            let (rows, cols) = (index(rows)?, index(cols)?);
            cistern_kernels::column_sum(b.read(0)?, rows, cols, b.write(1)?).map_err(refused)?;
        }
        Kernel::MseLoss => {
            let loss = cistern_kernels::mse_loss(b.read(0)?, b.read(1)?).map_err(refused)?;
            match b.write(2)?.first_mut() {
                Some(out) => *out = loss,
                None => return Err(malformed("mse_loss has no output element").into()),
            }
        }
        Kernel::SegmentSum { segments } => {
            cistern_kernels::segment_sum(b.read(0)?, segments, b.write(1)?).map_err(refused)?;
        }
        Kernel::SegmentSumSquares { segments } => {
            cistern_kernels::segment_sum_squares(b.read(0)?, segments, b.write(1)?)
                .map_err(refused)?;
        }
        &Kernel::AmpUnscale { inv_scale } => {
            cistern_kernels::amp_unscale(b.write(0)?, inv_scale, b.write(1)?).map_err(refused)?;
        }
        Kernel::OptimizerStep(step) => optimizer_step(&b, step, launch.bindings.len(), refused)?,
        Kernel::AmpUnscaleByDeviceScale => {
            cistern_kernels::amp_unscale_by_device_scale(b.write(0)?, b.write(1)?, b.read(2)?)
                .map_err(refused)?;
        }
        Kernel::AmpUpdateScale { rule } => {
            let (found_inf, scale) = (b.read(0)?, b.write(1)?);
            cistern_kernels::amp_update_scale(rule, found_inf, scale, b.write(2)?, b.write(3)?)
                .map_err(refused)?;
        }
        Kernel::OptimizerStepCounted(step) => {
            counted_step(&b, step, launch.bindings.len(), refused)?;
        }
        &Kernel::Softmax { rows, cols, log } => {
            let (rows, cols) = (index(rows)?, index(cols)?);
            cistern_kernels::softmax(b.read(0)?, rows, cols, log, b.write(1)?).map_err(refused)?;
        }
        &Kernel::SoftmaxBackward { rows, cols, log } => {
            let (rows, cols) = (index(rows)?, index(cols)?);
            let (y, g, grad) = (b.read(0)?, b.read(1)?, b.write(2)?);
            cistern_kernels::softmax_backward(y, g, rows, cols, log, grad).map_err(refused)?;
        }
        Kernel::ClassLoss(spec) => {
            let (input, targets) = (b.read(0)?, b.targets(1)?);
            let weight = spec.weighted.then(|| b.read(2)).transpose()?;
            let out = b.write(2 + usize::from(spec.weighted))?;
            cistern_kernels::class_loss(spec, input, targets, weight, out).map_err(refused)?;
        }
        Kernel::ClassLossBackward(spec) => {
            let (input, targets) = (b.read(0)?, b.targets(1)?);
            let weight = spec.weighted.then(|| b.read(2)).transpose()?;
            let next = 2 + usize::from(spec.weighted);
            let (grad_output, grad) = (b.read(next)?, b.write(next + 1)?);
            cistern_kernels::class_loss_backward(spec, input, targets, weight, grad_output, grad)
                .map_err(refused)?;
        }
        Kernel::BroadcastBinary(spec) => {
            let (a, c, out) = (b.read(0)?, b.read(1)?, b.write(2)?);
            cistern_kernels::broadcast_binary(spec, a, c, out).map_err(refused)?;
        }
        Kernel::StridedSum(spec) => {
            cistern_kernels::strided_sum(spec, b.read(0)?, b.write(1)?).map_err(refused)?;
        }
        Kernel::LayerNorm(spec) => {
            let affine = match spec.affine {
                true => Some((b.read(1)?, b.read(2)?)),
                false => None,
            };
            let next = if spec.affine { 3 } else { 1 };
            let (x, y, stats) = (b.read(0)?, b.write(next)?, b.write(next + 1)?);
            cistern_kernels::layer_norm(spec, x, affine, y, stats).map_err(refused)?;
        }
        Kernel::LayerNormBackward(spec) => {
            let weight = spec.affine.then(|| b.read(1)).transpose()?;
            let next = 1 + usize::from(spec.affine);
            let (x, stats, grad_y) = (b.read(0)?, b.read(next)?, b.read(next + 1)?);
            let (grad_x, weighted) = (b.write(next + 2)?, b.write(next + 3)?);
            cistern_kernels::layer_norm_backward(spec, x, weight, stats, grad_y, grad_x, weighted)
                .map_err(refused)?;
        }
        Kernel::Attention(spec) => {
            let inputs = [b.read(0)?, b.read(1)?, b.read(2)?];
            let (out, weights) = (b.write(3)?, b.write(4)?);
            cistern_kernels::attention(spec, inputs, out, weights).map_err(refused)?;
        }
        Kernel::AttentionBackwardQueries(spec) => {
            let inputs = [b.read(0)?, b.read(1)?, b.read(2)?, b.read(3)?];
            let (scores, grad_q) = (b.write(4)?, b.write(5)?);
            cistern_kernels::attention_backward_queries(spec, inputs, scores, grad_q)
                .map_err(refused)?;
        }
        Kernel::AttentionBackwardKeys(spec) => {
            let inputs = [b.read(0)?, b.read(1)?, b.read(2)?, b.read(3)?];
            let (grad_k, grad_v) = (b.write(4)?, b.write(5)?);
            cistern_kernels::attention_backward_keys(spec, inputs, grad_k, grad_v)
                .map_err(refused)?;
        }
        Kernel::BatchedGemm(spec) => {
            let (a, c, out) = (b.read(0)?, b.read(1)?, b.write(2)?);
            cistern_kernels::batched_gemm(spec, a, c, out).map_err(refused)?;
        }
        Kernel::Dropout(spec) => {
            cistern_kernels::dropout::dropout(spec, b.read(0)?, b.write(1)?).map_err(refused)?;
        }
        Kernel::DropoutCounted(spec) => {
            let (x, counter, out) = (b.read(0)?, b.read(1)?, b.write(2)?);
            cistern_kernels::dropout::dropout_counted(spec, x, counter, out).map_err(refused)?;
        }
        Kernel::BatchGather(spec) => {
            let (features, targets, counter) = (b.read(0)?, b.read(1)?, b.write(2)?);
            let (x, y) = (b.write(3)?, b.write(4)?);
            cistern_kernels::batch_gather(spec, features, targets, counter, x, y)
                .map_err(refused)?;
        }
        Kernel::Embedding(spec) => {
            let (weight, indices, out) = (b.read(0)?, b.targets(1)?, b.write(2)?);
            cistern_kernels::embedding(spec, weight, indices, out).map_err(refused)?;
        }
        Kernel::EmbeddingBackward(spec) => {
            let (indices, grad_out, grad) = (b.targets(0)?, b.read(1)?, b.write(2)?);
            cistern_kernels::embedding_backward(spec, indices, grad_out, grad).map_err(refused)?;
        }
        Kernel::MaxDim(spec) => {
            let (x, values, indices) = (b.read(0)?, b.write(1)?, b.words_mut(2)?);
            cistern_kernels::max_dim(spec, x, values, indices).map_err(refused)?;
        }
        Kernel::MaxDimBackward(spec) => {
            let (indices, grad_out, grad) = (b.targets(0)?, b.read(1)?, b.write(2)?);
            cistern_kernels::max_dim_backward(spec, indices, grad_out, grad).map_err(refused)?;
        }
    }
    Ok(())
}

fn optimizer_step(
    b: &Bound<'_>,
    step: &OptimizerArgs,
    bindings: usize,
    refused: impl Fn(KernelError) -> LaunchError,
) -> Result<(), LaunchError> {
    let params = b.write(0)?;
    let grads = b.read(1)?;
    let (found_inf, first_state) = if step.found_inf {
        (Some(b.read(2)?), 3)
    } else {
        (None, 2)
    };
    let mut state = (first_state..bindings)
        .map(|i| b.write(i))
        .collect::<Result<Vec<_>, _>>()?;
    let ctx = StepContext {
        step: step.step,
        segments: &step.segments,
        found_inf,
    };
    cistern_kernels::optimizer_step(&step.config, &ctx, params, grads, &mut state)
        .map_err(refused)?;
    Ok(())
}

fn counted_step(
    b: &Bound<'_>,
    step: &OptimizerArgs,
    bindings: usize,
    refused: impl Fn(KernelError) -> LaunchError,
) -> Result<(), LaunchError> {
    let (params, grads, found_inf, count) = (b.write(0)?, b.read(1)?, b.read(2)?, b.write(3)?);
    let mut state = (4..bindings)
        .map(|i| b.write(i))
        .collect::<Result<Vec<_>, _>>()?;
    cistern_kernels::optimizer_step_counted(
        &step.config,
        &step.segments,
        found_inf,
        count,
        params,
        grads,
        &mut state,
    )
    .map_err(refused)?;
    Ok(())
}

fn gemm(
    b: &Bound<'_>,
    spec: &GemmSpec,
    bias: bool,
    refused: impl Fn(KernelError) -> LaunchError,
) -> Result<(), LaunchError> {
    let (bias, c) = if bias {
        (Some(b.read(2)?), b.write(3)?)
    } else {
        (None, b.write(2)?)
    };
    cistern_kernels::gemm(spec, b.read(0)?, b.read(1)?, bias, c).map_err(refused)
}

/// A launch's bindings as slices.
///
/// Every accessor hands out a view of a distinct binding: the server checked
/// that no written binding overlaps any other, and the stream orders this
/// launch against every other user of the memory, so a view is exclusive
/// when written and unwritten while read.
struct Bound<'a>(&'a CpuLaunch);

impl<'a> Bound<'a> {
    fn slice(&self, index: usize) -> Result<&'a HostSlice, KernelFault> {
        self.0
            .bindings
            .get(index)
            .ok_or_else(|| malformed(format!("{} has no binding {index}", self.0.kernel.name())))
    }

    fn bytes(&self, index: usize) -> Result<&'a [u8], KernelFault> {
        // SAFETY: see the type's docs: no one writes a bound range while it is read.
        Ok(unsafe { self.slice(index)?.bytes() })
    }

    fn bytes_mut(&self, index: usize) -> Result<&'a mut [u8], KernelFault> {
        // SAFETY: see the type's docs: a written range overlaps no other
        // binding, and each index is asked for once per launch.
        Ok(unsafe { self.slice(index)?.bytes_mut() })
    }

    fn read(&self, index: usize) -> Result<&'a [f32], KernelFault> {
        bytemuck::try_cast_slice(self.bytes(index)?).map_err(|e| malformed(e.to_string()))
    }

    /// A binding of `i32` class indices.
    fn targets(&self, index: usize) -> Result<&'a [i32], KernelFault> {
        bytemuck::try_cast_slice(self.bytes(index)?).map_err(|e| malformed(e.to_string()))
    }

    fn write(&self, index: usize) -> Result<&'a mut [f32], KernelFault> {
        bytemuck::try_cast_slice_mut(self.bytes_mut(index)?).map_err(|e| malformed(e.to_string()))
    }

    /// A written binding of `i32` words (indices a kernel produces).
    fn words_mut(&self, index: usize) -> Result<&'a mut [i32], KernelFault> {
        bytemuck::try_cast_slice_mut(self.bytes_mut(index)?).map_err(|e| malformed(e.to_string()))
    }
}

fn malformed(message: impl Into<String>) -> KernelFault {
    KernelFault::Malformed(message.into())
}

fn index(value: u64) -> Result<usize, KernelFault> {
    usize::try_from(value).map_err(|_| malformed(format!("{value} does not fit in usize")))
}

/// Copies `source` to `target`, which must be as long.
pub(super) fn copy_bytes(source: &[u8], target: &mut [u8]) -> Result<(), KernelFault> {
    if source.len() != target.len() {
        return Err(malformed("copy sizes differ"));
    }
    target.copy_from_slice(source);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_of_unequal_sizes_is_malformed() {
        assert!(matches!(
            copy_bytes(&[1, 2, 3], &mut [0, 0]),
            Err(KernelFault::Malformed(_))
        ));
    }

    fn bare(kernel: Kernel) -> CpuLaunch {
        CpuLaunch {
            kernel,
            bindings: Vec::new(),
        }
    }

    #[test]
    fn a_batch_stops_at_its_trap_and_counts_the_empty_launches_before_it() {
        let batch = [Kernel::Empty, Kernel::Empty, Kernel::Trap, Kernel::Empty].map(bare);
        let outcome = run_all(&batch);
        assert_eq!(
            outcome.result,
            Err((2, LaunchError::Fault(KernelFault::Trap)))
        );
        assert_eq!((outcome.empty, outcome.others), (2, 0));
    }

    #[test]
    fn a_malformed_launch_in_a_batch_is_named_by_its_index() {
        let scale = Kernel::map(cistern_kernels::MapOp::Scale, &[2.0]);
        let batch = [Kernel::Empty, scale].map(bare);
        let outcome = run_all(&batch);
        assert!(matches!(
            outcome.result,
            Err((1, LaunchError::Fault(KernelFault::Malformed(_))))
        ));
        assert_eq!((outcome.empty, outcome.others), (1, 0));
    }
}

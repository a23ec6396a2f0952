//! Optimizer steps over one concatenated parameter buffer: one call updates
//! every parameter of a model, each tensor being a [`Segment`].
//!
//! Every step takes the step count (from 1), the segment table, the
//! parameters, the gradients and the state buffers in the order of
//! [`cistern_optim::StateLayout`]. Per-step scalars (bias corrections, step
//! sizes) are computed once per call in f64, then rounded to f32.

mod adagrad;
mod adam;
mod amp;
mod flags;
mod lamb;
mod pieces;
mod rmsprop;
mod scalars;
mod sgd;

use cistern_optim::{OptimError, OptimizerConfig, Segment, validate_segments};
use serde::{Deserialize, Serialize};

use crate::KernelError;

pub use adagrad::adagrad_step;
pub use adam::{adam_step, adamw_step};
pub use amp::{ScaleRule, amp_unscale, amp_unscale_by_device_scale, amp_update_scale};
pub use lamb::lamb_step;
pub(crate) use pieces::segment_pieces;
pub use rmsprop::rmsprop_step;
pub use scalars::{StepScalars, segment_runs, step_scalars};
pub use sgd::sgd_step;

/// What one optimizer step is applied to, besides the buffers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepContext<'a> {
    /// The step count, starting at 1 (PyTorch's `state['step']` after its increment).
    pub step: u64,
    /// One segment per parameter tensor; sorted, disjoint, inside the buffers.
    pub segments: &'a [Segment],
    /// The AMP found-inf flag (one element, as written by [`amp_unscale`]):
    /// when it is non-zero the step changes nothing. `None` outside AMP.
    pub found_inf: Option<&'a [f32]>,
}

/// Whether a step changed the parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepOutcome {
    /// Parameters and state were updated.
    Applied,
    /// The found-inf flag was set: nothing changed.
    Skipped,
}

/// Runs the step of whichever optimizer `config` is.
pub fn optimizer_step(
    config: &OptimizerConfig,
    ctx: &StepContext<'_>,
    params: &mut [f32],
    grads: &[f32],
    state: &mut [&mut [f32]],
) -> Result<StepOutcome, KernelError> {
    match config {
        OptimizerConfig::Sgd(c) => sgd_step(c, ctx, params, grads, state),
        OptimizerConfig::Adam(c) => adam_step(c, ctx, params, grads, state),
        OptimizerConfig::AdamW(c) => adamw_step(c, ctx, params, grads, state),
        OptimizerConfig::RmsProp(c) => rmsprop_step(c, ctx, params, grads, state),
        OptimizerConfig::Adagrad(c) => adagrad_step(c, ctx, params, grads, state),
        OptimizerConfig::Lamb(c) => lamb_step(c, ctx, params, grads, state),
    }
}

/// Checks everything a step depends on; `Some(Skipped)` when the found-inf
/// flag says the step must change nothing.
fn prepare(
    validated: Result<(), OptimError>,
    state_buffers: usize,
    ctx: &StepContext<'_>,
    params: &[f32],
    grads: &[f32],
    state: &[&mut [f32]],
) -> Result<Option<StepOutcome>, KernelError> {
    validated?;
    if ctx.step == 0 {
        return Err(KernelError::invalid("step", "steps count from 1"));
    }
    let n = params.len();
    KernelError::check_len("grads", n, grads.len())?;
    KernelError::check_len("state", state_buffers, state.len())?;
    for (i, buffer) in state.iter().enumerate() {
        KernelError::check_len(&format!("state[{i}]"), n, buffer.len())?;
    }
    validate_segments(ctx.segments, n)?;
    match ctx.found_inf {
        None => Ok(None),
        Some(flag) => {
            KernelError::check_len("found_inf", 1, flag.len())?;
            Ok((flag[0] != 0.0).then_some(StepOutcome::Skipped))
        }
    }
}

/// Total elements the segments cover.
fn covered(segments: &[Segment]) -> usize {
    segments.iter().map(|s| s.len).sum()
}

/// [`optimizer_step`] with its step count on the device: `count` (one
/// `u32` in an `f32` word) holds the steps applied so far. A set
/// `found_inf` skips the step and leaves the count; otherwise the step
/// runs as step `count + 1` and the count advances, so a skipped step
/// never advances the bias corrections (PyTorch's fused Adam with its
/// `state_steps` tensor).
pub fn optimizer_step_counted(
    config: &OptimizerConfig,
    segments: &[Segment],
    found_inf: &[f32],
    count: &mut [f32],
    params: &mut [f32],
    grads: &[f32],
    state: &mut [&mut [f32]],
) -> Result<StepOutcome, KernelError> {
    KernelError::check_len("found_inf", 1, found_inf.len())?;
    KernelError::check_len("count", 1, count.len())?;
    if found_inf[0] != 0.0 {
        return Ok(StepOutcome::Skipped);
    }
    let step = count[0]
        .to_bits()
        .checked_add(1)
        .ok_or_else(|| KernelError::invalid("count", "the step count overflows u32"))?;
    let ctx = StepContext {
        step: u64::from(step),
        segments,
        found_inf: None,
    };
    let outcome = optimizer_step(config, &ctx, params, grads, state)?;
    count[0] = f32::from_bits(step);
    Ok(outcome)
}

//! Mixed precision: unscaling gradients and detecting overflow.

use crate::KernelError;
use crate::parallel::{MIN_PARALLEL, PIECE};
use rayon::prelude::*;

/// `grads ← grads · inv_scale`; sets `found_inf[0]` to 1 if any gradient
/// was non-finite (and never clears it, so calls over several buffers
/// accumulate), as PyTorch's `_amp_foreach_non_finite_check_and_unscale_`.
pub fn amp_unscale(
    grads: &mut [f32],
    inv_scale: f32,
    found_inf: &mut [f32],
) -> Result<(), KernelError> {
    KernelError::check_len("found_inf", 1, found_inf.len())?;
    let piece = |g: &mut [f32]| {
        let mut bad = false;
        for v in g.iter_mut() {
            bad |= !v.is_finite();
            *v *= inv_scale;
        }
        bad
    };
    let any_bad = if grads.len() < MIN_PARALLEL {
        piece(grads)
    } else {
        grads
            .par_chunks_mut(PIECE)
            .map(piece)
            .reduce(|| false, |a, b| a | b)
    };
    if any_bad {
        found_inf[0] = 1.0;
    }
    Ok(())
}

/// [`amp_unscale`] by the loss scale held on the device (`scale[0]`):
/// `inv_scale` is `1 / scale` rounded from f64, as `GradScaler::inv_scale`.
pub fn amp_unscale_by_device_scale(
    grads: &mut [f32],
    found_inf: &mut [f32],
    scale: &[f32],
) -> Result<(), KernelError> {
    KernelError::check_len("scale", 1, scale.len())?;
    let inv_scale = (1.0 / f64::from(scale[0])) as f32;
    amp_unscale(grads, inv_scale, found_inf)
}

/// The loss scaler's rules, as `GradScaler::update` and PyTorch's
/// `_amp_update_scale_` apply them after a step.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScaleRule {
    /// The multiplier after `growth_interval` clean steps (> 1).
    pub growth_factor: f64,
    /// The multiplier after a skipped step (in (0, 1)).
    pub backoff_factor: f64,
    /// Clean steps before the scale grows (> 0).
    pub growth_interval: u32,
}

/// PyTorch's `_amp_update_scale_` on the device: on a set `found_inf`
/// the scale backs off (kept if the result would be 0 or subnormal),
/// the growth tracker becomes 0 and `skipped` counts one; otherwise the
/// tracker counts one and at `growth_interval` becomes 0, the scale
/// growing when the result is finite. `scale` is one `f32`; `tracker`
/// and `skipped` are one `u32` each, stored in `f32` words.
pub fn amp_update_scale(
    rule: &ScaleRule,
    found_inf: &[f32],
    scale: &mut [f32],
    tracker: &mut [f32],
    skipped: &mut [f32],
) -> Result<(), KernelError> {
    KernelError::check_len("found_inf", 1, found_inf.len())?;
    KernelError::check_len("scale", 1, scale.len())?;
    KernelError::check_len("tracker", 1, tracker.len())?;
    KernelError::check_len("skipped", 1, skipped.len())?;
    if found_inf[0] != 0.0 {
        let backed_off = (f64::from(scale[0]) * rule.backoff_factor) as f32;
        if backed_off.is_normal() {
            scale[0] = backed_off;
        }
        tracker[0] = f32::from_bits(0);
        skipped[0] = f32::from_bits(skipped[0].to_bits().saturating_add(1));
        return Ok(());
    }
    let successful = tracker[0].to_bits().saturating_add(1);
    if successful < rule.growth_interval {
        tracker[0] = f32::from_bits(successful);
        return Ok(());
    }
    tracker[0] = f32::from_bits(0);
    let grown = (f64::from(scale[0]) * rule.growth_factor) as f32;
    if grown.is_finite() {
        scale[0] = grown;
    }
    Ok(())
}

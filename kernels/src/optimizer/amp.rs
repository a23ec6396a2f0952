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

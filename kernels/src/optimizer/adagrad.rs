//! Adagrad with learning-rate decay.

use cistern_optim::AdagradConfig;

use super::flags::{bit, sign};
use super::pieces::{element_pieces, split, split_mut};
use super::{StepContext, StepOutcome, covered, prepare};
use crate::KernelError;
use crate::parallel::{MIN_PARALLEL, run, with_wide_vectors};

/// One step of `torch.optim.Adagrad` (state: `sum`, which starts at
/// `initial_accumulator_value`).
pub fn adagrad_step(
    config: &AdagradConfig,
    ctx: &StepContext<'_>,
    params: &mut [f32],
    grads: &[f32],
    state: &mut [&mut [f32]],
) -> Result<StepOutcome, KernelError> {
    let layout = config.state_layout();
    if let Some(skipped) = prepare(config.validate(), layout.len(), ctx, params, grads, state)? {
        return Ok(skipped);
    }
    let s = AdagradScalars::of(config, ctx.step);
    let [sum] = state else {
        return Err(KernelError::invalid("state", "does not match the layout"));
    };
    let ranges = element_pieces(ctx.segments);
    let work: Vec<_> = split_mut(params, &ranges)?
        .into_iter()
        .zip(split(grads, &ranges))
        .zip(split_mut(sum, &ranges)?)
        .collect();
    let decayed = s.weight_decay != 0.0;
    run(
        work,
        covered(ctx.segments) >= MIN_PARALLEL,
        |((p, g), sum)| {
            with_wide_vectors(
                #[inline(always)]
                || {
                    if decayed {
                        piece::<true>(&s, p, g, sum)
                    } else {
                        piece::<false>(&s, p, g, sum)
                    }
                },
            )
        },
    );
    Ok(StepOutcome::Applied)
}

/// Adagrad's constants for one step (`super::scalars` packs them for the GPUs).
#[derive(Debug, Clone, Copy)]
pub(super) struct AdagradScalars {
    sign: f32,
    weight_decay: f32,
    clr: f32,
    eps: f32,
}

impl AdagradScalars {
    /// The constants of `config`'s step `step` (from 1): the learning rate
    /// decays with the steps before this one.
    pub(super) fn of(config: &AdagradConfig, step: u64) -> Self {
        AdagradScalars {
            sign: sign(config.maximize),
            weight_decay: config.weight_decay as f32,
            clr: (config.lr / (1.0 + step.saturating_sub(1) as f64 * config.lr_decay)) as f32,
            eps: config.eps as f32,
        }
    }

    /// The floats in the GPU kernels' order, and the op bits: 1 weight decay.
    pub(super) fn packed(&self) -> (Vec<f32>, u32) {
        let floats = vec![self.sign, self.weight_decay, self.clr, self.eps];
        (floats, bit(self.weight_decay != 0.0, 1))
    }
}

// The decay flag is a const so the loop has no branch and vectorizes; with
// `DECAYED` false the parameter is not read into the gradient, so a
// non-finite parameter does not leak into `sum`.
#[inline(always)]
fn piece<const DECAYED: bool>(s: &AdagradScalars, p: &mut [f32], g: &[f32], sum: &mut [f32]) {
    for ((p, &g), sum) in p.iter_mut().zip(g).zip(sum.iter_mut()) {
        let mut grad = g * s.sign;
        if DECAYED {
            grad += s.weight_decay * *p;
        }
        let total = *sum + grad * grad;
        *sum = total;
        *p -= s.clr * (grad / (total.sqrt() + s.eps));
    }
}

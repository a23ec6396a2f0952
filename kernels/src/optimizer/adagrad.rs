//! Adagrad with learning-rate decay.

use cistern_optim::AdagradConfig;

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
    let sign: f32 = if config.maximize { -1.0 } else { 1.0 };
    let weight_decay = config.weight_decay as f32;
    let clr = (config.lr / (1.0 + (ctx.step - 1) as f64 * config.lr_decay)) as f32;
    let eps = config.eps as f32;
    let [sum] = state else {
        return Err(KernelError::invalid("state", "does not match the layout"));
    };
    let ranges = element_pieces(ctx.segments);
    let work: Vec<_> = split_mut(params, &ranges)?
        .into_iter()
        .zip(split(grads, &ranges))
        .zip(split_mut(sum, &ranges)?)
        .collect();
    let s = AdagradScalars {
        sign,
        weight_decay,
        clr,
        eps,
    };
    let decayed = weight_decay != 0.0;
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

#[derive(Debug, Clone, Copy)]
struct AdagradScalars {
    sign: f32,
    weight_decay: f32,
    clr: f32,
    eps: f32,
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

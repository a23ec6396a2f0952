//! Adagrad with learning-rate decay.

use cistern_optim::AdagradConfig;

use super::pieces::{element_pieces, split, split_mut};
use super::{StepContext, StepOutcome, covered, prepare};
use crate::KernelError;
use crate::parallel::{MIN_PARALLEL, run};

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
    run(
        work,
        covered(ctx.segments) >= MIN_PARALLEL,
        |((p, g), sum)| {
            let n = p.len();
            let (g, sum) = (&g[..n], &mut sum[..n]);
            for i in 0..n {
                let mut grad = g[i] * sign;
                if weight_decay != 0.0 {
                    grad += weight_decay * p[i];
                }
                sum[i] += grad * grad;
                p[i] -= clr * (grad / (sum[i].sqrt() + eps));
            }
        },
    );
    Ok(StepOutcome::Applied)
}

//! RMSprop, plain or centered, with or without momentum.

use cistern_optim::RmsPropConfig;

use super::pieces::{element_pieces, split, split_mut, split_optional};
use super::{StepContext, StepOutcome, covered, prepare};
use crate::KernelError;
use crate::parallel::{MIN_PARALLEL, run};

/// One step of `torch.optim.RMSprop` (state: `square_avg`, then
/// `momentum_buffer` when momentum > 0, then `grad_avg` when centered).
pub fn rmsprop_step(
    config: &RmsPropConfig,
    ctx: &StepContext<'_>,
    params: &mut [f32],
    grads: &[f32],
    state: &mut [&mut [f32]],
) -> Result<StepOutcome, KernelError> {
    let layout = config.state_layout();
    if let Some(skipped) = prepare(config.validate(), layout.len(), ctx, params, grads, state)? {
        return Ok(skipped);
    }
    let s = RmsPropScalars {
        sign: if config.maximize { -1.0 } else { 1.0 },
        weight_decay: config.weight_decay as f32,
        lr: config.lr as f32,
        alpha: config.alpha as f32,
        one_minus_alpha: (1.0 - config.alpha) as f32,
        eps: config.eps as f32,
        momentum: config.momentum as f32,
    };
    let mut buffers = state.iter_mut().map(|b| &mut **b);
    let square_avg = buffers.next();
    let momentum_buffer = if config.momentum > 0.0 {
        buffers.next()
    } else {
        None
    };
    let grad_avg = if config.centered {
        buffers.next()
    } else {
        None
    };
    let Some(square_avg) = square_avg else {
        return Err(KernelError::invalid("state", "does not match the layout"));
    };
    let ranges = element_pieces(ctx.segments);
    let work: Vec<_> = split_mut(params, &ranges)?
        .into_iter()
        .zip(split(grads, &ranges))
        .zip(split_mut(square_avg, &ranges)?)
        .zip(split_optional(momentum_buffer, &ranges)?)
        .zip(split_optional(grad_avg, &ranges)?)
        .collect();
    run(
        work,
        covered(ctx.segments) >= MIN_PARALLEL,
        |((((p, g), sq), mom), avg)| piece(&s, p, g, sq, mom, avg),
    );
    Ok(StepOutcome::Applied)
}

#[derive(Debug, Clone, Copy)]
struct RmsPropScalars {
    sign: f32,
    weight_decay: f32,
    lr: f32,
    alpha: f32,
    one_minus_alpha: f32,
    eps: f32,
    momentum: f32,
}

fn piece(
    s: &RmsPropScalars,
    p: &mut [f32],
    g: &[f32],
    square_avg: &mut [f32],
    mut momentum_buffer: Option<&mut [f32]>,
    mut grad_avg: Option<&mut [f32]>,
) {
    let n = p.len();
    let (g, square_avg) = (&g[..n], &mut square_avg[..n]);
    for i in 0..n {
        let mut grad = g[i] * s.sign;
        if s.weight_decay != 0.0 {
            grad += s.weight_decay * p[i];
        }
        let sq = square_avg[i] * s.alpha + s.one_minus_alpha * grad * grad;
        square_avg[i] = sq;
        let avg = match grad_avg.as_deref_mut().and_then(|a| a.get_mut(i)) {
            Some(ga) => {
                *ga += s.one_minus_alpha * (grad - *ga);
                (sq - *ga * *ga).sqrt() + s.eps
            }
            None => sq.sqrt() + s.eps,
        };
        match momentum_buffer.as_deref_mut().and_then(|b| b.get_mut(i)) {
            Some(buf) => {
                *buf = *buf * s.momentum + grad / avg;
                p[i] -= s.lr * *buf;
            }
            None => p[i] -= s.lr * (grad / avg),
        }
    }
}

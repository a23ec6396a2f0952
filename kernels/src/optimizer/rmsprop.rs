//! RMSprop, plain or centered, with or without momentum.

use cistern_optim::RmsPropConfig;

use super::flags::{bit, sign};
use super::pieces::{element_pieces, split, split_mut, split_optional};
use super::{StepContext, StepOutcome, covered, prepare};
use crate::KernelError;
use crate::parallel::{MIN_PARALLEL, run, with_wide_vectors};

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
    let s = RmsPropScalars::of(config);
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
    let (momentum, centered) = (momentum_buffer.is_some(), grad_avg.is_some());
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
        |((((p, g), sq), mom), avg)| {
            let decayed = s.weight_decay != 0.0;
            let (mom, avg) = (mom.unwrap_or_default(), avg.unwrap_or_default());
            with_wide_vectors(
                #[inline(always)]
                || match (decayed, momentum, centered) {
                    (false, false, false) => piece::<false, false, false>(&s, p, g, sq, mom, avg),
                    (false, false, true) => piece::<false, false, true>(&s, p, g, sq, mom, avg),
                    (false, true, false) => piece::<false, true, false>(&s, p, g, sq, mom, avg),
                    (false, true, true) => piece::<false, true, true>(&s, p, g, sq, mom, avg),
                    (true, false, false) => piece::<true, false, false>(&s, p, g, sq, mom, avg),
                    (true, false, true) => piece::<true, false, true>(&s, p, g, sq, mom, avg),
                    (true, true, false) => piece::<true, true, false>(&s, p, g, sq, mom, avg),
                    (true, true, true) => piece::<true, true, true>(&s, p, g, sq, mom, avg),
                },
            )
        },
    );
    Ok(StepOutcome::Applied)
}

/// RMSprop's constants for one step (`super::scalars` packs them for the GPUs).
#[derive(Debug, Clone, Copy)]
pub(super) struct RmsPropScalars {
    sign: f32,
    weight_decay: f32,
    lr: f32,
    alpha: f32,
    one_minus_alpha: f32,
    eps: f32,
    momentum: f32,
}

impl RmsPropScalars {
    /// The constants of `config`'s steps (RMSprop's do not change with the step).
    pub(super) fn of(config: &RmsPropConfig) -> Self {
        RmsPropScalars {
            sign: sign(config.maximize),
            weight_decay: config.weight_decay as f32,
            lr: config.lr as f32,
            alpha: config.alpha as f32,
            one_minus_alpha: (1.0 - config.alpha) as f32,
            eps: config.eps as f32,
            momentum: config.momentum as f32,
        }
    }

    /// The floats in the GPU kernels' order, and the op bits: 1 weight
    /// decay, 2 a momentum buffer, 4 centered.
    pub(super) fn packed(&self, momentum_buffer: bool, centered: bool) -> (Vec<f32>, u32) {
        let floats = vec![
            self.sign,
            self.weight_decay,
            self.lr,
            self.alpha,
            self.one_minus_alpha,
            self.eps,
            self.momentum,
        ];
        let ops = bit(self.weight_decay != 0.0, 1) | bit(momentum_buffer, 2) | bit(centered, 4);
        (floats, ops)
    }
}

/// The flags as consts, so each combination gets its own branch-free loop;
/// the optional buffers are empty where their flag is off.
#[inline(always)]
fn piece<const DECAYED: bool, const MOMENTUM: bool, const CENTERED: bool>(
    s: &RmsPropScalars,
    p: &mut [f32],
    g: &[f32],
    square_avg: &mut [f32],
    momentum_buffer: &mut [f32],
    grad_avg: &mut [f32],
) {
    let n = p.len();
    debug_assert!(!MOMENTUM || momentum_buffer.len() == n);
    debug_assert!(!CENTERED || grad_avg.len() == n);
    let (g, square_avg) = (&g[..n], &mut square_avg[..n]);
    let momentum_buffer = if MOMENTUM {
        &mut momentum_buffer[..n]
    } else {
        &mut [][..]
    };
    let grad_avg = if CENTERED {
        &mut grad_avg[..n]
    } else {
        &mut [][..]
    };
    // PyTorch's CPU order, and the FMAs its kernels form (`add` with
    // `alpha`, `addcmul`, `lerp`): within float rounding of torch.optim's
    // RMSprop on an FMA machine (tests/pytorch_parity.rs).
    for i in 0..n {
        let mut grad = g[i] * s.sign;
        if DECAYED {
            grad = p[i].mul_add(s.weight_decay, grad);
        }
        let sq = (s.one_minus_alpha * grad).mul_add(grad, square_avg[i] * s.alpha);
        square_avg[i] = sq;
        let avg = if CENTERED {
            let ga = s.one_minus_alpha.mul_add(grad - grad_avg[i], grad_avg[i]);
            grad_avg[i] = ga;
            (-ga).mul_add(ga, sq).sqrt() + s.eps
        } else {
            sq.sqrt() + s.eps
        };
        if MOMENTUM {
            let buf = momentum_buffer[i] * s.momentum + grad / avg;
            momentum_buffer[i] = buf;
            p[i] = buf.mul_add(-s.lr, p[i]);
        } else {
            // `addcdiv_(grad, avg, value=-lr)`: the product, then the quotient.
            p[i] += (-s.lr * grad) / avg;
        }
    }
}

//! SGD with momentum, dampening, Nesterov and weight decay.

use cistern_optim::SgdConfig;

use super::flags::{bit, sign};
use super::pieces::{element_pieces, split, split_mut, split_optional};
use super::{StepContext, StepOutcome, covered, prepare};
use crate::KernelError;
use crate::parallel::{MIN_PARALLEL, run};

/// One step of `torch.optim.SGD` (state: `momentum_buffer` when momentum ≠ 0).
/// At step 1 the momentum buffer becomes the gradient itself, undampened,
/// as PyTorch does for a buffer it has not created yet.
pub fn sgd_step(
    config: &SgdConfig,
    ctx: &StepContext<'_>,
    params: &mut [f32],
    grads: &[f32],
    state: &mut [&mut [f32]],
) -> Result<StepOutcome, KernelError> {
    let layout = config.state_layout();
    if let Some(skipped) = prepare(config.validate(), layout.len(), ctx, params, grads, state)? {
        return Ok(skipped);
    }
    let s = SgdScalars::of(config, ctx.step);
    let buffer = state.first_mut().map(|b| &mut **b);
    let ranges = element_pieces(ctx.segments);
    let work: Vec<_> = split_mut(params, &ranges)?
        .into_iter()
        .zip(split(grads, &ranges))
        .zip(split_optional(buffer, &ranges)?)
        .collect();
    run(
        work,
        covered(ctx.segments) >= MIN_PARALLEL,
        |((p, g), buf)| piece(&s, p, g, buf),
    );
    Ok(StepOutcome::Applied)
}

/// SGD's constants for one step (`super::scalars` packs them for the GPUs).
#[derive(Debug, Clone, Copy)]
pub(super) struct SgdScalars {
    sign: f32,
    weight_decay: f32,
    lr: f32,
    momentum: f32,
    one_minus_dampening: f32,
    nesterov: bool,
    first: bool,
}

impl SgdScalars {
    /// The constants of `config`'s step `step` (from 1).
    pub(super) fn of(config: &SgdConfig, step: u64) -> Self {
        SgdScalars {
            sign: sign(config.maximize),
            weight_decay: config.weight_decay as f32,
            lr: config.lr as f32,
            momentum: config.momentum as f32,
            one_minus_dampening: (1.0 - config.dampening) as f32,
            nesterov: config.nesterov,
            first: step == 1,
        }
    }

    /// The floats in the GPU kernels' order, and the op bits: 1 weight
    /// decay, 2 a momentum buffer, 4 the first step, 8 Nesterov.
    pub(super) fn packed(&self, momentum_buffer: bool) -> (Vec<f32>, u32) {
        let floats = vec![
            self.sign,
            self.weight_decay,
            self.lr,
            self.momentum,
            self.one_minus_dampening,
        ];
        let ops = bit(self.weight_decay != 0.0, 1)
            | bit(momentum_buffer, 2)
            | bit(self.first, 4)
            | bit(self.nesterov, 8);
        (floats, ops)
    }
}

fn piece(s: &SgdScalars, p: &mut [f32], g: &[f32], buf: Option<&mut [f32]>) {
    let n = p.len();
    let g = &g[..n];
    let decayed = |p: f32, g: f32| {
        let g = g * s.sign;
        if s.weight_decay != 0.0 {
            g + s.weight_decay * p
        } else {
            g
        }
    };
    match buf {
        None => {
            for i in 0..n {
                p[i] -= s.lr * decayed(p[i], g[i]);
            }
        }
        Some(buf) => {
            let buf = &mut buf[..n];
            for i in 0..n {
                let d = decayed(p[i], g[i]);
                let b = if s.first {
                    d
                } else {
                    s.momentum * buf[i] + s.one_minus_dampening * d
                };
                buf[i] = b;
                let step = if s.nesterov { d + s.momentum * b } else { b };
                p[i] -= s.lr * step;
            }
        }
    }
}

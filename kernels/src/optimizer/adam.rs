//! Adam and AdamW: one fused pass over p, g, m, v (and the amsgrad max).

use cistern_optim::{AdamConfig, AdamWConfig};

use super::flags::{bit, sign};
use super::pieces::{element_pieces, split, split_optional};
use super::{StepContext, StepOutcome, covered, prepare};
use crate::KernelError;
use crate::parallel::{MIN_PARALLEL, run, with_wide_vectors};

/// One step of `torch.optim.Adam` (state: `exp_avg`, `exp_avg_sq`, and
/// `max_exp_avg_sq` with amsgrad).
pub fn adam_step(
    config: &AdamConfig,
    ctx: &StepContext<'_>,
    params: &mut [f32],
    grads: &[f32],
    state: &mut [&mut [f32]],
) -> Result<StepOutcome, KernelError> {
    let layout = config.state_layout();
    if let Some(skipped) = prepare(config.validate(), layout.len(), ctx, params, grads, state)? {
        return Ok(skipped);
    }
    let scalars = AdamScalars::of_adam(config, ctx.step);
    apply(&scalars, config.amsgrad, ctx, params, grads, state)
}

/// One step of `torch.optim.AdamW` (state as [`adam_step`]).
pub fn adamw_step(
    config: &AdamWConfig,
    ctx: &StepContext<'_>,
    params: &mut [f32],
    grads: &[f32],
    state: &mut [&mut [f32]],
) -> Result<StepOutcome, KernelError> {
    let layout = config.state_layout();
    if let Some(skipped) = prepare(config.validate(), layout.len(), ctx, params, grads, state)? {
        return Ok(skipped);
    }
    let scalars = AdamScalars::of_adamw(config, ctx.step);
    apply(&scalars, config.amsgrad, ctx, params, grads, state)
}

/// Adam's and AdamW's per-step constants, computed once in f64
/// (`super::scalars` packs them for the GPUs).
#[derive(Debug, Clone, Copy)]
pub(super) struct AdamScalars {
    sign: f32,
    coupled_decay: f32,
    decay_factor: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    step_size: f32,
    inv_bias_correction2_sqrt: f32,
    eps: f32,
}

impl AdamScalars {
    fn new(step: u64, lr: f64, betas: (f64, f64), eps: f64, maximize: bool) -> Self {
        let t = step as f64;
        let bias_correction1 = 1.0 - betas.0.powf(t);
        let bias_correction2 = 1.0 - betas.1.powf(t);
        Self {
            sign: sign(maximize),
            coupled_decay: 0.0,
            decay_factor: 1.0,
            one_minus_beta1: (1.0 - betas.0) as f32,
            beta2: betas.1 as f32,
            one_minus_beta2: (1.0 - betas.1) as f32,
            step_size: (lr / bias_correction1) as f32,
            inv_bias_correction2_sqrt: (1.0 / bias_correction2.sqrt()) as f32,
            eps: eps as f32,
        }
    }

    /// Adam's step `step` (from 1): the decay coupled into the gradient.
    pub(super) fn of_adam(config: &AdamConfig, step: u64) -> Self {
        let mut scalars = Self::new(step, config.lr, config.betas, config.eps, config.maximize);
        scalars.coupled_decay = config.weight_decay as f32;
        scalars
    }

    /// AdamW's step `step` (from 1): the parameter decayed by its own factor.
    pub(super) fn of_adamw(config: &AdamWConfig, step: u64) -> Self {
        let mut scalars = Self::new(step, config.lr, config.betas, config.eps, config.maximize);
        scalars.decay_factor = (1.0 - config.lr * config.weight_decay) as f32;
        scalars
    }

    /// The floats in the GPU kernels' order, and the op bits: 1 a coupled
    /// decay, 2 amsgrad.
    pub(super) fn packed(&self, amsgrad: bool) -> (Vec<f32>, u32) {
        let floats = vec![
            self.sign,
            self.coupled_decay,
            self.decay_factor,
            self.one_minus_beta1,
            self.beta2,
            self.one_minus_beta2,
            self.step_size,
            self.inv_bias_correction2_sqrt,
            self.eps,
        ];
        (floats, bit(self.coupled_decay != 0.0, 1) | bit(amsgrad, 2))
    }
}

fn apply(
    s: &AdamScalars,
    amsgrad: bool,
    ctx: &StepContext<'_>,
    params: &mut [f32],
    grads: &[f32],
    state: &mut [&mut [f32]],
) -> Result<StepOutcome, KernelError> {
    let (exp_avg, exp_avg_sq, max_exp_avg_sq) = match state {
        [m, v] => (&mut **m, &mut **v, None),
        [m, v, max] if amsgrad => (&mut **m, &mut **v, Some(&mut **max)),
        _ => return Err(KernelError::invalid("state", "does not match the layout")),
    };
    let ranges = element_pieces(ctx.segments);
    let work: Vec<_> = super::pieces::split_mut(params, &ranges)?
        .into_iter()
        .zip(split(grads, &ranges))
        .zip(super::pieces::split_mut(exp_avg, &ranges)?)
        .zip(super::pieces::split_mut(exp_avg_sq, &ranges)?)
        .zip(split_optional(max_exp_avg_sq, &ranges)?)
        .collect();
    let coupled = s.coupled_decay != 0.0;
    run(
        work,
        covered(ctx.segments) >= MIN_PARALLEL,
        |((((p, g), m), v), max)| {
            with_wide_vectors(
                #[inline(always)]
                || match (coupled, max) {
                    (false, None) => piece::<false>(s, p, g, m, v),
                    (true, None) => piece::<true>(s, p, g, m, v),
                    (false, Some(max)) => piece_amsgrad::<false>(s, p, g, m, v, max),
                    (true, Some(max)) => piece_amsgrad::<true>(s, p, g, m, v, max),
                },
            )
        },
    );
    Ok(StepOutcome::Applied)
}

/// The gradient after maximize and coupled L2 decay. With `COUPLED` false the
/// parameter is not read, so a non-finite parameter does not leak into it.
#[inline(always)]
fn gradient<const COUPLED: bool>(s: &AdamScalars, p: f32, g: f32) -> f32 {
    let g = g * s.sign;
    if COUPLED { g + s.coupled_decay * p } else { g }
}

// m is updated as PyTorch's `lerp_` (m + w·(g − m)), v as its `mul_`/`addcmul_`.
#[inline(always)]
fn piece<const COUPLED: bool>(
    s: &AdamScalars,
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
) {
    let n = p.len();
    let (g, m, v) = (&g[..n], &mut m[..n], &mut v[..n]);
    for i in 0..n {
        let grad = gradient::<COUPLED>(s, p[i], g[i]);
        let param = p[i] * s.decay_factor;
        let m_i = m[i] + s.one_minus_beta1 * (grad - m[i]);
        let v_i = v[i] * s.beta2 + s.one_minus_beta2 * grad * grad;
        m[i] = m_i;
        v[i] = v_i;
        let denom = v_i.sqrt() * s.inv_bias_correction2_sqrt + s.eps;
        p[i] = param - s.step_size * (m_i / denom);
    }
}

#[inline(always)]
fn piece_amsgrad<const COUPLED: bool>(
    s: &AdamScalars,
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    max: &mut [f32],
) {
    let n = p.len();
    let (g, m, v, max) = (&g[..n], &mut m[..n], &mut v[..n], &mut max[..n]);
    for i in 0..n {
        let grad = gradient::<COUPLED>(s, p[i], g[i]);
        let param = p[i] * s.decay_factor;
        let m_i = m[i] + s.one_minus_beta1 * (grad - m[i]);
        let v_i = v[i] * s.beta2 + s.one_minus_beta2 * grad * grad;
        // NaN in v wins, as with torch.maximum.
        let max_i = if max[i] >= v_i { max[i] } else { v_i };
        m[i] = m_i;
        v[i] = v_i;
        max[i] = max_i;
        let denom = max_i.sqrt() * s.inv_bias_correction2_sqrt + s.eps;
        p[i] = param - s.step_size * (m_i / denom);
    }
}

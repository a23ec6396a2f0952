//! LAMB with apex `FusedLAMB` semantics, all-or-nothing.
//!
//! Three passes: the global gradient norm (reads g); per segment the
//! parameter norm, the update norm and a finiteness check of the new moments
//! (reads p, g, m, v; nothing written); then the write pass, which recomputes
//! the same update. The recomputation is bit-identical (same f32 operations,
//! no FMA contraction), and it is what lets a refusal change nothing without
//! a scratch buffer: 48 bytes per element in all, against 28 for one pass.

use cistern_optim::LambConfig;

use super::pieces::{segment_pieces, split, split_mut};
use super::{StepContext, StepOutcome, covered, prepare};
use crate::KernelError;
use crate::parallel::{MIN_PARALLEL, map, run, sum_squares, with_wide_vectors};

/// One step of apex `FusedLAMB` (state: `exp_avg`, `exp_avg_sq`).
/// A non-finite global gradient norm, moment, norm or trust ratio is an
/// invalid-argument error and changes nothing.
pub fn lamb_step(
    config: &LambConfig,
    ctx: &StepContext<'_>,
    params: &mut [f32],
    grads: &[f32],
    state: &mut [&mut [f32]],
) -> Result<StepOutcome, KernelError> {
    let layout = config.state_layout();
    if let Some(skipped) = prepare(config.validate(), layout.len(), ctx, params, grads, state)? {
        return Ok(skipped);
    }
    let [exp_avg, exp_avg_sq] = state else {
        return Err(KernelError::invalid("state", "does not match the layout"));
    };
    let parallel = covered(ctx.segments) >= MIN_PARALLEL;
    let pieces = segment_pieces(ctx.segments);
    let ranges: Vec<_> = pieces.iter().map(|(_, r)| r.clone()).collect();

    let grad_norm = map(split(grads, &ranges), parallel, |g| {
        with_wide_vectors(
            #[inline(always)]
            || sum_squares(g),
        )
    })
    .iter()
    .sum::<f64>()
    .sqrt();
    if !grad_norm.is_finite() {
        return Err(KernelError::invalid(
            "grads",
            "the global gradient norm is not finite",
        ));
    }
    let s = LambScalars::new(config, ctx.step, grad_norm);

    let measured = {
        let read: Vec<_> = split(params, &ranges)
            .into_iter()
            .zip(split(grads, &ranges))
            .zip(split(exp_avg, &ranges))
            .zip(split(exp_avg_sq, &ranges))
            .collect();
        map(read, parallel, |(((p, g), m), v)| {
            with_wide_vectors(
                #[inline(always)]
                || {
                    if s.adam_w_mode {
                        measure::<true>(&s, p, g, m, v)
                    } else {
                        measure::<false>(&s, p, g, m, v)
                    }
                },
            )
        })
    };
    let mut norms = vec![Norms::default(); ctx.segments.len()];
    for ((segment, _), piece) in pieces.iter().zip(measured) {
        norms[*segment].add(piece);
    }
    let mut ratios = Vec::with_capacity(norms.len());
    for (index, norms) in norms.iter().enumerate() {
        let param_norm = norms.param_squares.sqrt();
        let update_norm = norms.update_squares.sqrt();
        let ratio = if s.trust_ratio && param_norm != 0.0 && update_norm != 0.0 {
            config.lr * (param_norm / update_norm)
        } else {
            config.lr
        };
        // A non-finite new moment makes the update norm NaN (see `measure`).
        if !(param_norm.is_finite() && update_norm.is_finite() && ratio.is_finite()) {
            return Err(KernelError::invalid(
                format!("segments[{index}]"),
                "a moment, norm or trust ratio would be non-finite",
            ));
        }
        ratios.push(ratio as f32);
    }

    let work: Vec<_> = pieces
        .iter()
        .map(|(segment, _)| ratios.get(*segment).copied().unwrap_or(0.0))
        .zip(split_mut(params, &ranges)?)
        .zip(split(grads, &ranges))
        .zip(split_mut(exp_avg, &ranges)?)
        .zip(split_mut(exp_avg_sq, &ranges)?)
        .collect();
    run(work, parallel, |((((ratio, p), g), m), v)| {
        with_wide_vectors(
            #[inline(always)]
            || {
                if s.adam_w_mode {
                    write::<true>(&s, ratio, p, g, m, v)
                } else {
                    write::<false>(&s, ratio, p, g, m, v)
                }
            },
        )
    });
    Ok(StepOutcome::Applied)
}

/// Per-step constants, as apex's `multi_tensor_lamb` computes them.
#[derive(Debug, Clone, Copy)]
struct LambScalars {
    inv_clip: f32,
    decay: f32,
    adam_w_mode: bool,
    beta1: f32,
    beta2: f32,
    beta3: f32,
    one_minus_beta2: f32,
    inv_bias_correction1: f32,
    inv_bias_correction2: f32,
    eps: f32,
    trust_ratio: bool,
}

impl LambScalars {
    fn new(c: &LambConfig, step: u64, grad_norm: f64) -> Self {
        let k = c.step_constants(step, grad_norm);
        Self {
            inv_clip: k.inv_clip,
            decay: k.decay,
            adam_w_mode: c.adam_w_mode,
            beta1: k.beta1,
            beta2: k.beta2,
            beta3: k.beta3,
            one_minus_beta2: k.one_minus_beta2,
            inv_bias_correction1: k.inv_bias_correction1,
            inv_bias_correction2: k.inv_bias_correction2,
            eps: k.eps,
            trust_ratio: c.use_nvlamb || c.weight_decay != 0.0,
        }
    }

    /// The new moments and the update direction of one element.
    /// `ADAM_W` is `adam_w_mode` as a const, so the loops have no branch.
    #[inline(always)]
    fn update<const ADAM_W: bool>(&self, p: f32, g: f32, m: f32, v: f32) -> (f32, f32, f32) {
        let mut g = g * self.inv_clip;
        if !ADAM_W {
            g += self.decay * p;
        }
        let m = m * self.beta1 + self.beta3 * g;
        let v = v * self.beta2 + self.one_minus_beta2 * g * g;
        let denom = (v * self.inv_bias_correction2).sqrt() + self.eps;
        let mut u = (m * self.inv_bias_correction1) / denom;
        if ADAM_W {
            u += self.decay * p;
        }
        (m, v, u)
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Norms {
    param_squares: f64,
    update_squares: f64,
}

impl Norms {
    fn add(&mut self, other: Norms) {
        self.param_squares += other.param_squares;
        self.update_squares += other.update_squares;
    }
}

/// Elements per block of the measuring loop: a block's update directions
/// go through a stack buffer, so the update loop and the f64 sums each
/// vectorize on their own.
const BLOCK: usize = 1024;

#[inline(always)]
fn measure<const ADAM_W: bool>(
    s: &LambScalars,
    p: &[f32],
    g: &[f32],
    m: &[f32],
    v: &[f32],
) -> Norms {
    let mut param_squares = 0.0f64;
    let mut update_squares = 0.0f64;
    let mut directions = [0.0f32; BLOCK];
    let blocks = p
        .chunks(BLOCK)
        .zip(g.chunks(BLOCK))
        .zip(m.chunks(BLOCK))
        .zip(v.chunks(BLOCK));
    for (((p, g), m), v) in blocks {
        let n = p.len();
        let (g, m, v, u) = (&g[..n], &m[..n], &v[..n], &mut directions[..n]);
        for i in 0..n {
            let (m_i, v_i, u_i) = s.update::<ADAM_W>(p[i], g[i], m[i], v[i]);
            // `x · 0` is ±0 for a finite x and NaN otherwise: adding it
            // leaves u as it is, or makes the update norm NaN exactly when a
            // new moment is not finite, without a branch.
            u[i] = u_i + (m_i * 0.0 + v_i * 0.0);
        }
        update_squares += sum_squares(u);
        param_squares += sum_squares(p);
    }
    Norms {
        param_squares,
        update_squares,
    }
}

#[inline(always)]
fn write<const ADAM_W: bool>(
    s: &LambScalars,
    ratio: f32,
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
) {
    let n = p.len();
    let (g, m, v) = (&g[..n], &mut m[..n], &mut v[..n]);
    for i in 0..n {
        let (m_i, v_i, u) = s.update::<ADAM_W>(p[i], g[i], m[i], v[i]);
        m[i] = m_i;
        v[i] = v_i;
        p[i] -= ratio * u;
    }
}

//! The f64 reference of every update: one small function per optimizer,
//! per-element loops, written to be read next to PyTorch's
//! `_single_tensor_*` code (and apex's `multi_tensor_lamb.cu` for LAMB).
//! Fast kernels are tested against these; speed is not a goal here.

use crate::{
    AdagradConfig, AdamConfig, AdamWConfig, LambConfig, OptimError, OptimizerConfig, RmsPropConfig,
    Segment, SgdConfig, validate_segments,
};

/// Parameters and optimizer state in f64, laid out as
/// [`OptimizerConfig::state_layout`] says.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceState {
    /// The concatenated parameters.
    pub params: Vec<f64>,
    /// One buffer per [`crate::StateBuffer`], each as long as `params`.
    pub buffers: Vec<Vec<f64>>,
}

impl ReferenceState {
    /// `params` with every state buffer at its initial value.
    pub fn new(config: &OptimizerConfig, params: Vec<f64>) -> Self {
        let buffers = config
            .state_layout()
            .buffers
            .iter()
            .map(|b| vec![b.initial_value; params.len()])
            .collect();
        Self { params, buffers }
    }
}

/// Applies step `step` (counting from 1) of `config` to `state`.
pub fn step(
    config: &OptimizerConfig,
    step: u64,
    segments: &[Segment],
    grads: &[f64],
    state: &mut ReferenceState,
) -> Result<(), OptimError> {
    match config {
        OptimizerConfig::Sgd(c) => sgd(c, step, segments, grads, state),
        OptimizerConfig::Adam(c) => adam(c, step, segments, grads, state),
        OptimizerConfig::AdamW(c) => adamw(c, step, segments, grads, state),
        OptimizerConfig::RmsProp(c) => rmsprop(c, step, segments, grads, state),
        OptimizerConfig::Adagrad(c) => adagrad(c, step, segments, grads, state),
        OptimizerConfig::Lamb(c) => lamb(c, step, segments, grads, state),
    }
}

/// Refuses a bad step count, buffer length or segment table.
fn check(
    config: &OptimizerConfig,
    step: u64,
    segments: &[Segment],
    grads: &[f64],
    state: &ReferenceState,
) -> Result<(), OptimError> {
    config.validate()?;
    if step == 0 {
        return Err(OptimError::invalid("step", "steps count from 1"));
    }
    let n = state.params.len();
    if grads.len() != n {
        return Err(OptimError::invalid(
            "grads",
            format!("has {} elements, params have {n}", grads.len()),
        ));
    }
    if state.buffers.len() != config.state_layout().len() {
        return Err(OptimError::invalid(
            "state",
            format!(
                "has {} buffers, the config needs {}",
                state.buffers.len(),
                config.state_layout().len()
            ),
        ));
    }
    if let Some(i) = state.buffers.iter().position(|b| b.len() != n) {
        return Err(OptimError::invalid(
            format!("state[{i}]"),
            format!("has {} elements, params have {n}", state.buffers[i].len()),
        ));
    }
    validate_segments(segments, n)
}

fn indices(segments: &[Segment]) -> impl Iterator<Item = usize> + '_ {
    segments.iter().flat_map(|s| s.offset..s.offset + s.len)
}

/// `torch.optim.SGD`.
pub fn sgd(
    c: &SgdConfig,
    step: u64,
    segments: &[Segment],
    grads: &[f64],
    state: &mut ReferenceState,
) -> Result<(), OptimError> {
    check(
        &OptimizerConfig::Sgd(c.clone()),
        step,
        segments,
        grads,
        state,
    )?;
    for i in indices(segments) {
        let p = state.params[i];
        let mut g = if c.maximize { -grads[i] } else { grads[i] };
        if c.weight_decay != 0.0 {
            g += c.weight_decay * p;
        }
        if c.momentum != 0.0 {
            let buf = &mut state.buffers[0][i];
            *buf = if step == 1 {
                g
            } else {
                c.momentum * *buf + (1.0 - c.dampening) * g
            };
            g = if c.nesterov {
                g + c.momentum * *buf
            } else {
                *buf
            };
        }
        state.params[i] = p - c.lr * g;
    }
    Ok(())
}

/// `torch.optim.Adam`.
pub fn adam(
    c: &AdamConfig,
    step: u64,
    segments: &[Segment],
    grads: &[f64],
    state: &mut ReferenceState,
) -> Result<(), OptimError> {
    check(
        &OptimizerConfig::Adam(c.clone()),
        step,
        segments,
        grads,
        state,
    )?;
    let moments = AdamMoments {
        lr: c.lr,
        betas: c.betas,
        eps: c.eps,
        amsgrad: c.amsgrad,
    };
    for i in indices(segments) {
        let mut g = if c.maximize { -grads[i] } else { grads[i] };
        if c.weight_decay != 0.0 {
            g += c.weight_decay * state.params[i];
        }
        moments.apply(step, i, g, state);
    }
    Ok(())
}

/// `torch.optim.AdamW`.
pub fn adamw(
    c: &AdamWConfig,
    step: u64,
    segments: &[Segment],
    grads: &[f64],
    state: &mut ReferenceState,
) -> Result<(), OptimError> {
    check(
        &OptimizerConfig::AdamW(c.clone()),
        step,
        segments,
        grads,
        state,
    )?;
    let moments = AdamMoments {
        lr: c.lr,
        betas: c.betas,
        eps: c.eps,
        amsgrad: c.amsgrad,
    };
    for i in indices(segments) {
        let g = if c.maximize { -grads[i] } else { grads[i] };
        state.params[i] *= 1.0 - c.lr * c.weight_decay;
        moments.apply(step, i, g, state);
    }
    Ok(())
}

/// The part Adam and AdamW share once the gradient is final.
struct AdamMoments {
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    amsgrad: bool,
}

impl AdamMoments {
    fn apply(&self, step: u64, i: usize, g: f64, state: &mut ReferenceState) {
        let (beta1, beta2) = self.betas;
        let t = step as f64;
        let m = beta1 * state.buffers[0][i] + (1.0 - beta1) * g;
        let v = beta2 * state.buffers[1][i] + (1.0 - beta2) * g * g;
        state.buffers[0][i] = m;
        state.buffers[1][i] = v;
        let second = if self.amsgrad {
            let max = state.buffers[2][i].max(v);
            state.buffers[2][i] = max;
            max
        } else {
            v
        };
        let bias_correction1 = 1.0 - beta1.powf(t);
        let bias_correction2 = 1.0 - beta2.powf(t);
        let denom = second.sqrt() / bias_correction2.sqrt() + self.eps;
        state.params[i] -= self.lr / bias_correction1 * m / denom;
    }
}

/// `torch.optim.RMSprop`.
pub fn rmsprop(
    c: &RmsPropConfig,
    step: u64,
    segments: &[Segment],
    grads: &[f64],
    state: &mut ReferenceState,
) -> Result<(), OptimError> {
    check(
        &OptimizerConfig::RmsProp(c.clone()),
        step,
        segments,
        grads,
        state,
    )?;
    let momentum_index = (c.momentum > 0.0).then_some(1);
    let grad_avg_index = c.centered.then_some(1 + usize::from(c.momentum > 0.0));
    for i in indices(segments) {
        let mut g = if c.maximize { -grads[i] } else { grads[i] };
        if c.weight_decay != 0.0 {
            g += c.weight_decay * state.params[i];
        }
        let square_avg = c.alpha * state.buffers[0][i] + (1.0 - c.alpha) * g * g;
        state.buffers[0][i] = square_avg;
        let avg = match grad_avg_index {
            Some(k) => {
                let grad_avg = c.alpha * state.buffers[k][i] + (1.0 - c.alpha) * g;
                state.buffers[k][i] = grad_avg;
                (square_avg - grad_avg * grad_avg).sqrt() + c.eps
            }
            None => square_avg.sqrt() + c.eps,
        };
        match momentum_index {
            Some(k) => {
                let buf = c.momentum * state.buffers[k][i] + g / avg;
                state.buffers[k][i] = buf;
                state.params[i] -= c.lr * buf;
            }
            None => state.params[i] -= c.lr * g / avg,
        }
    }
    Ok(())
}

/// `torch.optim.Adagrad`.
pub fn adagrad(
    c: &AdagradConfig,
    step: u64,
    segments: &[Segment],
    grads: &[f64],
    state: &mut ReferenceState,
) -> Result<(), OptimError> {
    check(
        &OptimizerConfig::Adagrad(c.clone()),
        step,
        segments,
        grads,
        state,
    )?;
    let clr = c.lr / (1.0 + (step - 1) as f64 * c.lr_decay);
    for i in indices(segments) {
        let mut g = if c.maximize { -grads[i] } else { grads[i] };
        if c.weight_decay != 0.0 {
            g += c.weight_decay * state.params[i];
        }
        let sum = state.buffers[0][i] + g * g;
        state.buffers[0][i] = sum;
        state.params[i] -= clr * g / (sum.sqrt() + c.eps);
    }
    Ok(())
}

/// apex `FusedLAMB`. Refuses (changing nothing) when the global gradient
/// norm, a moment, a norm or a trust ratio is not finite.
pub fn lamb(
    c: &LambConfig,
    step: u64,
    segments: &[Segment],
    grads: &[f64],
    state: &mut ReferenceState,
) -> Result<(), OptimError> {
    check(
        &OptimizerConfig::Lamb(c.clone()),
        step,
        segments,
        grads,
        state,
    )?;
    let (beta1, beta2) = c.betas;
    let t = step as f64;
    let (bias_correction1, bias_correction2) = if c.bias_correction {
        (1.0 - beta1.powf(t), 1.0 - beta2.powf(t))
    } else {
        (1.0, 1.0)
    };
    let beta3 = if c.grad_averaging { 1.0 - beta1 } else { 1.0 };
    let global_norm = indices(segments)
        .map(|i| grads[i] * grads[i])
        .sum::<f64>()
        .sqrt();
    if !global_norm.is_finite() {
        return Err(OptimError::invalid(
            "grads",
            "the global gradient norm is not finite",
        ));
    }
    let clip = if global_norm > c.max_grad_norm {
        global_norm / c.max_grad_norm
    } else {
        1.0
    };
    // Compute everything before writing anything, so a refusal changes nothing.
    let mut next = state.clone();
    for (s, segment) in segments.iter().enumerate() {
        let range = segment.offset..segment.offset + segment.len;
        let mut update = vec![0.0; segment.len];
        for (u, i) in update.iter_mut().zip(range.clone()) {
            let p = state.params[i];
            let mut g = grads[i] / clip;
            if !c.adam_w_mode {
                g += c.weight_decay * p;
            }
            let m = beta1 * state.buffers[0][i] + beta3 * g;
            let v = beta2 * state.buffers[1][i] + (1.0 - beta2) * g * g;
            if !(m.is_finite() && v.is_finite()) {
                return Err(OptimError::invalid(
                    format!("segments[{s}]"),
                    "a moment would become non-finite",
                ));
            }
            next.buffers[0][i] = m;
            next.buffers[1][i] = v;
            *u = (m / bias_correction1) / ((v / bias_correction2).sqrt() + c.eps);
            if c.adam_w_mode {
                *u += c.weight_decay * p;
            }
        }
        let param_norm = range
            .clone()
            .map(|i| state.params[i].powi(2))
            .sum::<f64>()
            .sqrt();
        let update_norm = update.iter().map(|u| u * u).sum::<f64>().sqrt();
        let ratio =
            if (c.use_nvlamb || c.weight_decay != 0.0) && param_norm != 0.0 && update_norm != 0.0 {
                c.lr * (param_norm / update_norm)
            } else {
                c.lr
            };
        if !(param_norm.is_finite() && update_norm.is_finite() && ratio.is_finite()) {
            return Err(OptimError::invalid(
                format!("segments[{s}]"),
                "a norm or the trust ratio is not finite",
            ));
        }
        for (u, i) in update.iter().zip(range) {
            next.params[i] = state.params[i] - ratio * u;
        }
    }
    *state = next;
    Ok(())
}

//! `torch.optim.Adam` and `torch.optim.AdamW`.

use serde::{Deserialize, Serialize};

use super::{StateLayout, non_negative, unit_interval};
use crate::OptimError;

/// Adam as PyTorch's `_single_tensor_adam`: coupled L2 weight decay, eps
/// added after the bias-corrected square root, and with `amsgrad` the
/// running max of the *uncorrected* second moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdamConfig {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Decay rates of the first and second moments (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Added to the denominator for stability (default 1e-8).
    pub eps: f64,
    /// Coupled L2 penalty added to the gradient (default 0).
    pub weight_decay: f64,
    /// Keep and use the running max of the second moment.
    pub amsgrad: bool,
    /// Maximize the objective instead of minimizing it.
    pub maximize: bool,
}

impl Default for AdamConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            amsgrad: false,
            maximize: false,
        }
    }
}

impl AdamConfig {
    /// Checks every field; the error names the first invalid one.
    pub fn validate(&self) -> Result<(), OptimError> {
        validate_adam_fields(self.lr, self.betas, self.eps, self.weight_decay)
    }

    /// `exp_avg`, `exp_avg_sq`, and `max_exp_avg_sq` with amsgrad.
    pub fn state_layout(&self) -> StateLayout {
        adam_layout(self.amsgrad)
    }
}

/// AdamW: Adam with decoupled weight decay, `p ← p·(1 − lr·weight_decay)`
/// before the moment update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdamWConfig {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Decay rates of the first and second moments (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Added to the denominator for stability (default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay (default 1e-2).
    pub weight_decay: f64,
    /// Keep and use the running max of the second moment.
    pub amsgrad: bool,
    /// Maximize the objective instead of minimizing it.
    pub maximize: bool,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 1e-2,
            amsgrad: false,
            maximize: false,
        }
    }
}

impl AdamWConfig {
    /// Checks every field; the error names the first invalid one.
    pub fn validate(&self) -> Result<(), OptimError> {
        validate_adam_fields(self.lr, self.betas, self.eps, self.weight_decay)
    }

    /// `exp_avg`, `exp_avg_sq`, and `max_exp_avg_sq` with amsgrad.
    pub fn state_layout(&self) -> StateLayout {
        adam_layout(self.amsgrad)
    }
}

pub(super) fn validate_adam_fields(
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
) -> Result<(), OptimError> {
    non_negative("lr", lr)?;
    non_negative("eps", eps)?;
    unit_interval("betas[0]", betas.0)?;
    unit_interval("betas[1]", betas.1)?;
    non_negative("weight_decay", weight_decay)
}

fn adam_layout(amsgrad: bool) -> StateLayout {
    if amsgrad {
        StateLayout::zeros(&["exp_avg", "exp_avg_sq", "max_exp_avg_sq"])
    } else {
        StateLayout::zeros(&["exp_avg", "exp_avg_sq"])
    }
}

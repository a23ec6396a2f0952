//! LAMB with NVIDIA apex `FusedLAMB` semantics.

use serde::{Deserialize, Serialize};

use super::{StateLayout, non_negative, unit_interval};
use crate::OptimError;

/// LAMB as apex's `FusedLAMB`: gradients are clipped by their global norm
/// over *all* parameters, and each tensor (segment) is scaled by its trust
/// ratio `lr·‖p‖/‖u‖` (plain `lr` when either norm is 0). As in apex, the
/// trust ratio applies only when `weight_decay != 0` or `use_nvlamb`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LambConfig {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Decay rates of the first and second moments (default (0.9, 0.999)).
    pub betas: (f64, f64),
    /// Added to the denominator for stability (default 1e-6).
    pub eps: f64,
    /// Weight decay (default 0.01); decoupled when `adam_w_mode`, else L2.
    pub weight_decay: f64,
    /// Divide the moments by `1 − beta^t` (default true).
    pub bias_correction: bool,
    /// Decoupled weight decay (true) or L2 added to the gradient (false).
    pub adam_w_mode: bool,
    /// Scale the gradient entering the first moment by `1 − beta1` (default true).
    pub grad_averaging: bool,
    /// Global gradient-norm clipping threshold over all parameters (default 1.0).
    pub max_grad_norm: f64,
    /// Apply the trust ratio even to tensors without weight decay (default false).
    pub use_nvlamb: bool,
}

impl Default for LambConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-6,
            weight_decay: 0.01,
            bias_correction: true,
            adam_w_mode: true,
            grad_averaging: true,
            max_grad_norm: 1.0,
            use_nvlamb: false,
        }
    }
}

impl LambConfig {
    /// Checks every field; the error names the first invalid one.
    pub fn validate(&self) -> Result<(), OptimError> {
        non_negative("lr", self.lr)?;
        unit_interval("betas[0]", self.betas.0)?;
        unit_interval("betas[1]", self.betas.1)?;
        non_negative("eps", self.eps)?;
        non_negative("weight_decay", self.weight_decay)?;
        // Infinity is allowed: it turns clipping off.
        if self.max_grad_norm.is_nan() || self.max_grad_norm <= 0.0 {
            return Err(OptimError::invalid(
                "max_grad_norm",
                format!("must be > 0, got {}", self.max_grad_norm),
            ));
        }
        Ok(())
    }

    /// `exp_avg`, `exp_avg_sq`.
    pub fn state_layout(&self) -> StateLayout {
        StateLayout::zeros(&["exp_avg", "exp_avg_sq"])
    }
}

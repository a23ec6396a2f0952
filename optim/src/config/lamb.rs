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

    /// The f32 constants of step `step` (from 1) with global gradient norm
    /// `grad_norm`, computed in f64 as apex's `multi_tensor_lamb` does:
    /// what every backend's LAMB kernel multiplies by.
    pub fn step_constants(&self, step: u64, grad_norm: f64) -> LambConstants {
        let (beta1, beta2) = self.betas;
        let t = step as f64;
        let (bias_correction1, bias_correction2) = if self.bias_correction {
            (1.0 - beta1.powf(t), 1.0 - beta2.powf(t))
        } else {
            (1.0, 1.0)
        };
        let clip = if grad_norm > self.max_grad_norm {
            grad_norm / self.max_grad_norm
        } else {
            1.0
        };
        LambConstants {
            inv_clip: (1.0 / clip) as f32,
            decay: self.weight_decay as f32,
            beta1: beta1 as f32,
            beta2: beta2 as f32,
            beta3: if self.grad_averaging {
                1.0 - beta1
            } else {
                1.0
            } as f32,
            one_minus_beta2: (1.0 - beta2) as f32,
            inv_bias_correction1: (1.0 / bias_correction1) as f32,
            inv_bias_correction2: (1.0 / bias_correction2) as f32,
            eps: self.eps as f32,
        }
    }
}

/// One LAMB step's constants ([`LambConfig::step_constants`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LambConstants {
    /// `1 / clip`: the gradient's scale after global-norm clipping.
    pub inv_clip: f32,
    /// The weight decay.
    pub decay: f32,
    /// The first moment's decay rate.
    pub beta1: f32,
    /// The second moment's decay rate.
    pub beta2: f32,
    /// The gradient's weight in the first moment (`1 − beta1` when
    /// averaging, else 1).
    pub beta3: f32,
    /// `1 − beta2`.
    pub one_minus_beta2: f32,
    /// `1 / (1 − beta1^t)` (1 without bias correction).
    pub inv_bias_correction1: f32,
    /// `1 / (1 − beta2^t)` (1 without bias correction).
    pub inv_bias_correction2: f32,
    /// Added to the denominator.
    pub eps: f32,
}

impl LambConstants {
    /// The constants in the order the GPU kernels take them.
    pub fn to_array(self) -> [f32; 9] {
        [
            self.inv_clip,
            self.decay,
            self.beta1,
            self.beta2,
            self.beta3,
            self.one_minus_beta2,
            self.inv_bias_correction1,
            self.inv_bias_correction2,
            self.eps,
        ]
    }
}

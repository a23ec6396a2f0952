//! `torch.optim.RMSprop`.

use serde::{Deserialize, Serialize};

use super::{StateLayout, non_negative};
use crate::OptimError;

/// RMSprop as PyTorch: eps added outside the square root; `centered`
/// subtracts the squared running mean of the gradient.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RmsPropConfig {
    /// Learning rate (default 1e-2).
    pub lr: f64,
    /// Smoothing constant of the squared-gradient average (default 0.99).
    pub alpha: f64,
    /// Added to the denominator for stability (default 1e-8).
    pub eps: f64,
    /// Coupled L2 penalty added to the gradient (default 0).
    pub weight_decay: f64,
    /// Momentum factor; 0 keeps no momentum buffer.
    pub momentum: f64,
    /// Normalize by the estimated variance instead of the second moment.
    pub centered: bool,
    /// Maximize the objective instead of minimizing it.
    pub maximize: bool,
}

impl Default for RmsPropConfig {
    fn default() -> Self {
        Self {
            lr: 1e-2,
            alpha: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            momentum: 0.0,
            centered: false,
            maximize: false,
        }
    }
}

impl RmsPropConfig {
    /// Checks every field; the error names the first invalid one.
    pub fn validate(&self) -> Result<(), OptimError> {
        non_negative("lr", self.lr)?;
        non_negative("eps", self.eps)?;
        non_negative("momentum", self.momentum)?;
        non_negative("weight_decay", self.weight_decay)?;
        non_negative("alpha", self.alpha)
    }

    /// `square_avg`, then `momentum_buffer` when momentum > 0, then
    /// `grad_avg` when centered.
    pub fn state_layout(&self) -> StateLayout {
        let mut names = vec!["square_avg"];
        if self.momentum > 0.0 {
            names.push("momentum_buffer");
        }
        if self.centered {
            names.push("grad_avg");
        }
        StateLayout::zeros(&names)
    }
}

//! `torch.optim.SGD`.

use serde::{Deserialize, Serialize};

use super::{StateLayout, finite, non_negative};
use crate::OptimError;

/// Stochastic gradient descent with PyTorch's options. The first step's
/// momentum buffer is the (decayed) gradient itself, without dampening.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SgdConfig {
    /// Learning rate (PyTorch default 1e-3).
    pub lr: f64,
    /// Momentum factor; 0 keeps no momentum buffer.
    pub momentum: f64,
    /// Dampening applied to the gradient when it enters the momentum buffer.
    pub dampening: f64,
    /// Coupled L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Nesterov momentum; needs `momentum > 0` and `dampening == 0`.
    pub nesterov: bool,
    /// Maximize the objective instead of minimizing it.
    pub maximize: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            maximize: false,
        }
    }
}

impl SgdConfig {
    /// Checks every field; the error names the first invalid one.
    pub fn validate(&self) -> Result<(), OptimError> {
        non_negative("lr", self.lr)?;
        non_negative("momentum", self.momentum)?;
        finite("dampening", self.dampening)?;
        non_negative("weight_decay", self.weight_decay)?;
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(OptimError::invalid(
                "nesterov",
                "Nesterov momentum requires momentum > 0 and dampening == 0",
            ));
        }
        Ok(())
    }

    /// `momentum_buffer` when momentum is on, nothing otherwise.
    pub fn state_layout(&self) -> StateLayout {
        if self.momentum != 0.0 {
            StateLayout::zeros(&["momentum_buffer"])
        } else {
            StateLayout::default()
        }
    }
}

//! `torch.optim.Adagrad`.

use serde::{Deserialize, Serialize};

use super::{StateBuffer, StateLayout, non_negative};
use crate::OptimError;

/// Adagrad as PyTorch: step `t` uses `clr = lr / (1 + (t − 1)·lr_decay)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdagradConfig {
    /// Learning rate (default 1e-2).
    pub lr: f64,
    /// Learning-rate decay per step (default 0).
    pub lr_decay: f64,
    /// Coupled L2 penalty added to the gradient (default 0).
    pub weight_decay: f64,
    /// Starting value of the squared-gradient sum (default 0).
    pub initial_accumulator_value: f64,
    /// Added to the denominator for stability (default 1e-10).
    pub eps: f64,
    /// Maximize the objective instead of minimizing it.
    pub maximize: bool,
}

impl Default for AdagradConfig {
    fn default() -> Self {
        Self {
            lr: 1e-2,
            lr_decay: 0.0,
            weight_decay: 0.0,
            initial_accumulator_value: 0.0,
            eps: 1e-10,
            maximize: false,
        }
    }
}

impl AdagradConfig {
    /// Checks every field; the error names the first invalid one.
    pub fn validate(&self) -> Result<(), OptimError> {
        non_negative("lr", self.lr)?;
        non_negative("lr_decay", self.lr_decay)?;
        non_negative("weight_decay", self.weight_decay)?;
        non_negative("initial_accumulator_value", self.initial_accumulator_value)?;
        non_negative("eps", self.eps)
    }

    /// `sum`, starting at `initial_accumulator_value`.
    pub fn state_layout(&self) -> StateLayout {
        StateLayout {
            buffers: vec![StateBuffer {
                name: "sum",
                initial_value: self.initial_accumulator_value,
            }],
        }
    }
}

//! Optimizer configs and the state each optimizer keeps per parameter.

mod adagrad;
mod adam;
mod lamb;
mod rmsprop;
mod sgd;

use serde::{Deserialize, Serialize};

pub use adagrad::AdagradConfig;
pub use adam::{AdamConfig, AdamWConfig};
pub use lamb::{LambConfig, LambConstants};
pub use rmsprop::RmsPropConfig;
pub use sgd::SgdConfig;

use crate::OptimError;

/// Any of the six optimizer families, so a runtime can store, validate and
/// allocate state for an optimizer without knowing which one it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum OptimizerConfig {
    /// `torch.optim.SGD`.
    Sgd(SgdConfig),
    /// `torch.optim.Adam`.
    Adam(AdamConfig),
    /// `torch.optim.AdamW`.
    AdamW(AdamWConfig),
    /// `torch.optim.RMSprop`.
    RmsProp(RmsPropConfig),
    /// `torch.optim.Adagrad`.
    Adagrad(AdagradConfig),
    /// NVIDIA apex `FusedLAMB`.
    Lamb(LambConfig),
}

impl OptimizerConfig {
    /// Checks every field; the error names the first invalid one.
    pub fn validate(&self) -> Result<(), OptimError> {
        match self {
            Self::Sgd(c) => c.validate(),
            Self::Adam(c) => c.validate(),
            Self::AdamW(c) => c.validate(),
            Self::RmsProp(c) => c.validate(),
            Self::Adagrad(c) => c.validate(),
            Self::Lamb(c) => c.validate(),
        }
    }

    /// The state buffers (each the size of the parameters) this config needs.
    pub fn state_layout(&self) -> StateLayout {
        match self {
            Self::Sgd(c) => c.state_layout(),
            Self::Adam(c) => c.state_layout(),
            Self::AdamW(c) => c.state_layout(),
            Self::RmsProp(c) => c.state_layout(),
            Self::Adagrad(c) => c.state_layout(),
            Self::Lamb(c) => c.state_layout(),
        }
    }

    /// The family's short name, e.g. `"adamw"`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sgd(_) => "sgd",
            Self::Adam(_) => "adam",
            Self::AdamW(_) => "adamw",
            Self::RmsProp(_) => "rmsprop",
            Self::Adagrad(_) => "adagrad",
            Self::Lamb(_) => "lamb",
        }
    }
}

/// One state buffer of the parameters' size, in the order the update reads them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StateBuffer {
    /// PyTorch's name for the state, e.g. `exp_avg_sq`.
    pub name: &'static str,
    /// The value every element holds before the first step.
    pub initial_value: f64,
}

/// The state buffers an optimizer needs, in the order the kernels and the
/// reference expect them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StateLayout {
    /// The buffers, each as long as the parameter buffer.
    pub buffers: Vec<StateBuffer>,
}

impl StateLayout {
    /// How many parameter-sized buffers to allocate.
    pub fn len(&self) -> usize {
        self.buffers.len()
    }

    /// True when the optimizer keeps no state.
    pub fn is_empty(&self) -> bool {
        self.buffers.is_empty()
    }

    pub(crate) fn zeros(names: &[&'static str]) -> Self {
        Self {
            buffers: names
                .iter()
                .map(|&name| StateBuffer {
                    name,
                    initial_value: 0.0,
                })
                .collect(),
        }
    }
}

/// `value >= 0` and finite; NaN fails, as PyTorch's `0.0 <= value` does.
pub(crate) fn non_negative(field: &str, value: f64) -> Result<(), OptimError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(OptimError::invalid(
            field,
            format!("must be finite and >= 0, got {value}"),
        ))
    }
}

/// `0 <= value < 1`, the range of a beta or decay rate.
pub(crate) fn unit_interval(field: &str, value: f64) -> Result<(), OptimError> {
    if (0.0..1.0).contains(&value) {
        Ok(())
    } else {
        Err(OptimError::invalid(
            field,
            format!("must be in [0, 1), got {value}"),
        ))
    }
}

/// Finite, any sign.
pub(crate) fn finite(field: &str, value: f64) -> Result<(), OptimError> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(OptimError::invalid(
            field,
            format!("must be finite, got {value}"),
        ))
    }
}

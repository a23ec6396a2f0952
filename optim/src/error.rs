//! The error type of the optimizer crate.

use serde::{Deserialize, Serialize};

/// Why an optimizer config, step or scaler update was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
pub enum OptimError {
    /// An argument (a config field, the step count, a segment, a buffer
    /// length, or a value the update would make non-finite) is invalid.
    /// Nothing was changed. Fix the call; retrying it unchanged fails the same way.
    #[error("invalid argument `{field}`: {reason}")]
    InvalidArgument {
        /// The offending field or argument, e.g. `betas[0]` or `segments[3]`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The loss scale would become 0, subnormal or non-finite. The gradients
    /// overflow at every scale the scaler can represent: inspect the model and
    /// data (or lower the learning rate); do not retry.
    #[error("loss scale would become {scale}: {reason}")]
    ScaleOutOfRange {
        /// The scale the update would have produced.
        scale: f64,
        /// Why that scale is refused.
        reason: String,
    },
}

impl OptimError {
    /// An [`OptimError::InvalidArgument`] naming `field`.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

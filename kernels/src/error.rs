//! The error type of the CPU kernels.

use cistern_optim::OptimError;
use serde::{Deserialize, Serialize};

/// Why a kernel refused its arguments. A refused kernel changed nothing.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
pub enum KernelError {
    /// A buffer's length is not the one the other arguments imply.
    /// Fix the call; retrying it unchanged fails the same way.
    #[error("`{argument}` has {actual} elements, expected {expected}")]
    LengthMismatch {
        /// The argument with the wrong length.
        argument: String,
        /// The length the other arguments imply.
        expected: usize,
        /// The length it has.
        actual: usize,
    },
    /// An argument is out of range: a config field, a shape whose size
    /// overflows, a bad segment table, a step count of 0, or an update that
    /// would make values non-finite. Fix the call; never retry it unchanged.
    #[error("invalid argument `{field}`: {reason}")]
    InvalidArgument {
        /// The offending field or argument.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl KernelError {
    /// A [`KernelError::InvalidArgument`] naming `field`.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Refuses `actual` unless it equals `expected`.
    pub(crate) fn check_len(
        argument: &str,
        expected: usize,
        actual: usize,
    ) -> Result<(), KernelError> {
        if expected == actual {
            Ok(())
        } else {
            Err(Self::LengthMismatch {
                argument: argument.into(),
                expected,
                actual,
            })
        }
    }
}

impl From<OptimError> for KernelError {
    fn from(error: OptimError) -> Self {
        match error {
            OptimError::InvalidArgument { field, reason } => {
                Self::InvalidArgument { field, reason }
            }
            OptimError::ScaleOutOfRange { scale, reason } => {
                Self::invalid("scale", format!("{reason} ({scale})"))
            }
        }
    }
}

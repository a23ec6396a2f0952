//! The store's errors are `BackendError`; the tape's, which its forward
//! calls meet, are converted keeping what the caller does about them.

use crate::error::{AutodiffError, BackendError};

/// `error` in the store's vocabulary.
pub(super) fn backend(error: AutodiffError) -> BackendError {
    match error {
        AutodiffError::Backend(error) => error,
        AutodiffError::ShapeMismatch(error) => BackendError::ShapeMismatch(error),
        AutodiffError::TapeMismatch => BackendError::TapeMismatch,
        AutodiffError::InvalidArgument(message) => BackendError::InvalidArgument(message),
        other => BackendError::InvalidArgument(other.to_string()),
    }
}

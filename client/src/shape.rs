//! `ShapeError`: why a tensor's shape does not fit the operation, and the
//! checks that produce it.

use serde::{Deserialize, Serialize};

/// A shape that does not fit: the caller passed data or handles of the wrong size.
///
/// Never transient: fix the call. Serializable; new variants go last.
#[derive(Clone, Debug, PartialEq, thiserror::Error, Serialize, Deserialize)]
pub enum ShapeError {
    /// The number of elements differs from what the shape or slot holds:
    /// pass data of the expected length.
    #[error("expected {expected} elements, got {actual}")]
    ElementCountMismatch {
        /// Elements the operation needs.
        expected: usize,
        /// Elements given.
        actual: usize,
    },
    /// The number of dimensions differs: reshape before the call.
    #[error("expected rank {expected}, got rank {actual}")]
    RankMismatch {
        /// Dimensions the operation needs.
        expected: usize,
        /// Dimensions given.
        actual: usize,
    },
    /// The product of the dimensions does not fit in `usize`: the shape is
    /// malformed; fix it.
    #[error("the element count of shape {dims:?} overflows")]
    ElementCountOverflow {
        /// The dimensions given.
        dims: Vec<usize>,
    },
    /// One dimension differs (an inner dimension of a matmul, a bias length):
    /// fix the operand of that axis.
    #[error("dimension {axis} is {actual}, expected {expected}")]
    DimensionMismatch {
        /// The axis that differs.
        axis: usize,
        /// Its size the operation needs.
        expected: usize,
        /// Its size given.
        actual: usize,
    },
    /// An axis beyond the tensor's rank was named: name an existing axis.
    #[error("axis {axis} is out of range for rank {rank}")]
    AxisOutOfRange {
        /// The axis named.
        axis: usize,
        /// The tensor's rank.
        rank: usize,
    },
}

impl ShapeError {
    /// The number of elements of `dims`, or `ElementCountOverflow`.
    pub fn element_count(dims: &[usize]) -> Result<usize, ShapeError> {
        dims.iter()
            .try_fold(1usize, |count, &dim| count.checked_mul(dim))
            .ok_or_else(|| ShapeError::ElementCountOverflow {
                dims: dims.to_vec(),
            })
    }

    /// `Ok` when `actual` equals `expected`, else the first difference:
    /// the rank, then the lowest axis that differs.
    pub fn check_dims(expected: &[usize], actual: &[usize]) -> Result<(), ShapeError> {
        if expected.len() != actual.len() {
            return Err(ShapeError::RankMismatch {
                expected: expected.len(),
                actual: actual.len(),
            });
        }
        match expected.iter().zip(actual).position(|(e, a)| e != a) {
            Some(axis) => Err(ShapeError::DimensionMismatch {
                axis,
                expected: expected[axis],
                actual: actual[axis],
            }),
            None => Ok(()),
        }
    }

    /// `Ok` when `actual` elements is what `expected` needs.
    pub fn check_element_count(expected: usize, actual: usize) -> Result<(), ShapeError> {
        if expected == actual {
            Ok(())
        } else {
            Err(ShapeError::ElementCountMismatch { expected, actual })
        }
    }
}

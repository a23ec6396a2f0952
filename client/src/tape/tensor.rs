//! `Tensor`: a host tensor (shape and row-major data), what a tape uploads
//! and reads back.

use serde::{Deserialize, Serialize};

use crate::shape::ShapeError;

/// A host tensor: its dimensions and its elements in row-major order.
///
/// The shape `[]` is a scalar (one element). The data always holds exactly
/// as many elements as the shape: [`Tensor::new`] refuses anything else.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tensor<T> {
    shape: Vec<usize>,
    data: Vec<T>,
}

impl<T> Tensor<T> {
    /// A tensor of `shape` holding `data`; `ElementCountMismatch` when the
    /// lengths differ, `ElementCountOverflow` for a shape too large to count.
    pub fn new(shape: impl Into<Vec<usize>>, data: Vec<T>) -> Result<Self, ShapeError> {
        let shape = shape.into();
        let expected = ShapeError::element_count(&shape)?;
        ShapeError::check_element_count(expected, data.len())?;
        Ok(Tensor { shape, data })
    }

    /// A scalar (shape `[]`).
    pub fn scalar(value: T) -> Self {
        Tensor {
            shape: Vec::new(),
            data: vec![value],
        }
    }

    /// Its dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Its elements, row-major.
    pub fn data(&self) -> &[T] {
        &self.data
    }

    /// Its elements, row-major, taken out.
    pub fn into_data(self) -> Vec<T> {
        self.data
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether it holds no elements (some dimension is 0).
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

impl<T: Copy> Tensor<T> {
    /// The one element of a one-element tensor (any shape), else `None`.
    pub fn item(&self) -> Option<T> {
        match self.data.as_slice() {
            [value] => Some(*value),
            _ => None,
        }
    }
}

impl<T: Clone> Tensor<T> {
    /// A tensor of `shape` with every element `value`.
    pub fn full(shape: impl Into<Vec<usize>>, value: T) -> Result<Self, ShapeError> {
        let shape = shape.into();
        let count = ShapeError::element_count(&shape)?;
        Ok(Tensor {
            shape,
            data: vec![value; count],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tensor_holds_exactly_the_elements_of_its_shape() {
        assert!(Tensor::new([2, 3], vec![0.0f32; 6]).is_ok());
        assert_eq!(
            Tensor::new([2, 3], vec![0.0f32; 5]),
            Err(ShapeError::ElementCountMismatch {
                expected: 6,
                actual: 5
            })
        );
    }

    #[test]
    fn a_scalar_has_no_dimensions_and_one_item() {
        let scalar = Tensor::scalar(2.5f32);
        assert_eq!(scalar.shape(), &[] as &[usize]);
        assert_eq!(scalar.item(), Some(2.5));
        assert_eq!(Tensor::full([2], 1.0f32).ok().and_then(|t| t.item()), None);
    }
}

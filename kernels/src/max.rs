//! The maximum over one dimension, PyTorch's `torch.max(x, dim)`: each
//! output element the largest of its `dim` elements and the index of the
//! first one that large (a NaN is larger than every number: the first NaN
//! wins, as PyTorch's), and its backward, which routes each gradient to
//! that index. The input is read as `outer×dim×inner` (row-major), the
//! outputs as `outer×inner`; indices are `i32` words.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::KernelError;

/// The shape of a maximum over one dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MaxDimSpec {
    /// The product of the dimensions before the reduced one.
    pub outer: u64,
    /// The reduced dimension's length.
    pub dim: u64,
    /// The product of the dimensions after it.
    pub inner: u64,
}

impl MaxDimSpec {
    /// Refuses an empty reduced dimension (its maximum is undefined) and
    /// one whose indices do not fit in an `i32`.
    pub fn validate(&self) -> Result<(), KernelError> {
        if self.dim == 0 {
            return Err(KernelError::invalid(
                "dim",
                "the maximum of no elements is undefined",
            ));
        }
        if i32::try_from(self.dim).is_err() {
            return Err(KernelError::invalid("dim", "its indices do not fit in i32"));
        }
        Ok(())
    }

    /// The input's (and its gradient's) element count.
    pub fn inputs(&self) -> Option<u64> {
        self.outer.checked_mul(self.dim)?.checked_mul(self.inner)
    }

    /// The values' (and indices') element count.
    pub fn outputs(&self) -> Option<u64> {
        self.outer.checked_mul(self.inner)
    }

    fn dims(&self) -> Result<(usize, usize, usize), KernelError> {
        self.validate()?;
        let size = |v: u64, field| {
            usize::try_from(v).map_err(|_| KernelError::invalid(field, "does not fit in usize"))
        };
        self.inputs()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| KernelError::invalid("dim", "the sizes overflow"))?;
        Ok((
            size(self.outer, "outer")?,
            size(self.dim, "dim")?,
            size(self.inner, "inner")?,
        ))
    }
}

/// Whether `v` replaces `best` as the running maximum: strictly larger,
/// or the first NaN.
fn replaces(v: f32, best: f32) -> bool {
    v > best || (v.is_nan() && !best.is_nan())
}

/// `values[o][i] ← max_k x[o][k][i]` and `indices[o][i]` its first `k`.
pub fn max_dim(
    spec: &MaxDimSpec,
    x: &[f32],
    values: &mut [f32],
    indices: &mut [i32],
) -> Result<(), KernelError> {
    let (outer, dim, inner) = spec.dims()?;
    KernelError::check_len("x", outer * dim * inner, x.len())?;
    KernelError::check_len("values", outer * inner, values.len())?;
    KernelError::check_len("indices", outer * inner, indices.len())?;
    if inner == 0 {
        return Ok(());
    }
    let rows = values
        .par_chunks_mut(inner)
        .zip(indices.par_chunks_mut(inner));
    rows.zip(x.par_chunks(dim * inner))
        .with_min_len(16)
        .for_each(|((values, indices), block)| {
            values.copy_from_slice(&block[..inner]);
            indices.fill(0);
            for (k, row) in block.chunks_exact(inner).enumerate().skip(1) {
                for ((best, index), &v) in values.iter_mut().zip(indices.iter_mut()).zip(row) {
                    if replaces(v, *best) {
                        *best = v;
                        *index = k as i32;
                    }
                }
            }
        });
    Ok(())
}

/// `grad_x[o][k][i] ← k = indices[o][i] ? grad_out[o][i] : 0`, the
/// gradient of [`max_dim`]; an index out of range routes nothing.
pub fn max_dim_backward(
    spec: &MaxDimSpec,
    indices: &[i32],
    grad_out: &[f32],
    grad_x: &mut [f32],
) -> Result<(), KernelError> {
    let (outer, dim, inner) = spec.dims()?;
    KernelError::check_len("indices", outer * inner, indices.len())?;
    KernelError::check_len("grad_out", outer * inner, grad_out.len())?;
    KernelError::check_len("grad_x", outer * dim * inner, grad_x.len())?;
    if inner == 0 {
        return Ok(());
    }
    let blocks = grad_x.par_chunks_mut(dim * inner).with_min_len(16);
    let routed = indices.par_chunks(inner).zip(grad_out.par_chunks(inner));
    blocks.zip(routed).for_each(|(block, (indices, g))| {
        for (k, row) in block.chunks_exact_mut(inner).enumerate() {
            for ((out, &index), &g) in row.iter_mut().zip(indices).zip(g) {
                *out = if usize::try_from(index) == Ok(k) {
                    g
                } else {
                    0.0
                };
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_maximum_and_the_first_nan_win_and_backward_routes_to_them() {
        // x is 1×4×2: column 0 ties at 3 (indices 1, 3), column 1 has NaNs at 1 and 2.
        let spec = MaxDimSpec {
            outer: 1,
            dim: 4,
            inner: 2,
        };
        let x = [1.0, 5.0, 3.0, f32::NAN, 2.0, f32::NAN, 3.0, 9.0];
        let (mut values, mut indices) = ([0.0; 2], [7; 2]);
        max_dim(&spec, &x, &mut values, &mut indices).unwrap();
        assert_eq!(values[0], 3.0);
        assert!(values[1].is_nan());
        assert_eq!(indices, [1, 1]);
        let mut grad = [9.0; 8];
        max_dim_backward(&spec, &indices, &[10.0, 20.0], &mut grad).unwrap();
        assert_eq!(grad, [0.0, 0.0, 10.0, 20.0, 0.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn an_empty_dimension_and_wrong_lengths_are_refused() {
        let empty = MaxDimSpec {
            outer: 2,
            dim: 0,
            inner: 1,
        };
        assert!(max_dim(&empty, &[], &mut [0.0; 2], &mut [0; 2]).is_err());
        let spec = MaxDimSpec {
            outer: 2,
            dim: 3,
            inner: 1,
        };
        assert!(max_dim(&spec, &[0.0; 5], &mut [0.0; 2], &mut [0; 2]).is_err());
        assert!(max_dim_backward(&spec, &[0; 2], &[0.0; 2], &mut [0.0; 5]).is_err());
    }
}
